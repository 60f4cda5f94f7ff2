"""Device profiles (DESIGN §4): YAML data saying which hardware a profile matches, backends in
order, precision, decode defaults, memory policy, TensorRT build settings and ONNX Runtime
session options.

    load_profiles()            every bundled profile plus the user's (DLLM_DEPLOY_PROFILES=dir or file)
    detect()                   facts of this machine: Jetson (L4T files), NVML GPU, else CPU (arch, cores, memory)
    select(profiles, facts)    the best match, with the reasons (what `profiles explain` prints)
    explain(profiles, facts)   the winner, its reasons, and every other profile's score or reason to lose
    notes(facts)               advice on the machine beyond its profile (x86 without VNNI: 7-bit int8 weights)
"""
from __future__ import annotations

import os
import platform
import re
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from ..options import OPTIONS, PROFILE_KEYS, option_error
from ..errors import OptionError, UserError, file_error, read_text

BUNDLED = Path(__file__).resolve().parent

NUM = (int, float)
_SCHEMA = {
    "name": str, "description": str, "match": dict, "device": dict, "backends": list, "precision": str,
    "decode": dict, "memory": dict, "trt": dict, "ort": dict, "priority": int,
    "tuned": dict,                     # provenance written by `bench --tune` (free-form, not interpreted)
}
_MATCH = {"kind": str, "arch": list, "gpu_name": list, "min_memory_gb": NUM, "max_memory_gb": NUM}
_DEVICE = {"memory_gb": NUM, "compute_capability": str, "shared_host_memory": bool}
_DECODE = {k: OPTIONS[k].pytype for k in PROFILE_KEYS}    # decode_options.json: the options with "profile"
_MEMORY = {"fraction": float, "reserve_mb": int}
_TRT = {"workspace_mb": int, "opt_level": int, "hardware_compatibility": str}
_ORT = {"intra_op_threads": int, "provider_options": dict}
KINDS = ("cpu", "gpu", "jetson")
PRECISIONS = ("fp32", "fp16", "int8", "int4")
HW_COMPAT = ("none", "ampere_plus", "same_compute_capability")


@dataclass
class Profile:
    name: str                          # unique name (file stem by convention)
    description: str                   # one line for `profiles list`
    match: dict                        # kind (cpu|gpu|jetson), arch list, gpu_name words, memory range (GB)
    backends: list                     # ONNX Runtime execution providers, in order of preference
    precision: str = "fp32"            # artifact variant to load
    device: dict = field(default_factory=dict)   # the hardware: memory (GB), compute capability, shared host memory
    decode: dict = field(default_factory=dict)   # defaults for the decode loop
    memory: dict = field(default_factory=dict)   # fraction of free memory usable, reserve (MB)
    trt: dict = field(default_factory=dict)      # TensorRT build: workspace (MB), builder opt level, hardware compat.
    ort: dict = field(default_factory=dict)      # session options: threads, provider options
    priority: int = 0                  # tie-break between equally specific matches
    tuned: dict = field(default_factory=dict)    # provenance of a `bench --tune` overlay (not interpreted)
    source: str = ""                   # the file it came from


def _check(d: dict, schema: dict, where: str) -> None:
    if not isinstance(d, dict):
        raise UserError(f"{where}: expected a mapping, got {type(d).__name__}")
    for k, v in d.items():
        if k not in schema:
            raise UserError(f"{where}: unknown key {k!r} (expected one of {', '.join(schema)})")
        want = schema[k]
        if want is bool:
            ok = isinstance(v, bool)
        elif want is float:
            ok = isinstance(v, (int, float)) and not isinstance(v, bool)
        else:
            ok = isinstance(v, want) and not isinstance(v, bool)
        if not ok:
            raise UserError(f"{where}: {k!r} has the wrong type ({type(v).__name__})")


