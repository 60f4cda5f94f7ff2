"""An OpenAI-compatible HTTP frontend over a running ``dllm-deploy serve`` (docs/serving.md).

    GET  /v1/models               the one served model
    POST /v1/completions          prompt -> text (streamed as server-sent events with ``stream``)
    POST /v1/chat/completions     messages -> text (the artifact's chat template renders them)
    GET  /health                  200 once Triton's models answer, else 503

Stateless, as Triton's own OpenAI frontend: each request becomes one request to model
``dllm_stream`` over gRPC streaming (the server validates, renders chat, batches and decodes), so
several frontends can stand behind a load balancer. The request body is checked against the
OpenAI schema before anything is sent (unknown fields and wrong types answer 400 naming the
field); the server's refusals come back as OpenAI error objects with the status a client expects
(400 bad parameter, 404 unknown model, 429 server busy, 503 shutting down or unreachable).
dLLM knobs ride as extra body fields: ``strategy``, ``beam_width``, ``threshold``, ``top_k``.
"""
from __future__ import annotations

import asyncio
import json
import re
import time
import uuid
from typing import Literal, Union

import numpy as np
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field

from .contract import INPUTS

STREAM_MODEL = "dllm_stream"
INT32 = 2**31 - 1
FINISH = {"eos": "stop", "stop": "stop", "length": "length"}     # the runtime's reasons -> OpenAI's
# the server's input names -> the request field a client wrote
FIELD = {"text_input": "prompt", "stop_words": "stop"}


