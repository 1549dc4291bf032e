"""The sidecar's gauges read off its /metrics page, for the real-vLLM tier."""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass

from exporter.metrics import USAGE_PEAK_PAGE, USAGE_PEAK_WARNING
from exporter.risk.bottleneck import RESOURCES


def value(text: str, name: str, **labels: str) -> float | None:
    """One sample's value from a /metrics page; None when absent."""
    pattern = re.escape(name) + r"\{([^}]*)\} (\S+)|" + re.escape(name) + r" (\S+)"
    for m in re.finditer(r"^(?:" + pattern + r")$", text, re.M):
        have = dict(re.findall(r'(\w+)="([^"]*)"', m.group(1) or ""))
        if all(have.get(k) == v for k, v in labels.items()):
            return float(m.group(2) or m.group(3))
    return None


@dataclass(frozen=True)
class Reading:
    """The sidecar's gauges for engine 0 at one read of its /metrics."""

    t: float
    risk: float | None
    usage: float | None
    running: float | None
    waiting: float | None
    history: float | None
    preemptions: float | None  # what the sidecar itself has seen
    bottleneck: str | None  # the resource whose gauge reads 1
    load_headroom: float | None = None  # absent without traffic
    vllm_up: float | None = None  # whether the sidecar's last poll of vLLM got an answer
    # The usage's peak over the sidecar's polls of each alert's window: what the rules read.
    peak_page: float | None = None
    peak_warning: float | None = None

    def row(self, since: float) -> str:
        def f(x: float | None, spec: str) -> str:
            return "-" if x is None else format(x, spec)

        return (
            f"{self.t - since:6.1f}s risk {f(self.risk, '.2f')} usage {f(self.usage, '.2f')} "
            f"running {f(self.running, 'g')} waiting {f(self.waiting, 'g')} "
            f"30 s peak {f(self.peak_warning, '.2f')} history {f(self.history, '.0f')}s "
            f"preemptions {f(self.preemptions, 'g')} "
            f"bottleneck {self.bottleneck or '-'} load headroom {f(self.load_headroom, '.2f')} "
            f"vllm up {f(self.vllm_up, 'g')}"
        )


def reading(t: float, text: str) -> Reading:
    def v(name: str) -> float | None:
        return value(text, "kv_headroom_" + name, engine="0")

    binding = [r for r in RESOURCES if value(text, "kv_headroom_bottleneck", resource=r) == 1]
    return Reading(
        t=t,
        risk=v("preemption_risk"),
        usage=v("kv_usage_ratio"),
        running=v("requests_running"),
        waiting=v("requests_waiting"),
        history=v("risk_history_seconds"),
        preemptions=v("preemptions_total"),
        bottleneck=binding[0] if len(binding) == 1 else None,
        load_headroom=v("load_headroom_ratio"),
        vllm_up=value(text, "kv_headroom_source_up", source="vllm"),
        peak_page=v(USAGE_PEAK_PAGE),
        peak_warning=v(USAGE_PEAK_WARNING),
    )


def timeline(
    readings: Sequence[Reading], since: float, until: float | None = None, last: float = math.inf
) -> str:
    """The sidecar's readings as lines, for an assertion message: those up to ``until``, of
    its ``last`` seconds."""
    end = until if until is not None else max((r.t for r in readings), default=since)
    return "\n".join(r.row(since) for r in readings if end - last <= r.t <= end)