def parse_profile(raw: dict, source: str) -> Profile:
    """Validate one profile mapping (unknown keys, types, a few values) into a Profile."""
    if not isinstance(raw, dict):
        raise UserError(f"{source}: a profile must be a mapping")
    _check(raw, _SCHEMA, source)
    for key in ("name", "match", "backends"):
        if key not in raw:
            raise UserError(f"{source}: missing key {key!r}")
    for key, schema in (("match", _MATCH), ("device", _DEVICE), ("decode", _DECODE), ("memory", _MEMORY),
                        ("trt", _TRT), ("ort", _ORT)):
        _check(raw.get(key, {}), schema, f"{source}: {key}")
    m, dev, mem, trt = raw["match"], raw.get("device", {}), raw.get("memory", {}), raw.get("trt", {})
    if m.get("kind") not in KINDS:
        raise UserError(f"{source}: match.kind must be cpu, gpu or jetson")
    for key, items in (("match.arch", m.get("arch")), ("match.gpu_name", m.get("gpu_name")), ("backends", raw["backends"])):
        if items is not None and not all(isinstance(x, str) and x for x in items):
            raise UserError(f"{source}: {key} must be a list of non-empty strings")
    if raw.get("precision", "fp32") not in PRECISIONS:
        raise UserError(f"{source}: precision must be one of {', '.join(PRECISIONS)}")
    if "compute_capability" in dev and not re.fullmatch(r"\d+\.\d+", dev["compute_capability"]):
        raise UserError(f"{source}: device.compute_capability must look like '8.7' (quote it in YAML)")
    if not 0 < mem.get("fraction", 0.5) <= 1:
        raise UserError(f"{source}: memory.fraction must be in (0, 1]")
    if trt.get("hardware_compatibility", "none") not in HW_COMPAT:
        raise UserError(f"{source}: trt.hardware_compatibility must be one of {', '.join(HW_COMPAT)}")
    if not 0 <= trt.get("opt_level", 3) <= 5:
        raise UserError(f"{source}: trt.opt_level must be 0..5")
    d = raw.get("decode", {})
    for key, value in d.items():
        err = option_error(key, value)
        if err:
            raise OptionError(err.code, key, f"{source}: decode.{key}: {err}")
    for section, key in (("memory", "reserve_mb"), ("ort", "intra_op_threads")):
        value = raw.get(section, {}).get(key, 0)
        if value < 0:
            raise UserError(f"{source}: {section}.{key} must be >= 0, got {value}")
    if d.get("beam_width", 1) > d.get("max_beam_width", d.get("beam_width", 1)):
        raise UserError(f"{source}: decode.beam_width is above decode.max_beam_width")
    return Profile(description=raw.get("description", ""), source=source,
                   **{k: v for k, v in raw.items() if k != "description"})


def user_profile_dir() -> Path:
    """Where user profiles (and `bench --tune` overlays) live: DLLM_DEPLOY_PROFILES when it names a
    folder, else $XDG_CONFIG_HOME/dllm-deploy/profiles (~/.config/...)."""
    env = os.environ.get("DLLM_DEPLOY_PROFILES")
    if env and not env.endswith((".yaml", ".yml")):
        return Path(env)
    return Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config") / "dllm-deploy" / "profiles"


class Profiles(dict):
    """Profiles by name, plus the user profiles that could not be read (``broken``: name ->
    one-line reason). A broken user profile is skipped with a warning so that it does not block
    a run naming another profile; naming it is an error (get_profile)."""

    def __init__(self):
        super().__init__()
        self.broken: dict[str, str] = {}

    def warn_broken(self) -> None:
        for reason in dict.fromkeys(self.broken.values()):
            warnings.warn(f"{reason} (profile skipped)", stacklevel=2)


def _read_yaml(path: Path):
    """The YAML value of one profile file; an unreadable, non-UTF-8 or invalid file is a UserError."""
    text = read_text(path)
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise UserError(f"{path}: not valid YAML ({str(e).splitlines()[0]})") from None
    except RecursionError:
        raise UserError(f"{path}: not a profile (nested too deeply)") from None


