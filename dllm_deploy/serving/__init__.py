"""Serving: Triton Inference Server over the runtime (docs/serving.md)."""
