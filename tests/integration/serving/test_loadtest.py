"""`dllm-deploy loadtest` against the session server (conftest.server): every answer checked
against offline generate, the checker can fail, and only loopback is loaded."""
from __future__ import annotations

import json
import os
import subprocess
import sys

from dllm_deploy.cli import main

from .conftest import GEN_LENGTH, ROOT


def loadtest(server, artifact, tmp_path, *flags, gen_length=GEN_LENGTH):
    out = tmp_path / "load.json"
    r = subprocess.run([sys.executable, "-m", "dllm_deploy.cli", "loadtest", "--artifact", str(artifact),
                        "--gen-length", str(gen_length), "--url", server.url, "--json-out", str(out), *flags],
                       env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=180)
    return r, json.loads(out.read_text())


def test_loadtest_answers_equal_offline(server, tiny_artifact, tmp_path):
    r, res = loadtest(server, tiny_artifact[0], tmp_path, "--concurrency", "1,4", "--requests", "4")
    assert r.returncode == 0, r.stderr
    assert res["passed"] and [lv["concurrency"] for lv in res["levels"]] == [1, 4]
    for lv in res["levels"]:
        assert (lv["answered"], lv["errors"], lv["corrupted"]) == (4, 0, 0)
        assert lv["tokens_per_s"] > 0 and lv["latency_p50_s"] <= lv["latency_p99_s"]
    assert "| 4 | 4/4 | 0 | 0 |" in r.stdout


def test_loadtest_stream_times_first_token(server, tiny_artifact, tmp_path):
    r, res = loadtest(server, tiny_artifact[0], tmp_path, "--stream", "--concurrency", "2", "--requests", "4")
    assert r.returncode == 0, r.stderr
    (lv,) = res["levels"]
    assert (lv["answered"], lv["corrupted"]) == (4, 0)
    assert 0 < lv["ttft_p50_s"] <= lv["latency_p99_s"]


def test_loadtest_fails_on_answers_that_differ(server, tiny_artifact, tmp_path):
    """References from another canvas than the server's: every answer counts as corrupted, exit 1."""
    r, res = loadtest(server, tiny_artifact[0], tmp_path, "--concurrency", "1", "--requests", "2",
                      gen_length=GEN_LENGTH * 2)
    assert r.returncode == 1
    assert not res["passed"] and res["levels"][0]["corrupted"] >= 1
    assert "give loadtest the decode flags serve runs with" in r.stderr


def test_loadtest_refuses_other_hosts(capsys):
    assert main(["loadtest", "--artifact", "x", "--url", "http://192.168.1.5:8000"]) == 2
    assert capsys.readouterr().err.strip() == ("dllm-deploy: error: --url http://192.168.1.5:8000: loadtest targets "
                                               "loopback only (127.0.0.1, localhost, ::1), not 192.168.1.5")
