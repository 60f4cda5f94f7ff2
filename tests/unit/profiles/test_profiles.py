import pytest
import yaml

from dllm_deploy.errors import UserError
from dllm_deploy.profiles import (
    detect,
    explain,
    get_profile,
    jetson_facts,
    load_profiles,
    parse_profile,
    select,
)
from dllm_deploy.profiles.memory import free_bytes_for, free_memory_bytes

BUNDLED = {"cpu-x86_64", "cpu-arm64", "generic-cpu", "generic-gpu-small", "generic-gpu", "generic-gpu-large",
           "jetson-orin-nano", "jetson-orin-nx", "jetson-orin-agx", "jetson-generic", "l4", "a10", "rtx-4090",
           "a100-40gb", "a100-80gb", "h100", "h200", "b200"}


def test_bundled_profiles_load_and_gpus_carry_device_facts():
    ps = load_profiles()
    assert BUNDLED <= set(ps)
    cc = {"jetson-orin-nano": "8.7", "jetson-orin-nx": "8.7", "jetson-orin-agx": "8.7", "a10": "8.6", "rtx-4090": "8.9",
          "l4": "8.9", "a100-40gb": "8.0", "a100-80gb": "8.0", "h100": "9.0", "h200": "9.0", "b200": "10.0"}
    for name, want in cc.items():
        assert ps[name].device["compute_capability"] == want, name
        assert ps[name].trt["workspace_mb"] > 0
    for name in ("jetson-orin-nano", "jetson-orin-nx", "jetson-orin-agx", "jetson-generic"):
        assert ps[name].device["shared_host_memory"] is True
    assert ps["a100-40gb"].device["memory_gb"] == 40 and ps["b200"].device["memory_gb"] == 180


# fake device facts as detect() reports them (NVML names, GiB as NVML counts them; Jetson: device-tree model)
@pytest.mark.parametrize("facts, want", [
    ({"kind": "cpu", "arch": "x86_64", "memory_gb": 16}, "cpu-x86_64"),
    ({"kind": "cpu", "arch": "aarch64", "memory_gb": 8}, "cpu-arm64"),
    ({"kind": "cpu", "arch": "riscv64", "memory_gb": 4}, "generic-cpu"),
    ({"kind": "jetson", "arch": "aarch64", "gpu_name": "NVIDIA Jetson Orin Nano Developer Kit", "memory_gb": 7.4,
      "compute_capability": "8.7"}, "jetson-orin-nano"),
    ({"kind": "jetson", "arch": "aarch64", "gpu_name": "NVIDIA Jetson Orin Nano Engineering Reference Developer Kit Super",
      "memory_gb": 7.4, "compute_capability": "8.7"}, "jetson-orin-nano"),
    ({"kind": "jetson", "arch": "aarch64", "gpu_name": "NVIDIA Jetson Orin NX Engineering Reference Developer Kit",
      "memory_gb": 15.3, "compute_capability": "8.7"}, "jetson-orin-nx"),
    ({"kind": "jetson", "arch": "aarch64", "gpu_name": "NVIDIA Jetson AGX Orin Developer Kit", "memory_gb": 61.4,
      "compute_capability": "8.7"}, "jetson-orin-agx"),
    ({"kind": "jetson", "arch": "aarch64", "gpu_name": "Jetson-AGX", "memory_gb": 31.0,
      "compute_capability": "7.2"}, "jetson-generic"),                                   # Xavier: not an Orin
    ({"kind": "gpu", "gpu_name": "NVIDIA A10", "memory_gb": 22.5, "compute_capability": "8.6"}, "a10"),
    ({"kind": "gpu", "gpu_name": "NVIDIA A10G", "memory_gb": 22.5, "compute_capability": "8.6"}, "a10"),
    ({"kind": "gpu", "gpu_name": "NVIDIA GeForce RTX 4090", "memory_gb": 23.6, "compute_capability": "8.9"}, "rtx-4090"),
    ({"kind": "gpu", "gpu_name": "NVIDIA L4", "memory_gb": 22.5, "compute_capability": "8.9"}, "l4"),
    ({"kind": "gpu", "gpu_name": "NVIDIA A100-SXM4-40GB", "memory_gb": 39.4, "compute_capability": "8.0"}, "a100-40gb"),
    ({"kind": "gpu", "gpu_name": "NVIDIA A100-PCIE-40GB", "memory_gb": 39.4}, "a100-40gb"),
    ({"kind": "gpu", "gpu_name": "NVIDIA A100-SXM4-80GB", "memory_gb": 79.2, "compute_capability": "8.0"}, "a100-80gb"),
    ({"kind": "gpu", "gpu_name": "NVIDIA H100 80GB HBM3", "memory_gb": 79.6, "compute_capability": "9.0"}, "h100"),
    ({"kind": "gpu", "gpu_name": "NVIDIA H200", "memory_gb": 139.8, "compute_capability": "9.0"}, "h200"),
    ({"kind": "gpu", "gpu_name": "NVIDIA B200", "memory_gb": 179.1, "compute_capability": "10.0"}, "b200"),
    # unknown GPUs: the generic fallback by memory size (and no substring accidents)
    ({"kind": "gpu", "gpu_name": "Tesla T4", "memory_gb": 15.0, "compute_capability": "7.5"}, "generic-gpu"),
    ({"kind": "gpu", "gpu_name": "NVIDIA GeForce RTX 3060", "memory_gb": 11.8, "compute_capability": "8.6"}, "generic-gpu-small"),
    ({"kind": "gpu", "gpu_name": "NVIDIA L40S", "memory_gb": 44.5, "compute_capability": "8.9"}, "generic-gpu-large"),
    ({"kind": "gpu", "gpu_name": "NVIDIA GH200 480GB", "memory_gb": 94.5, "compute_capability": "9.0"}, "generic-gpu-large"),
    ({"kind": "gpu", "gpu_name": "NVIDIA GeForce RTX 4090 Laptop GPU", "memory_gb": 15.7, "compute_capability": "8.9"}, "generic-gpu"),
])
def test_selection_with_fake_device_facts(facts, want):
    prof, reasons = select(load_profiles(), facts)
    assert prof.name == want
    assert reasons and reasons[0].startswith("kind ")


