"""``dllm-deploy serve``: Triton Inference Server (through PyTriton) over one Runtime.

Two model names share one scheduler (docs/serving.md):
- ``dllm``: plain (one response per request): KServe v2 ``infer`` over HTTP and gRPC and
  ``/v2/models/dllm/generate``. Triton refuses ``infer`` on a decoupled model, so the plain
  model cannot be the streaming one. One request per call (no batch dimension): ``instances``
  copies take requests concurrently and the scheduler batches them.
- ``dllm_stream``: decoupled: ``/generate_stream`` (server-sent events, one per chunk) and gRPC
  streaming; with ``stream`` false it answers once, so ``/generate`` works on it too. Its
  callable is asynchronous: one instance holds any number of requests.
"""
from __future__ import annotations

import asyncio
import errno
import logging
import os
import queue
import re
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
from pathlib import Path

from ..errors import UserError
from .contract import (INPUTS, OUTPUTS, BadRequest, Limits, cancel_target, check_parameters, check_with_runtime,
                       parse_request, response)
from .reaper import start_time
from .scheduler import Scheduler

PLAIN, STREAM = "dllm", "dllm_stream"


def check_ports(host: str, ports: dict) -> None:
    """UserError, before anything starts, for a port out of range, port 0 (tritonserver would pick
    one nobody is told), two flags on one port, a host that does not resolve, or a busy port
    (PyTriton would otherwise talk to whatever listens there)."""
    for flag, port in ports.items():
        if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
            raise UserError(f"{flag} {port}: a port is a number in 1..65535")
    seen: dict[int, str] = {}
    for flag, port in ports.items():
        if port in seen:
            raise UserError(f"{flag} {port}: {seen[port]} uses that port already; each needs its own")
        seen[port] = flag
    try:
        family, _, _, _, addr = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)[0]
    except (socket.gaierror, UnicodeError) as e:
        raise UserError(f"--host {host}: not an address of this machine ({getattr(e, 'strerror', None) or e})") from None
    for flag, port in ports.items():
        with socket.socket(family, socket.SOCK_STREAM) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind((addr[0], port))
            except OSError as e:
                if e.errno == errno.EADDRNOTAVAIL:
                    raise UserError(f"--host {host}: not an address of this machine ({e.strerror})") from None
                raise UserError(f"{flag} {port}: {host}:{port} is busy ({e.strerror}); pick a free port") from None


def check_environment() -> None:
    """The bundled Python backend stub (pybind11 against numpy 1) crashes on BYTES tensors under
    numpy 2; nvidia-pytriton requires numpy<2 for that reason."""
    import numpy
    try:
        import pytriton  # noqa: F401
    except ImportError:
        raise UserError("serving needs nvidia-pytriton: pip install 'dllm-deploy[serve]'") from None
    if int(numpy.__version__.split(".")[0]) >= 2:
        raise UserError(f"serving needs numpy<2 (nvidia-pytriton's Python backend stub; this environment has "
                        f"numpy {numpy.__version__}): pip install 'numpy<2'")


def _with_libdir(env: dict) -> None:
    """The stub links libpython: on a Python built outside the system (pyenv) its LIBDIR must be on
    LD_LIBRARY_PATH for tritonserver's children (this process's environment passes to them)."""
    libdir = sysconfig.get_config_var("LIBDIR")
    parts = [p for p in env.get("LD_LIBRARY_PATH", "").split(":") if p]
    if libdir and libdir not in parts:
        env["LD_LIBRARY_PATH"] = ":".join([libdir, *parts])


