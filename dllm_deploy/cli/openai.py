"""``dllm-deploy openai``: an OpenAI API frontend over a running serve's gRPC port."""
from __future__ import annotations

import sys

from ..errors import UserError


def add_parser(sub) -> None:
    oa = sub.add_parser("openai", help="an OpenAI API frontend over a running serve's gRPC port (docs/serving.md)")
    oa.add_argument("--triton-url", required=True, help="the server's gRPC endpoint, HOST:PORT (serve --grpc-port)")
    oa.add_argument("--host", default="127.0.0.1", help="bind address (default loopback)")
    oa.add_argument("--port", type=int, default=8080)
    oa.add_argument("--served-model-name", default="dllm", help="the model id OpenAI clients send")
    oa.set_defaults(func=run)


def run(a) -> int:
    from ..serving.openai_api import Frontend, Server
    from ..serving.server import check_ports
    host, sep, port = a.triton_url.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise UserError(f"--triton-url {a.triton_url}: expected HOST:GRPC_PORT, e.g. 127.0.0.1:8001")
    check_ports(a.host, {"--port": a.port})
    print(f"dllm-deploy: OpenAI API for model {a.served_model_name} at http://{a.host}:{a.port}/v1 "
          f"(Triton gRPC {a.triton_url})", file=sys.stderr, flush=True)
    Server(Frontend(a.triton_url, a.served_model_name), a.host, a.port).run()
    return 0