def _user_files(user: Path) -> list[Path]:
    """The user's profile files: ``user`` itself, or the *.yaml files in that folder."""
    try:
        if not user.exists():
            raise UserError(f"{user}: no such profile file or folder")
        return sorted(p for p in user.iterdir() if p.name.endswith(".yaml")) if user.is_dir() else [user]
    except OSError as e:
        raise file_error(user, e, "profile folder") from None


def load_profiles(extra: str | Path | None = None) -> Profiles:
    """Bundled profiles, then the user's (``extra``, else DLLM_DEPLOY_PROFILES, else the user
    profile folder when it exists); a user profile of the same name replaces a bundled one.
    A bundled profile that fails its checks is an error; a user's is recorded in ``broken``."""
    out = Profiles()
    for p in sorted(BUNDLED.glob("*.yaml")):
        prof = parse_profile(_read_yaml(p), str(p))
        out[prof.name] = prof
    user = extra or os.environ.get("DLLM_DEPLOY_PROFILES")
    if not user:
        folder = user_profile_dir()
        try:
            user = folder if folder.is_dir() else None
        except OSError as e:     # a parent folder the user may not enter
            raise file_error(folder, e, "profile folder") from None
    for p in _user_files(Path(user)) if user else []:
        raw = None
        try:
            raw = _read_yaml(p)
            prof = parse_profile(raw, str(p))
        except UserError as e:
            named = raw.get("name") if isinstance(raw, dict) else None     # known by its stem and its name
            out.broken.update(dict.fromkeys({p.stem, named if isinstance(named, str) else p.stem}, str(e)))
            continue
        out[prof.name] = prof      # a user's profile of the same name replaces the bundled one
        out.broken.pop(prof.name, None)
    return out


# device-tree "compatible" SoC -> CUDA compute capability of its integrated GPU
_TEGRA_CC = {"tegra234": "8.7", "tegra194": "7.2"}


ROOT_ENV = "DLLM_DEPLOY_ROOT"    # a folder standing for / when detecting (another board's facts: docs/profiles.md)


def detect() -> dict:
    """Facts of this machine. Jetson by its L4T files (GPU and CPU share the host memory; NVML is
    absent there); else NVML (nvidia-ml-py) for a discrete GPU when it loads; else the CPU.
    With DLLM_DEPLOY_ROOT set, the facts of the folder it names instead (its proc/cpuinfo,
    proc/meminfo, proc/device-tree and etc/nv_tegra_release; no NVML): another board's, to see
    which profile it gets."""
    root = os.environ.get(ROOT_ENV)
    if root:
        return root_facts(Path(root))
    facts = {"arch": platform.machine(), "cpus": os.cpu_count() or 1, "memory_gb": _mem_gb(), "kind": "cpu"}
    try:
        kernels = int8_kernels(Path("/proc/cpuinfo").read_text(errors="ignore"))
    except OSError:
        kernels = None
    if kernels:
        facts["int8_kernels"] = kernels
    if Path("/etc/nv_tegra_release").exists():
        return {**facts, **jetson_facts(Path("/"))}
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
    except Exception:  # noqa: BLE001, S110 -- ImportError, NVMLError_LibraryNotFound, no driver: a CPU machine
        pass
    return facts


