"""Measuring: `dllm-deploy bench` (run, targets, memory, the other paradigms' benches) and
`dllm-deploy report` (report)."""
