"""The serving load table from lab/load_ab.sh's runs (build/ab/NAME-cC.json, NAME one of
one-at-a-time, static, continuous): writes lab/load-ab.json, which
`dllm-deploy report ... --load-test lab/load-ab.json` puts in docs/BENCHMARKS.md, and
prints the table.

    python lab/load_table.py [build/ab]
"""
import json
import sys
from pathlib import Path

from dllm_deploy.bench.report import SERVERS, load_rows


def main(folder: Path) -> None:
    levels: dict = {}
    for s in SERVERS:
        for f in sorted(folder.glob(f"{s}-c*.json")):
            for lv in json.loads(f.read_text())["levels"]:
                levels.setdefault(str(lv["concurrency"]), {})[s] = lv
    load = {"note": ("three servers up at once over the tiny artifact, concurrency levels interleaved, on 2 shared CPU "
                     "cores (single figures move between runs; compare the ratios of one level)"), "levels": levels}
    out = Path(__file__).resolve().parent / "load-ab.json"
    out.write_text(json.dumps(load, indent=2) + "\n")
    print("\n".join(load_rows(load)))


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "build/ab"))
