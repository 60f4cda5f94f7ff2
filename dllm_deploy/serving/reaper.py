"""The watchdog that keeps tritonserver from outliving ``dllm-deploy serve``.

``serve`` starts this script (``python -I reaper.py SCRATCH``, its own session) with a pipe on its
standard input and writes a line ``pid:starttime ... /tmp/folderXXXXXX ...`` naming its process
tree (tritonserver, the Python backend stubs and their helpers) and tritonserver's copies of the
model repository whenever that changes. When the pipe closes — serve exited, normally or by
SIGKILL — the script SIGKILLs every listed process that still has its recorded start time (so a
reused pid is never hit) and removes the folders, the scratch folder and the shared-memory
segments PyTriton named after serve's pid (``/dev/shm/pytrtion<pid>-*``, 4 MB each). Without it a
SIGKILLed serve leaves tritonserver draining for seconds with its ports held (PyTriton only sets a
parent-death SIGTERM) and the stubs orphaned.

Standalone (no package imports) so that it starts fast and runs whatever serve's state."""
import os
import shutil
import signal
import sys


def start_time(pid: int) -> str | None:
    """Field 22 of /proc/PID/stat (clock ticks since boot): a process's identity with its pid."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


SHM = "/dev/shm"


def main() -> None:
    serve = os.getppid()                              # serve started this script
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)           # Ctrl-C reaches serve; this waits for the pipe
    tree: set[str] = set()
    for line in sys.stdin:
        tree.update(line.split())      # everything ever listed: a stub tritonserver left is no longer serve's
    for entry in tree:
        pid, _, started = entry.partition(":")
        if not entry.startswith("/") and start_time(int(pid)) == started:
            try:
                os.kill(int(pid), signal.SIGKILL)
            except ProcessLookupError:
                pass
    for folder in [e for e in tree if e.startswith("/")] + sys.argv[1:]:
        shutil.rmtree(folder, ignore_errors=True)
    try:
        segments = [n for n in os.listdir(SHM) if n.startswith(f"pytrtion{serve}-")]
    except OSError:
        segments = []
    for name in segments:
        try:
            os.unlink(os.path.join(SHM, name))
        except OSError:
            pass


if __name__ == "__main__":
    main()
