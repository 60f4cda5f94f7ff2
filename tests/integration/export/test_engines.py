import pytest

from dllm_deploy.artifact import SAMPLING_INPUTS
from dllm_deploy.artifact.engines import (
    Shapes,
    build_settings,
    cache_key,
    engine_record,
    engine_shapes,
    record_engines,
    recorded_engines,
    stale_reasons,
)
from dllm_deploy.errors import UserError
from dllm_deploy.export.engines import plan_engines, trtexec_command
from dllm_deploy.profiles import load_profiles

INPUTS = ["input_ids", "position_ids", "attention_mask",
          *[f"past_key_values.{i}.{k}" for i in range(2) for k in ("key", "value")], *SAMPLING_INPUTS]
MANIFEST = {"model": {"num_layers": 2, "num_kv_heads": 8, "head_dim": 128, "max_seq": 4096},
            "block_length": 32, "max_beam_width": 16, "kv_shapes": [[8, 128]] * 2,
            "graphs": {g: {"inputs": INPUTS} for g in ("prefill", "verify")}}


def test_h100_like_shapes_are_sane():
    s = engine_shapes(MANIFEST, {"batch": 8, "beam_width": 4, "max_beam_width": 8, "max_seq": 4096})
    v = s["verify"]
    assert v["input_ids"] == Shapes((1, 32), (8, 128), (8, 256))          # L .. W_opt*L .. W_max*L
    assert v["past_key_values.0.key"].max == (8, 8, 4096 - 32, 128)
    # the last block's W branches attend the whole prefix: keys up to (max_seq - L) + W_max * L
    assert v["attention_mask"].max == (8, 1, 256, 4096 - 32 + 256)
    assert s["prefill"]["attention_mask"].max == (8, 1, 4096, 4096)
    assert v["sample_u"] == v["input_ids"] and v["temperature"] == Shapes((1,), (8,), (8,))   # per token, per row
    p = s["prefill"]
    assert p["input_ids"].max == (8, 4096) and p["input_ids"].min == (1, 1)
    assert list(v) == INPUTS        # every input of the graph, in its order


def test_max_beam_width_is_the_smaller_of_profile_and_artifact():
    s = engine_shapes(MANIFEST, {"beam_width": 4, "max_beam_width": 64})
    assert s["verify"]["input_ids"].max == (1, 16 * 32)


def test_shapes_reject_inverted_ranges():
    with pytest.raises(UserError):
        Shapes((1, 64), (1, 32), (1, 128))


def test_trtexec_command():
    s = engine_shapes(MANIFEST, {"batch": 1, "beam_width": 2, "max_beam_width": 4, "max_seq": 1024})
    cmd = trtexec_command("verify.onnx", "engines/h100/verify.plan", s["verify"], workspace_mb=8192, opt_level=4)
    assert cmd[:3] == ["trtexec", "--onnx=verify.onnx", "--saveEngine=engines/h100/verify.plan"]
    assert "--stronglyTyped" in cmd and "--memPoolSize=workspace:8192M" in cmd
    maxs = next(c for c in cmd if c.startswith("--maxShapes="))
    assert "input_ids:1x128" in maxs and "past_key_values.1.value:1x8x992x128" in maxs


def test_cache_key_changes_with_each_part():
    base = cache_key("abc", "10.9", "9.0", {"w": 4})
    assert base == cache_key("abc", "10.9", "9.0", {"w": 4})
    assert len({base, cache_key("abd", "10.9", "9.0", {"w": 4}), cache_key("abc", "11.0", "9.0", {"w": 4}),
                cache_key("abc", "10.9", "8.9", {"w": 4}), cache_key("abc", "10.9", "9.0", {"w": 8})}) == 5


def _manifest(precisions=("fp32",)):
    names = ["input_ids", "position_ids", "attention_mask"] + [f"past_key_values.{i}.{k}" for i in range(2) for k in ("key", "value")]
    files = {p: {"prefill": f"{p}/prefill.onnx", "verify": f"{p}/verify.onnx", "weights": f"{p}/weights.bin"} for p in precisions}
    return {**MANIFEST, "topk": 2,
            "model": {**MANIFEST["model"], "vocab_size": 1000},
            "graphs": {"prefill": {"inputs": names, "outputs": ["logits", "top_ids", "top_probs"]
                                   + [f"present.{i}.{k}" for i in range(2) for k in ("key", "value")]},
                       "verify": {"inputs": names, "outputs": ["top_ids", "top_probs"]}},
            "precisions": files, "files": {f: f"sha-{f}" for fs in files.values() for f in fs.values()}}