class APIError(Exception):
    """An OpenAI error response: {"error": {"message", "type", "param", "code"}} with ``status``."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code

    @property
    def type(self) -> str:
        return {400: "invalid_request_error", 404: "invalid_request_error", 429: "rate_limit_error",
                503: "service_unavailable", 504: "timeout"}.get(self.status, "server_error")

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


# --- request bodies (the OpenAI fields this server honours; anything else is refused) ---

class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class StreamOptions(_Body):
    include_usage: bool = False


class _Sampling(_Body):
    model: str
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    n: int | None = None
    stop: Union[str, list[str], None] = None
    seed: int | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None                    # the caller's tag: accepted, not used
    # accepted at their "off" values only (the server has no penalties, logprobs or bias)
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logprobs: Union[bool, int, None] = None
    logit_bias: dict | None = None
    # dLLM decoding (extra body fields)
    strategy: str | None = None
    beam_width: int | None = None
    threshold: float | None = None
    top_k: int | None = None
    timeout: float | None = None               # seconds: the server cancels the request after them


class CompletionBody(_Sampling):
    prompt: Union[str, list[str]]
    echo: bool = False
    suffix: str | None = None
    best_of: int | None = None


class TextPart(_Body):
    type: Literal["text"]
    text: str


class Message(_Body):
    role: str
    content: Union[str, list[TextPart]]
    name: str | None = None


class ChatBody(_Sampling):
    messages: list[Message] = Field(min_length=1)
    max_completion_tokens: int | None = None
    top_logprobs: int | None = None


def _unsupported(body: _Sampling) -> None:
    """400 for OpenAI features this server does not have, asked for with a non-default value."""
    off = {"presence_penalty": (None, 0, 0.0), "frequency_penalty": (None, 0, 0.0), "logprobs": (None, False),
           "logit_bias": (None, {}), "echo": (False,), "suffix": (None,), "best_of": (None, 1),
           "top_logprobs": (None, 0)}
    for name, allowed in off.items():
        if name in type(body).model_fields and getattr(body, name) not in allowed:
            raise APIError(400, f"{name}: not supported by this server", param=name)
    if body.n not in (None, 1):
        raise APIError(400, f"n: {body.n} choices asked; this server returns one (n=1)", param="n")
    if body.stream_options is not None and not body.stream:
        raise APIError(400, "stream_options: only with stream true", param="stream_options")


def _int(value, name: str, low: int, high: int):
    if value is not None and not low <= value <= high:
        raise APIError(400, f"{name}: {value} is outside {low}..{high}", param=name)
    return value


def triton_fields(body: _Sampling) -> dict:
    """The dllm_stream inputs of an OpenAI request (the server checks them against its limits)."""
    _unsupported(body)
    max_tokens = body.max_tokens
    if isinstance(body, ChatBody) and body.max_completion_tokens is not None:
        if max_tokens is not None and max_tokens != body.max_completion_tokens:
            raise APIError(400, "max_completion_tokens: differs from max_tokens; give one", param="max_completion_tokens")
        max_tokens = body.max_completion_tokens
    fields = {"max_tokens": _int(max_tokens, "max_tokens", 1, INT32),
              "temperature": body.temperature, "top_p": body.top_p,
              "top_k": _int(body.top_k, "top_k", 0, INT32),
              "seed": _int(body.seed, "seed", 0, 2**64 - 1),
              "strategy": body.strategy, "beam_width": _int(body.beam_width, "beam_width", 1, INT32),
              "threshold": body.threshold, "stream": body.stream, "timeout": body.timeout}
    if body.stop:           # None, "" and [] all mean no stop string
        fields["stop_words"] = [body.stop] if isinstance(body.stop, str) else body.stop
    if isinstance(body, CompletionBody):
        prompts = [body.prompt] if isinstance(body.prompt, str) else body.prompt
        if len(prompts) != 1:
            raise APIError(400, f"prompt: {len(prompts)} prompts in one request; send one", param="prompt")
        fields["text_input"] = prompts[0]
    else:
        messages = []
        for m in body.messages:
            content = m.content if isinstance(m.content, str) else "".join(p.text for p in m.content)
            messages.append({"role": m.role, "content": content, **({"name": m.name} if m.name else {})})
        fields["messages"] = json.dumps(messages, ensure_ascii=False)
    return {k: v for k, v in fields.items() if v is not None}


_DTYPES = {name: (dtype, shape) for name, dtype, shape, _ in INPUTS}
_TRITON_TYPES = {np.int32: "INT32", np.float32: "FP32", np.uint64: "UINT64", np.bool_: "BOOL", bytes: "BYTES"}


def infer_inputs(fields: dict) -> list:
    """tritonclient InferInputs of ``fields`` (dtypes and shapes from contract.INPUTS)."""
    from tritonclient.grpc import InferInput
    out = []
    for name, value in fields.items():
        dtype, _ = _DTYPES[name]
        values = value if isinstance(value, list) else [value]
        if dtype is bytes:
            array = np.array([str(v).encode("utf-8") for v in values], dtype=object)
        else:
            array = np.array(values, dtype=dtype)
        x = InferInput(name, list(array.shape), _TRITON_TYPES[dtype])
        x.set_data_from_numpy(array)
        out.append(x)
    return out


def server_error(message: str, field: str) -> APIError:
    """The APIError of a server refusal (contract.BadRequest's text, after PyTriton's class prefix);
    ``field``: what the prompt field is called in this request (prompt or messages)."""
    message = re.sub(r"^[\w.]*BadRequest: ", "", message.strip())
    if "server busy" in message:
        return APIError(429, message, code="server_busy")
    if "shutting down" in message or "stopped before this answer" in message:
        return APIError(503, message, code="shutting_down")
    if message.startswith("timeout: the request's deadline"):
        return APIError(504, message, param="timeout", code="timeout")
    if message.startswith("decode failed"):
        return APIError(500, message)
    name, sep, rest = message.partition(": ")
    if sep and name in _DTYPES:
        param = field if name in ("text_input", "messages") else FIELD.get(name, name)
        return APIError(400, f"{param}: {rest}", param=param)
    return APIError(400, message)


class Frontend:
    """The FastAPI app of one served model over a Triton gRPC endpoint (``host:port``)."""

    def __init__(self, triton_url: str, model_name: str):
        self.triton_url, self.model_name, self.created = triton_url, model_name, int(time.time())
        self.draining = False          # set when the server drains: /health 503, new requests 503
        self._client = None
        self._tasks: set = set()       # cancel requests in flight
        self.app = self._build()

    def client(self):
        """The gRPC client (made on first use: it belongs to the serving event loop)."""
        if self._client is None:
            from tritonclient.grpc.aio import InferenceServerClient
            self._client = InferenceServerClient(self.triton_url)
        return self._client

    async def close(self) -> None:
        if self._client is not None:
            await self._client.close()
            self._client = None

    def _build(self) -> FastAPI:
        app = FastAPI(title="dllm-deploy OpenAI-compatible API", docs_url=None, redoc_url=None, openapi_url=None)

        @app.exception_handler(APIError)
        async def api_error(request: Request, e: APIError):
            return JSONResponse(e.body(), status_code=e.status)

        @app.exception_handler(RequestValidationError)
        async def invalid(request: Request, e: RequestValidationError):
            err = e.errors()[0]
            loc = [str(x) for x in err.get("loc", ()) if x != "body"]
            # a union's alternatives add their type name to the path: keep the field's own path
            loc = [x for x in loc if not re.fullmatch(r"str|int|float|bool|list\[.*\]|function-.*|.*\[.*\]", x)]
            param = ".".join(loc) or None
            if err.get("type") == "json_invalid":
                param, message = None, f"the body is not JSON ({err.get('ctx', {}).get('error', 'invalid')})"
            elif err.get("type") == "extra_forbidden":
                message = f"{param}: unknown field"
            elif param is None:
                message = "the body must be a JSON object"
            else:
                message = f"{param}: {err.get('msg', 'invalid')}"
            return JSONResponse(APIError(400, message, param=param).body(), status_code=400)

        @app.get("/health")
        async def health():
            if self.draining:
                return JSONResponse({"ready": False, "draining": True}, status_code=503)
            try:
                ready = await self.client().is_model_ready(STREAM_MODEL)
            except Exception:
                ready = False
            return JSONResponse({"ready": bool(ready)}, status_code=200 if ready else 503)

        @app.get("/v1/models")
        async def models():
            return {"object": "list", "data": [self._model_card()]}

        @app.get("/v1/models/{name:path}")
        async def model(name: str):
            self._check_model(name)
            return self._model_card()

        @app.post("/v1/completions")
        async def completions(body: CompletionBody, request: Request):
            return await self._answer(body, "prompt", request)

        @app.post("/v1/chat/completions")
        async def chat(body: ChatBody, request: Request):
            return await self._answer(body, "messages", request)

        return app

    def _model_card(self) -> dict:
        return {"id": self.model_name, "object": "model", "created": self.created, "owned_by": "dllm-deploy"}

    def _check_model(self, name: str) -> None:
        if name != self.model_name:
            raise APIError(404, f"model {name!r} does not exist; this server serves {self.model_name!r}",
                           param="model", code="model_not_found")

    def _cancel_later(self, request_id: str) -> None:
        """Tell the server the request's client went away (a ``cancel`` request, contract.py), from
        a task of its own: the request's own task is being cancelled."""
        async def send():
            answered = asyncio.Event()

            async def one():
                yield {"model_name": STREAM_MODEL, "inputs": infer_inputs({"cancel": request_id})}
                await answered.wait()
            try:
                call = self.client().stream_infer(one())
                async for _ in call:
                    break
                answered.set()
                call.cancel()
            except Exception:             # the server is gone: nothing left to cancel
                answered.set()
        task = asyncio.get_running_loop().create_task(send())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _responses(self, fields: dict, field: str):
        """The server's responses to one request, as dicts; the first is awaited before this
        returns (a refusal raises APIError here, before any HTTP response starts). Closed or
        cancelled before its last response (the client went away), it cancels the request."""
        from tritonclient.utils import InferenceServerException
        done = asyncio.Event()
        finished = False

        async def requests():
            yield {"model_name": STREAM_MODEL, "inputs": infer_inputs(fields)}
            await done.wait()              # the stream stays open until the answer is complete

        try:
            call = self.client().stream_infer(requests())
        except InferenceServerException as e:
            raise APIError(503, f"the inference server is unreachable: {e.message()}") from None
        it = call.__aiter__()

        async def next_response():
            try:
                result, error = await it.__anext__()
            except StopAsyncIteration:
                raise APIError(500, "the inference server ended the answer early") from None
            except Exception as e:       # grpc errors: the server is gone or unreachable
                raise APIError(503, f"the inference server is unreachable ({type(e).__name__})") from None
            if error is not None:
                raise server_error(error.message(), field)
            return {"text": result.as_numpy("text_output")[0].decode("utf-8"),
                    "token_ids": result.as_numpy("token_ids").reshape(-1).tolist(),
                    "forwards": int(result.as_numpy("forwards").reshape(-1)[0]),
                    "finish_reason": result.as_numpy("finish_reason")[0].decode() or None,
                    "prompt_tokens": int(result.as_numpy("prompt_tokens").reshape(-1)[0])}

        try:
            first = await next_response()
        except BaseException as e:
            done.set()
            call.cancel()
            if not isinstance(e, APIError):           # cancelled while waiting: the request is in flight
                self._cancel_later(fields["request_id"])
            raise

        async def rest():
            nonlocal finished
            try:
                item = first
                yield item
                while item["finish_reason"] is None:
                    item = await next_response()
                    yield item
                finished = True
            except APIError:
                finished = True                       # the server ended it
                raise
            finally:
                done.set()
                call.cancel()
                if not finished:
                    self._cancel_later(fields["request_id"])
        return rest()

    @staticmethod
    async def _watching(work, http_request: Request):
        """``work`` (a coroutine), cancelled if the client disconnects first (checked every 0.25 s)."""
        task = asyncio.ensure_future(work)
        while not task.done():
            await asyncio.wait({task}, timeout=0.25)
            if not task.done() and await http_request.is_disconnected():
                task.cancel()
                try:
                    await task
                except (asyncio.CancelledError, Exception):
                    pass
                raise APIError(499, "the client went away")
        return task.result()

    async def _answer(self, body: _Sampling, field: str, http_request: Request):
        if self.draining:
            raise APIError(503, "the server is shutting down", code="shutting_down")
        self._check_model(body.model)
        fields = triton_fields(body)
        chat = field == "messages"
        ident = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
        fields["request_id"] = ident
        responses = await self._watching(self._responses(fields, field), http_request)
        head = {"id": ident, "object": "chat.completion" if chat else "text_completion", "created": int(time.time()),
                "model": self.model_name}
        if not body.stream:
            async def gather():
                return [item async for item in responses]
            items = await self._watching(gather(), http_request)
            text, ids, last = [], 0, None
            for item in items:
                text.append(item["text"])
                ids += len(item["token_ids"])
                last = item
            choice = {"index": 0, "logprobs": None, "finish_reason": FINISH.get(last["finish_reason"], "stop")}
            if chat:
                choice["message"] = {"role": "assistant", "content": "".join(text)}
            else:
                choice["text"] = "".join(text)
            return {**head, "choices": [choice], "usage": _usage(last["prompt_tokens"], ids, last["forwards"])}
        usage = body.stream_options is not None and body.stream_options.include_usage
        return StreamingResponse(self._events(responses, head, chat, usage), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache"})

    async def _events(self, responses, head: dict, chat: bool, usage: bool):
        """Server-sent events: one chunk per server response (a chat stream opens with the role),
        then the usage chunk when asked for, then ``[DONE]``; a failure mid-answer is an error event."""
        head = {**head, "object": "chat.completion.chunk" if chat else "text_completion"}
        extra = {"usage": None} if usage else {}

        def event(obj) -> str:
            return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"
        if chat:
            yield event({**head, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                                              "logprobs": None, "finish_reason": None}], **extra})
        ids, last = 0, None
        try:
            async for item in responses:
                ids += len(item["token_ids"])
                last = item
                finish = FINISH.get(item["finish_reason"], "stop") if item["finish_reason"] else None
                if not item["text"] and finish is None:
                    continue
                if chat:
                    delta = {"content": item["text"]} if item["text"] else {}
                    choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
                else:
                    choice = {"index": 0, "text": item["text"], "logprobs": None, "finish_reason": finish}
                yield event({**head, "choices": [choice], **extra})
        except APIError as e:
            yield event(e.body())
            yield "data: [DONE]\n\n"
            return
        if usage:
            yield event({**head, "choices": [], "usage": _usage(last["prompt_tokens"], ids, last["forwards"])})
        yield "data: [DONE]\n\n"


def _usage(prompt_tokens: int, completion_tokens: int, forwards: int) -> dict:
    """OpenAI's usage counts, plus the model forwards the answer took (a dLLM's cost: tokens per
    forward is completion_tokens / forwards)."""
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens, "forwards": forwards}


class Server:
    """uvicorn serving a Frontend in a thread of this process (serve --openai-port) or in the main
    thread (dllm-deploy openai)."""

    def __init__(self, frontend: Frontend, host: str, port: int):
        import uvicorn
        self.frontend = frontend
        config = uvicorn.Config(frontend.app, host=host, port=port, log_level="warning", access_log=False,
                                lifespan="off", timeout_graceful_shutdown=5)
        self.server = uvicorn.Server(config)
        self._thread = None

    def start(self, timeout: float = 30.0) -> None:
        """Serve from a thread; return once it listens (RuntimeError if it cannot)."""
        import threading
        self._thread = threading.Thread(target=self.server.run, name="dllm-openai", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the OpenAI frontend did not start")
            time.sleep(0.05)

    def stop(self) -> None:
        self.server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=10)

    def run(self) -> None:
        """Serve in this thread until SIGINT / SIGTERM."""
        self.server.run()
