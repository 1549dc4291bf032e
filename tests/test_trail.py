"""The status page's history ring: bounded, thinned by time, never losing a preemption."""

from __future__ import annotations

from dataclasses import replace

from exporter.capacity.live import Occupancy
from exporter.deployment import Deployment
from exporter.snapshot import EngineView, Snapshot
from exporter.trail import Trail, point_of

ENGINE = EngineView(
    engine="0", model_name="m", running=3.0, waiting=0.0, waiting_for_capacity=None,
    kv_usage=0.5, preemptions_total=0.0, num_blocks=101, block_size=16, capacity_tokens=1600,
    budget_bytes=None, occupancy=Occupancy(101, 16, 0.5, 3.0), context=None, contexts={},
    max_sequences={}, free_sequences={}, sequences_per_request=1.0, max_users={},
    config_overcommit_ratio=None, recommended_max_num_seqs=None, prefix_cache_hit_ratio=None,
    prefix_cache_extra_sequences=None, stale=False,
)  # fmt: skip
EMPTY = Snapshot(
    time=0.0, sources=(), poll_duration_seconds=0.0, deployment=Deployment(), model_name=None,
    attention_kind=None, kv_bytes_per_token=None, kv_bytes_per_token_source=None,
    expected=None, expected_note="", engines=(), gpus=(), vllm_ready=False,
)  # fmt: skip


def snap(t: float, preemptions: float = 0.0) -> Snapshot:
    return replace(
        EMPTY, time=t, engines=(replace(ENGINE, preemptions_total=preemptions),), vllm_ready=True
    )


def test_a_point_counts_tokens_over_the_usable_blocks() -> None:
    point = point_of(snap(1.0))
    assert point is not None
    assert point.capacity_tokens == 100 * 16  # one of the 101 blocks is vLLM's reserve
    assert point.used_tokens == 800


def test_nothing_is_kept_before_vllm_has_answered() -> None:
    trail = Trail()
    trail.add(EMPTY)
    assert trail.points() == ()


def test_polls_closer_than_the_spacing_are_thinned() -> None:
    trail = Trail(seconds=60.0, max_points=6)  # one point per 10 s
    for t in range(0, 60, 2):
        trail.add(snap(float(t)))
    assert [p.time for p in trail.points()] == [0.0, 10.0, 20.0, 30.0, 40.0, 50.0, 58.0]


def test_points_older_than_the_span_are_dropped() -> None:
    trail = Trail(seconds=60.0, max_points=600)
    for t in range(0, 200, 10):
        trail.add(snap(float(t)))
    assert trail.points()[0].time == 130.0


def test_the_ring_never_holds_more_than_its_bound() -> None:
    trail = Trail(seconds=1000.0, max_points=5)  # one per 200 s; 0..1000 s would be six
    for t in range(0, 1001, 200):
        trail.add(snap(float(t)))
    assert [p.time for p in trail.points()] == [200.0, 400.0, 600.0, 800.0, 1000.0]


def test_a_preemption_between_kept_points_is_still_dated() -> None:
    trail = Trail(seconds=60.0, max_points=6)
    trail.add(snap(0.0))
    trail.add(snap(2.0, preemptions=1.0))  # shown as the newest point, not kept
    trail.add(snap(4.0, preemptions=1.0))  # replaces it
    assert [p.time for p in trail.points()] == [0.0, 4.0]
    assert trail.last_preemption == 2.0


def test_the_first_poll_does_not_count_as_a_preemption() -> None:
    trail = Trail()
    trail.add(snap(0.0, preemptions=7.0))  # vLLM had preempted before the sidecar came
    assert trail.last_preemption is None