def root_facts(root: Path) -> dict:
    """The facts detect() reports for the machine whose files are under ``root``: the architecture
    and core count from proc/cpuinfo (an ARM core lists "CPU implementer"; x86 "vendor_id"), the
    memory from proc/meminfo's MemTotal, and a Jetson's from its L4T files."""
    cpuinfo = root / "proc/cpuinfo"
    try:
        text = cpuinfo.read_text(errors="ignore")
    except OSError as e:
        raise UserError(f"{ROOT_ENV}={root}: no readable proc/cpuinfo there ({e.strerror})") from None
    arch = "aarch64" if "CPU implementer" in text else "x86_64" if "vendor_id" in text else "unknown"
    facts = {"arch": arch, "cpus": max(len(re.findall(r"^processor\s*:", text, re.M)), 1), "memory_gb": 0.0, "kind": "cpu"}
    kernels = int8_kernels(text)
    if kernels:
        facts["int8_kernels"] = kernels
    meminfo = root / "proc/meminfo"
    m = re.search(r"^MemTotal:\s*(\d+)\s*kB", meminfo.read_text(errors="ignore"), re.M) if meminfo.exists() else None
    if m:
        facts["memory_gb"] = int(m.group(1)) / 2**20
    if (root / "etc/nv_tegra_release").exists():
        facts.update(jetson_facts(root))
    return facts


def int8_kernels(cpuinfo: str) -> str | None:
    """Which of ONNX Runtime's int8 product kernels an x86 CPU runs, from the flags of its
    /proc/cpuinfo: "vnni" (AVX-VNNI or AVX512-VNNI: byte products summed in 32 bits) or "avx2"
    (summed in pairs into 16-bit lanes, which full-range int8 weights can saturate; the fix is
    ``export --int8-reduce-range``, docs/precision.md). None for other CPUs (Arm's kernels sum in
    32 bits) and x86 ones without AVX2."""
    m = re.search(r"^flags\s*:(.*)$", cpuinfo, re.M)
    if not m:
        return None
    flags = set(m.group(1).split())
    return "vnni" if flags & {"avx_vnni", "avx512_vnni", "avx512vnni"} else "avx2" if "avx2" in flags else None


INT8_SATURATION_NOTE = ("int8: this CPU has no VNNI, so ONNX Runtime sums int8 byte pairs in 16 bits, which "
                        "full-range weights can saturate: export int8 with --int8-reduce-range (docs/precision.md)")


def notes(facts: dict) -> list[str]:
    """What a user choosing a configuration on the machine of ``facts`` should know beyond its
    profile (`profiles explain` prints them)."""
    return [INT8_SATURATION_NOTE] if facts.get("int8_kernels") == "avx2" else []


def jetson_facts(root: Path) -> dict:
    """Jetson facts from L4T files under ``root``: the module name (device-tree model), the SoC's
    compute capability (device-tree compatible), the L4T release. memory_gb stays the host's:
    the GPU allocates from the same DRAM."""
    facts: dict = {"kind": "jetson", "shared_host_memory": True}
    model = root / "proc/device-tree/model"
    facts["gpu_name"] = model.read_text(errors="ignore").strip("\x00 \n") if model.exists() else "jetson"
    compat = root / "proc/device-tree/compatible"
    if compat.exists():
        socs = compat.read_text(errors="ignore").replace("\x00", ",")
        cc = next((c for soc, c in _TEGRA_CC.items() if soc in socs), None)
        if cc:
            facts["compute_capability"] = cc
    rel = root / "etc/nv_tegra_release"
    if rel.exists():
        m = re.search(r"R(\d+)\s*\(release\),\s*REVISION:\s*([\d.]+)", rel.read_text(errors="ignore"))
        if m:
            facts["l4t"] = f"{m.group(1)}.{m.group(2)}"
    return facts


def _mem_gb() -> float:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    except (ValueError, OSError, AttributeError):
        return 0.0


def _name_has(name: str, word: str) -> bool:
    """``word`` occurs in ``name`` not glued to other letters or digits (case-insensitive):
    'A10' matches 'NVIDIA A10' but not 'NVIDIA A100-SXM4-40GB'; 'L4' does not match 'NVIDIA L40S'."""
    return re.search(rf"(?<![0-9a-z]){re.escape(word.lower())}(?![0-9a-z])", name.lower()) is not None


