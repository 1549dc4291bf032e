"""Adapters that read the outside world: vLLM over HTTP, NVML, files. Every input injectable."""
