import pytest

from dllm_deploy.errors import UserError
from dllm_deploy.export.engines import Shapes, cache_key, engine_shapes, trtexec_command

MANIFEST = {"model": {"num_layers": 2, "num_kv_heads": 8, "head_dim": 128, "max_seq": 4096},
            "block_length": 32, "max_beam_width": 16}


def test_h100_like_shapes_are_sane():
    s = engine_shapes(MANIFEST, {"batch": 8, "beam_width": 4, "max_beam_width": 8, "max_seq": 4096})
    v = s["verify"]
    assert v["input_ids"] == Shapes((1, 32), (8, 128), (8, 256))          # L .. W_opt*L .. W_max*L
    assert v["past_key_values.0.key"].max == (8, 8, 4096 - 32, 128)
    assert v["attention_mask"].max == (8, 1, 256, 4096)
    p = s["prefill"]
    assert p["input_ids"].max == (8, 4096) and p["input_ids"].min == (1, 1)
    assert set(v) == {"input_ids", "position_ids", "attention_mask"} | {
        f"past_key_values.{i}.{k}" for i in range(2) for k in ("key", "value")}


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
