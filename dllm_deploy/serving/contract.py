"""The model's tensors (Triton's generate / TensorRT-LLM naming) and the checks a request passes.

One request = one prompt (the tensors carry no batch dimension): the server batches requests
itself (scheduler.py), so a bad request fails alone and never takes a batch's other rows with it.
The prompt is ``text_input`` (text as is) or ``messages`` (a JSON list of chat messages, rendered
with the artifact's chat template: text.py); exactly one of the two. Every other optional input
falls back to the server's default (profile, then flags)."""
from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field, replace

import numpy as np

from ..options import OPTIONS
from ..errors import UserError
from ..runtime.api import ROW_KEYWORDS, row_options
from ..runtime.rows import RowOptions

# (name, numpy dtype, shape, optional); BYTES tensors are numpy object arrays of bytes
INPUTS = [
    ("text_input", bytes, (1,), True),
    ("messages", bytes, (1,), True),
    ("max_tokens", np.int32, (1,), True),
    ("temperature", np.float32, (1,), True),
    ("top_p", np.float32, (1,), True),
    ("top_k", np.int32, (1,), True),
    ("seed", np.uint64, (1,), True),
    ("stop_words", bytes, (-1,), True),
    ("stream", np.bool_, (1,), True),
    ("strategy", bytes, (1,), True),
    ("beam_width", np.int32, (1,), True),
    ("threshold", np.float32, (1,), True),
    ("timeout", np.float32, (1,), True),
    ("request_id", bytes, (1,), True),
    ("cancel", bytes, (1,), True),
]
OUTPUTS = [
    ("text_output", bytes, (1,)),
    ("token_ids", np.int32, (-1,)),
    ("forwards", np.int32, (1,)),
    ("finish_reason", bytes, (1,)),
    ("prompt_tokens", np.int32, (1,)),
]
STRATEGIES = tuple(OPTIONS["strategy"].choices)


class BadRequest(Exception):
    """A request the server refuses: its message is the whole error response (PyTriton formats an
    error with its traceback, so this exception reports none)."""

    @property
    def __traceback__(self):
        return None

    @__traceback__.setter
    def __traceback__(self, value):
        pass


@dataclass(frozen=True)
class Limits:
    """What one request may ask for: the prompt length, the token budget (the canvas a batch
    decodes, gen_length) and the beam width cap; max_queue bounds the requests waiting or decoding."""
    max_prompt_tokens: int
    max_tokens: int
    max_beam_width: int
    max_queue: int
    max_stop_words: int = 16        # stop strings a request may give (each is searched in every chunk)
    max_stop_bytes: int = 256       # UTF-8 bytes of one stop string
    timeout: float = 0.0            # seconds a request may take when it sets none (0: no deadline)


@dataclass(frozen=True)
class Request:
    prompt: str
    decode: dict          # batch options: requests with equal ones decode in one batch
    row: RowOptions       # this request's own sampling and stopping
    stream: bool
    prompt_tokens: int = 0   # the prompt's length in tokens (usage counts)
    request_id: str | None = None     # the client's name for it (``cancel`` names it)
    deadline: float | None = None     # time.monotonic() past which it is cancelled
    timeout: float | None = None      # the seconds that deadline allowed
    cancelled: threading.Event = field(default_factory=threading.Event, compare=False, repr=False)

    def expired(self) -> bool:
        return self.deadline is not None and time.monotonic() > self.deadline


MAX_REQUEST_ID = 128


def cancel_target(inputs: dict) -> str | None:
    """The request_id a ``cancel`` request names (None: not a cancel request); a cancel request
    carries nothing else."""
    if "cancel" not in inputs:
        return None
    if set(inputs) != {"cancel"}:
        raise BadRequest(f"cancel: a cancel request carries only cancel (got {', '.join(sorted(set(inputs) - {'cancel'}))})")
    target = _text(_scalar(inputs, "cancel"), "cancel")
    if not 1 <= len(target) <= MAX_REQUEST_ID:
        raise BadRequest(f"cancel: a request_id of 1..{MAX_REQUEST_ID} characters")
    return target


