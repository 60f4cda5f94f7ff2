"""The load table of docs/serving.md from benchmarks/load_ab.sh's runs (build/ab/NAME-cC.json):
tokens/s and p50 latency per server and concurrency, and the throughput ratios over one request at
a time, measured in the same interleaved run. Writes benchmarks/load-ab.json; prints markdown.

    python benchmarks/load_table.py [build/ab]
"""
import json
import sys
from pathlib import Path

SERVERS = ("one-at-a-time", "static", "continuous")


def main(folder: Path) -> None:
    rows = {}
    for s in SERVERS:
        for f in folder.glob(f"{s}-c*.json"):
            for lv in json.loads(f.read_text())["levels"]:
                rows.setdefault(lv["concurrency"], {})[s] = lv
    print("| clients | one at a time tok/s | static x8 tok/s | continuous x8 tok/s | static / one | continuous / one "
          "| continuous / static | p50 ms one / static / continuous | lost / corrupted |")
    print("|---|---|---|---|---|---|---|---|---|")
    for c in sorted(rows):
        r = rows[c]
        if set(r) != set(SERVERS):
            continue
        t = {s: r[s]["tokens_per_s"] for s in SERVERS}
        bad = sum(r[s]["requests"] - r[s]["answered"] for s in SERVERS), sum(r[s]["corrupted"] for s in SERVERS)
        p50 = " / ".join(f"{r[s]['latency_p50_s'] * 1000:.0f}" for s in SERVERS)
        print(f"| {c} | {t['one-at-a-time']:.1f} | {t['static']:.1f} | {t['continuous']:.1f} "
              f"| {t['static'] / t['one-at-a-time']:.2f}x | {t['continuous'] / t['one-at-a-time']:.2f}x "
              f"| {t['continuous'] / t['static']:.2f}x | {p50} | {bad[0]} / {bad[1]} |")
    out = Path(__file__).resolve().parent / "load-ab.json"
    out.write_text(json.dumps({"note": "benchmarks/load_ab.sh: three servers up at once, levels interleaved",
                               "levels": {str(c): rows[c] for c in sorted(rows)}}, indent=2) + "\n")


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "build/ab"))
