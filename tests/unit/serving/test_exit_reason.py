"""Why tritonserver exited, from its log (dllm_deploy/serving/server.py, exit_reason): the lines are
tritonserver 2.x's own, from a serve whose gRPC / HTTP / metrics port another process took after
serve's check found it free (tritonserver loads the models before it binds its ports)."""
from __future__ import annotations

import pytest

from dllm_deploy.serving.server import exit_reason

NOISE = (
    'E1207 18:04:41.739251 20195 server.cc:241] "CudaDriverHelper has not been initialized."\n'
    "I1207 18:04:46.991201 20195 model_lifecycle.cc:849] \"successfully loaded 'dllm'\"\n"
    "Error: Failed to initialize NVML\n"
    'W1207 18:04:47.006914 20195 metrics.cc:798] "DCGM unable to start: DCGM initialization error"\n')
GRPC = (
    "E1207 18:04:47.013663449   20195 chttp2_server.cc:1060]                UNKNOWN:No address added out of total 1 "
    "resolved for '127.0.0.1:18902' {created_time:\"2026-12-07T18:04:47.013575303+00:00\", children:[UNKNOWN:Address "
    "already in use {syscall:\"bind\", os_error:\"Address already in use\", errno:98}]}\n"
    'E1207 18:04:47.019027 20195 main.cc:245] "failed to start GRPC service: Unavailable - Socket '
    "'127.0.0.1:18902' already in use \"\n")
HTTP = ('E1207 18:10:14.643695 26930 main.cc:257] "failed to start HTTP service: Unavailable - Socket '
        "'127.0.0.1:18901' already in use \"\n")
METRICS = ('E1207 18:10:24.372743 27483 main.cc:293] "failed to start Metrics service: Unavailable - Socket '
           "'127.0.0.1:18903' already in use \"\n")


@pytest.mark.parametrize("tail, flag, service", [(GRPC, "--grpc-port", "GRPC"), (HTTP, "--http-port", "HTTP"),
                                                 (METRICS, "--metrics-port", "Metrics")])
def test_a_port_taken_names_its_flag(tail, flag, service):
    reason, port = exit_reason(NOISE + tail)
    assert port == flag
    assert reason.startswith(f"failed to start {service} service: ") and reason.endswith("already in use")


def test_another_error_is_the_reason_without_a_port():
    line = ("E1207 18:20:01.000001 31000 model_lifecycle.cc:641] \"failed to load 'dllm' version 1: Internal: "
            "TimeoutError: Timeout occurred while waiting for config file /tmp/x/dllm-config.sock\"\n")
    assert exit_reason(NOISE + line) == ("failed to load 'dllm' version 1: Internal: TimeoutError: Timeout occurred "
                                         "while waiting for config file /tmp/x/dllm-config.sock", None)


def test_no_error_line_no_reason():
    assert exit_reason(NOISE) == ("", None)
    assert exit_reason("") == ("", None)
