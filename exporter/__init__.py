"""vllm-kv-headroom: KV-cache capacity and headroom for vLLM servers."""

__version__ = "0.1.0"