def test_build_settings_come_from_the_profile_with_cli_overrides():
    ps = load_profiles()
    assert build_settings(ps["h100"]) == {"workspace_mb": 8192, "opt_level": 4, "hardware_compatibility": "none"}
    assert build_settings(ps["jetson-orin-nano"], workspace_mb=512)["workspace_mb"] == 512
    assert build_settings(ps["cpu-x86_64"]) == {"workspace_mb": 4096, "opt_level": 3, "hardware_compatibility": "none"}
    with pytest.raises(UserError, match="0..5"):
        build_settings(ps["h100"], opt_level=7)


def test_trtexec_hardware_compatibility_flag():
    s = engine_shapes(MANIFEST, {"batch": 1})["verify"]
    assert not any(c.startswith("--hardwareCompatibilityLevel") for c in trtexec_command("v.onnx", "v.plan", s))
    cmd = trtexec_command("v.onnx", "v.plan", s, hardware_compatibility="ampere_plus")
    assert "--hardwareCompatibilityLevel=ampere+" in cmd


def test_plan_uses_the_profile_precision_when_the_artifact_has_it():
    ps = load_profiles()
    plan = plan_engines("art", _manifest(("fp32", "fp16")), ps["h100"])
    assert plan["precision"] == "fp16" and plan["engines"][0]["onnx"] == "fp16/prefill.onnx"
    assert plan["out_dir"].endswith("engines/h100") and plan["settings"]["opt_level"] == 4
    assert plan_engines("art", _manifest(), ps["h100"])["precision"] == "fp32"       # fp32 only: fall back


def _record(m, trt="10.9.0", cc="9.0", decode=None, hw="none"):
    return engine_record(m, "h100", "fp32", engine_shapes(m, decode or {"batch": 8, "max_beam_width": 8}),
                         {"workspace_mb": 1, "opt_level": 3, "hardware_compatibility": hw}, trt, cc)


def test_engine_record_and_why_engines_are_stale():
    m = _manifest()
    built = _record(m)
    assert built["graphs"]["verify"]["plan"] == "engines/h100/verify.plan"
    assert stale_reasons(built, _record(m)) == []
    # workspace and builder level change speed, not validity
    assert stale_reasons(built, engine_record(m, "h100", "fp32", engine_shapes(m, {"batch": 8, "max_beam_width": 8}),
                                              {"workspace_mb": 99, "opt_level": 5}, "10.9.0", "9.0")) == []
    assert stale_reasons(built, _record(m, trt="10.12.0")) == ["built with TensorRT 10.9.0, this is 10.12.0"]
    assert stale_reasons(built, _record(m, cc="8.9")) == ["built for compute capability 9.0, this GPU is 8.9"]
    assert "shapes or hardware compatibility changed" in stale_reasons(built, _record(m, decode={"batch": 4}))[0]
    assert "hardware compatibility" in stale_reasons(built, _record(m, hw="ampere_plus"))[0]
    changed = {**m, "files": {**m["files"], "fp32/weights.bin": "other"}}
    assert stale_reasons(built, _record(changed)) == ["the ONNX graphs or weights changed since the build"]
    assert stale_reasons(None, built) == ["no engines recorded for this profile"]


def test_record_engines_keeps_the_manifest_and_adds_the_entry(tmp_path):
    import json

    from dllm_deploy.artifact import read_manifest, write_manifest
    (tmp_path / "a.bin").write_bytes(b"x")
    from dllm_deploy.models.capabilities import block_causal
    write_manifest(tmp_path, {"model": {}, "precisions": {}, "tokenizer": {}, "family": "block_causal",
                              "capabilities": block_causal().to_dict(), "kv_shapes": [[1, 8]],
                              "sampling": {"pool": 8}, "graphs": {g: {"inputs": [], "outputs": []} for g in ("prefill", "verify")}})
    before = json.loads((tmp_path / "manifest.json").read_text())
    record_engines(tmp_path, "h100", {"trt_version": "10.9.0"})
    m = read_manifest(tmp_path, verify=True)
    assert recorded_engines(m, "h100") == {"trt_version": "10.9.0"} and recorded_engines(m, "l4") is None
    assert {k: v for k, v in m.items() if k != "engines"} == before
