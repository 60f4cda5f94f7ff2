"""``python -m dllm_deploy.cli``: the same as the ``dllm-deploy`` console script."""
from . import entry

entry()