def score(p: Profile, facts: dict) -> tuple[int | None, list[str]]:
    """How specifically ``p`` matches ``facts``: (score, reasons), or (None, [why not])."""
    m, reasons, sc = p.match, [], 0
    if m["kind"] != facts.get("kind"):
        return None, [f"kind {facts.get('kind')} is not {m['kind']}"]
    reasons.append(f"kind {facts['kind']}")
    if "arch" in m:
        if facts.get("arch") not in m["arch"]:
            return None, [f"arch {facts.get('arch')} not in {m['arch']}"]
        reasons.append(f"arch {facts['arch']} in {m['arch']}")
        sc += 1
    if "gpu_name" in m:
        name = str(facts.get("gpu_name", ""))
        hit = next((g for g in m["gpu_name"] if _name_has(name, g)), None)
        if hit is None:
            return None, [f"device name {name!r} has none of {m['gpu_name']}"]
        reasons.append(f"device name {name!r} contains {hit!r}")
        sc += 4
    mem = float(facts.get("memory_gb", 0))
    if "min_memory_gb" in m:
        if mem < m["min_memory_gb"]:
            return None, [f"memory {mem:.1f} GB < {m['min_memory_gb']}"]
        reasons.append(f"memory {mem:.1f} GB >= {m['min_memory_gb']}")
        sc += 1
    if "max_memory_gb" in m:
        if mem > m["max_memory_gb"]:
            return None, [f"memory {mem:.1f} GB > {m['max_memory_gb']}"]
        reasons.append(f"memory {mem:.1f} GB <= {m['max_memory_gb']}")
        sc += 1
    want_cc, got_cc = p.device.get("compute_capability"), facts.get("compute_capability")
    if want_cc and got_cc:             # checked when both are known (NVML, the Jetson device tree)
        if want_cc != got_cc:
            return None, [f"compute capability {got_cc} is not {want_cc}"]
        reasons.append(f"compute capability {got_cc}")
        sc += 1
    return sc, reasons


def explain(profiles: dict[str, Profile], facts: dict) -> dict:
    """The winner (highest score, then priority), its reasons, and every candidate's outcome."""
    rows = []
    for p in profiles.values():
        sc, why = score(p, facts)
        rows.append({"name": p.name, "score": sc, "priority": p.priority, "reasons": why})
    ok = [r for r in rows if r["score"] is not None]
    if not ok:
        raise UserError(f"no profile matches this device ({facts.get('kind')}, {facts.get('arch')}, "
                        f"{facts.get('gpu_name', 'no GPU')}); add one (docs/profiles.md)")
    ok.sort(key=lambda r: (r["score"], r["priority"]), reverse=True)
    win = ok[0]
    rest = sorted((r for r in rows if r is not win), key=lambda r: (r["score"] is None, -(r["score"] or 0), r["name"]))
    return {"profile": win["name"], "reasons": win["reasons"], "score": win["score"], "candidates": rest}


def select(profiles: dict[str, Profile], facts: dict) -> tuple[Profile, list[str]]:
    """The most specific profile whose match holds; the reasons say which facts matched."""
    e = explain(profiles, facts)
    return profiles[e["profile"]], e["reasons"]


def get_profile(name: str, profiles: dict[str, Profile] | None = None) -> tuple[Profile, list[str], dict]:
    """A profile by name, or 'auto' (detect + select). Returns (profile, reasons, facts)."""
    profiles = profiles if profiles is not None else load_profiles()
    broken = getattr(profiles, "broken", {})
    if name in broken:
        raise UserError(broken[name])
    if broken:
        profiles.warn_broken()
    if name == "auto":
        facts = detect()
        prof, reasons = select(profiles, facts)
        return prof, reasons, facts
    if name not in profiles:
        raise UserError(f"no profile named {name!r} (see `dllm-deploy profiles list`)")
    return profiles[name], [f"named explicitly: {name}"], {}
