"""docs/cpp.md: its embedding example is cpp/examples/embed.cpp, which builds and runs."""
from __future__ import annotations

import re
import subprocess

from .conftest import REPO

DOC = REPO / "docs" / "cpp.md"
EMBED = REPO / "cpp" / "examples" / "embed.cpp"


def test_docs_example_is_embed_cpp():
    blocks = re.findall(r"```cpp\n(.*?)```", DOC.read_text(), flags=re.DOTALL)
    assert EMBED.read_text() in blocks
    assert len(EMBED.read_text().splitlines()) <= 25


def test_embed_example_runs_like_python(cpp_build, tiny_artifact):
    from dllm_deploy import Runtime
    from dllm_deploy.runtime.api import decode_config
    r = subprocess.run([str(cpp_build / "dllm-embed"), str(tiny_artifact[0])], check=False, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    want = Runtime.load(artifact=str(tiny_artifact[0])).decoder.generate(
        ["upper: air war\n"], decode_config(strategy="spd", beam_width=4, gen_length=64))[0]
    assert r.stdout == f"{want.text}\n{want.tokens} tokens, {want.forwards} forwards\n"


def test_c_header_compiles_as_c(cpp_build):
    """build/cpp/dllm-c-check: dllm.h included from a C99 file, linked, and its defaults read."""
    assert subprocess.run([str(cpp_build / "dllm-c-check")], check=False).returncode == 0
