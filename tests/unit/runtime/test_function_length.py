"""The runtime stays readable: no function in dllm_deploy/runtime/ over 60 lines (the decode loop
is a handful of small functions; a long one is asking to be split)."""
import ast
from pathlib import Path

import dllm_deploy.runtime

LIMIT = 60


def test_no_runtime_function_over_60_lines():
    root = Path(dllm_deploy.runtime.__file__).parent
    long = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > LIMIT:
                    long.append(f"{path.relative_to(root)}:{node.lineno} {node.name} ({n} lines)")
    assert not long, long
