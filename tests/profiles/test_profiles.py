import pytest
import yaml

from dllm_deploy.errors import UserError
from dllm_deploy.profiles import detect, get_profile, load_profiles, parse_profile, select


def test_bundled_profiles_load():
    ps = load_profiles()
    assert {"cpu-x86_64", "cpu-arm64", "generic-cpu", "generic-gpu", "h100", "h200", "l4", "a100-80gb"} <= set(ps)


@pytest.mark.parametrize("facts, want", [
    ({"kind": "cpu", "arch": "x86_64", "memory_gb": 16}, "cpu-x86_64"),
    ({"kind": "cpu", "arch": "aarch64", "memory_gb": 8}, "cpu-arm64"),
    ({"kind": "cpu", "arch": "riscv64", "memory_gb": 4}, "generic-cpu"),
    ({"kind": "gpu", "gpu_name": "NVIDIA H100 80GB HBM3", "memory_gb": 79.6}, "h100"),
    ({"kind": "gpu", "gpu_name": "NVIDIA H200", "memory_gb": 139.8}, "h200"),
    ({"kind": "gpu", "gpu_name": "NVIDIA A100-SXM4-40GB", "memory_gb": 39.4}, "generic-gpu"),
    ({"kind": "gpu", "gpu_name": "NVIDIA A100-SXM4-80GB", "memory_gb": 79.2}, "a100-80gb"),
    ({"kind": "gpu", "gpu_name": "Tesla T4", "memory_gb": 15}, "generic-gpu"),
])
def test_selection_with_fake_device_facts(facts, want):
    prof, reasons = select(load_profiles(), facts)
    assert prof.name == want
    assert reasons and reasons[0].startswith("kind ")


def test_auto_on_this_machine_is_a_cpu_profile_with_reasons():
    prof, reasons, facts = get_profile("auto")
    assert facts["kind"] == detect()["kind"]
    if facts["kind"] == "cpu":
        assert prof.match["kind"] == "cpu" and any("arch" in r for r in reasons)


def _write(tmp_path, body):
    f = tmp_path / "mine.yaml"
    f.write_text(yaml.safe_dump(body))
    return f


def test_user_profile_overrides_and_validation(tmp_path):
    base = {"name": "my-cpu", "match": {"kind": "cpu", "arch": ["x86_64"]}, "backends": ["CPUExecutionProvider"],
            "priority": 5, "decode": {"beam_width": 3}}
    ps = load_profiles(_write(tmp_path, base))
    assert select(ps, {"kind": "cpu", "arch": "x86_64", "memory_gb": 8})[0].name == "my-cpu"
    with pytest.raises(UserError, match="unknown key 'beam'"):
        load_profiles(_write(tmp_path, {**base, "decode": {"beam": 3}}))
    with pytest.raises(UserError, match="'beam_width' has the wrong type"):
        load_profiles(_write(tmp_path, {**base, "decode": {"beam_width": "four"}}))
    with pytest.raises(UserError, match="missing key 'backends'"):
        parse_profile({"name": "x", "match": {"kind": "cpu"}}, "x.yaml")
    with pytest.raises(UserError, match="no profile named 'nope'"):
        get_profile("nope")
