"""`make demo` (`dllm-deploy demo`): export -> profile -> decode with each strategy, printing the
figures; here with one prompt per family (the command decodes five)."""
from __future__ import annotations

import contextlib
import io
import json

from dllm_deploy.cli.demo import STRATEGIES, run_demo


def test_the_demo_exports_loads_and_decodes_with_each_strategy(tmp_path):
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert run_demo(json_out=True, out_dir=str(tmp_path), n_per_family=1) == 0
    res = json.loads(out.getvalue())
    assert (tmp_path / "tiny-artifact" / "manifest.json").is_file() and set(res["sizes_bytes"]) == {"fp32", "int8"}
    assert [r["strategy"] for r in res["runs"]] == [label for label, _ in STRATEGIES]
    by = {r["strategy"]: r for r in res["runs"]}
    # lossless SPD returns vanilla's answers in fewer forwards; the threshold rule commits several per step
    assert by["spd lossless W4"]["accuracy"] == by["vanilla"]["accuracy"]
    assert by["spd lossless W4"]["forwards"] < by["vanilla"]["forwards"] and by["threshold 0.9"]["tpf"] > 2
    assert res["sample"]["text"] == "DIFFUSION MODELS FILL MANY TOKENS PER FORWARD"
    assert res["profile"] and res["profile_reasons"]
