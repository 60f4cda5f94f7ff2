"""Batching across requests: one thread owns the Runtime and decodes the waiting requests together.

A request is queued with a ``deliver`` callback. The scheduler thread takes the oldest waiting
request plus every other waiting request with the same batch options (``Request.decode``:
strategy, beam width, threshold, gen_length... the shape a batch shares), up to ``max_batch``,
and decodes them as one batch > 1 with each row's own RowOptions (seed, sampling, max_tokens,
stop). Each row's chunks go to its own ``deliver`` as the decode loop reports them; a finished
row's last chunk carries its finish_reason.

Continuous batching: a request that arrives while a batch decodes joins it at the next block
boundary when it is compatible and there is room (rows that finished have left by then), as
vLLM and SGLang do; the decode loop asks ``_run``'s join callable at every boundary
(Runtime.stream(join=...)). That needs an exact cache at block boundaries (a block-causal
model under cache exact or delayed, ONNX Runtime or torch); elsewhere, and with ``continuous=False`` (serve --static-batches), a request waits for the
next batch (static batches formed at arrival).
"""
from __future__ import annotations

import threading
from collections import deque

from .contract import BadRequest, Request


def _key(request: Request) -> str:
    return repr(sorted(request.decode.items()))


class Scheduler:
    def __init__(self, runtime, max_batch: int, max_queue: int, continuous: bool = True):
        self.runtime, self.max_batch, self.max_queue = runtime, max_batch, max_queue
        self.continuous = continuous
        self.joined = 0                           # requests that joined a running batch
        self._cv = threading.Condition()
        self._waiting: deque = deque()
        self._active = 0
        self._closed = False
        self.batch_sizes: list[int] = []          # every batch decoded so far (the load test reads them)
        self._thread = threading.Thread(target=self._loop, name="dllm-scheduler", daemon=True)
        self._thread.start()

    def submit(self, request: Request, deliver) -> None:
        """Queue a request; ``deliver(chunk)`` gets its chunks, ``deliver(exception)`` a failure."""
        with self._cv:
            if self._closed:
                raise BadRequest("the server is shutting down")
            if len(self._waiting) + self._active >= self.max_queue:
                raise BadRequest(f"server busy: {self.max_queue} requests already queued or decoding (--max-queue)")
            self._waiting.append((request, deliver))
            self._cv.notify()

    def close(self) -> None:
        with self._cv:
            self._closed = True
            self._cv.notify()

    def _take_compatible(self, key: str, room: int) -> list:
        """Remove and return up to ``room`` waiting requests whose batch options have ``key``."""
        taken = [item for item in self._waiting if _key(item[0]) == key][:room]
        for item in taken:
            self._waiting.remove(item)
        return taken

    def _take(self) -> list:
        with self._cv:
            while not self._waiting and not self._closed:
                self._cv.wait()
            if self._closed:
                return []
            first = self._waiting.popleft()
            batch = [first, *self._take_compatible(_key(first[0]), self.max_batch - 1)]
            self._active = len(batch)
            return batch

    def _loop(self) -> None:
        while batch := self._take():
            self.batch_sizes.append(len(batch))
            self._run(batch)
            with self._cv:
                self._active = 0
        with self._cv:                       # closed: nothing waiting is decoded any more
            left, self._waiting = list(self._waiting), deque()
        for _, deliver in left:
            deliver(BadRequest("the server is shutting down"))

    def _joiner(self, batch: list, done: list):
        """The join callable of a running batch (None: requests wait for the next batch): at a block
        boundary it moves compatible waiting requests into ``batch``, up to ``max_batch`` unfinished rows."""
        decode = batch[0][0].decode
        if not (self.continuous and self.runtime.joins_batches(**decode)):
            return None
        key = _key(batch[0][0])

        def join() -> list:
            room = self.max_batch - done.count(False)
            if room <= 0:
                return []
            with self._cv:
                taken = self._take_compatible(key, room)
                self._active += len(taken)
            batch.extend(taken)
            done.extend([False] * len(taken))
            self.joined += len(taken)
            return [(r.prompt, r.row) for r, _ in taken]
        return join

    def _run(self, batch: list) -> None:
        requests = [r for r, _ in batch]
        done = [False] * len(batch)
        try:
            for chunk in self.runtime.stream([r.prompt for r in requests], rows=[r.row for r in requests],
                                             join=self._joiner(batch, done), **requests[0].decode):
                i = chunk["index"]
                done[i] = chunk["finish_reason"] is not None
                batch[i][1](chunk)
        except Exception as e:     # the runtime refused or failed: every unfinished row hears why
            error = e if isinstance(e, BadRequest) else BadRequest(f"decode failed: {e}")
            for (_, deliver), finished in zip(batch, done):
                if not finished:
                    deliver(error)

