"""Issue 13 on real vLLM 0.32 (CPU), each on a freshly started server with a fresh sidecar.

A cold start into a burst must get ``preemption_risk`` above the alert threshold before
vLLM's first preemption, on a figure that says it rests on priors; a queue held back by
prefill compute (the issue's reproduction) must keep the risk below the threshold while
the bottleneck gauge says ``compute``; a queue behind ``max_num_seqs`` likewise, with the
gauge saying ``max_num_seqs``. On a failure the message is the sidecar's gauges
over time.
"""

from __future__ import annotations

import pytest

from exporter.risk.model import TREND_MIN_SECONDS, WARNING_THRESHOLD
from tests.e2e.fresh import (
    BATCH_MAX_SEQS,
    BATCH_REQUESTS,
    COLD_IDLE_S,
    COMPUTE_WAVE,
    ColdStartRun,
    QueueRun,
)
from tests.e2e.gauges import timeline as _timeline

pytestmark = pytest.mark.vllm


def timeline(run: ColdStartRun | QueueRun, until: float | None = None) -> str:
    return "sidecar's gauges, seconds after it started:\n" + _timeline(
        run.readings, run.sidecar_started, until
    )


def test_the_burst_arrives_in_the_sidecars_first_30_seconds_and_preempts(
    cold_start: ColdStartRun,
) -> None:
    assert cold_start.burst_at - cold_start.sidecar_spawned < 30.0
    assert cold_start.burst_at - cold_start.sidecar_started >= COLD_IDLE_S
    assert cold_start.first_preemption is not None, "the burst never made vLLM preempt"


def test_the_warnings_condition_holds_before_vllm_counts_its_first_preemption(
    cold_start: ColdStartRun,
) -> None:
    first = cold_start.first_preemption
    assert first is not None
    assert cold_start.warning is not None, timeline(cold_start, first)
    assert cold_start.warning.t < first


def test_the_risk_exceeds_the_threshold_before_vllm_evicts_a_running_request(
    cold_start: ColdStartRun,
) -> None:
    # The score, not the warning: the warning's usage gate passes seconds before the cache
    # is full (docs/risk-model.md, stop 46); the score must know before vLLM acts.
    evicted = cold_start.first_eviction
    assert evicted is not None, "no running request of the burst went back to the queue"
    assert cold_start.high is not None, timeline(cold_start, evicted)
    assert cold_start.high.t < evicted, timeline(cold_start, evicted)


def test_the_cold_start_warning_says_it_rests_on_priors(cold_start: ColdStartRun) -> None:
    warning = cold_start.warning
    assert warning is not None, timeline(cold_start)
    assert warning.history is not None, timeline(cold_start)
    assert warning.history < TREND_MIN_SECONDS
    # this epoch's history is the sidecar's own: no older than its process (on a loaded
    # machine it polled for 11 s before /healthz answered)
    assert warning.history <= warning.t - cold_start.sidecar_spawned + 0.5


def assert_calm(run: QueueRun) -> None:
    """No reading at or above the alert threshold while the sidecar saw requests wait."""
    assert run.queued, timeline(run)
    high = [r for r in run.queued if r.risk is None or r.risk >= WARNING_THRESHOLD]
    assert not high, timeline(run, high[-1].t + 10)


def assert_named(run: QueueRun, resource: str) -> None:
    """The bottleneck gauge names ``resource`` at every queued reading once settled."""
    assert run.settled, timeline(run)
    wrong = [r for r in run.settled if r.bottleneck != resource]
    assert not wrong, timeline(run, wrong[-1].t + 10)


def test_the_compute_bound_workload_queues_dozens_on_a_mostly_free_cache(
    compute_bound: QueueRun,
) -> None:
    samples = compute_bound.samples
    assert max(s.waiting for s in samples) >= COMPUTE_WAVE / 2
    assert max(s.usage for s in samples) < 0.5
    assert compute_bound.preemptions == 0


def test_the_risk_stays_below_the_threshold_while_compute_holds_the_queue(
    compute_bound: QueueRun,
) -> None:
    assert_calm(compute_bound)


def test_the_bottleneck_gauge_says_compute_while_requests_wait(
    compute_bound: QueueRun,
) -> None:
    assert_named(compute_bound, "compute")


def test_the_batch_bound_workload_queues_behind_max_num_seqs_on_a_mostly_free_cache(
    batch_bound: QueueRun,
) -> None:
    samples = batch_bound.samples
    assert max(s.running for s in samples) == BATCH_MAX_SEQS
    assert max(s.waiting for s in samples) >= BATCH_REQUESTS / 2
    assert max(s.usage for s in samples) < 0.5
    assert batch_bound.preemptions == 0


def test_the_risk_stays_below_the_threshold_while_max_num_seqs_holds_the_queue(
    batch_bound: QueueRun,
) -> None:
    assert_calm(batch_bound)


def test_the_bottleneck_gauge_says_max_num_seqs_while_requests_wait_for_a_slot(
    batch_bound: QueueRun,
) -> None:
    assert_named(batch_bound, "max_num_seqs")