def test_explain_reports_the_matched_facts_and_the_losers():
    facts = {"kind": "gpu", "gpu_name": "NVIDIA A10", "memory_gb": 22.5, "compute_capability": "8.6"}
    e = explain(load_profiles(), facts)
    assert e["profile"] == "a10"
    assert "device name 'NVIDIA A10' contains 'A10'" in e["reasons"] and "compute capability 8.6" in e["reasons"]
    by = {c["name"]: c for c in e["candidates"]}
    assert by["generic-gpu"]["score"] is not None and by["generic-gpu"]["score"] < e["score"]
    assert by["a100-40gb"]["score"] is None and "has none of ['A100']" in by["a100-40gb"]["reasons"][0]
    assert by["cpu-x86_64"]["reasons"] == ["kind gpu is not cpu"]


def test_a_known_name_on_another_architecture_does_not_win():
    # compute capability is checked when both the device and the profile know it
    facts = {"kind": "gpu", "gpu_name": "NVIDIA H100 80GB HBM3", "memory_gb": 79.6, "compute_capability": "8.0"}
    assert select(load_profiles(), facts)[0].name == "generic-gpu-large"


def test_jetson_facts_from_l4t_files(tmp_path):
    (tmp_path / "proc/device-tree").mkdir(parents=True)
    (tmp_path / "etc").mkdir()
    (tmp_path / "proc/device-tree/model").write_text("NVIDIA Jetson Orin Nano Developer Kit\x00")
    (tmp_path / "proc/device-tree/compatible").write_text("nvidia,p3768-0000+p3767-0005\x00nvidia,p3767-0005\x00nvidia,tegra234\x00")
    (tmp_path / "etc/nv_tegra_release").write_text("# R36 (release), REVISION: 4.3, GCID: 38968081, BOARD: generic\n")
    f = jetson_facts(tmp_path)
    assert f == {"kind": "jetson", "shared_host_memory": True, "gpu_name": "NVIDIA Jetson Orin Nano Developer Kit",
                 "compute_capability": "8.7", "l4t": "36.4.3"}
    prof, reasons = select(load_profiles(), {"arch": "aarch64", "memory_gb": 7.4, **f})
    assert prof.name == "jetson-orin-nano" and "compute capability 8.7" in reasons


def test_memory_budget_source_follows_the_device():
    ps = load_profiles()
    gpu = {"kind": "gpu", "free_memory_gb": 70.0}
    free, where = free_bytes_for(ps["h100"], gpu, on_gpu=True)
    assert free == 70 * 2**30 and "NVML" in where
    # Jetson: the GPU allocates from host DRAM, so the budget is the host's MemAvailable
    free, where = free_bytes_for(ps["jetson-orin-nano"], {"kind": "jetson"}, on_gpu=True)
    assert "host MemAvailable" in where and "shares host memory" in where
    assert abs(free - free_memory_bytes()) < 512 * 2**20
    # a GPU profile whose providers fell back to the CPU: host memory, not the GPU's
    assert "host" in free_bytes_for(ps["h100"], gpu, on_gpu=False)[1]


