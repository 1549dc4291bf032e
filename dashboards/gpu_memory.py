"""gpu-memory.json: GPU memory: totals, what this vLLM is expected to take and what others use."""

from __future__ import annotations

from grafana_foundation_sdk.models import common as common_m
from grafana_foundation_sdk.models import dashboard as dashboard_m
from grafana_foundation_sdk.models import prometheus as prometheus_m

from dashboards.lib.frame import frame
from dashboards.lib.panels import stat, table, timeseries
from dashboards.lib.queries import (
    Q,
    agg,
    named,
    ours,
    sel,
    with_model,
)


def gpu_memory() -> dashboard_m.Dashboard:
    def per_gpu(metric: str) -> str:
        return ours("max", metric, by=("gpu",))

    used_share = named(
        with_model(
            agg("max", sel("kv_headroom_gpu_memory_used_bytes"), "gpu")
            + " / "
            + agg("max", sel("kv_headroom_gpu_memory_total_bytes"), "gpu")
        )
    )
    return (
        frame(
            "GPU memory",
            "kv-headroom-gpu",
            "Memory on the GPUs each vLLM uses (NVML): total, used, and used by anything "
            "that is not this vLLM.",
        )
        .with_panel(
            timeseries(
                "GPU memory used vs total",
                "Per GPU: memory used by every process and the total, with vLLM's ceiling "
                "(total × gpu_memory_utilization). Used well above the ceiling means "
                "something else shares the GPU.",
                "bytes",
                [
                    Q(per_gpu("kv_headroom_gpu_memory_used_bytes"), "{{target}} GPU {{gpu}} used"),
                    Q(
                        per_gpu("kv_headroom_gpu_memory_total_bytes"),
                        "{{target}} GPU {{gpu}} total",
                    ),
                    Q(ours("max", "kv_headroom_memory_ceiling_bytes"), "{{target}} ceiling"),
                ],
                span=12,
                height=9,
            )
        )
        .with_panel(
            timeseries(
                "Foreign GPU memory",
                "Memory used beyond this vLLM's expected footprint (its ceiling plus CUDA "
                "context): another process, a leak, or a second model. vLLM's startup "
                "profile takes it from the KV cache, so a restart with it present shrinks "
                "the cache: find and move it, or lower gpu_memory_utilization to leave it "
                "room.",
                "bytes",
                [Q(per_gpu("kv_headroom_gpu_memory_foreign_bytes"), "{{target}} GPU {{gpu}}")],
                span=12,
                height=9,
                thresholds=((None, "green"), (1024**3, "orange")),
                threshold_style=common_m.GraphThresholdsStyleMode.DASHED,
            )
        )
        .with_panel(
            timeseries(
                "GPU memory used share",
                "Used ÷ total per GPU. vLLM pre-allocates its cache, so this sits near "
                "gpu_memory_utilization whatever the load; a rise above it is foreign "
                "memory, a fall means vLLM is down.",
                "percentunit",
                [Q(used_share, "{{target}} GPU {{gpu}}")],
                span=12,
                max_val=1,
            )
        )
        .with_panel(
            stat(
                "NVML source up",
                "1 when the sidecar read NVML at its last poll. At 0 the GPU panels are "
                "empty: the sidecar lacks the NVIDIA library, a GPU or permission (see its "
                "source_down log event). No data at all: NVML is disabled (nvml.enabled).",
                "short",
                [Q(ours("min", "kv_headroom_source_up", 'source="nvml"'))],
                span=12,
                height=8,
                thresholds=((None, "red"), (1, "green")),
                decimals=0,
            )
        )
        .with_panel(
            table(
                "GPUs",
                "The GPUs each vLLM uses: index, UUID and name as NVML reports them, with "
                "the model served. Use the UUID to find the GPU in the node's nvidia-smi.",
                "short",
                [
                    Q(
                        with_model(sel("kv_headroom_gpu_info")),
                        "",
                        instant=True,
                        fmt=prometheus_m.PromQueryFormat.TABLE,
                    )
                ],
            )
        )
        .build()
    )
