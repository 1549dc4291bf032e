"""Adapters that read the outside world, every input injectable: ``vllm`` (HTTP) and its
parser ``vllm_page``, ``cmdline`` (the vLLM process), ``nvml``, ``model_dir``; ``base``
holds what they share (the ``Source`` shape, ``Readings``, ``SourceHealth``, threads)."""
