"""The scheduler's continuous batching, in process over the tiny ONNX artifact (no Triton): a
request that arrives while a batch decodes joins it at the next block boundary and is answered
exactly as offline generate answers it; with continuous=False it waits for the next batch."""
import queue

import pytest

from dllm_deploy.runtime.rows import RowOptions
from dllm_deploy.serving.contract import Request
from dllm_deploy.serving.scheduler import Scheduler

DECODE = {"strategy": "spd", "beam_width": 4, "gen_length": 64}
FIRST = "reverse: river stone cloud garden window light\n"     # outlives its first block
LATE = "upper: hello there\n"


@pytest.fixture(scope="module")
def rt(tiny_artifact):
    from dllm_deploy import Runtime
    return Runtime.load(artifact=str(tiny_artifact[0]))


def answer(q: queue.Queue) -> tuple[str, list[int], str]:
    text, ids = "", []
    while True:
        c = q.get(timeout=120)
        if isinstance(c, Exception):
            raise c
        text, ids = text + c["delta"], ids + c["token_ids"]
        if c["finish_reason"]:
            return text, ids, c["finish_reason"]


def late_join(rt, decode: dict, late_row: RowOptions, continuous: bool = True) -> Scheduler:
    """FIRST decodes; LATE arrives with its first chunk. Both answers must equal offline generate;
    returns the (closed) scheduler for its counts."""
    s = Scheduler(rt, max_batch=4, max_queue=8, continuous=continuous)
    first_q, late_q = queue.Queue(), queue.Queue()

    def first_deliver(chunk):       # the late request arrives while the first one decodes
        if not isinstance(chunk, Exception) and not getattr(first_deliver, "sent", False):
            first_deliver.sent = True
            s.submit(Request(LATE, decode, late_row, True), late_q.put)
        first_q.put(chunk)

    try:
        s.submit(Request(FIRST, decode, RowOptions(), True), first_deliver)
        got_first, got_late = answer(first_q), answer(late_q)
    finally:
        s.close()
    for got, prompt, row in ((got_first, FIRST, RowOptions()), (got_late, LATE, late_row)):
        r = rt.generate([prompt], rows=[row], **decode)[0]
        assert got == (r.text, r.token_ids, r.finish_reason)
    return s


@pytest.mark.parametrize("continuous", [True, False])
def test_a_late_request_joins_the_running_batch(rt, continuous):
    s = late_join(rt, DECODE, RowOptions(temperature=0.7, top_p=0.9, seed=5), continuous)
    assert (s.joined, s.batch_sizes) == ((1, [1]) if continuous else (0, [1, 1]))


@pytest.mark.parametrize("strategy", ["tree-spec", "fastdiffuser"])
def test_a_late_request_joins_a_self_speculative_batch(selfspec_artifact, strategy):
    """The same on a self-speculative model: the late request joins at a round boundary."""
    from dllm_deploy import Runtime
    rt = Runtime.load(artifact=str(selfspec_artifact))
    late_row = RowOptions() if strategy == "fastdiffuser" else RowOptions(temperature=0.7, seed=5)
    s = late_join(rt, {"strategy": strategy, "beam_width": 2, "gen_length": 48}, late_row)
    assert (s.joined, s.batch_sizes) == (1, [1])


def test_a_late_request_joins_a_uniform_diffusion_batch(diffusion_gemma_export):
    """The same on a DiffusionGemma artifact: the late request joins at a canvas boundary."""
    from dllm_deploy import Runtime
    rt = Runtime.load(artifact=str(diffusion_gemma_export[1]))
    s = late_join(rt, {"gen_length": 32, "steps": 3}, RowOptions(seed=5))
    assert (s.joined, s.batch_sizes) == (1, [1])
