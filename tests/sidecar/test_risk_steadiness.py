"""The score the alerts hold for 15 s, from the sidecar's own poll pipeline watching the
demo's simulated vLLM at the demo's 1-s polls (as tests/integration/test_prometheus_stack.py
scrapes it)."""

from __future__ import annotations

from exporter.replay import replay
from exporter.risk.model import WARNING_FOR_SECONDS, WARNING_THRESHOLD
from exporter.simulator.simulation import load_scenario


def test_once_the_demos_score_crosses_the_warning_threshold_it_holds_until_vllm_preempts() -> None:
    # A request caught between two steps once read as a prefill-paced queue for one poll:
    # the score fell from 0.8 to 0.005 and back, resetting the warning's 15 s, and a real
    # Prometheus saw vLLM preempt with no warning (stop 42's CI).
    run = replay(load_scenario("demo"), interval=1.0, after_preemption=0.0)
    assert run.first_preemption_at is not None
    before = [t for t in run.ticks if t.t < run.first_preemption_at]
    crossed = next(i for i, t in enumerate(before) if t.preemption_risk > WARNING_THRESHOLD)
    held = before[crossed:]
    dips = [round(t.preemption_risk, 3) for t in held if t.preemption_risk <= WARNING_THRESHOLD]
    assert dips == []
    assert held[-1].t - held[0].t > 2 * WARNING_FOR_SECONDS