def _scalar(inputs: dict, name: str):
    """The one value of an optional input (None when absent)."""
    if name not in inputs:
        return None
    values = np.asarray(inputs[name]).reshape(-1)
    if values.size != 1:
        raise BadRequest(f"{name}: expected one value, got {values.size}")
    return values[0]


def _text(value, name: str) -> str:
    try:
        return bytes(value).decode("utf-8")
    except (TypeError, UnicodeDecodeError):
        raise BadRequest(f"{name}: not UTF-8 text") from None


def _prompt(inputs: dict, chat) -> tuple[str, str]:
    """(prompt text, the input it came from): ``text_input`` as is, or ``messages`` rendered by
    ``chat`` (messages -> text; None: this server renders no chat)."""
    given = [name for name in ("text_input", "messages") if name in inputs]
    if len(given) != 1:
        raise BadRequest("text_input: give a prompt (text_input) or chat messages (messages), exactly one of the two")
    name = given[0]
    text = _text(_scalar(inputs, name), name)
    if name == "text_input":
        return text, name
    if chat is None:
        raise BadRequest("messages: this server renders no chat templates; send text_input")
    try:
        messages = json.loads(text)
    except ValueError as e:
        raise BadRequest(f"messages: not JSON ({e})") from None
    try:
        return chat(messages), name
    except UserError as e:
        raise BadRequest(f"messages: {e}") from None


def parse_request(inputs: dict, tokenizer, limits: Limits, defaults: dict, chat=None,
                  strategies: tuple[str, ...] = STRATEGIES) -> Request:
    """A Request from one request's tensors, or BadRequest naming the input at fault.
    ``defaults``: the server's decode options (strategy, beam_width, gen_length..., and the row
    options every request starts from: temperature, seed, max_tokens, stop...); ``chat``: renders
    a ``messages`` input (Runtime.chat_prompt); ``strategies``: the model's (Runtime.strategies)."""
    prompt, source = _prompt(inputs, chat)
    n_prompt = len(tokenizer.encode(prompt))
    if n_prompt == 0:
        raise BadRequest(f"{source}: empty prompt")
    if n_prompt > limits.max_prompt_tokens:
        raise BadRequest(f"{source}: prompt of {n_prompt} tokens is over the server's limit of {limits.max_prompt_tokens}")
    max_tokens = _scalar(inputs, "max_tokens")
    if max_tokens is not None and not 1 <= int(max_tokens) <= limits.max_tokens:
        raise BadRequest(f"max_tokens: {int(max_tokens)} is outside 1..{limits.max_tokens} (the server's token budget)")
    strategy = _scalar(inputs, "strategy")
    strategy = defaults.get("strategy", OPTIONS["strategy"].default) if strategy is None else _text(strategy, "strategy")
    if strategy not in strategies:
        raise BadRequest(f"strategy: unknown strategy {strategy!r} (expected one of {', '.join(strategies)})")
    beam_width = _scalar(inputs, "beam_width")
    if beam_width is not None and not 1 <= int(beam_width) <= limits.max_beam_width:
        raise BadRequest(f"beam_width: {int(beam_width)} is outside 1..{limits.max_beam_width} (the server's cap)")
    threshold = _scalar(inputs, "threshold")
    if threshold is not None and not 0.0 <= float(threshold) <= 1.0:
        raise BadRequest(f"threshold: {float(threshold)} is outside [0, 1]")
    decode = {**{k: v for k, v in defaults.items() if k not in ROW_KEYWORDS}, "strategy": strategy}
    if beam_width is not None:
        decode["beam_width"] = int(beam_width)
    if threshold is not None:
        decode["threshold"] = float(threshold)
    row = _row_options(inputs, max_tokens, row_options(**defaults), limits)
    stream = _scalar(inputs, "stream")
    timeout = _scalar(inputs, "timeout")
    if timeout is not None and not 0.0 < float(timeout) <= 86400.0:
        raise BadRequest(f"timeout: {float(timeout)} is outside (0, 86400] seconds")
    timeout = float(timeout) if timeout is not None else (limits.timeout or None)
    request_id = _scalar(inputs, "request_id")
    if request_id is not None:
        request_id = _text(request_id, "request_id")
        if not 1 <= len(request_id) <= MAX_REQUEST_ID:
            raise BadRequest(f"request_id: {len(request_id)} characters; 1..{MAX_REQUEST_ID}")
    return Request(prompt=prompt, prompt_tokens=n_prompt, decode=decode, row=row,
                   stream=bool(stream) if stream is not None else False, request_id=request_id,
                   deadline=time.monotonic() + timeout if timeout else None, timeout=timeout)


