"""Why requests wait in mixed overloads (issue 27, item 4): a head too long for the free
blocks while the budget has room, and a preemption that no longer holds the queue.
Histories shaped like fuzz-tier polls (every 2 s, counters since the sidecar started)."""

from __future__ import annotations

from exporter.risk.bottleneck import IDLE_POLLS, WINDOW_SECONDS, classify
from exporter.risk.model import Point


def history(
    n: int,
    *,
    usage: float,
    usage_step: float,
    running: float,
    waiting: float,
    prompt_per_poll: float,
    generated_per_poll: float,
    preempted_at: float | None = None,
) -> list[Point]:
    """``n`` polls 2 s apart; usage moving by ``usage_step`` a poll; one preemption
    counted at ``preempted_at`` (seconds)."""
    return [
        Point(
            t, usage + i * usage_step, running, waiting, 100 + i * 0.2,
            50_000 + i * generated_per_poll, 0, prompt=400_000 + i * prompt_per_poll,
            preemptions=float(preempted_at is not None and t >= preempted_at),
        )
        for i, t in ((i, 2.0 * i) for i in range(n))
    ]  # fmt: skip


# A long-context hour on a big cache (fuzz seed 45): 145,472 tokens, 5 running, 3 waiting,
# the cache 90 % full and growing by decoding alone (5 running × ~20 tokens/s), no prompt
# prefilled for 30 s. 14,000 tokens are free, a typical prompt is 3,000: the head of the
# queue is a 26,000-token prompt.
CAPACITY = 145_472.0
DECODE = 5 * 2 * 19.5  # tokens generated per 2 s poll by 5 running requests
TYPICAL = 3_016.0


def test_no_prefill_with_free_blocks_for_a_typical_prompt_is_the_cache() -> None:
    pts = history(16, usage=0.900, usage_step=DECODE / CAPACITY, running=5, waiting=3,
                  prompt_per_poll=0, generated_per_poll=DECODE)  # fmt: skip
    b = classify(pts, CAPACITY, 256, TYPICAL)
    assert b.resource == "kv_cache"
    assert "head of the queue needs more blocks" in b.evidence


def test_the_same_queue_with_prompts_being_prefilled_is_compute() -> None:
    # Prompts complete prefill every poll: the step's token budget went to new work.
    pts = history(16, usage=0.900, usage_step=DECODE / CAPACITY, running=5, waiting=3,
                  prompt_per_poll=TYPICAL, generated_per_poll=DECODE)  # fmt: skip
    assert classify(pts, CAPACITY, 256, TYPICAL).resource == "compute"


def test_a_single_poll_without_prefill_is_not_enough() -> None:
    # One poll can fall between a long prompt's chunks: only IDLE_POLLS in a row count.
    pts = history(16, usage=0.900, usage_step=DECODE / CAPACITY, running=5, waiting=3,
                  prompt_per_poll=TYPICAL, generated_per_poll=DECODE)  # fmt: skip
    last = pts[-1]
    pts[-1] = Point(last.t, last.usage, last.running, last.waiting, last.finished,
                    last.generated, 0, prompt=pts[-2].prompt, preemptions=0.0)  # fmt: skip
    assert IDLE_POLLS > 1
    assert classify(pts, CAPACITY, 256, TYPICAL).resource == "compute"


def test_a_chunked_prefill_growing_the_cache_is_not_a_head_that_does_not_fit() -> None:
    # No prompt completed, but the cache grows by 4,000 tokens a poll, far beyond what
    # 5 running requests decode: a long prompt is being prefilled chunk by chunk.
    pts = history(16, usage=0.50, usage_step=4_000 / CAPACITY, running=5, waiting=3,
                  prompt_per_poll=0, generated_per_poll=DECODE)  # fmt: skip
    assert classify(pts, CAPACITY, 256, TYPICAL).resource == "compute"


# A chat overload on A100-40GB (fuzz seed 21): 67,072 tokens, 45 running, 13 waiting, the
# cache 77 % full, prompts prefilled at the budget's pace, vLLM's counter moved once.
CHAT_CAPACITY = 67_072.0
CHAT_PROMPT = 2_946.0


def pts_end() -> float:
    return 2.0 * 29  # the last of chat()'s 30 polls


def chat(preempted_at: float) -> list[Point]:
    return history(30, usage=0.77, usage_step=0.0, running=45, waiting=13,
                   prompt_per_poll=3 * CHAT_PROMPT, generated_per_poll=250,
                   preempted_at=preempted_at)  # fmt: skip


def test_a_preemption_counted_just_now_is_the_cache() -> None:
    pts = chat(preempted_at=pts_end() - 4)
    assert classify(pts, CHAT_CAPACITY, 256, CHAT_PROMPT).resource == "kv_cache"


def test_a_preemption_older_than_the_window_no_longer_holds_the_queue() -> None:
    # 15,000 tokens free hold five typical prompts and prompts are being prefilled: the
    # token budget holds the queue now, not the preemption of 20 s ago.
    pts = chat(preempted_at=pts_end() - 2 * WINDOW_SECONDS)
    b = classify(pts, CHAT_CAPACITY, 256, CHAT_PROMPT)
    assert b.resource == "compute"
