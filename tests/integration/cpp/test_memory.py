"""The C++ memory-aware beam-width cap (cpp/src/memory.cpp) gives the W of
dllm_deploy/profiles/memory.py for the same model, precision and free memory."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from dllm_deploy.artifact import SAMPLING_INPUTS
from dllm_deploy.models.config import DLLMConfig
from dllm_deploy.profiles import get_profile
from dllm_deploy.profiles.memory import beam_width_cap, estimate_bytes

GIB = 2**30
# synthetic models: (name, model dims over the tiny one's)
MODELS = {
    "tiny": {},
    "7b-mha": dict(vocab_size=32000, hidden_size=4096, intermediate_size=11008, num_layers=32, num_heads=32,
                   num_kv_heads=32, head_dim=128, max_seq=4096, block_size=32),
    "8b-gqa-tied": dict(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_layers=32, num_heads=32,
                        num_kv_heads=8, head_dim=128, max_seq=8192, block_size=64, tie_word_embeddings=True),
    "1b-long": dict(vocab_size=50000, hidden_size=2048, intermediate_size=5632, num_layers=22, num_heads=16,
                    num_kv_heads=4, head_dim=128, max_seq=32768, block_size=16),
    # layers that differ in Hkv and D (the artifact's kv_shapes): every other layer multi-query
    "3b-mixed-kv": dict(vocab_size=64000, hidden_size=3072, intermediate_size=8192, num_layers=24, num_heads=24,
                        num_kv_heads=8, head_dim=128, max_seq=8192, block_size=32,
                        kv_shapes=[[8, 128] if i % 2 == 0 else [1, 256] for i in range(24)]),
    # mixtures of experts: LLaDA2.0-mini's shapes (dense first layer, sigmoid router, shared expert,
    # q/k norms) and SDAR-30B-A3B's (Qwen3-MoE: 128 experts, 8 active)
    "llada2-mini": dict(vocab_size=157184, hidden_size=2048, intermediate_size=5120, num_layers=20, num_heads=16,
                        num_kv_heads=4, head_dim=128, max_seq=16384, block_size=32, qk_norm=True, num_experts=256,
                        experts_per_token=8, expert_size=512, shared_expert_size=512, dense_layers=1, router="sigmoid"),
    "sdar-30b-a3b": dict(vocab_size=151936, hidden_size=2048, intermediate_size=6144, num_layers=48, num_heads=32,
                         num_kv_heads=4, head_dim=128, max_seq=32768, block_size=4, qk_norm=True, num_experts=128,
                         experts_per_token=8, expert_size=768),
}
FREE = [1 * GIB, 6 * GIB, 24 * GIB, 80 * GIB, 1024 * GIB]


def _artifact(tiny: Path, root: Path, name: str, dims: dict) -> Path:
    """A manifest-only folder: the tiny artifact's manifest with other model dims (the graph name
    lists follow num_layers); read with verify off, as the check binary does."""
    m = json.loads((tiny / "manifest.json").read_text())
    dims = dict(dims)
    m["model"].update({k: v for k, v in dims.items() if k != "kv_shapes"})
    layers = m["model"]["num_layers"]
    m["kv_shapes"] = dims.get("kv_shapes") or [[m["model"]["num_kv_heads"], m["model"]["head_dim"]]] * layers
    past = [f"past_key_values.{i}.{kv}" for i in range(layers) for kv in ("key", "value")]
    present = [f"present.{i}.{kv}" for i in range(layers) for kv in ("key", "value")]
    m["graphs"]["prefill"]["inputs"] = m["graphs"]["verify"]["inputs"] = ["input_ids", "position_ids",
                                                                          "attention_mask", *past, *SAMPLING_INPUTS]
    m["graphs"]["prefill"]["outputs"] = ["logits", "top_ids", "top_probs", *present]
    d = root / name
    d.mkdir()
    (d / "manifest.json").write_text(json.dumps(m))
    return d


def _cpp(build: Path, folder: Path, precision: str, free: int, limit: int, *budget) -> dict:
    r = subprocess.run([str(build / "dllm-memory-check"), str(folder), precision, str(free), str(limit),
                        *map(str, budget)], capture_output=True, text=True, check=False, timeout=30)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


@pytest.mark.parametrize("precision", ["fp32", "int8", "int4"])
def test_cap_matches_python(cpp_build, tiny_artifact, tmp_path, precision):
    tiny = Path(tiny_artifact[0])
    caps = set()
    for name, dims in MODELS.items():
        folder = _artifact(tiny, tmp_path, name, dims)
        m = json.loads((folder / "manifest.json").read_text())
        cfg = {**DLLMConfig.from_dict(m["model"]).to_dict(), "kv_shapes": m["kv_shapes"]}
        kw = dict(block_length=cfg["block_size"], max_seq=cfg["max_seq"])
        # free memory where the cap moves from W-1 to W under the (0.4, 512) budget, and a byte below
        edges = [int((estimate_bytes(cfg, precision, 1, w, **kw)["total"] + 512 * 2**20) / 0.4) + k
                 for w in (3, 6) for k in (-1, 0, 1)]
        for limit in (8, 64):
            for free in FREE + edges:
                for budget in [(), (0.4, 512)]:
                    out = _cpp(cpp_build, folder, precision, free, limit, *budget)
                    fraction, reserve = budget or (out["fraction"], out["reserve_mb"])
                    want = beam_width_cap(cfg, free, fraction=fraction, reserve_mb=reserve, precision=precision,
                                          limit=limit, **kw)
                    assert out["beam_width_cap"] == want, (name, precision, free, limit, budget)
                    caps.add(want)
            assert out["estimates"] == [estimate_bytes(cfg, precision, 1, w, **kw)["total"]
                                        for w in range(1, limit + 1)], name
    assert len(caps) > 3  # the configurations reach several different caps, not only 1 and the limit


def test_default_budget_is_this_machines_cpu_profile(cpp_build, tiny_artifact):
    """The C++ runtime's built-in fraction / reserve are those of the profile Python picks here."""
    prof, _, _ = get_profile("auto")
    if prof.backends[0] != "CPUExecutionProvider":
        pytest.skip(f"this machine's profile {prof.name} is not a CPU profile")
    out = _cpp(cpp_build, Path(tiny_artifact[0]), "fp32", GIB, 8)
    assert (out["fraction"], out["reserve_mb"]) == (prof.memory["fraction"], prof.memory["reserve_mb"])


