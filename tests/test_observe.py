"""Counters and histograms survive vLLM restarts: totals only ever grow."""

from __future__ import annotations

from exporter.capacity.histogram import Histogram
from exporter.observe import Folder, History, Observation, advance, fold, restarted
from exporter.sources.vllm_page import EngineMetrics, VllmPage


def engine(preemptions: float, finished: float, count: float = 0.0) -> EngineMetrics:
    h = Histogram((100.0,), (count, count), count * 50, count)
    return EngineMetrics("0", preemptions=preemptions, requests_finished=finished, prompt_len=h)


def test_first_read_counts_nothing() -> None:
    t = advance(None, None, engine(29, 40, 40))
    assert t.preemptions == 0
    assert t.prompt_len is None


def test_increases_accumulate() -> None:
    t = advance(None, None, engine(1, 1))
    t = advance(t, engine(1, 1), engine(4, 2))
    assert t.preemptions == 3
    assert t.requests_finished == 1


def test_a_restart_adds_the_new_count_never_a_negative_one() -> None:
    a, b, c = engine(10, 10, 10), engine(12, 11, 11), engine(2, 0, 1)
    t = advance(advance(advance(None, None, a), a, b), b, c)
    assert restarted(b, c)
    assert t.preemptions == 2 + 2
    assert t.prompt_len is not None
    assert t.prompt_len.count == 1 + 1


def test_history_drops_what_is_older_than_it_keeps() -> None:
    h = History(keep_seconds=10, max_len=100)
    for second in range(30):
        h.append(Observation(float(second), None))
    assert len(h) == 11
    assert h.at_or_after(25.0) is not None


def test_history_is_bounded_by_length_too() -> None:
    h = History(keep_seconds=1e9, max_len=5)
    for second in range(30):
        h.append(Observation(float(second), None))
    assert len(h) == 5


def test_history_windows_are_the_observations_at_or_after_their_start() -> None:
    # Bounded by length, by age, and with the newest dropped: the windows stay those a
    # scan of the ring would find.
    h = History(keep_seconds=20, max_len=15)
    for second in range(40):
        h.append(Observation(float(second), None))
    h.drop_latest()
    times = [o.time for o in h]
    assert times == [float(s) for s in range(25, 39)]
    for since in (0.0, 25.0, 30.5, 38.0, 39.0):
        assert [o.time for o in h.recent(since)] == [t for t in times if t >= since]
        first = h.at_or_after(since)
        assert (first.time if first else None) == next((t for t in times if t >= since), None)


def test_an_observations_points_are_the_risk_models_view_of_each_engine_that_reported_usage() -> (
    None
):
    page = VllmPage(
        (
            EngineMetrics("0", running=3, waiting=1, kv_usage=0.4, requests_finished=7),
            EngineMetrics("1", running=2),  # no usage figure: nothing to assess
            EngineMetrics("0", running=9, kv_usage=0.9),  # a second read: the first counts
        )
    )
    folded = fold(fold(Folder(), 0.0, page).folder, 2.0, page).observation
    assert set(folded.points) == {"0"}
    point = folded.points["0"]
    assert (point.t, point.usage, point.running, point.waiting) == (2.0, 0.4, 3, 1)
    assert point.epoch == folded.epoch
    assert point.finished == folded.totals["0"].requests_finished


def test_an_observation_without_a_page_has_no_points() -> None:
    assert Observation(0.0, None).points == {}


def test_history_keeps_each_engines_points_as_its_observations_come_and_go() -> None:
    # Engines that come and go, vLLM down in between, the ring bounded by length and by
    # age, and the newest dropped: the kept points are those a scan of the ring finds.
    def page(second: int) -> VllmPage | None:
        if second % 7 == 3:
            return None  # vLLM did not answer
        engines = [EngineMetrics("0", running=1, kv_usage=0.1)]
        if second % 3:
            engines.append(EngineMetrics("1", running=2, kv_usage=0.2))
        return VllmPage(tuple(engines))

    h = History(keep_seconds=20, max_len=15)
    folder = Folder()
    for second in range(40):
        folded = fold(folder, float(second), page(second))
        folder = folded.folder
        h.append(folded.observation)
    h.drop_latest()
    for engine in ("0", "1", "2"):
        for since in (0.0, 25.0, 30.5, 38.0, 39.0):
            scanned = [o.points[engine] for o in h.recent(since) if engine in o.points]
            assert h.points(engine, since) == scanned
