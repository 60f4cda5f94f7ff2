"""The built-in model families, one file each (models/registry.py imports them on first lookup).

Adding a decoder-only family takes its file here (or in your own package, registered with
``dllm_deploy.register_family``), a module only if ``models/transformer.py`` cannot express it,
and its tests: docs/families.md.
"""

# model_types recognised but not supported yet: model_type -> why (the loader's one-line refusal)
UNSUPPORTED: dict[str, str] = {
    "diffusion_gemma": "only `dllm-deploy export` takes the checkpoint; `generate`, `serve` and Runtime.load take "
                       "its artifact: docs/diffusion_gemma.md",
}

# model_types whose artifact another writer builds (graphs of other roles): model_type -> "module:function"
# (function(work_folder, checkpoint_folder, opset, log) -> manifest), used by export/exporter.py
OWN_EXPORT: dict[str, str] = {"diffusion_gemma": "dllm_deploy.export.diffusion_gemma:write_artifact"}