def test_both_runtimes_cap_w_from_another_boards_meminfo(cpp_build, tiny_artifact, tmp_path, monkeypatch):
    """DLLM_DEPLOY_ROOT (docs/profiles.md): the W cap of Runtime.load and of dllm-generate comes
    from that folder's proc/meminfo MemAvailable, the same W on both."""
    from dllm_deploy import Runtime
    art = tiny_artifact[0]
    m = json.loads((art / "manifest.json").read_text())
    cfg = {**DLLMConfig.from_dict(m["model"]).to_dict(), "kv_shapes": m["kv_shapes"]}
    prof, _, _ = get_profile("auto")
    fraction, reserve = prof.memory["fraction"], prof.memory["reserve_mb"]
    need = estimate_bytes(cfg, "fp32", 1, 3, block_length=cfg["block_size"], max_seq=cfg["max_seq"])["total"]
    free = int((need + reserve * 2**20) / fraction) + 1            # W 3 fits, W 4 does not
    root = tmp_path / "board"
    (root / "proc").mkdir(parents=True)
    (root / "proc" / "cpuinfo").write_text(Path("/proc/cpuinfo").read_text())
    (root / "proc" / "meminfo").write_text(f"MemTotal: {4 * free // 1024} kB\nMemAvailable: {free // 1024 + 1} kB\n")
    monkeypatch.setenv("DLLM_DEPLOY_ROOT", str(root))
    assert Runtime.load(artifact=str(art)).max_beam_width == 3
    r = subprocess.run([str(cpp_build / "dllm-generate"), "--artifact", str(art), "--prompt", "upper: air\n",
                        "--strategy", "spd", "--beam-width", "8", "--gen-length", "32", "--json"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["beam_width_used"] == 3
    monkeypatch.delenv("DLLM_DEPLOY_ROOT")
    assert Runtime.load(artifact=str(art)).max_beam_width == 8      # this machine's memory: no cap
