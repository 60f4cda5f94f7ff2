"""Markdown tables of `dllm-deploy eval --json` results: one folder of runs, or BEFORE AFTER folders
side by side (each with core/ and general/ subfolders, as lab/eval_distill.sh writes them).

    python3 lab/eval_table.py lab/eval-distill/distilled
    python3 lab/eval_table.py lab/eval-distill/base lab/eval-distill/distilled
"""
import json
import sys
from pathlib import Path


def runs(folder: Path) -> dict:
    # an empty file is a run lab/eval_distill.sh is still writing: left out until it ends
    return {f.stem: json.loads(f.read_text())["overall"] for f in sorted(folder.glob("*.json")) if f.stat().st_size}


def main(args: list[str]) -> None:
    folders = [Path(a) for a in args]
    for split in ("core", "general"):
        tables = [runs(f / split) for f in folders]
        names = sorted(set().union(*tables))
        cols = " | ".join(f"{f.name}: acc | TPF | tok/s" for f in folders)
        print(f"\n{split}:\n\n| run | {cols} |")
        print("|---|" + "---|---|---|" * len(folders))
        for n in names:
            cells = []
            for t in tables:
                o = t.get(n)
                cells.append("- | - | -" if o is None else f"{o['accuracy']:.3f} | {o['tpf']:.2f} | {o['tokens_per_s']:.0f}")
            print(f"| {n} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main(sys.argv[1:])