def test_auto_on_this_machine_is_a_cpu_profile_with_reasons():
    prof, reasons, facts = get_profile("auto")
    assert facts["kind"] == detect()["kind"]
    if facts["kind"] == "cpu":
        assert prof.match["kind"] == "cpu" and any("arch" in r for r in reasons)


def test_ort_provider_options_come_from_the_profile(monkeypatch):
    import onnxruntime as ort

    from dllm_deploy.runtime.backends.ort import provider_list
    ps = load_profiles()
    assert provider_list(ps["cpu-x86_64"].backends, ps["cpu-x86_64"].ort.get("provider_options")) == [("CPUExecutionProvider", {})]
    monkeypatch.setattr(ort, "get_available_providers",
                        lambda: ["TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"])
    got = provider_list(ps["h100"].backends, ps["h100"].ort["provider_options"])
    assert [n for n, _ in got] == ["TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"]
    assert got[0][1] == {"trt_fp16_enable": True, "trt_engine_cache_enable": True}
    # a provider this onnxruntime lacks is skipped; CPU stays last
    monkeypatch.setattr(ort, "get_available_providers", lambda: ["CPUExecutionProvider"])
    assert provider_list(ps["jetson-orin-nano"].backends, ps["jetson-orin-nano"].ort["provider_options"]) == [("CPUExecutionProvider", {})]


def _write(tmp_path, body):
    f = tmp_path / "mine.yaml"
    f.write_text(yaml.safe_dump(body))
    return f


def test_user_profile_overrides_and_validation(tmp_path):
    base = {"name": "my-cpu", "match": {"kind": "cpu", "arch": ["x86_64"]}, "backends": ["CPUExecutionProvider"],
            "priority": 5, "decode": {"beam_width": 3, "max_beam_width": 4}}
    ps = load_profiles(_write(tmp_path, base))
    assert select(ps, {"kind": "cpu", "arch": "x86_64", "memory_gb": 8})[0].name == "my-cpu"
    bad = [({**base, "decode": {"beam": 3}}, "unknown key 'beam'"),
           ({**base, "decode": {"beam_width": "four"}}, "'beam_width' has the wrong type"),
           ({**base, "device": {"shared_host_memory": "yes"}}, "'shared_host_memory' has the wrong type"),
           ({**base, "device": {"compute_capability": 8.7}}, "'compute_capability' has the wrong type"),
           ({**base, "device": {"compute_capability": "sm87"}}, "must look like '8.7'"),
           ({**base, "trt": {"hardware_compatibility": "any"}}, "trt.hardware_compatibility must be one of"),
           ({**base, "trt": {"opt_level": 9}}, "trt.opt_level must be 0..5"),
           ({**base, "memory": {"fraction": 1.5}}, r"memory.fraction must be in \(0, 1\]"),
           ({**base, "precision": "fp8"}, "precision must be one of"),
           ({**base, "decode": {"beam_width": 8, "max_beam_width": 4}}, "beam_width is above"),
           ({**base, "match": {"kind": "tpu"}}, "match.kind must be cpu, gpu or jetson"),
           ({**base, "trt": 4096}, "'trt' has the wrong type")]
    for body, msg in bad:
        ps = load_profiles(_write(tmp_path, body))     # a broken user profile is skipped ...
        assert "my-cpu" not in ps and "generic-cpu" in ps
        with pytest.raises(UserError, match=msg):      # ... and naming it is the error
            get_profile("my-cpu", ps)
    with pytest.raises(UserError, match="missing key 'backends'"):
        parse_profile({"name": "x", "match": {"kind": "cpu"}}, "x.yaml")
    with pytest.raises(UserError, match="no profile named 'nope'"):
        get_profile("nope")


def test_a_bench_tune_overlay_loads(tmp_path):
    # the shape `bench --tune` writes: decode defaults for the strategy, and free-form provenance
    body = {"name": "cpu-x86_64-tuned", "priority": 2, "match": {"kind": "cpu", "arch": ["x86_64"]},
            "backends": ["CPUExecutionProvider"], "precision": "fp32", "memory": {"fraction": 0.5, "reserve_mb": 1024},
            "decode": {"strategy": "spd", "beam_width": 4, "threshold": 0.9, "select": "lossless", "base": "vanilla", "tree": "wide"},
            "tuned": {"from": "bench.json", "speedup_vs_threshold": 1.4}}
    ps = load_profiles(_write(tmp_path, body))
    assert ps["cpu-x86_64-tuned"].decode["tree"] == "wide"
    assert select(ps, {"kind": "cpu", "arch": "x86_64"})[0].name == "cpu-x86_64-tuned"


ARM_CPUINFO = "".join(f"processor\t: {i}\nBogoMIPS\t: 50.00\nFeatures\t: fp asimd evtstrm aes pmull sha1 sha2 crc32\n"
                      f"CPU implementer\t: 0x41\nCPU architecture: 8\nCPU part\t: 0xd0c\n\n" for i in range(4))


