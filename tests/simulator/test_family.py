"""The randomized family of the alert benchmark's fuzz tier: reproducible, wide, and placed
by plan --traffic's own search."""

from __future__ import annotations

import dataclasses
import statistics
from collections import Counter

import pytest

from exporter.capacity import memory
from exporter.plan.traffic import Traffic, replay
from exporter.simulator import family, simulation
from exporter.simulator.family import HOUR, Tenant, draw, place, shape_at
from exporter.simulator.simulation import Simulation


def test_a_seed_draws_the_same_hour_every_time() -> None:
    a, b = draw(17), draw(17)
    assert (a.kind, a.deployment, a.shape, a.tenants) == (b.kind, b.deployment, b.shape, b.tenants)
    assert a.arrivals == b.arrivals


def test_forty_seeds_draw_every_kind_process_and_shape() -> None:
    draws = [draw(seed) for seed in range(40)]
    assert set(family.KINDS) <= {d.kind for d in draws}
    assert {"poisson", "mmpp", "hawkes"} <= {t.process for d in draws for t in d.tenants}
    assert {"flat", "ramp", "wave", "abrupt"} <= {d.shape for d in draws}
    assert any(t.session_share for d in draws for t in d.tenants)
    assert any(a.n > 1 for d in draws for a in d.arrivals)
    assert any(len(d.tenants) > 1 for d in draws)
    assert any("max_num_seqs" in d.deployment for d in draws)
    assert any("max_num_batched_tokens" in d.deployment for d in draws)
    assert len({d.deployment["model"] for d in draws}) >= 6


def test_every_request_fits_the_drawn_context() -> None:
    for seed in range(10):
        d = draw(seed)
        context = d.deployment["max_model_len"]
        assert all(a.prompt + a.generation <= context for a in d.arrivals), seed


def _tenant(process: str, **params: float) -> Tenant:
    return Tenant(1.0, process, params, 100.0, 0.5, 0.0, 1.5, 50.0, 0.5, 0, 1, 0.0, 2.0, 10.0,
                  0.0, 2)  # fmt: skip


def test_each_arrival_process_keeps_the_rate_it_is_given() -> None:
    # Bursts and clusters reshape the arrivals, not their mean: an hour at 2 requests a
    # second brings 7,200 of them on average whatever the process (over 40 hours: a burst
    # of a minute brings ~900 requests, so one hour alone swings by thousands).
    import random

    for tenant in (
        _tenant("poisson"),
        _tenant("mmpp", ratio=30.0, burst_share=0.1, burst_seconds=60.0),
        _tenant("hawkes", branching=0.7, decay=10.0),
    ):
        counts = [len(family._times(random.Random(k), tenant, 2.0, "flat", {})) for k in range(40)]
        assert abs(statistics.fmean(counts) / 7200 - 1) < 0.2, (tenant.process, counts)


def test_bursts_come_in_bursts() -> None:
    # The Markov-modulated process: most of its requests arrive in a fifth of its minutes.
    import random

    tenant = _tenant("mmpp", ratio=50.0, burst_share=0.1, burst_seconds=60.0)
    times = family._times(random.Random(3), tenant, 2.0, "flat", {})
    per_minute = sorted(Counter(int(t // 60) for t in times).values(), reverse=True)
    assert sum(per_minute[:12]) > 0.6 * len(times)


def test_an_abrupt_hour_steps_up_and_a_ramp_grows() -> None:
    abrupt = {"before": 0.1, "at": 600.0}
    assert shape_at("abrupt", abrupt, 599.0) == 0.1
    assert shape_at("abrupt", abrupt, 600.0) == 1.0
    ramp = {"growth": 4.0, "ramp_from": 0.0, "ramp_seconds": 1800.0}
    assert shape_at("ramp", ramp, 0.0) == 0.25
    assert shape_at("ramp", ramp, HOUR) == 1.0


def test_a_placed_hour_runs_at_its_fraction_of_the_largest_multiple_held() -> None:
    d = draw(12)  # a light hour on a small GPU: few requests, a quick search
    placed = place(d)
    limit = placed.limit
    assert limit.held is not None
    assert limit.failed is not None
    assert limit.failed / limit.held - 1 <= family.PRECISION
    assert placed.multiple is not None
    assert placed.multiple == limit.held * d.fraction
    held = limit.at(limit.held)
    failed = limit.at(limit.failed)
    assert held is not None
    assert held.held
    assert not held.preemptions
    assert failed is not None
    assert failed.preemptions > 0
    scenario = placed.scenario()
    assert scenario.tags[0] == d.kind
    # The scenario replays exactly the coupled sample the search scaled.
    traffic = Traffic.of(d.name, d.arrivals, d.seed)
    assert list(scenario.requests) == traffic.at(placed.multiple)
    outcome = replay(traffic, family.engine_for(d), placed.multiple, max_queue_wait=float("inf"))
    assert outcome.preemptions == 0


def test_a_refit_of_plans_residuals_leaves_the_tiers_engines_where_they_were(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Today's residuals doubled stand for a refit: an ordinary scenario's engine shrinks, the
    # tier's (searched and replayed) do not, so the tier is not re-placed by it.
    d = draw(12)
    before = family.engine_for(d)
    scenario = family.Placed(d, place(d).limit, 1.0).scenario()
    replayed = Simulation(scenario).engine.config
    plain = dataclasses.replace(scenario, overhead=None)
    ordinary = Simulation(plain).engine.config
    refit = dataclasses.replace(
        memory.DEFAULT_OVERHEAD,
        compile_bytes=2 * memory.DEFAULT_OVERHEAD.compile_bytes,
        non_torch_single_by_era=tuple(
            (since, 2 * b) for since, b in memory.DEFAULT_OVERHEAD.non_torch_single_by_era
        ),
    )
    monkeypatch.setattr(simulation, "DEFAULT_OVERHEAD", refit)
    assert Simulation(plain).engine.config.num_blocks < ordinary.num_blocks
    assert draw(12) == d  # its arrivals are drawn at the capacity plan gives too
    assert family.engine_for(d) == before
    assert Simulation(scenario).engine.config == replayed == before
