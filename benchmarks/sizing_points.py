"""Real vLLM start-up figures (tests/fixtures/sizing/vllm_startup_points.csv) as plan requests.

Each row is one vLLM start: GPU, flags and what vLLM printed (available KV memory, blocks,
tokens, concurrency). Shared by the accuracy benchmark and the tests that reproduce them.

Rows whose ``gpu`` is ``cpu`` are starts of vLLM's CPU backend captured on this project's own
machine (tests/fixtures/sizing/cpu-0.32/): their KV memory is ``VLLM_CPU_KVCACHE_SPACE``
GiB, a setting known to the byte, so they test exactness; being set rather than measured,
they say nothing about predicting the memory (see :attr:`StartupPoint.kv_memory_set`).
"""

from __future__ import annotations

import csv
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal

from exporter.capacity.arch import parse_config
from exporter.capacity.gpus import GIB, lookup_gpu
from exporter.capacity.plan import PlanRequest
from exporter.capacity.releases import release
from exporter.sources.model_dir import load_model

ROOT = Path(__file__).resolve().parent.parent
POINTS = ROOT / "tests" / "fixtures" / "sizing" / "vllm_startup_points.csv"
CONFIGS = ROOT / "tests" / "fixtures" / "models"
# Configs of public start-ups whose checkpoint is not in the catalogue (README.md beside the CSV).
STARTUP_CONFIGS = POINTS.parent / "configs"


@dataclass(frozen=True)
class StartupPoint:
    row: int
    model: str
    version: str
    tp: int
    pp: int
    max_model_len: int
    kv_cache_dtype: str
    quantization: str
    printed_kv_bytes: int  # "Available KV cache memory: X GiB", as a byte count
    tokens: int | None  # None when vLLM refused to start before printing it
    blocks: int | None
    concurrency: float | None
    dtype: str
    request: PlanRequest  # the deployment, with no printed figure in it
    exact: bool = True  # the printed worker is the tightest one, so its figures follow
    family: str = ""  # the model's architecture family (config model_type)
    printed_weights_bytes: int | None = None  # "Model loading took X GiB", when printed

    @property
    def kv_memory_set(self) -> bool:
        """The KV memory was set (CPU backend), not profiled: an exactness row only."""
        return self.request.gpu.platform == "cpu"

    @property
    def label(self) -> str:
        extra = f" q={self.quantization}" if self.quantization else ""
        return (
            f"{self.model.split('/')[-1]} {self.version} tp{self.tp} pp{self.pp} "
            f"len{self.max_model_len} kv={self.kv_cache_dtype} {self.dtype}{extra}"
        )


def _config_dir(model: str) -> Path:
    """A catalogue model's folder, or a tiny config captured beside the CSV (cpu-0.32/...)."""
    captured = POINTS.parent / model
    if captured.is_dir():
        return captured
    folder = model.replace("/", "__")
    if (STARTUP_CONFIGS / folder).is_dir():
        return STARTUP_CONFIGS / folder
    return CONFIGS / folder


def _int(text: str) -> int | None:
    return int(text) if text else None


def _yes_no(text: str) -> bool | None:
    return {"yes": True, "no": False}.get(text)


def _runner(text: str) -> Literal["v1", "v2"] | None:
    """VLLM_USE_V2_MODEL_RUNNER as the row's command set it; empty: the release's choice."""
    if text in ("v1", "v2"):
        return "v1" if text == "v1" else "v2"
    assert not text, f"model_runner {text!r}: v1, v2 or empty"
    return None


def family_of(model_type: str) -> str:
    """``qwen3_moe`` and ``qwen3_vl_moe_text`` → ``qwen3``: leave-one-family-out groups."""
    base = model_type.removesuffix("_text")
    for suffix in ("_moe", "_vl", "_5_vl"):
        base = base.removesuffix(suffix)
    return base


def load_points(path: Path = POINTS) -> list[StartupPoint]:
    points = []
    with path.open(newline="", encoding="utf-8") as f:
        for i, row in enumerate(csv.DictReader(f), start=2):
            m = re.search(r"\bdtype=(auto|bfloat16|float16|float32)\b", row["notes"])
            dtype = m.group(1) if m else "auto"
            source = load_model(str(_config_dir(row["model"])))
            arch = parse_config(source.config, source.config_path, dtype=dtype, name=row["model"])
            gpu = lookup_gpu(row["gpu"])
            if row.get("gpu_family"):  # a GPU given by its size: what the log says it is
                gpu = replace(gpu, family=row["gpu_family"])
            if row["gpu_mem_gib"]:
                assert round(gpu.total_bytes / GIB, 2) == float(row["gpu_mem_gib"]), row["gpu"]
            printed_kv_bytes = round(float(row["reported_kv_cache_gib"]) * GIB)
            utilization = row["gpu_memory_utilization"]
            request = PlanRequest(
                arch=arch,
                model_name=row["model"],
                gpu=gpu,
                release=release(row["vllm_version"]),
                gpu_memory_utilization=float(utilization) if utilization else None,
                tensor_parallel_size=int(row["tp"]),
                pipeline_parallel_size=int(row["pp"]),
                kv_cache_dtype=row["kv_cache_dtype"] or "auto",
                block_size=int(row["block_size"]) if row["block_size"] else None,
                max_model_len=int(row["max_model_len"]),
                max_num_batched_tokens=_int(row.get("max_num_batched_tokens") or ""),
                max_num_seqs=_int(row.get("max_num_seqs") or ""),
                quantization=row["quantization"] or None,
                flashinfer_installed=_yes_no(row.get("flashinfer") or ""),
                enable_prefix_caching=_yes_no(row.get("prefix_caching") or ""),
                model_runner=_runner(row.get("model_runner") or ""),
                # On CPU the figure is the deployment's setting (VLLM_CPU_KVCACHE_SPACE).
                kv_cache_memory_bytes=printed_kv_bytes if gpu.platform == "cpu" else None,
            )
            concurrency = row["reported_max_concurrency"]
            points.append(
                StartupPoint(
                    row=i,
                    model=row["model"],
                    version=row["vllm_version"],
                    tp=int(row["tp"]),
                    pp=int(row["pp"]),
                    max_model_len=int(row["max_model_len"]),
                    kv_cache_dtype=row["kv_cache_dtype"],
                    quantization=row["quantization"],
                    printed_kv_bytes=printed_kv_bytes,
                    tokens=_int(row["reported_kv_tokens"]),
                    blocks=_int(row["reported_gpu_blocks"]),
                    concurrency=float(concurrency) if concurrency else None,
                    dtype=dtype,
                    request=request,
                    exact=row.get("exact", "yes") != "no",
                    family=family_of(arch.model_type),
                    printed_weights_bytes=(
                        round(float(row["reported_weights_gib"]) * GIB)
                        if row["reported_weights_gib"]
                        else None
                    ),
                )
            )
    return points
