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
        self._draining = False
        self._expected = 0                        # while draining: queued requests still to admit
        self._named: dict = {}                    # request_id -> Request, while in flight
        self.batch_sizes: list[int] = []          # every batch decoded so far (the load test reads them)
        self._thread = threading.Thread(target=self._loop, name="dllm-scheduler", daemon=True)
        self._thread.start()

    def submit(self, request: Request, deliver, admitted: bool = False) -> None:
        """Queue a request; ``deliver(chunk)`` gets its chunks, ``deliver(exception)`` a failure.
        While draining only ``admitted`` ones (``admit``) are taken."""
        with self._cv:
            if self._closed or (self._draining and not admitted):
                raise BadRequest("the server is shutting down")
            if request.request_id is not None:
                if request.request_id in self._named:
                    raise BadRequest(f"request_id: {request.request_id!r} names a request still in flight")
                self._named[request.request_id] = request
            if len(self._waiting) + self._active >= self.max_queue:
                raise BadRequest(f"server busy: {self.max_queue} requests already queued or decoding (--max-queue)")
            self._waiting.append((request, self._forgetting(request, deliver)))
            self._cv.notify()

    def _forgetting(self, request: Request, deliver):
        """``deliver`` that also forgets the request's name once its last chunk or error went out."""
        if request.request_id is None:
            return deliver

        def last(item):
            if isinstance(item, Exception) or item["finish_reason"] is not None:
                with self._cv:
                    self._named.pop(request.request_id, None)
            deliver(item)
        return last

    def cancel(self, request_id: str) -> bool:
        """End the named request (a client gone): it leaves the queue, or its batch's decode, at the
        next forward. False if no request of that name is in flight."""
        with self._cv:
            request = self._named.get(request_id)
            if request is None:
                return False
            request.cancelled.set()
            self._cv.notify_all()
        self._sweep()
        return True

    @staticmethod
    def _why(request: Request) -> BadRequest:
        if request.cancelled.is_set():
            return BadRequest("cancelled: the request was cancelled (its client went away)")
        return BadRequest(f"timeout: the request's deadline ({request.timeout:g} s) passed")

    def _sweep(self) -> None:
        """Waiting requests that were cancelled or whose deadline passed leave the queue, each told why."""
        with self._cv:
            gone = [item for item in self._waiting if item[0].cancelled.is_set() or item[0].expired()]
            for item in gone:
                self._waiting.remove(item)
            if gone:
                self._cv.notify_all()
        for request, deliver in gone:
            deliver(self._why(request))

    def in_flight(self) -> int:
        """Requests waiting or decoding (and, while draining, queued ones still to come)."""
        with self._cv:
            return len(self._waiting) + self._active + self._expected

    def admit(self) -> bool:
        """A request that waited in Triton's queue reaches its handler: True unless draining, where
        only the ``expected`` ones (queued before the drain began) are still taken."""
        with self._cv:
            if not self._draining:
                return True
            if self._expected > 0:
                self._expected -= 1
                self._cv.notify_all()
                return True
            return False

    def drain(self, timeout: float, expected: int = 0) -> bool:
        """Refuse new requests ("the server is shutting down") but the ``expected`` ones already
        queued in front of the server (``admit``), and wait up to ``timeout`` seconds for them and
        every queued and decoding request to finish; True if they all did."""
        with self._cv:
            self._draining, self._expected = True, expected
            return self._cv.wait_for(lambda: not self._waiting and not self._active and not self._expected, timeout)

    def close(self) -> None:
        """Stop: waiting requests are refused; a batch still decoding ends with an error for each
        of its unfinished rows at its next chunk (no answer is left without an end)."""
        with self._cv:
            self._closed = True
            self._cv.notify_all()

    def _take_compatible(self, key: str, room: int) -> list:
        """Remove and return up to ``room`` waiting requests whose batch options have ``key``."""
        taken = [item for item in self._waiting if _key(item[0]) == key][:room]
        for item in taken:
            self._waiting.remove(item)
        return taken

    def _take(self) -> list:
        self._sweep()
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
                self._cv.notify_all()
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

    def _ending(self, batch: list, done: list):
        """The decode's cancel callable: after every forward, the unfinished rows whose request was
        cancelled or ran past its deadline (and the same sweep of the waiting queue)."""
        def ending() -> list:
            self._check_files()
            self._sweep()
            return [i for i, (r, _) in enumerate(batch) if not done[i] and (r.cancelled.is_set() or r.expired())]
        return ending

    def _check_files(self) -> None:
        """BadRequest when the served artifact's files changed in place since load: no answer is
        computed from weights that are no longer the model's (Runtime.files_changed)."""
        changed = getattr(self.runtime, "files_changed", None)
        why = changed() if changed else None
        if why:
            raise BadRequest(f"the server's artifact changed: {why}")

    def _run(self, batch: list) -> None:
        requests = [r for r, _ in batch]
        done = [False] * len(batch)
        try:
            self._check_files()
            for chunk in self.runtime.stream([r.prompt for r in requests], rows=[r.row for r in requests],
                                             join=self._joiner(batch, done), cancel=self._ending(batch, done),
                                             **requests[0].decode):
                if self._closed:
                    raise BadRequest("the server stopped before this answer was complete")
                i = chunk["index"]
                done[i] = chunk["finish_reason"] is not None
                batch[i][1](self._why(batch[i][0]) if chunk["finish_reason"] == "cancelled" else chunk)
        except Exception as e:     # the runtime refused or failed: every unfinished row hears why
            error = e if isinstance(e, BadRequest) else BadRequest(f"decode failed: {e}")
            for (_, deliver), finished in zip(batch, done):
                if not finished:
                    deliver(error)

