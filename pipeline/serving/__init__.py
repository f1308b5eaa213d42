"""Serving on this host: local server, smoke test, load benchmark, LLM-API client and trtllm-serve inputs (the launch
plans they share with `ops.deploy` are in `pipeline.stages.package`)."""