def _board(root, meminfo_kb: int, jetson_model: str | None = None):
    """A fake root: an arm64 board's proc/cpuinfo and proc/meminfo, and a Jetson's L4T files."""
    (root / "proc").mkdir(parents=True)
    (root / "proc/cpuinfo").write_text(ARM_CPUINFO)
    (root / "proc/meminfo").write_text(f"MemTotal:       {meminfo_kb} kB\nMemFree:        1000 kB\n")
    if jetson_model:
        (root / "proc/device-tree").mkdir()
        (root / "etc").mkdir()
        (root / "proc/device-tree/model").write_text(jetson_model + "\x00")
        (root / "proc/device-tree/compatible").write_text("nvidia,p3737-0000\x00nvidia,tegra234\x00")
        (root / "etc/nv_tegra_release").write_text("# R36 (release), REVISION: 3.0, GCID: 1, BOARD: generic\n")
    return root


def test_profiles_explain_auto_on_another_boards_facts(tmp_path, monkeypatch, capsys):
    """DLLM_DEPLOY_ROOT names a folder standing for /: `profiles explain auto` on an arm64 board's
    facts picks cpu-arm64, on a Jetson AGX Orin's jetson-orin-agx, each with its reasons."""
    import json

    from dllm_deploy.cli import main
    for root, kb, model, want in ((tmp_path / "pi", 8_000_000, None, "cpu-arm64"),
                                  (tmp_path / "agx", 64_000_000, "NVIDIA Jetson AGX Orin Developer Kit", "jetson-orin-agx")):
        monkeypatch.setenv("DLLM_DEPLOY_ROOT", str(_board(root, kb, model)))
        assert main(["profiles", "explain", "auto", "--json"]) == 0
        out = json.loads(capsys.readouterr().out)
        assert out["profile"] == want and out["facts"]["arch"] == "aarch64" and out["facts"]["cpus"] == 4
        assert abs(out["facts"]["memory_gb"] - kb / 2**20) < 1e-9 and out["reasons"]
    monkeypatch.setenv("DLLM_DEPLOY_ROOT", str(tmp_path / "nowhere"))
    assert main(["profiles", "explain", "auto"]) == 2
    assert "DLLM_DEPLOY_ROOT" in capsys.readouterr().err


def _x86_root(root, flags: str):
    (root / "proc").mkdir(parents=True)
    (root / "proc/cpuinfo").write_text("".join(f"processor\t: {i}\nvendor_id\t: AuthenticAMD\nflags\t\t: {flags}\n\n"
                                               for i in range(2)))
    (root / "proc/meminfo").write_text("MemTotal:       8000000 kB\n")
    return root


def test_an_x86_cpu_without_vnni_gets_the_int8_note(tmp_path, monkeypatch, capsys):
    """The int8 kernels come from the cpuinfo flags: AVX2 alone sums byte pairs in 16 bits, so
    `profiles explain` advises 7-bit int8 weights; with VNNI (either flag), or on Arm, it does not."""
    import json

    from dllm_deploy.cli import main
    from dllm_deploy.profiles import int8_kernels
    base = "fpu sse2 avx f16c fma avx2"
    assert int8_kernels(f"flags\t: {base}\n") == "avx2"
    assert int8_kernels(f"flags\t: {base} avx512f avx512_vnni\n") == "vnni"
    assert int8_kernels(f"flags\t: {base} avx_vnni\n") == "vnni"
    assert int8_kernels("flags\t: fpu sse2 avx\n") is None and int8_kernels(ARM_CPUINFO) is None
    for name, flags, note in (("avx2", base, True), ("vnni", base + " avx512_vnni", False)):
        monkeypatch.setenv("DLLM_DEPLOY_ROOT", str(_x86_root(tmp_path / name, flags)))
        assert main(["profiles", "explain", "auto", "--json"]) == 0
        out = json.loads(capsys.readouterr().out)
        assert out["profile"] == "cpu-x86_64" and out["facts"]["int8_kernels"] == name
        assert [n for n in out["notes"] if "--int8-reduce-range" in n] == ([out["notes"][0]] if note else [])
        assert main(["profiles", "explain", "auto"]) == 0
        lines = capsys.readouterr().out.splitlines()
        assert any(line.startswith("note: int8: this CPU has no VNNI") for line in lines) == note
    monkeypatch.setenv("DLLM_DEPLOY_ROOT", str(_board(tmp_path / "pi", 8_000_000)))
    assert main(["profiles", "explain", "auto", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert "int8_kernels" not in out["facts"] and out["notes"] == []
