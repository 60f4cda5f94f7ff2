"""The Python surface: ``rt = Runtime.load("tiny"); rt.generate(["..."], strategy="spd")``."""
from __future__ import annotations

from dataclasses import fields
from pathlib import Path
from typing import Iterator

from ..artifact import artifact_format
from ..options import OPTIONS, PROFILE_DEFAULT_KEYS, RUNTIME_OPTIONS, option_error, rule_error
from ..errors import OptionError, UserError
from ..models.capabilities import resolve_cache
from .backends.diffusion_gemma_ort import FORMAT as UNIFORM_FORMAT   # a uniform-diffusion artifact's manifest
from .loop import Decoder, RowResult, joins
from .rows import RowOptions
from .strategies import DecodeConfig

_FIELDS = [f.name for f in fields(DecodeConfig)]
_KEYWORDS = list(dict.fromkeys([*RUNTIME_OPTIONS, *_FIELDS]))   # declared options first: the first bad one is reported
ROW_KEYWORDS = tuple(f.name for f in fields(RowOptions) if f.name in OPTIONS)   # decode options a row may set


def decode_config(**kw) -> DecodeConfig:
    """DecodeConfig from keyword arguments (None = default), with the checks a user needs. The
    batch's options only: the per-row ones (``ROW_KEYWORDS``) are checked and left to ``row_options``,
    a declared option that is not implemented yet is checked (its default only); neither is passed on."""
    unknown = sorted(set(kw) - set(_KEYWORDS))
    if unknown:
        raise OptionError("unknown_option", unknown[0], f"unknown decode option(s): {', '.join(unknown)}")
    for name in _KEYWORDS:
        err = option_error(name, kw.get(name), OPTIONS[name].flag if name in OPTIONS else None)
        if err:
            raise err
    if kw.get("max_tokens") is not None and kw.get("gen_length") is None:
        kw = {**kw, "gen_length": kw["max_tokens"]}        # gen_length defaults to max_tokens (docs/streaming.md)
    err = rule_error({**{n: OPTIONS[n].default for n in _KEYWORDS if n in OPTIONS}, **{k: v for k, v in kw.items() if v is not None}})
    if err:
        raise err
    cfg = DecodeConfig(**{k: v for k, v in kw.items() if v is not None and k in _FIELDS})
    if cfg.candidates and not (cfg.strategy == "spd" and cfg.select == "threshold"):
        raise UserError("--candidates prunes the drafts of spd --select threshold only")
    return cfg


