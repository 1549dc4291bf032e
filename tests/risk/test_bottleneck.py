"""Why requests wait, told from what /metrics shows: one resource per cause."""

from __future__ import annotations

from exporter.risk.bottleneck import STALL_SECONDS, classify, settled
from exporter.risk.model import Point

CAPACITY = 100_000.0


def polls(
    seconds: float,
    *,
    usage: float,
    running: float,
    waiting: float,
    prompt_rate: float = 3000.0,
    generation_rate: float = 500.0,
    preemptions: float = 0.0,
) -> list[Point]:
    """A poll every 2 s of a steady state with these figures and counter rates."""
    return [
        Point(
            t, usage, running, waiting, t / 2, generation_rate * t, 0,
            prompt=prompt_rate * t, preemptions=preemptions * t / seconds,
        )
        for t in (2.0 * i for i in range(int(seconds / 2) + 1))
    ]  # fmt: skip


def test_nobody_waiting_is_no_bottleneck() -> None:
    assert classify(polls(60, usage=0.9, running=40, waiting=0), CAPACITY, 64, 1500).resource == (
        "none"
    )


def one_waiting_at(pts: list[Point], *indices: int) -> list[Point]:
    out = list(pts)
    for i in indices:
        p = out[i]
        out[i] = Point(p.t, p.usage, p.running, 1, p.finished, p.generated, 0, prompt=p.prompt,
                       preemptions=p.preemptions)  # fmt: skip
    return out


def test_the_gauge_shows_no_queue_for_a_request_caught_between_two_steps() -> None:
    # A busy server with no queue: one poll in a few reads a request that arrived since
    # the last poll and waits for the next step.
    pts = one_waiting_at(polls(60, usage=0.3, running=20, waiting=0), -1)
    shown = settled(classify(pts, CAPACITY, 64, 1500), pts)
    assert shown.resource == "none"
    assert "none at the poll before" in shown.evidence


def test_the_gauge_shows_a_queue_a_second_poll_still_sees() -> None:
    pts = one_waiting_at(polls(60, usage=0.3, running=20, waiting=0), -2, -1)
    assert settled(classify(pts, CAPACITY, 64, 1500), pts).resource == "compute"


def test_the_gauge_shows_a_burst_at_once_though_the_poll_before_saw_no_queue() -> None:
    # Real vLLM (e2e): a wave of 56 prompts into an idle, prefill-bound server; the poll
    # after it reads 2 running and 54 waiting. Nothing admits 54 by the next step.
    pts = polls(60, usage=0.0, running=0, waiting=0)
    p = pts[-1]
    pts[-1] = Point(p.t, 0.11, 2, 54, pts[-2].finished, p.generated, 0, prompt=p.prompt,
                    preemptions=0.0)  # fmt: skip
    assert settled(classify(pts, CAPACITY, 64, 1500), pts).resource == "compute"


def test_the_gauge_shows_a_queue_at_the_first_poll() -> None:
    # Nothing before it to tell a queue from a request between steps (a cold start).
    first = polls(60, usage=0.1, running=6, waiting=58)[:1]
    assert settled(classify(first, CAPACITY, 64, 1500), first).resource == "compute"


def test_what_a_new_queue_waits_on_is_known_at_once() -> None:
    # A burst that arrived since the last poll: the risk model takes classify's answer,
    # so a prefill-bound burst is not counted whole into the cache before a second poll.
    pts = polls(60, usage=0.13, running=6, waiting=0)
    p = pts[-1]
    pts[-1] = Point(p.t, 0.13, 6, 58, p.finished, p.generated, 0, prompt=p.prompt)
    assert classify(pts, CAPACITY, 64, 1500).resource == "compute"


def test_a_queue_while_the_cache_has_room_and_the_batch_has_slots_is_compute() -> None:
    # The prefill-bound burst: 58 waiting, 13 % of the cache used, 6 of 64 running.
    b = classify(polls(60, usage=0.13, running=6, waiting=58), CAPACITY, 64, 1500)
    assert b.resource == "compute"
    assert "58 waiting" in b.evidence


def test_a_queue_behind_a_full_batch_is_max_num_seqs() -> None:
    b = classify(polls(60, usage=0.8, running=64, waiting=10), CAPACITY, 64, 1500)
    assert b.resource == "max_num_seqs"


def test_a_queue_whose_prompt_does_not_fit_is_kv_cache() -> None:
    # 1,000 tokens free, a typical prompt needs 1,500.
    b = classify(polls(60, usage=0.99, running=40, waiting=10), CAPACITY, 256, 1500)
    assert b.resource == "kv_cache"


def test_recent_preemptions_make_it_kv_cache_even_with_room_now() -> None:
    b = classify(polls(60, usage=0.6, running=40, waiting=3, preemptions=5), CAPACITY, 256, 1500)
    assert b.resource == "kv_cache"


def test_a_full_batch_binds_before_a_full_cache_as_vllm_checks_it_first() -> None:
    b = classify(polls(60, usage=0.995, running=64, waiting=10), CAPACITY, 64, 1500)
    assert b.resource == "max_num_seqs"


def test_a_queue_with_no_progress_and_a_free_cache_is_stalled() -> None:
    frozen = polls(60, usage=0.05, running=0, waiting=12, prompt_rate=0, generation_rate=0)
    b = classify(frozen, CAPACITY, 256, 1500)
    assert b.resource == "stalled"


def test_admission_stopped_while_running_requests_still_generate_is_stalled() -> None:
    stuck = polls(60, usage=0.3, running=4, waiting=12, prompt_rate=0)
    assert classify(stuck, CAPACITY, 256, 1500).resource == "stalled"


def test_a_stall_needs_the_whole_window_of_evidence() -> None:
    short = polls(STALL_SECONDS - 10, usage=0.05, running=0, waiting=12, prompt_rate=0,
                  generation_rate=0)  # fmt: skip
    assert classify(short, CAPACITY, 256, 1500).resource != "stalled"


def test_a_long_prompt_prefilled_in_chunks_is_not_a_stall() -> None:
    # No prompt finished prefill for 60 s, but the cache grows chunk by chunk.
    chunked = [
        Point(t, 0.1 + t / 1000, 1, 5, 0, 0, 0, prompt=0.0, preemptions=0.0)
        for t in range(0, 62, 2)
    ]
    assert classify(chunked, CAPACITY, 256, 1500).resource == "compute"


def test_without_a_typical_prompt_a_running_sequence_stands_in() -> None:
    # 99 % of 100,000 used by 40 running: 2,475 tokens each; 1,000 free do not hold one.
    b = classify(polls(60, usage=0.99, running=40, waiting=2), CAPACITY, 256, None)
    assert b.resource == "kv_cache"