def _row_options(inputs: dict, max_tokens, base: RowOptions, limits: Limits) -> RowOptions:
    """``base`` (the server's row defaults) with what this request sets."""
    temperature, top_p, top_k, seed = (_scalar(inputs, n) for n in ("temperature", "top_p", "top_k", "seed"))
    if temperature is not None and not float(temperature) >= 0.0:
        raise BadRequest(f"temperature: {float(temperature)} must be >= 0")
    if top_p is not None and not 0.0 < float(top_p) <= 1.0:
        raise BadRequest(f"top_p: {float(top_p)} is outside (0, 1]")
    if top_k is not None and int(top_k) < 0:
        raise BadRequest(f"top_k: {int(top_k)} must be >= 0")
    words = np.asarray(inputs["stop_words"] if "stop_words" in inputs else []).reshape(-1)
    if words.size > limits.max_stop_words:
        raise BadRequest(f"stop_words: {words.size} stop words, over the server's limit of {limits.max_stop_words}")
    stop = tuple(_text(s, "stop_words") for s in words)
    if any(not s for s in stop):
        raise BadRequest("stop_words: an empty stop word")
    long = next((s for s in stop if len(s.encode("utf-8")) > limits.max_stop_bytes), None)
    if long is not None:
        raise BadRequest(f"stop_words: a stop word of {len(long.encode('utf-8'))} bytes, over the server's limit of "
                         f"{limits.max_stop_bytes}")
    given = {"temperature": temperature, "top_k": top_k, "top_p": top_p, "seed": seed, "max_tokens": max_tokens,
             "stop": stop or None}
    cast = {"temperature": float, "top_p": float, "top_k": int, "seed": int, "max_tokens": int, "stop": tuple}
    return replace(base, **{k: cast[k](v) for k, v in given.items() if v is not None})


# request parameters Triton's clients and frontends set themselves (KServe, sequence batching)
TRITON_PARAMETERS = {"binary_data_output", "binary_data", "binary_data_size", "sequence_id", "sequence_start",
                     "sequence_end", "priority", "timeout", "headers"}


def check_parameters(parameters: dict | None) -> None:
    """BadRequest for a request parameter this model does not read. Triton's generate endpoint
    turns every JSON field that is not an input into a parameter, so a typo (``max_token``) lands
    here instead of being ignored."""
    unknown = sorted(k for k in (parameters or {}) if k not in TRITON_PARAMETERS and not k.startswith("triton_"))
    if unknown:
        names = ", ".join(name for name, *_ in INPUTS)
        raise BadRequest(f"{unknown[0]}: unknown field (this model's inputs: {names})")


def check_with_runtime(runtime, request: Request) -> None:
    """BadRequest for what the runtime would refuse (the checks of ``generate``), before the request
    joins a batch: a refusal inside a batch would fail its other rows too."""
    try:
        runtime.check_rows([request.row], runtime.decode_config(**request.decode))
    except UserError as e:
        raise BadRequest(str(e)) from None


def response(text: str, token_ids: list[int], forwards: int, finish_reason: str | None, prompt_tokens: int) -> dict:
    """The output tensors of one response (a whole result or one streamed chunk)."""
    return {"text_output": np.array([text.encode("utf-8")], dtype=object),
            "token_ids": np.asarray(token_ids, dtype=np.int32).reshape(-1),
            "forwards": np.array([forwards], dtype=np.int32),
            "finish_reason": np.array([(finish_reason or "").encode()], dtype=object),
            "prompt_tokens": np.array([prompt_tokens], dtype=np.int32)}
