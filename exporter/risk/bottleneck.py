"""Why requests wait: the one resource that keeps vLLM from admitting the next request. Pure.

vLLM's scheduler (``vllm/v1/core/sched/scheduler.py``) admits a waiting request only when
the running batch is below ``max_num_seqs``, the step's token budget
(``max_num_batched_tokens``) has room after the running requests' tokens, and the free
blocks hold its prompt. A queue therefore forms for one of four reasons, and each has a
different cure — so each is told from what ``/metrics`` shows, strongest evidence first:

* ``stalled`` — requests wait, yet for ``STALL_SECONDS`` no prompt was prefilled and the
  cache did not grow, while either nothing was generated or a request would fit (the
  batch below ``max_num_seqs``, room for the longest prompt ``max_model_len`` allows, or a
  typical one where that is unknown): the scheduler stopped
  admitting (the hang vLLM users report while ``/health`` answers 200). Cure: restart.
* ``kv_cache`` — vLLM preempted in the last ``WINDOW_SECONDS``: the cache is full. Cure:
  more KV (fp8 KV, memory, TP).
* ``max_num_seqs`` — the batch is at ``max_num_seqs`` (vLLM checks this first, so it binds
  first), less the slots its last step freed and its next step refills. Cure: raise it
  (if the cache holds that many sequences) or scale out.
* ``kv_cache`` — the head does not fit: for ``IDLE_POLLS`` polls running requests waited
  and no prompt was prefilled, the cache growing no faster than decoding fills it. The
  step's token budget was then spent on decode tokens alone (one per running request,
  far below ``max_num_batched_tokens``), so it had room, and the batch had slots: what
  kept the head out is its prompt, longer than the free blocks (the head of a queue is
  length-biased: short prompts leave it at once, so it is often longer than typical).
* ``kv_cache`` — the free tokens do not hold a typical prompt. Where prompts are being
  prefilled too, the budget and the cache may both bind; the gauge names the cache, the
  one whose relief the head needs in every case: the budget is renewed every step, the
  blocks only as requests finish (the simulator labels such a step ``kv_cache`` too).
* ``compute`` — none of the above: the cache has room and the batch has slots, so the
  step's token budget is what holds the queue back (prefill-bound). Cure: scale out.
* ``none`` — nobody waits, or only requests that arrived since the last poll and go
  within the next steps (a new queue no longer than the engine admitted over the last
  poll interval, nor than the batch it runs).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from exporter.risk.model import Point

RESOURCES = ("kv_cache", "max_num_seqs", "compute", "stalled", "none")
# Preemptions this recent mean the cache binds now. vLLM counts a preemption only when the
# request reports output again, i.e. once it was readmitted and recomputed: by then the
# cache's hold lasts only while the refilled batch takes its blocks back, a few steps.
# Longer, the counter outlives it and names the cache through stretches in which the
# step's token budget held the queue (issue 27: chat overloads said kv_cache for 78-90 %
# of their waiting while requests waited on compute for 65-72 %). Five 2 s polls.
WINDOW_SECONDS = 10.0
STALL_SECONDS = 30.0  # no progress with a queue for this long is a stall
# Polls in a row with a queue and no prefill that say the head does not fit: one poll can
# fall between a prefill's chunks (vLLM counts prompt tokens when the prefill completes).
IDLE_POLLS = 2
# Cache growth beyond the tokens decoded that is still no prefill, per running request:
# each takes a whole block at a time (vLLM's default block, 16 tokens on CUDA), and a poll
# reads usage and the token counters a step apart.
BLOCK_ROUNDING = 2 * 16


@dataclass(frozen=True)
class Bottleneck:
    resource: str  # one of RESOURCES
    evidence: str  # the numbers that decided it, for the status page and the alert


NONE = Bottleneck("none", "no request is waiting")


def _stalled(pts: Sequence[Point], free: float, longest: float, max_num_seqs: int | None) -> bool:
    """A queue all through the last STALL_SECONDS and no progress in them. While the batch
    still generates, only a queue whose head would surely fit (``free`` ≥ ``longest``, the
    longest prompt it can have) is stalled: vLLM admits the head only when its whole
    prompt fits (``scheduler_reserve_full_isl``, on by default in 0.32:
    ``KVCacheManager.allocate_slots(full_sequence_must_fit=...)``), and one longer than
    the free blocks waits for them while the batch decodes: a full cache, not a stall."""
    last = pts[-1]
    window = [p for p in pts if p.t >= last.t - STALL_SECONDS]
    first = window[0]
    if last.t - first.t < STALL_SECONDS * 0.9 or any(p.waiting < 1 for p in window):
        return False
    if first.prompt is None or last.prompt is None or last.prompt > first.prompt:
        return False  # a prompt was prefilled: admission works
    if max(p.usage for p in window) > first.usage + 1e-9:
        return False  # blocks were taken: a long prompt is being prefilled in chunks
    generating = last.generated > first.generated
    room = (max_num_seqs is None or last.running < max_num_seqs) and free >= longest
    return not generating or room


def _head_does_not_fit(pts: Sequence[Point], capacity_tokens: float) -> bool:
    """For ``IDLE_POLLS`` polls a queue, and no prompt prefilled: the prompt counter flat
    and the cache grown by no more than the tokens decoded (plus block rounding). The
    step's token budget had room (decode takes one token per running request), so the
    head of the queue waits for blocks."""
    if len(pts) <= IDLE_POLLS:
        return False
    window = pts[-1 - IDLE_POLLS :]
    first, last = window[0], window[-1]
    if any(p.waiting < 1 for p in window):
        return False
    if first.prompt is None or last.prompt is None or last.prompt > first.prompt:
        return False  # a prompt was prefilled: the budget went to new work
    grew = (last.usage - first.usage) * capacity_tokens
    rounding = BLOCK_ROUNDING * max(p.running for p in window)
    return grew <= (last.generated - first.generated) + rounding


def settled(bottleneck: Bottleneck, points: Sequence[Point]) -> Bottleneck:
    """What the gauge shows: ``bottleneck``, unless the queue is only requests that
    arrived since the last poll and go within the engine's next steps.

    On a busy server with no queue at all, one poll in a few catches a request between two
    steps. Such a queue is new (the poll before saw none) and short: no longer than the
    engine admitted over the last poll interval, nor than the batch it runs (a step's
    token budget admits about a batch's worth). A new queue longer than both (a burst into
    a prefill-bound server: 54 waiting, 2 running) is one at once, and so is one the batch
    shrank into without anyone finishing (vLLM evicted them). With a single poll there
    is nothing to go by, and it counts. The risk model reads this answer too: a request
    between two steps read as a prefill-paced queue would narrow its spread for one poll
    (snapshot.py); a burst that just arrived is one at once, as above."""
    if bottleneck.resource == "none" or len(points) < 2 or points[-2].waiting >= 1:
        return bottleneck
    before, last = points[-2], points[-1]
    # Requests that started since the poll before: the ones now running or finished since.
    admitted = (last.finished + last.running) - (before.finished + before.running)
    if admitted < 0:
        # The batch lost requests that did not finish: vLLM sent them back to the queue
        # (it counts the preemption only when it schedules them again). Not new arrivals.
        return bottleneck
    if last.waiting <= max(admitted, last.running):
        return Bottleneck(
            "none",
            f"{last.waiting:,.0f} waiting, none at the poll before; {admitted:,.0f} admitted "
            f"since and {last.running:,.0f} running: they go within the next steps",
        )
    return bottleneck


def _freed_last_step(points: Sequence[Point]) -> int:
    """Slots that requests finishing in the engine's last step freed, and its next step
    refills: a poll lands between two steps, so a batch held at ``max_num_seqs`` reads
    that many short. Steps per interval = tokens generated ÷ requests running (each running
    request decodes a token a step); finished per step = finished ÷ steps, rounded up."""
    if len(points) < 2:
        return 0
    before, last = points[-2], points[-1]
    finished = last.finished - before.finished
    generated = last.generated - before.generated
    running = (last.running + before.running) / 2
    if finished <= 0 or generated <= 0 or running <= 0:
        return 0
    return math.ceil(finished * running / generated)


def classify(
    points: Sequence[Point],
    capacity_tokens: float,
    max_num_seqs: int | None,
    prompt_tokens: float | None,
    max_model_len: int | None = None,
) -> Bottleneck:
    """What keeps the queue waiting now (``points`` oldest first, one epoch).

    ``prompt_tokens`` is a typical prompt (the recent mean); without one, what a running
    sequence holds stands in for it. ``max_model_len`` bounds the head's prompt: with it
    known, a queue is called stalled while the batch generates only if even the longest
    prompt would fit; without it, a typical one.
    """
    if not points:
        return NONE
    last = points[-1]
    if last.waiting < 1:
        return NONE
    waiting = f"{last.waiting:,.0f} waiting"
    used = last.usage * capacity_tokens
    free = max(0.0, capacity_tokens - used)
    prompt = prompt_tokens or (used / last.running if last.running >= 1 else 0.0)
    if _stalled(points, free, max_model_len or prompt, max_num_seqs):
        return Bottleneck(
            "stalled",
            f"{waiting}, and for {STALL_SECONDS:.0f} s no prompt was admitted and the cache did "
            f"not grow ({last.usage:.0%} used, {last.running:,.0f} running)",
        )
    recent = [p for p in points if p.t >= last.t - WINDOW_SECONDS]
    first = recent[0]
    if first.preemptions is not None and last.preemptions is not None:
        preempted = last.preemptions - first.preemptions
        if preempted > 0:
            return Bottleneck(
                "kv_cache",
                f"{waiting}; vLLM preempted {preempted:,.0f} times in the last "
                f"{last.t - first.t:.0f} s ({last.usage:.0%} of the cache used)",
            )
    if max_num_seqs is not None and last.running + _freed_last_step(points) >= max_num_seqs:
        return Bottleneck(
            "max_num_seqs",
            f"{waiting}; {last.running:,.0f} running = max_num_seqs {max_num_seqs:,} "
            f"with {last.usage:.0%} of the cache used",
        )
    if _head_does_not_fit(points, capacity_tokens):
        polls = f"{IDLE_POLLS} polls"
        return Bottleneck(
            "kv_cache",
            f"{waiting}; no prompt was prefilled for {polls} with {free:,.0f} KV tokens free "
            f"and {last.running:,.0f} running: the head of the queue needs more blocks",
        )
    if prompt > 0 and free < prompt:
        return Bottleneck(
            "kv_cache",
            f"{waiting}; {free:,.0f} KV tokens free, a typical prompt needs {prompt:,.0f}",
        )
    seqs = f" of max_num_seqs {max_num_seqs:,}" if max_num_seqs is not None else ""
    return Bottleneck(
        "compute",
        f"{waiting} with {free:,.0f} KV tokens free and {last.running:,.0f} running{seqs}: "
        "the step's token budget (prefill) admits them",
    )
