"""One real server for the serving tests: `dllm-deploy serve` over the tiny artifact on free
loopback ports, in a subprocess of this interpreter. Where serving cannot run (no nvidia-pytriton,
glibc < 2.35, numpy 2: the Python backend stub crashes on BYTES tensors) the tests skip and say why."""
from __future__ import annotations

import os
import platform
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
import warnings
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
GEN_LENGTH = 32


def free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def serving_python() -> str:
    """The interpreter that runs the server, or pytest.skip with the reason."""
    try:
        import pytriton  # noqa: F401
    except ImportError:
        pytest.skip("nvidia-pytriton is not installed (pip install '.[serve]')")
    libc, version = platform.libc_ver()
    if libc != "glibc" or tuple(int(x) for x in version.split(".")[:2]) < (2, 35):
        pytest.skip(f"the bundled tritonserver needs glibc >= 2.35 (have {libc} {version})")
    import numpy
    if int(numpy.__version__.split(".")[0]) >= 2:
        pytest.skip(f"numpy {numpy.__version__} here: the Triton Python backend stub needs numpy<2 (pip install 'numpy<2')")
    return sys.executable


class NotReady(RuntimeError):
    """A server still running but not ready when the time ran out."""


class PortTaken(RuntimeError):
    """A server that exited because another process took one of its ports after it checked them."""


def wait_ready(url: str, proc: subprocess.Popen, timeout: float = 90,
               paths=("/v2/models/dllm/ready", "/v2/models/dllm_stream/ready"), log=None) -> None:
    """Until every path answers 200; a RuntimeError with the server's stderr (``log()``, else its
    pipe) when it exits first or the time runs out."""
    def stderr() -> str:
        return (log() if log else proc.stderr.read() if proc.poll() is not None else "")[-3000:]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            err = stderr()
            raise (PortTaken if "another process took the port" in err else RuntimeError)(
                f"serve exited with {proc.returncode}: {err}")
        try:
            for path in paths:
                urllib.request.urlopen(f"{url}{path}", timeout=2)
            return
        except OSError:
            time.sleep(0.5)
    raise NotReady(f"serve did not become ready in {timeout:g} s: {stderr()}")


class Server:
    """`dllm-deploy serve` over ``artifact`` (or, with ``command``, any server taking the three
    ports from ``command(http, grpc, metrics)``) on free loopback ports, ready. Its stderr goes to
    a file (``stderr()``), never a pipe nobody drains. A start that is not ready in time, or that
    ends on a port taken, is tried once more on other ports: the ports are free when picked, and
    another test worker's processes can take one before this server binds it (serve then says so
    and exits)."""

    def __init__(self, artifact: Path, extra: list[str] = (), command=None, env: dict | None = None,
                 openai: bool = False):
        for attempt in (1, 2):
            t0 = time.monotonic()
            try:
                self._start(artifact, extra, command, env, openai)
                return
            except (NotReady, PortTaken) as e:
                if attempt == 2:
                    raise
                # in the run's warnings summary: what a first start that failed said, to tell a
                # slow machine from a start that hangs (one was seen idle for a whole timeout)
                warnings.warn(f"serve's first start failed after {time.monotonic() - t0:.0f} s and is tried again "
                              f"on other ports: {type(e).__name__}: {str(e)[-1500:]}", stacklevel=2)

    def _start(self, artifact, extra, command, env, openai) -> None:
        self.http, self.grpc, self.metrics, self.openai = free_ports(4)
        self.url = f"http://127.0.0.1:{self.http}"
        self.openai_url = f"http://127.0.0.1:{self.openai}/v1"
        if command is None:
            command = lambda http, grpc, metrics: [  # noqa: E731
                serving_python(), "-m", "dllm_deploy.cli", "serve", "--artifact", str(artifact),
                "--gen-length", str(GEN_LENGTH), "--http-port", str(http), "--grpc-port", str(grpc),
                "--metrics-port", str(metrics), *extra,
                *(["--openai-port", str(self.openai), "--served-model-name", "tiny"] if openai else [])]
        self.log = tempfile.TemporaryFile("w+")
        self.proc = subprocess.Popen(command(self.http, self.grpc, self.metrics),
                                     env=env or {**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.DEVNULL,
                                     stderr=self.log, text=True, start_new_session=True)
        try:
            wait_ready(self.url, self.proc, log=self.stderr)
            if openai:
                wait_ready(self.openai_url.removesuffix("/v1"), self.proc, paths=["/health"], log=self.stderr)
        except BaseException:
            self.stop()
            raise

    def stderr(self) -> str:
        """What the server wrote to stderr so far."""
        self.log.seek(0)
        return self.log.read()

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        return self.proc.returncode


@pytest.fixture(scope="session")
def server(request):
    serving_python()                    # skip before the artifact is exported when serving can't run here
    artifact, _ = request.getfixturevalue("tiny_artifact")
    s = Server(artifact, ["--max-batch-size", "4", "--max-queue", "32"], openai=True)
    yield s
    s.stop()


@pytest.fixture(scope="session")
def offline_runtime(tiny_artifact):
    """The served artifact loaded in this process."""
    from dllm_deploy.runtime.api import Runtime
    return Runtime.load(artifact=str(tiny_artifact[0]))


@pytest.fixture(scope="session")
def offline(offline_runtime):
    """generate of the same artifact in this process: what every response must equal."""
    return lambda prompt, **decode: offline_runtime.generate([prompt], gen_length=GEN_LENGTH, **decode)[0]