def _descendants(pid: int) -> list[int]:
    """Every live process below ``pid`` (from /proc), children first."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    out, todo = [], list(children.get(pid, []))
    while todo:
        p = todo.pop(0)
        out.append(p)
        todo.extend(children.get(p, []))
    return out


def _kill(pids: list[int]) -> None:
    for p in pids:
        try:
            os.kill(p, signal.SIGKILL)
        except ProcessLookupError:
            pass


class _RefusalsInOneLine:
    """A logging filter for PyTriton's proxy, which logs every exception of a callable with its
    traceback (formatted into the message, inside its ``except``): a refused request (BadRequest)
    becomes one line; real failures keep theirs."""

    def filter(self, record) -> bool:
        exc = record.exc_info[1] if record.exc_info else sys.exc_info()[1]
        if isinstance(exc, BadRequest):
            record.msg, record.args, record.exc_info, record.exc_text = f"request refused: {exc}", (), None, None
        return True


class Handlers:
    """The two models' inference callables over one scheduler."""

    def __init__(self, runtime, scheduler: Scheduler, limits: Limits, defaults: dict):
        self.runtime, self.scheduler, self.limits, self.defaults = runtime, scheduler, limits, defaults

    def _parse(self, inputs: dict):
        check_parameters(getattr(inputs, "parameters", None))
        request = parse_request(inputs, self.runtime.tokenizer, self.limits, self.defaults, chat=self.runtime.chat_prompt,
                                strategies=self.runtime.strategies)
        check_with_runtime(self.runtime, request)
        return request

    def _cancel(self, inputs) -> dict | None:
        """The response to a ``cancel`` request (None: not one): the named request ends at its
        next forward (contract.cancel_target)."""
        target = cancel_target(inputs)
        if target is None:
            return None
        check_parameters(getattr(inputs, "parameters", None))
        if not self.scheduler.cancel(target):
            raise BadRequest(f"cancel: no request {target!r} in flight (it may have finished)")
        return response("", [], 0, "cancelled", 0)

    def plain(self, requests: list) -> list:
        """One whole response per request (``stream`` true is refused: use dllm_stream)."""
        out = []
        for inputs in requests:
            if (done := self._cancel(inputs)) is not None:
                out.append(done)
                continue
            if not self.scheduler.admit():
                raise BadRequest("the server is shutting down")
            request = self._parse(inputs)
            if request.stream:
                raise BadRequest(f"stream: model {PLAIN} answers once; stream from model {STREAM}")
            box: queue.Queue = queue.Queue()
            self.scheduler.submit(request, box.put, admitted=True)
            out.append(collect(iter(box.get, None), request.prompt_tokens))
        return out

    async def stream(self, requests: list):
        """A response per chunk when ``stream`` is true, else one whole response."""
        loop = asyncio.get_running_loop()
        for inputs in requests:
            if (done := self._cancel(inputs)) is not None:
                yield [done]
                continue
            request = self._parse(inputs)
            box: asyncio.Queue = asyncio.Queue()
            self.scheduler.submit(request, lambda item, box=box: loop.call_soon_threadsafe(box.put_nowait, item))
            chunks = []
            while True:
                chunk = await box.get()
                if isinstance(chunk, Exception):
                    raise chunk
                if request.stream:
                    yield [response(chunk["delta"], chunk["token_ids"], chunk["forwards"], chunk["finish_reason"],
                                    request.prompt_tokens)]
                else:
                    chunks.append(chunk)
                if chunk["finish_reason"] is not None:
                    break
            if not request.stream:
                yield [collect(iter(chunks), request.prompt_tokens)]


def collect(chunks, prompt_tokens: int) -> dict:
    """One whole response from a row's chunks (concatenated deltas and ids, the last counts)."""
    text, ids = [], []
    for chunk in chunks:
        if isinstance(chunk, Exception):
            raise chunk
        text.append(chunk["delta"])
        ids.extend(chunk["token_ids"])
        if chunk["finish_reason"] is not None:
            return response("".join(text), ids, chunk["forwards"], chunk["finish_reason"], prompt_tokens)
    raise BadRequest("the decode ended without a result")


def _tensors():
    """PyTriton's tensor specs of contract.py's inputs (optional ones marked) and outputs."""
    import numpy as np
    from pytriton.model_config import Tensor

    def dtype(d):
        return np.bytes_ if d is bytes else d
    return ([Tensor(name=n, dtype=dtype(d), shape=shape, optional=opt) for n, d, shape, opt in INPUTS],
            [Tensor(name=n, dtype=dtype(d), shape=shape) for n, d, shape in OUTPUTS])


STARTS = 6          # tries at starting tritonserver, a growing pause apart: a start can fail under load
                    # (PyTriton's instance handshake, below), not on a port taken (exit_reason)


_MODEL_COPY = re.compile(r"(/tmp/folder[A-Za-z0-9]{6})/\d+/model\.py")


