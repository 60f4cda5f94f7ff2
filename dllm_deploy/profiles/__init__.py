"""Device profiles (DESIGN §4): YAML data saying which hardware a profile matches, backends in
order, precision, decode defaults and ONNX Runtime session options.

    load_profiles()            every bundled profile plus the user's (DLLM_DEPLOY_PROFILES=dir or file)
    detect()                   facts of this machine: NVML GPU if any, else CPU (arch, cores, memory)
    select(profiles, facts)    the best match, with the reasons (what `profiles explain` prints)
"""
from __future__ import annotations

import os
import platform
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from ..errors import UserError

BUNDLED = Path(__file__).resolve().parent

_SCHEMA = {
    "name": str, "description": str, "match": dict, "backends": list, "precision": str,
    "decode": dict, "memory": dict, "ort": dict, "priority": int,
}
_MATCH = {"kind": str, "arch": list, "gpu_name": list, "min_memory_gb": (int, float), "max_memory_gb": (int, float)}
_DECODE = {"block_length": int, "beam_width": int, "max_beam_width": int, "threshold": float, "max_seq": int, "batch": int}
_MEMORY = {"fraction": float, "reserve_mb": int}
_ORT = {"intra_op_threads": int, "provider_options": dict}


@dataclass
class Profile:
    name: str                          # unique name (file stem by convention)
    description: str                   # one line for `profiles list`
    match: dict                        # kind (cpu|gpu|jetson), arch list, gpu_name substrings, memory range (GB)
    backends: list                     # ONNX Runtime execution providers, in order of preference
    precision: str = "fp32"            # artifact variant to load
    decode: dict = field(default_factory=dict)   # defaults for the decode loop
    memory: dict = field(default_factory=dict)   # fraction of free memory usable, reserve (MB)
    ort: dict = field(default_factory=dict)      # session options: threads, provider options
    priority: int = 0                  # tie-break between equally specific matches
    source: str = ""                   # the file it came from


def _check(d: dict, schema: dict, where: str) -> None:
    for k, v in d.items():
        if k not in schema:
            raise UserError(f"{where}: unknown key {k!r} (expected one of {', '.join(schema)})")
        want = schema[k]
        if isinstance(v, bool) or not isinstance(v, want if isinstance(want, tuple) else (want,) if want is not float else (int, float)):
            raise UserError(f"{where}: {k!r} has the wrong type ({type(v).__name__})")


def parse_profile(raw: dict, source: str) -> Profile:
    if not isinstance(raw, dict):
        raise UserError(f"{source}: a profile must be a mapping")
    _check(raw, _SCHEMA, source)
    for key in ("name", "match", "backends"):
        if key not in raw:
            raise UserError(f"{source}: missing key {key!r}")
    _check(raw["match"], _MATCH, f"{source}: match")
    _check(raw.get("decode", {}), _DECODE, f"{source}: decode")
    _check(raw.get("memory", {}), _MEMORY, f"{source}: memory")
    _check(raw.get("ort", {}), _ORT, f"{source}: ort")
    if raw["match"].get("kind") not in ("cpu", "gpu", "jetson"):
        raise UserError(f"{source}: match.kind must be cpu, gpu or jetson")
    return Profile(description=raw.get("description", ""), source=source,
                   **{k: v for k, v in raw.items() if k != "description"})


def load_profiles(extra: str | Path | None = None) -> dict[str, Profile]:
    paths = sorted(BUNDLED.glob("*.yaml"))
    user = extra or os.environ.get("DLLM_DEPLOY_PROFILES")
    if user:
        u = Path(user)
        if not u.exists():
            raise UserError(f"{u}: no such profile file or folder")
        paths += sorted(u.glob("*.yaml")) if u.is_dir() else [u]
    out: dict[str, Profile] = {}
    for p in paths:
        try:
            raw = yaml.safe_load(p.read_text())
        except yaml.YAMLError as e:
            raise UserError(f"{p}: not valid YAML ({str(e).splitlines()[0]})") from None
        prof = parse_profile(raw, str(p))
        out[prof.name] = prof      # a user's profile of the same name replaces the bundled one
    return out


