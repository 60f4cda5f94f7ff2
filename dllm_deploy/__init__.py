"""dllm-deploy: deploy diffusion language models through ONNX Runtime and TensorRT.

    import dllm_deploy as dd
    rt = dd.Runtime.load("tiny")
    out = rt.generate(["upper: hello world\\n"], strategy="spd", beam_width=4)
"""
from .errors import UserError
from .models.capabilities import Capabilities
from .models.registry import Family, NameMap, register_family
from .runtime.api import Runtime, decode_config
from .runtime.strategies import DecodeConfig

__version__ = "0.1.0"
__all__ = ["Runtime", "DecodeConfig", "decode_config", "UserError", "Family", "NameMap", "Capabilities",
           "register_family", "__version__"]
