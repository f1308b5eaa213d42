"""Serving: launch plan, local server, smoke test, load benchmark, LLM-API runtime."""