def detect() -> dict:
    """Facts of this machine. NVML (nvidia-ml-py) for GPUs when it loads; else the CPU."""
    facts = {"arch": platform.machine(), "cpus": os.cpu_count() or 1, "memory_gb": _mem_gb(), "kind": "cpu"}
    if Path("/etc/nv_tegra_release").exists():
        facts["kind"] = "jetson"
        model = Path("/proc/device-tree/model")
        facts["gpu_name"] = model.read_text(errors="ignore").strip("\x00 \n") if model.exists() else "jetson"
        return facts
    try:
        import pynvml  # nvidia-ml-py, imported lazily
        pynvml.nvmlInit()
        if pynvml.nvmlDeviceGetCount() > 0:
            h = pynvml.nvmlDeviceGetHandleByIndex(0)
            name = pynvml.nvmlDeviceGetName(h)
            mem = pynvml.nvmlDeviceGetMemoryInfo(h)
            cc = pynvml.nvmlDeviceGetCudaComputeCapability(h)
            facts.update(kind="gpu", gpu_name=name.decode() if isinstance(name, bytes) else name,
                         memory_gb=mem.total / 2**30, free_memory_gb=mem.free / 2**30, compute_capability=f"{cc[0]}.{cc[1]}")
    except Exception:  # ImportError, NVMLError_LibraryNotFound, no driver: this is a CPU machine
        pass
    return facts


def _mem_gb() -> float:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    except (ValueError, OSError, AttributeError):
        return 0.0


def select(profiles: dict[str, Profile], facts: dict) -> tuple[Profile, list[str]]:
    """The most specific profile whose match holds; the reasons say which facts matched."""
    best, best_key, best_reasons = None, None, []
    for p in profiles.values():
        m, reasons, score = p.match, [], 0
        if m["kind"] != facts["kind"]:
            continue
        reasons.append(f"kind {facts['kind']}")
        if "arch" in m:
            if facts.get("arch") not in m["arch"]:
                continue
            reasons.append(f"arch {facts['arch']} in {m['arch']}")
            score += 1
        if "gpu_name" in m:
            name = str(facts.get("gpu_name", "")).lower()
            hit = next((g for g in m["gpu_name"] if g.lower() in name), None)
            if hit is None:
                continue
            reasons.append(f"device name {facts.get('gpu_name')!r} contains {hit!r}")
            score += 4
        mem = facts.get("memory_gb", 0)
        if "min_memory_gb" in m:
            if mem < m["min_memory_gb"]:
                continue
            reasons.append(f"memory {mem:.1f} GB >= {m['min_memory_gb']}")
            score += 1
        if "max_memory_gb" in m:
            if mem > m["max_memory_gb"]:
                continue
            reasons.append(f"memory {mem:.1f} GB <= {m['max_memory_gb']}")
            score += 1
        key = (score, p.priority)
        if best_key is None or key > best_key:
            best, best_key, best_reasons = p, key, reasons
    if best is None:
        raise UserError(f"no profile matches this device ({facts.get('kind')}, {facts.get('arch')}); add one (docs/profiles.md)")
    return best, best_reasons


def get_profile(name: str, profiles: dict[str, Profile] | None = None) -> tuple[Profile, list[str], dict]:
    """A profile by name, or 'auto' (detect + select). Returns (profile, reasons, facts)."""
    profiles = profiles or load_profiles()
    if name == "auto":
        facts = detect()
        prof, reasons = select(profiles, facts)
        return prof, reasons, facts
    if name not in profiles:
        raise UserError(f"no profile named {name!r} (see `dllm-deploy profiles list`)")
    return profiles[name], [f"named explicitly: {name}"], {}
