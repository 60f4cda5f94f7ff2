"""Golden chunks for the C++ unit check (CTest): tests/data/golden/stream.json holds what
runtime/stream.py makes of a row's growing final ids (multi-byte characters, stop strings, EOS, the
budget). The committed file must equal what Python makes now (regenerate after a deliberate
change: DLLM_UPDATE_GOLDEN=1 pytest tests/integration/cpp/test_golden_cpp.py, and review the diff); `ctest`
then checks cpp/src/stream.cpp against it, cpp/src/noise.cpp against tests/data/golden/noise.json
(made by tests/unit/runtime/test_noise.py) and cpp/src/policy.cpp against the policy traces of
tests/data/golden/policy/ (made by tests/unit/runtime/test_policy_fixtures.py)."""
from __future__ import annotations

import json
import os
import re
import subprocess

from dllm_deploy.models.tokenizer import ByteTokenizer
from dllm_deploy.runtime.stream import RowText

from .conftest import REPO

FIXTURES = REPO / "tests" / "data" / "golden"
TOK = ByteTokenizer()


def b(s: str) -> list[int]:
    return list(s.encode("utf-8"))


def grow(ids: list[int], by: int = 1) -> list[list[int]]:
    """The final ids after each report when `by` tokens become final per forward."""
    return [ids[:n] for n in range(by, len(ids) + by, by)]


# name -> (final ids after each report, stop strings, budget)
STREAM = {
    "3-byte character split over 3 tokens": (grow(b("h€!")), [], 100),
    "4-byte character, 2 tokens per report": (grow(b("a\U0001F600bc"), 2), [], 100),
    "invalid byte stays a U+FFFD": (grow([97, 0xFF, 98, 0xC3]), [], 4),
    "stop string spanning chunks": (grow(b("abENx END")), ["END", "zz"], 100),
    "the earliest of two stop strings": (grow(b("xx zz END"), 3), ["END", "zz"], 100),
    "stop string at the start": (grow(b("ENDx")), ["END"], 100),
    "multibyte stop string": (grow(b("caf\u00e9 au lait")), ["\u00e9 a", "\u00e9t"], 100),
    "stop string after a held U+FFFD": (grow(b("ab\u00e9\n")), ["\n"], 100),
    "eos ends the text": (grow(b("ok") + [TOK.EOS]), ["x"], 100),
    "eos and a stop string in one report": ([b("ok") + b("!") + [TOK.EOS]], ["!"], 100),
    "budget": (grow(b("abcdef"), 2), [], 3),
    "budget with a held stop prefix": (grow(b("abcE")), ["END"], 4),
    "no growth, no chunk": ([b("ab"), b("ab"), b("abc")], [], 3),
}


def cut(ids: list[int], budget: int) -> list[int]:
    """loop.py::_Run.report's cuts: just after the first EOS, then to the budget."""
    if TOK.EOS in ids:
        ids = ids[:ids.index(TOK.EOS) + 1]
    return ids[:budget]


def stream_chunks(reports: list[list[int]], stop: list[str], budget: int) -> list[dict]:
    """loop.py::Decoder._chunks for one row: a chunk per report whose final ids grew."""
    t, out = RowText(TOK.decode, TOK.EOS, stop, budget), []
    for ids in reports:
        ids = cut(ids, budget)
        if t.finish_reason or len(ids) == t.seen:
            continue
        delta, new, reason = t.update(ids)
        out.append({"delta": delta, "token_ids": new, "tokens": t.sent, "finish_reason": reason})
    return out


def stream_golden() -> dict:
    return {"cases": [{"name": name, "stop": stop, "budget": budget, "eos_id": TOK.EOS, "reports": reports,
                       "chunks": stream_chunks(reports, stop, budget)}
                      for name, (reports, stop, budget) in STREAM.items()]}


ABOUT = ("Golden chunks of dllm_deploy/runtime/stream.py: per case the row's final ids after each report "
         "(before the EOS and budget cuts) and the chunks they give. Checked by cpp/tests/test_stream.cpp; "
         "made by tests/integration/cpp/test_golden_cpp.py.")


def dump(doc: dict) -> str:
    """One line per vector, so a diff shows which one changed."""
    lines = ["{", f' "about": {json.dumps(doc["about"])},']
    keys = [k for k in doc if k != "about"]
    for i, k in enumerate(keys):
        rows = [f"  {json.dumps(r)}" for r in doc[k]]
        lines += [f' "{k}": [', ",\n".join(rows), " ]" + ("," if i < len(keys) - 1 else "")]
    return "\n".join(lines + ["}"]) + "\n"


def check(name: str, made: dict) -> None:
    path = FIXTURES / f"{name}.json"
    doc = {"about": ABOUT, **made}
    if os.environ.get("DLLM_UPDATE_GOLDEN"):
        path.write_text(dump(doc))
    assert json.loads(path.read_text()) == json.loads(json.dumps(doc)), f"{path} is stale: DLLM_UPDATE_GOLDEN=1"


def test_stream_fixture_is_stream_py():
    made = stream_golden()
    reasons = {c["chunks"][-1]["finish_reason"] for c in made["cases"] if c["chunks"]}
    assert reasons >= {"eos", "stop", "length"}
    check("stream", made)


def test_ctest_checks_the_cpp_units_against_them(cpp_build):
    r = subprocess.run(["ctest", "--test-dir", str(cpp_build), "--output-on-failure"], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout[-3000:]
    for name in ("canvas_plans", "policy_traces", "noise_vectors", "stream_chunks"):
        assert f"{name} " in r.stdout and "Passed" in r.stdout
    out = subprocess.run([str(cpp_build / "test_policy"), str(FIXTURES / "policy")], capture_output=True, text=True)
    replayed = re.search(r"(\d+) policy traces, (\d+) steps replayed, 0 differ", out.stdout)
    assert out.returncode == 0 and replayed and int(replayed[1]) >= 8 and int(replayed[2]) >= 100, out.stdout
