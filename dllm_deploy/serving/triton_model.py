"""The Python-backend model of a ``dllm-deploy triton-repo`` repository (copied as ``1/model.py``).

Runs under a stock tritonserver's Python backend stub, not in this package's process: it imports
``dllm_deploy`` from the stub's Python (PYTHONPATH / the execution environment, docs/serving.md)
and reads everything else from its config.pbtxt parameters (the artifact, the decode defaults, the
limits). The same request checks (contract.py) and scheduler as ``dllm-deploy serve``:
- model ``dllm`` (one response each, dynamic batching): the requests of one ``execute`` call are
  decoded together and answered when all are done;
- model ``dllm_stream`` (decoupled): ``execute`` hands each request to the scheduler and returns;
  its chunks go out through the request's response sender as they come, so requests arriving
  while others decode join the next batch.
"""
import json
import queue

import triton_python_backend_utils as pb_utils

from dllm_deploy.runtime.api import Runtime
from dllm_deploy.serving.contract import (INPUTS, BadRequest, Limits, cancel_target, check_parameters,
                                          check_with_runtime, parse_request, response)
from dllm_deploy.serving.scheduler import Scheduler
from dllm_deploy.serving.server import collect


class TritonPythonModel:
    def initialize(self, args):
        self.final = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
        config = json.loads(args["model_config"])
        params = {k: v["string_value"] for k, v in config["parameters"].items()}
        self.batched = config.get("max_batch_size", 0) > 0
        self.decoupled = config.get("model_transaction_policy", {}).get("decoupled", False)
        self.runtime = Runtime.load(artifact=params["artifact"], profile=params["profile"])
        self.defaults = json.loads(params["defaults"])
        self.limits = Limits(**json.loads(params["limits"]))
        self.scheduler = Scheduler(self.runtime, max_batch=int(params["max_batch"]), max_queue=self.limits.max_queue)

    def _outputs(self, tensors: dict):
        """A response from contract.response's tensors (a batch dimension added on a batched model)."""
        return pb_utils.InferenceResponse(output_tensors=[
            pb_utils.Tensor(name, value[None] if self.batched else value) for name, value in tensors.items()])

    @staticmethod
    def _inputs(request) -> dict:
        inputs = {}
        for name, *_ in INPUTS:
            tensor = pb_utils.get_input_tensor_by_name(request, name)
            if tensor is not None:
                inputs[name] = tensor.as_numpy()
        check_parameters(json.loads(request.parameters() or "{}"))
        return inputs

    def _cancelled(self, request):
        """The response to a ``cancel`` request (None: not one)."""
        target = cancel_target(self._inputs(request))
        if target is None:
            return None
        if not self.scheduler.cancel(target):
            raise BadRequest(f"cancel: no request {target!r} in flight (it may have finished)")
        return self._outputs(response("", [], 0, "cancelled", 0))

    def _parse(self, request):
        inputs = self._inputs(request)
        parsed = parse_request(inputs, self.runtime.tokenizer, self.limits, self.defaults, chat=self.runtime.chat_prompt,
                               strategies=self.runtime.strategies)
        check_with_runtime(self.runtime, parsed)
        return parsed

    def execute(self, requests):
        return self._stream(requests) if self.decoupled else self._plain(requests)

    def _plain(self, requests):
        """Every request submitted first (they decode as one batch), then each answered."""
        boxes = []
        for request in requests:
            box, prompt_tokens = queue.Queue(), 0
            try:
                if (done := self._cancelled(request)) is not None:
                    boxes.append((done, 0))
                    continue
                parsed = self._parse(request)
                if parsed.stream:
                    raise BadRequest("stream: model dllm answers once; stream from model dllm_stream")
                prompt_tokens = parsed.prompt_tokens
                self.scheduler.submit(parsed, box.put)
            except BadRequest as e:
                box.put(e)
            boxes.append((box, prompt_tokens))
        out = []
        for box, prompt_tokens in boxes:
            if not isinstance(box, queue.Queue):          # a cancel request's response
                out.append(box)
                continue
            try:
                out.append(self._outputs(collect(iter(box.get, None), prompt_tokens)))
            except BadRequest as e:
                out.append(pb_utils.InferenceResponse(error=pb_utils.TritonError(str(e))))
        return out

    def _stream(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            try:
                if (done := self._cancelled(request)) is not None:
                    sender.send(done, flags=self.final)
                    continue
                parsed = self._parse(request)
            except BadRequest as e:
                sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError(str(e))), flags=self.final)
                continue
            self.scheduler.submit(parsed, self._deliver(sender, parsed.stream, parsed.prompt_tokens))
        return None

    def _deliver(self, sender, stream: bool, prompt_tokens: int):
        """The scheduler's callback for one request: each chunk sent (streaming), or the whole
        result once it is final; an exception ends the request with its message."""
        chunks = []

        def deliver(item):
            if isinstance(item, Exception):
                sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError(str(item))), flags=self.final)
                return
            last = item["finish_reason"] is not None
            if stream:
                sender.send(self._outputs(response(item["delta"], item["token_ids"], item["forwards"],
                                                   item["finish_reason"], prompt_tokens)), flags=self.final if last else 0)
            else:
                chunks.append(item)
                if last:
                    sender.send(self._outputs(collect(iter(chunks), prompt_tokens)), flags=self.final)
        return deliver

    def finalize(self):
        self.scheduler.close()
