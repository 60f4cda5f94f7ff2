"""`dllm-deploy bench --backends ort,cpp`: the C++ runtime measured beside Python ORT in one run."""
import json

from dllm_deploy.cli import main


def test_bench_cpp_backend(cpp_build, tiny_artifact, tmp_path, monkeypatch):
    monkeypatch.setenv("DLLM_DEPLOY_CPP", str(cpp_build / "dllm-generate"))
    out = tmp_path / "bench.json"
    rc = main(["bench", "--artifact", str(tiny_artifact[0]), "--backends", "ort,cpp", "--strategies", "vanilla,threshold,spd",
               "--beam-widths", "2", "--tasks", "upper,count", "--n", "1", "--repeats", "1", "--gen-length", "32",
               "--json-out", str(out), "--quiet"])
    assert rc == 0
    d = json.loads(out.read_text())
    by = {r["label"]: r for r in d["runs"]}
    cpp = [r for r in d["runs"] if r["backend"] == "cpp"]
    assert len(cpp) == 5          # vanilla (no cache), threshold, 3 x spd
    for r in cpp:
        twin = by[r["label"].replace("cpp:", "ort:", 1)]
        # token-identical runtimes: the same tokens, forwards and accuracy
        assert (r["tokens"], r["forwards"], r["accuracy"]) == (twin["tokens"], twin["forwards"], twin["accuracy"])
        assert 0.0 <= r["loop_overhead"] <= 1.0 and r["time_per_forward_ms"] > 0
        assert f"{r['label']} / ort" in d["ratios"]


def test_bench_cpp_needs_the_build(tiny_artifact, tmp_path, monkeypatch):
    monkeypatch.setenv("DLLM_DEPLOY_CPP", str(tmp_path / "missing"))
    assert main(["bench", "--artifact", str(tiny_artifact[0]), "--backends", "cpp", "--quiet"]) == 2