class Runtime:
    """A loaded model (torch) or artifact (ONNX Runtime) plus its tokenizer, ready to decode."""

    def __init__(self, backend, tokenizer, config, max_beam_width: int | None = None):
        self.backend, self.tokenizer, self.config = backend, tokenizer, config
        if self.kind == "uniform":
            from .uniform_decoder import UniformDecoder
            self.decoder = UniformDecoder(backend, tokenizer, config, backend.manifest["decoding"])
        elif self.kind == "self_spec":
            from .self_spec_decoder import SelfSpecDecoder
            self.decoder = SelfSpecDecoder(backend, tokenizer, config, max_beam_width=max_beam_width)
        else:
            self.decoder = Decoder(backend, tokenizer, config, max_beam_width=max_beam_width)
        self.profile, self.profile_reasons = None, []
        self.chat_template: str | None = None   # the model's chat template (text.py), None: it has none
        self.chat_variables: dict = {}          # bos_token / eos_token strings the template may read

    @classmethod
    def load(cls, model: str | None = "tiny", artifact: str | None = None, backend: str | None = None,
             device: str | None = None, precision: str | None = None, threads: int | None = None,
             profile: str = "auto") -> "Runtime":
        """``artifact``: ONNX Runtime with the profile's providers, threads, precision and W cap
        (``precision`` overrides the profile's when given). ``model``: the torch reference backend."""
        if artifact is not None and artifact_format(artifact) == UNIFORM_FORMAT:
            return cls._load_uniform(artifact, backend, precision, threads, profile)
        if artifact is not None:
            from ..profiles import get_profile
            from .backends.ort import FP16_ON_X86_CPU, fp16_runs_as_fp32, load_ort
            prof, reasons, facts = get_profile(profile)
            if precision is None:   # the profile's precision when the artifact has it, else fp32
                from ..artifact import read_manifest
                m = read_manifest(artifact, verify=False)
                precision = prof.precision if prof.precision in m["precisions"] else "fp32"
                from .self_spec import CALL_DEPENDENT
                if precision in CALL_DEPENDENT and m.get("capabilities", {}).get("attention") == "causal":
                    precision = "fp32"      # self-speculation is lossless only where a token's result is its own
                    reasons = [*reasons, f"precision fp32, not the profile's {prof.precision}: a self-speculative "
                               "model's verification equals ar only where activations are not scaled per call"]
            if backend == "trt":
                from .backends.trt import load_trt
                parts = load_trt(artifact, prof, precision=precision)
            else:
                parts = load_ort(artifact, precision=precision, threads=threads, providers=prof.backends,
                                 provider_options=prof.ort.get("provider_options"),
                                 threads_default=prof.ort.get("intra_op_threads") or None,
                                 max_beam_width=prof.decode.get("max_beam_width"))
            rt = cls(parts.backend, parts.tokenizer, parts.backend.config, max_beam_width=parts.max_beam_width)
            held = precision                # what the sessions hold and compute in
            if fp16_runs_as_fp32(precision, rt.backend.providers):
                import warnings
                warnings.warn(FP16_ON_X86_CPU, stacklevel=2)
                held = "fp32"
            rt._cap_by_memory(prof, facts, held)
            rt.profile, rt.profile_reasons = prof, reasons
            chat = parts.backend.manifest.get("chat")
            if isinstance(chat, dict) and isinstance(chat.get("template"), str):
                rt.chat_template = (Path(artifact) / chat["template"]).read_text(encoding="utf-8")
                rt.chat_variables = {k: chat[k] for k in ("bos_token", "eos_token") if isinstance(chat.get(k), str)}
            return rt
        if backend not in (None, "torch"):
            raise UserError(f"backend {backend!r} needs an exported artifact (--artifact DIR)")
        from ..models.loading import resolve_model_dir
        from ..models.tokenizer import load_tokenizer
        from .backends.torch import TorchBackend
        from ..text import load_chat_template, special_tokens
        be = TorchBackend.load(model or "tiny", device=device)
        folder = resolve_model_dir(model or "tiny")
        rt = cls(be, load_tokenizer(folder, be.config.eos_token_id), be.config)
        rt.chat_template, rt.chat_variables = load_chat_template(folder), special_tokens(folder)
        return rt

    def _cap_by_memory(self, prof, facts: dict, precision: str) -> None:
        """Lowers the decoder's beam-width cap to what the free memory of profile ``prof`` holds
        (profiles/memory.py), and records why the cap is what it is."""
        from ..profiles.memory import beam_width_cap, free_bytes_for
        free, _ = free_bytes_for(prof, facts, on_gpu=self.backend.providers[0] != "CPUExecutionProvider")
        mem_cap = beam_width_cap(self.memory_facts(), free, fraction=prof.memory.get("fraction", 0.5),
                                 reserve_mb=prof.memory.get("reserve_mb", 512), precision=precision,
                                 block_length=self.config.block_size, max_seq=self.config.max_seq,
                                 limit=self.decoder.max_beam_width)
        if mem_cap < self.decoder.max_beam_width:
            self.decoder.max_beam_width = mem_cap
            self.decoder.cap_reason = f"the free-memory estimate of profile {prof.name} ({free / 2**30:.1f} GiB free)"
        else:
            self.decoder.cap_reason = f"the artifact's / profile {prof.name}'s max_beam_width"

    @property
    def self_speculative(self) -> bool:
        """A causal model that drafts by diffusion (docs/self_speculation.md): its strategies are
        ar, linear-spec, tree-spec, fastdiffuser (``strategies``), decoded by self_spec_decoder.py."""
        return self.kind == "self_spec"

    @property
    def strategies(self) -> tuple[str, ...]:
        """The decode strategies this model takes."""
        return tuple(OPTIONS["strategy"].choices) if self.kind == "masked" else self.decoder.strategies

    @classmethod
    def _load_uniform(cls, artifact: str, backend: str | None, precision: str | None, threads: int | None,
                      profile: str) -> "Runtime":
        """A uniform-diffusion artifact (DiffusionGemma: docs/diffusion_gemma.md) on ONNX Runtime
        with the profile's providers and threads; its tokenizer.json, else the byte tokenizer."""
        from ..text import load_chat_template
        from ..models.diffusion_gemma import DiffusionGemmaConfig
        from ..models.tokenizer import load_tokenizer
        from ..profiles import get_profile
        from .backends.diffusion_gemma_ort import OrtDenoiser
        if backend not in (None, "ort"):
            raise UserError(f"{artifact}: a DiffusionGemma artifact runs on ONNX Runtime only (backend {backend!r})")
        if precision not in (None, "fp32"):
            raise UserError(f"{artifact}: a DiffusionGemma artifact holds fp32 only (precision {precision!r})")
        prof, reasons, _ = get_profile(profile)
        be = OrtDenoiser(artifact, providers=prof.backends, threads=threads or prof.ort.get("intra_op_threads") or None)
        cfg = DiffusionGemmaConfig(**{k: tuple(v) if isinstance(v, list) else v for k, v in be.manifest["model"].items()})
        if not (Path(artifact) / "tokenizer.json").is_file() and cfg.vocab_size < 256:
            raise UserError(f"{artifact}: no tokenizer.json, and its vocabulary ({cfg.vocab_size}) is too small for "
                            "the byte tokenizer: text cannot be encoded")
        rt = cls(be, load_tokenizer(artifact, cfg.eos_token_id), cfg)
        rt.profile, rt.profile_reasons = prof, reasons
        rt.chat_template = load_chat_template(artifact)
        return rt

    @property
    def kind(self) -> str:
        """How the model decodes: "masked" (the masked families: runtime/loop.py), "self_spec"
        (a causal model that drafts by diffusion: self_spec_decoder.py) or "uniform" (uniform-noise
        diffusion, DiffusionGemma: uniform_decoder.py)."""
        if getattr(self.backend, "kind", None) == "uniform-diffusion":
            return "uniform"
        return "self_spec" if self.backend.capabilities.attention == "causal" else "masked"

    def memory_facts(self) -> dict:
        """The model as the memory model (profiles/memory.py) reads it: the config and each layer's
        KV shape (an artifact's kv_shapes; the torch backend's module)."""
        shapes = getattr(self.backend, "kv_shapes", None)
        return {**self.config.to_dict(), **({"kv_shapes": [list(s) for s in shapes]} if shapes else {})}

    def decode_defaults(self) -> dict:
        """The profile's decode defaults that apply to this runtime (empty for the torch backend): the
        keys decode_options.json marks "profile": "default" (a `bench --tune` overlay writes them too)."""
        if self.profile is None:
            return {}
        return {k: self.profile.decode[k] for k in PROFILE_DEFAULT_KEYS if k in self.profile.decode}

    def decode_config(self, **decode) -> DecodeConfig:
        """A DecodeConfig where options left as None take the profile's defaults, then the built-in ones.
        A profile's ``cache: delayed`` (one branch per forward) gives way to the model's own cache
        when the call asks for an spd tree of more than one branch. A self-speculative model's:
        its SelfSpecOptions (self_spec_decoder.py; the profile's masked-family defaults do not apply);
        a uniform-diffusion model's: its UniformDiffusionOptions (uniform_decoder.py)."""
        if self.kind != "masked":
            return self.decoder.options(**decode)
        given = {k: v for k, v in decode.items() if v is not None}
        merged = {**self.decode_defaults(), **given}
        if "cache" not in given and merged.get("cache") == "delayed" and merged.get("strategy") == "spd" \
                and merged.get("beam_width", OPTIONS["beam_width"].default) > 1:
            del merged["cache"]
        return decode_config(**merged)

    @property
    def max_beam_width(self) -> int | None:
        """The largest W a call may run (the artifact's, the profile's and the free-memory cap)."""
        return self.decoder.max_beam_width

    def check_rows(self, rows: list[RowOptions], config=None) -> None:
        """The checks ``generate`` runs on per-row options (sampling within the graphs' pool; what
        ``config``'s strategy allows), alone: a server refuses a request with them before it joins a batch."""
        if self.kind == "masked":
            self.decoder.check_sampling(rows)
        else:
            self.decoder.check_sampling(rows, config)

    def _call(self, prompts: str | list[str], rows, decode: dict,
              config: DecodeConfig | None = None) -> tuple[list[str], DecodeConfig, list[RowOptions]]:
        """The prompts as a list, the call's DecodeConfig and one RowOptions per prompt (``rows``, or
        the decode keywords' for every row). Given ``rows`` and no gen_length, the canvas fits the
        largest row budget when every row has one. ``config``: a DecodeConfig resolved already
        (``decode_config``), instead of decode keywords."""
        if isinstance(prompts, str):
            prompts = [prompts]
        if config is not None:
            if decode:
                raise UserError(f"give decode options as keywords or as config=, not both ({', '.join(sorted(decode))})")
            return list(prompts), config, rows if rows is not None else [RowOptions()] * len(prompts)
        if rows and decode.get("gen_length") is None and all(r.max_tokens for r in rows):
            decode = {**decode, "gen_length": max(r.max_tokens for r in rows)}
        dcfg = self.decode_config(**decode)
        return list(prompts), dcfg, rows if rows is not None else [row_options(**decode)] * len(prompts)

    def generate(self, prompts: str | list[str], rows: list[RowOptions] | None = None, on_chunk=None,
                 config: DecodeConfig | None = None, trace=None, **decode) -> list[RowResult]:
        """One RowResult per prompt: the stream collected. ``rows``: one RowOptions per prompt (a
        server's per-request sampling and stopping), replacing the per-row values of the decode
        keywords; ``on_chunk``: called with every chunk as it comes (docs/streaming.md);
        ``config``: a resolved DecodeConfig instead of decode keywords; ``trace``: called with
        each decision record and its margin (runtime/trace.py; masked-diffusion models)."""
        if trace is None:
            return self.decoder.generate(*self._call(prompts, rows, decode, config), on_chunk=on_chunk)
        if self.kind != "masked":
            raise UserError(f"a decision trace is for masked-diffusion models, not a {self.kind} one")
        return self.decoder.generate(*self._call(prompts, rows, decode, config), on_chunk=on_chunk, trace=trace)

    def self_spec(self, prompts: str | list[str], strategy: str = "tree-spec", **options) -> list[dict]:
        """A self-speculative model's decode (runtime/self_spec.py; docs/self_speculation.md): one
        dict per prompt (SelfSpecResult.rows: text, token_ids, tokens, finish_reason, rounds, tokens_per_round) plus the
        batch's forwards. ``options``: SelfSpecOptions' fields (beam_width, block_size,
        max_new_tokens, temperature, seed, threshold, draft_ahead)."""
        from .self_spec import SelfSpecOptions, generate
        if self.backend.capabilities.attention != "causal":
            raise UserError(f"a {self.config.layout} model does not decode self-speculatively")
        unknown = sorted(set(options) - {"beam_width", "block_size", "max_new_tokens", "temperature", "seed", "threshold",
                                         "draft_ahead"})
        if unknown:
            raise UserError(f"unknown self-speculative option(s): {', '.join(unknown)}")
        prompts = [prompts] if isinstance(prompts, str) else list(prompts)
        c = self.config
        res = generate(self.backend, [self.tokenizer.encode(p) for p in prompts], SelfSpecOptions(strategy=strategy, **options),
                       c.mask_token_id, c.eos_token_id, c.block_size, max_seq=c.max_seq)
        return [{**row, "forwards": res.forwards} for row in res.rows(self.tokenizer.decode)]

    def chat_prompt(self, messages: list[dict], add_generation_prompt: bool = True) -> str:
        """The prompt text of chat ``messages`` ([{"role": "user", "content": "..."}]) under the
        model's chat template (text.py: rendered as transformers renders it)."""
        from ..text import render
        return render(self.chat_template, messages, add_generation_prompt, **self.chat_variables)

    def chat(self, messages: list[dict], rows: list[RowOptions] | None = None, **decode) -> RowResult:
        """generate() of the rendered ``messages``: one RowResult."""
        return self.generate([self.chat_prompt(messages)], rows, **decode)[0]

    def stream(self, prompts: str | list[str], rows: list[RowOptions] | None = None, join=None, cancel=None,
               **decode) -> Iterator[dict]:
        """The chunks of docs/streaming.md as text becomes final (a str prompt: index 0). Close the
        generator (break, .close()) to cancel; the runtime stays usable. ``join``: continuous
        batching, a callable the loop asks at every block boundary for [(prompt, RowOptions)] that
        join the running batch (their chunks' index numbers them after the rows so far; only where
        ``joins_batches(**decode)``, else never called). ``cancel``: a callable asked after every
        forward for the rows (chunk indexes) to end now, each with finish_reason "cancelled"."""
        return self.decoder.stream(*self._call(prompts, rows, decode), join=join, cancel=cancel)

    def files_changed(self) -> str | None:
        """Why the artifact this runtime serves from changed on disk since load (a file truncated
        or overwritten in place), or None; backends that hold no files never change."""
        loaded = getattr(self.backend, "loaded", None)
        return loaded.changed() if loaded is not None else None

    def joins_batches(self, **decode) -> bool:
        """Whether requests can join a running batch under these decode options (an exact cache)."""
        if self.kind != "masked":          # rows join at round / canvas boundaries (ONNX Runtime, torch)
            self.decode_config(**decode)
            return self.kind == "uniform" or bool(getattr(self.backend, "joins_batches", False))
        cfg, caps = self.decode_config(**decode), self.backend.capabilities
        return joins(self.backend, caps, resolve_cache(cfg.cache, caps, cfg.beam_width if cfg.strategy == "spd" else 1))


def row_options(**decode) -> RowOptions:
    """The RowOptions the decode keywords give every row (None = default); checked by decode_config.
    A single stop string stands for a list of one."""
    kw = {k: decode[k] for k in ROW_KEYWORDS if decode.get(k) is not None}
    if "stop" in kw:
        kw["stop"] = (kw["stop"],) if isinstance(kw["stop"], str) else tuple(kw["stop"])
    return RowOptions(**kw)