def _model_copies(pids: list[int]) -> list[str]:
    """The folders tritonserver copies a model's repository into (``/tmp/folderXXXXXX``, named
    on its Python backend stubs' command lines): a killed tritonserver leaves them behind."""
    out = set()
    for p in pids:
        try:
            argv = Path(f"/proc/{p}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if len(argv) > 1 and argv[0].endswith(b"triton_python_backend_stub"):
            if m := _MODEL_COPY.fullmatch(argv[1].decode(errors="replace")):
                out.add(m.group(1))
    return sorted(out)


class Reaper:
    """serve's side of reaper.py: starts the watchdog and keeps it told of this process's tree, so
    that tritonserver, its stubs and the scratch folder go when serve goes, SIGKILL included."""

    def __init__(self, scratch: Path):
        from . import reaper
        self.proc = subprocess.Popen([sys.executable, "-I", reaper.__file__, str(scratch)], stdin=subprocess.PIPE,
                                     text=True, start_new_session=True)
        self._sent, self._stop = None, threading.Event()
        self._thread = threading.Thread(target=self._watch, name="dllm-reaper", daemon=True)
        self._thread.start()

    def tree(self) -> list[int]:
        """This process's descendants but the watchdog."""
        return [p for p in _descendants(os.getpid()) if p != self.proc.pid]

    def _watch(self) -> None:
        while not self._stop.wait(0.25):
            tree = self.tree()
            listed = " ".join([f"{p}:{t}" for p in tree if (t := start_time(p))] + _model_copies(tree))
            if listed != self._sent:
                self.proc.stdin.write(listed + "\n")
                self.proc.stdin.flush()
                self._sent = listed

    def close(self) -> None:
        """Close the pipe: the watchdog kills what is left of the tree and exits."""
        self._stop.set()
        self._thread.join()
        self.proc.stdin.close()
        self.proc.wait(timeout=30)


# PyTriton's proxy model runs one tritonserver stub process per model instance; instance 0 serves
# the model's config on a unix socket it creates, and the others wait for that socket file for 1 s
# (get_config_from_handshake_server's default, in the copy of communication.py each model's folder
# of the model store holds). Triton starts the instances in parallel, and on 2 cores kept busy by
# other work instance 0 got there later than that: every start failed ("Timeout occurred while
# waiting for config file ...-config.sock", 3 tries in a row). The copies wait longer.
HANDSHAKE_WAIT_S = 60.0
_HANDSHAKE_SIGNATURE = "def get_config_from_handshake_server(socket_path: pathlib.Path, timeout_s: float = {})"


def patient_handshakes(store: Path, seconds: float = HANDSHAKE_WAIT_S) -> int:
    """Give every model's copy of PyTriton's communication.py under the model store ``store`` a
    wait of ``seconds`` for its instance 0's config socket; returns how many copies it changed."""
    old, new = _HANDSHAKE_SIGNATURE.format("1.0"), _HANDSHAKE_SIGNATURE.format(float(seconds))
    changed = 0
    for path in sorted(store.glob("*/*/communication.py")):
        text = path.read_text()
        if old in text:
            path.write_text(text.replace(old, new))
            changed += 1
    return changed


def _start(handlers: Handlers, config, workspace: Path, instances: int):
    """A running Triton with both models bound, or the start's exception (nothing left running)."""
    from pytriton.model_config import ModelConfig
    from pytriton.triton import Triton, TritonLifecyclePolicy

    # the models go into a local model store that tritonserver loads as it starts, so its
    # /v2/health/ready (strict readiness) turns 200 only once both models answer; by default
    # PyTriton starts the server first and loads the models over its API afterwards, and the
    # server said ready 6-7 s before a request could be answered
    triton = Triton(config=config, workspace=workspace,
                    triton_lifecycle_policy=TritonLifecyclePolicy(launch_triton_on_startup=False, local_model_store=True))
    try:
        inputs, outputs = _tensors()
        triton.bind(PLAIN, [handlers.plain] * instances, inputs=inputs, outputs=outputs,
                    config=ModelConfig(batching=False))
        triton.bind(STREAM, handlers.stream, inputs=inputs, outputs=outputs,
                    config=ModelConfig(batching=False, decoupled=True))
        patient_handshakes(workspace / "model-store")        # bind wrote the models' folders there
        _run_watched(triton)
        return triton
    except BaseException:
        triton.stop()
        raise


def _server_log(triton) -> str:
    """What tritonserver wrote so far (PyTriton keeps it), or "" before it started."""
    logs = getattr(getattr(triton, "_triton_server", None), "logs", None)
    return logs() if callable(logs) else ""


def _port_taken(flag: str, reason: str, ports: dict) -> UserError:
    where = f"{flag} {ports[flag]}" if flag in ports else flag
    return UserError(f"{where}: another process took the port after serve found it free (tritonserver: {reason}); "
                     "pick another port")


class StartFailed(Exception):
    """tritonserver exited while it loaded the models; ``reason``: the error its log gives, and
    ``port``: the flag of the port it could not bind, when that was why (``exit_reason``)."""

    def __init__(self, reason: str = "", port: str | None = None):
        super().__init__("tritonserver exited while loading the models" + (f": {reason}" if reason else ""))
        self.reason, self.port = reason, port


# tritonserver's error lines that say nothing about why it exited (no GPU here)
_HARMLESS = ("CudaDriverHelper has not been initialized",)
_SERVICE_PORT = re.compile(r"failed to start (\w+) service: .*Socket '[^']*' already in use", re.IGNORECASE)
_SERVICE_FLAGS = {"http": "--http-port", "grpc": "--grpc-port", "metrics": "--metrics-port"}


def exit_reason(log: str) -> tuple[str, str | None]:
    """(the last error line of tritonserver's ``log``, the port flag when it could not bind a port).
    Error lines start with E and a date (glog); the text is the quoted message when there is one."""
    reason = ""
    for line in log.splitlines():
        if not re.match(r"E\d{4} ", line) or any(h in line for h in _HARMLESS):
            continue
        text = line.split("] ", 1)[-1].strip()
        reason = text[1:-1].strip() if len(text) > 1 and text[0] == text[-1] == '"' else text
    m = _SERVICE_PORT.search(reason)
    return reason, (_SERVICE_FLAGS.get(m.group(1).lower(), "a port") if m else None)


def _run_watched(triton) -> None:
    """``triton.run()``, or StartFailed as soon as tritonserver exits during it: with the models in
    a local store, a model that fails to load makes tritonserver exit at once, while run() would go
    on waiting for its readiness for DEFAULT_TRITON_STARTUP_TIMEOUT_S (120 s). run() stays in this
    thread (PyTriton gives tritonserver a parent-death signal, sent when the starting *thread*
    ends); a watcher interrupts it through SIGUSR1's handler (main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        triton.run()
        return
    stop, died = threading.Event(), threading.Event()

    def watch():
        while not stop.wait(0.25):
            server = getattr(triton, "_triton_server", None)
            if getattr(server, "_tritonserver_running_cmd", None) is not None and not server.is_alive():
                died.set()
                signal.pthread_kill(threading.main_thread().ident, signal.SIGUSR1)   # wakes a sleep, too
                return

    def on_usr1(signum, frame):
        if died.is_set():
            raise StartFailed(*exit_reason(_server_log(triton)))
    previous = signal.signal(signal.SIGUSR1, on_usr1)
    watcher = threading.Thread(target=watch, name="dllm-triton-watch", daemon=True)
    watcher.start()
    try:
        triton.run()
    finally:
        stop.set()
        watcher.join()
        signal.signal(signal.SIGUSR1, previous)


def grpc_target(host: str, port: int) -> str:
    """``host:port`` a client dials for a server bound to ``host`` (a wildcard: loopback)."""
    host = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(host, host)
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class _StopSignals:
    """While serving: SIGTERM / SIGINT set ``event`` (a drain follows) instead of unwinding at once;
    a second one during the drain raises KeyboardInterrupt (stop now). Main thread only."""

    def __init__(self):
        self.event, self.name, self._previous = threading.Event(), None, {}

    def _on(self, signum, frame):
        if self.event.is_set():
            raise KeyboardInterrupt
        self.name = signal.Signals(signum).name
        self.event.set()

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                self._previous[sig] = signal.signal(sig, self._on)
        return self

    def __exit__(self, *exc):
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


def _queued(host: str, metrics_port: int, model: str) -> int:
    """Requests Triton holds in ``model``'s queue (its pending-request gauge; 0 if unreadable): the
    plain model's N instances take one request each, the rest wait there, not in the scheduler."""
    import urllib.request
    try:
        with urllib.request.urlopen(f"http://{grpc_target(host, metrics_port)}/metrics", timeout=5) as r:
            text = r.read().decode()
    except OSError:
        return 0
    m = re.search(rf'^nv_inference_pending_request_count{{model="{re.escape(model)}",[^}}]*}} (\d+)', text, re.M)
    return int(m.group(1)) if m else 0


def _drain(scheduler: Scheduler, frontend, stop: _StopSignals, timeout: float, queued: int, log) -> None:
    """Stop accepting (new requests: "the server is shutting down"; the OpenAI /health: 503), let
    every request already taken — queued in the scheduler, decoding, or ``queued`` in Triton in
    front of the plain model — finish for up to ``timeout`` seconds, then end the rest with an
    error (scheduler.close); tritonserver then delivers what is in flight as it stops."""
    if frontend is not None:
        frontend.frontend.draining = True
    n = scheduler.in_flight() + queued
    log(f"dllm-deploy: {stop.name}: draining {n} request{'s' * (n != 1)} (up to {timeout:g} s; {stop.name} again stops now)")
    drained = scheduler.drain(timeout, expected=queued)
    left = scheduler.in_flight()
    scheduler.close()
    log(f"dllm-deploy: stopped: {n - left} of {n} in-flight requests answered"
        + ("" if drained else f", {left} ended by the drain timeout (--drain-timeout {timeout:g})"))


def serve(runtime, host: str, ports: dict, limits: Limits, defaults: dict, instances: int,
          log=lambda msg: print(msg, file=sys.stderr, flush=True), continuous: bool = True,
          model_name: str = "dllm", drain_timeout: float = 30.0) -> None:
    """Serve until SIGTERM / SIGINT or until tritonserver dies; then tear tritonserver and its
    stubs down and remove the workspace. A signal once serving drains first (``_drain``: up to
    ``drain_timeout`` seconds) and returns normally; one during the start unwinds at once (the
    CLI raises it in this thread). A watchdog (Reaper) tears down the same if this process is
    killed outright. With ``ports["--openai-port"]``, the OpenAI frontend (openai_api.py) serves
    ``model_name`` there too, over Triton's gRPC port."""
    check_environment()
    check_ports(host, ports)
    from pytriton.triton import TritonConfig
    logging.getLogger("pytriton.proxy.inference").addFilter(_RefusalsInOneLine())

    _with_libdir(os.environ)
    scratch = Path(tempfile.mkdtemp(prefix="dllm-serve-"))
    reaper = Reaper(scratch)
    scheduler = Scheduler(runtime, max_batch=instances, max_queue=limits.max_queue, continuous=continuous)
    handlers = Handlers(runtime, scheduler, limits, defaults)
    config = TritonConfig(http_address=host, http_port=ports["--http-port"], grpc_address=host,
                          grpc_port=ports["--grpc-port"], metrics_address=host, metrics_port=ports["--metrics-port"],
                          exit_timeout_secs=3, log_verbose=0)
    triton = frontend = None
    try:
        for attempt in range(1, STARTS + 1):
            try:
                triton = _start(handlers, config, scratch / f"pytriton-{attempt}", instances)
                break
            except Exception as e:
                # a port checked free can be taken before tritonserver binds it (it loads the models
                # first, which takes seconds): trying again on the same port is no use
                if isinstance(e, StartFailed) and e.port:
                    raise _port_taken(e.port, e.reason, ports) from None
                if isinstance(e, StartFailed) and attempt == STARTS:
                    raise UserError(f"{e} ({STARTS} tries); see its log above") from None
                if not isinstance(e, StartFailed) and "handshake" not in str(e) or attempt == STARTS:
                    raise
                _kill(reaper.tree())
                log(f"dllm-deploy: tritonserver start {attempt} failed ({e}); starting again")
                time.sleep(attempt)                  # a moment for the load that lost the race to pass
        openai = ""
        if ports.get("--openai-port"):
            from .openai_api import Frontend, Server
            frontend = Server(Frontend(grpc_target(host, ports["--grpc-port"]), model_name), host, ports["--openai-port"])
            frontend.start()
            openai = f" openai http://{host}:{ports['--openai-port']}/v1 (model {model_name})"
        stop = _StopSignals()
        log(f"dllm-deploy: serving models {PLAIN} and {STREAM}: http://{host}:{ports['--http-port']} "
            f"grpc {host}:{ports['--grpc-port']} metrics http://{host}:{ports['--metrics-port']}/metrics{openai} "
            f"(batch up to {instances}, queue up to {limits.max_queue})")
        with stop:
            while triton.is_alive() and not stop.event.wait(0.5):
                pass
            if not stop.event.is_set():
                reason, port = exit_reason(_server_log(triton))
                if port:
                    raise _port_taken(port, reason, ports)
                raise UserError("tritonserver exited" + (f" ({reason})" if reason else "") + "; see its log above")
            _drain(scheduler, frontend, stop, drain_timeout, _queued(host, ports["--metrics-port"], PLAIN), log)
    finally:
        if frontend is not None:
            frontend.stop()
        scheduler.close()
        try:
            if triton is not None:
                triton.stop()
        finally:
            reaper.close()
            shutil.rmtree(scratch, ignore_errors=True)
