"""``plan --traffic``'s recommendation: the deployments with the fewest GPUs that hold a
request log — GPU of the table × tensor-parallel size × replicas × ``max_num_seqs`` × KV
dtype — each with the largest multiple of the log it holds and what binds it.

A deployment *holds* the log as ``plan --traffic`` says (``exporter/plan/traffic.py``): its 1×
replay never preempts and keeps the p95 queue wait within the bound. R replicas each
replay their share of the log: the requests dealt round-robin in arrival order, a
conversation's turns kept on the replica of its first (sticky sessions, so its prefix
cache is where its next turn lands); the deployment holds when every replica does.

Replays are slow, so the search is pruned, cheapest first:

* candidates go by GPU count (TP × PP × replicas), and within a count by the GPU's memory
  (smallest first), the model's own KV dtype before fp8 (tried only where the model's own
  did not hold), fewer TP (more replicas) first;
* every candidate is planned (the arithmetic of ``plan``; a deployment vLLM would refuse is
  dropped), then ruled out with no replay where its queue behind prefill alone fails the
  bound (``Prefill``: FCFS admission, at most ``max_num_batched_tokens`` of prompt per
  step of at least the weights' read, only prompt tokens no earlier request could have
  cached) — a lower bound on each request's wait, so it rules out only sure failures;
* a candidate no better than one that failed on every count (no more replicas, blocks or
  batched tokens, the same ``max_num_seqs``, no faster step) is skipped;
* ``max_num_seqs`` other than the default is tried only where the default failed, in the
  direction its failure points: twice it when requests waited on the cap, half when the
  cache preempted (fewer sequences to grow);
* the search stops at the first GPU count where a deployment holds (after at most
  ``RECOMMENDATIONS`` holders there), or after ``max_replays`` candidates replayed.

Then each deployment that holds gets the search for its largest multiple (from its 1×
replay); they are listed fewest GPUs first, then the smallest GPU, then the most headroom.
Pure apart from running the simulator.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass

from exporter.capacity.gpus import Gpu
from exporter.capacity.plan import Plan, _same_vendor, _tp_sizes, gpu_count, replan
from exporter.errors import InputError
from exporter.plan.traffic import (
    DEFAULT_MAX_QUEUE_WAIT,
    DEFAULT_PRECISION,
    QUEUE_WAIT_QUANTILE,
    Limit,
    Outcome,
    Traffic,
    engine_at,
    replay,
    search,
    split_traffic,
)
from exporter.simulator.engine import EngineConfig
from exporter.simulator.scenario import Scenario

RECOMMENDATIONS = 3  # deployments shown, at the fewest GPUs that hold
DEFAULT_MAX_REPLAYS = 48  # candidates replayed at 1× before the search gives up
MAX_GPUS = 64  # the largest deployment considered (GPUs in all)


@dataclass(frozen=True)
class Candidate:
    """One deployment: ``replicas`` copies of a planned engine."""

    plan: Plan
    replicas: int
    change: str  # the flags of one replica: --gpu, --tensor-parallel-size, …
    config: EngineConfig

    @property
    def gpus(self) -> int:
        return gpu_count(self.plan) * self.replicas


@dataclass(frozen=True)
class Recommendation:
    candidate: Candidate
    at_one: Outcome
    limit: Limit


@dataclass(frozen=True)
class Recommendations:
    found: tuple[Recommendation, ...]  # fewest GPUs first; empty when none held
    planned: int  # candidates that start, up to the count searched
    ruled_out: int  # by the prefill bound, without a replay
    dominated: int  # skipped: no better than one that failed
    replayed: int  # replayed at 1×
    capped: bool  # the replay cap stopped the search before a count held
    largest: int  # the largest GPU count searched
    wall_seconds: float

    @property
    def gpus(self) -> int | None:
        return self.found[0].candidate.gpus if self.found else None


class Prefill:
    """A sure failure found without a replay: the queue behind prefill.

    vLLM admits FCFS, and a request is scheduled with its first prefill chunk, so it cannot
    be scheduled before the prompts ahead of it are prefilled but for one step's budget. A
    step computes at most ``max_num_batched_tokens`` (B) prompt tokens and lasts at least
    ``step_base_s + B × per_prefill_token_s``, which caps the rate prompts are prefilled at.
    Counting only the prompt tokens no earlier request could have left in a cache (a lower
    bound), each request's earliest schedule follows; where more requests than the p95
    allows wait longer than the bound even so, the replay could only fail."""

    def __init__(self, traffic: Traffic, max_queue_wait: float, max_model_len: int) -> None:
        self.traffic = traffic
        self.bound = max_queue_wait
        self.own: dict[int, int] = {}
        seen: set[int] = set()
        for a in traffic.base:
            prompt = max(1, min(a.prompt, max_model_len - 1))
            if a.block_hashes:
                fresh = sum(1 for h in a.block_hashes if h not in seen)
                seen.update(a.block_hashes)
                cached = (len(a.block_hashes) - fresh) * a.hash_tokens
            else:
                cached = a.prefix_len
            self.own[id(a)] = max(0, prompt - cached)
        self.shares: dict[int, tuple[Traffic, ...]] = {}

    def share(self, replicas: int) -> tuple[Traffic, ...]:
        if replicas not in self.shares:
            self.shares[replicas] = split_traffic(self.traffic, replicas)
        return self.shares[replicas]

    def fails(self, config: EngineConfig, replicas: int) -> bool:
        budget = max(config.max_num_batched_tokens, 1)
        rate = budget / (config.step_base_s + budget * config.per_prefill_token_s)
        for share in self.share(replicas):
            total = sum(a.n for a in share.base)
            allowed = math.floor((1 - QUEUE_WAIT_QUANTILE) * total)
            ahead = late = 0
            for a in share.base:
                if (ahead - budget) / rate - a.time > self.bound:
                    late += a.n
                    if late > allowed:
                        return True
                ahead += self.own[id(a)]
        return False


def _no_better(c: Candidate, failed: Candidate) -> bool:
    """``c`` is no better than ``failed`` on anything a replay depends on."""
    a, b = c.config, failed.config
    return (
        c.replicas <= failed.replicas
        and a.max_num_seqs == b.max_num_seqs
        and a.block_size == b.block_size
        and a.max_model_len == b.max_model_len
        and a.enable_prefix_caching == b.enable_prefix_caching
        and a.num_blocks <= b.num_blocks
        and a.max_num_batched_tokens <= b.max_num_batched_tokens
        and a.step_base_s >= b.step_base_s
        and a.per_prefill_token_s >= b.per_prefill_token_s
        and a.per_kv_token_s >= b.per_kv_token_s
    )


def _combine(multiplier: float, outcomes: Sequence[Outcome]) -> Outcome:
    """The replicas' replays as one: held when all held; figures of the worst replica."""
    worst = max(outcomes, key=lambda o: (not o.held, o.queue_wait_seconds.get("p95", 0.0)))
    firsts = [o.first_preemption_seconds for o in outcomes if o.first_preemption_seconds]
    waiting: dict[str, float] = {}
    for o in outcomes:
        for reason, seconds in o.waiting_seconds.items():
            waiting[reason] = waiting.get(reason, 0.0) + seconds
    return dataclasses.replace(
        worst,
        multiplier=multiplier,
        sequences=sum(o.sequences for o in outcomes),
        preemptions=sum(o.preemptions for o in outcomes),
        first_preemption_seconds=min(firsts) if firsts else None,
        peak_kv_usage=max(o.peak_kv_usage for o in outcomes),
        p95_kv_usage=max(o.p95_kv_usage for o in outcomes),
        waiting_seconds=waiting if worst.held else worst.waiting_seconds,
        wall_seconds=sum(o.wall_seconds for o in outcomes),
        held=all(o.held for o in outcomes),
    )


def _flags(p: Plan, base: Plan) -> str:
    req = p.request
    flags = [f"--gpu {req.gpu.name}", f"--tensor-parallel-size {req.tensor_parallel_size}"]
    if req.pipeline_parallel_size > 1:
        flags.append(f"--pipeline-parallel-size {req.pipeline_parallel_size}")
    if req.kv_cache_dtype != base.request.kv_cache_dtype:
        flags.append(f"--kv-cache-dtype {req.kv_cache_dtype}")
    if req.max_num_seqs is not None:  # given, or tried beside vLLM's default for the GPU
        flags.append(f"--max-num-seqs {p.max_num_seqs}")
    return " ".join(flags)


def describe(c: Candidate) -> str:
    """One deployment as a user would write it down."""
    if c.replicas == 1:
        return c.change
    return f"{c.replicas} replicas × {c.change}"


class _Planner:
    """Plans of one replica, each made once: (GPU, TP, KV dtype, max_num_seqs)."""

    def __init__(self, base: Plan, scenario: Scenario | None) -> None:
        self.base = base
        self.scenario = scenario
        self.plans: dict[tuple[str, int, str, int | None], Plan | None] = {}
        self.configs: dict[int, EngineConfig] = {}

    def plan(self, gpu: Gpu, tp: int, kv: str, max_num_seqs: int | None) -> Plan | None:
        key = (gpu.name, tp, kv, max_num_seqs)
        if key not in self.plans:
            changes: dict[str, object] = {
                "gpu": gpu,
                "tensor_parallel_size": tp,
                "kv_cache_dtype": kv,
            }
            if max_num_seqs is not None:
                changes["max_num_seqs"] = max_num_seqs
            try:
                p: Plan | None = replan(self.base, **changes)
            except InputError:
                p = None
            if p is not None and (p.startup_failure is not None or not p.cap.num_blocks):
                p = None
            self.plans[key] = p
        return self.plans[key]

    def candidate(self, p: Plan, replicas: int) -> Candidate:
        config = self.configs.get(id(p))
        if config is None:
            config = self.configs[id(p)] = engine_at(p, self.scenario)
        return Candidate(p, replicas, _flags(p, self.base), config)


def recommend(
    base: Plan,
    traffic: Traffic,
    scenario: Scenario | None = None,
    *,
    max_queue_wait: float = DEFAULT_MAX_QUEUE_WAIT,
    precision: float = DEFAULT_PRECISION,
    max_replays: int = DEFAULT_MAX_REPLAYS,
    gpus: Sequence[Gpu] | None = None,
    say: Callable[[str], None] | None = None,
    jobs: int = 1,
) -> Recommendations:
    """The deployments with the fewest GPUs that hold ``traffic`` (see the module's doc);
    ``gpus`` are those to choose from (default: the table's, of the planned GPU's vendor);
    with ``jobs`` > 1, the searches for the multiples held probe that many at once, in
    parallel processes."""
    started = time.perf_counter()
    req = base.request
    pool = sorted(gpus or _same_vendor(req.gpu), key=lambda g: (g.total_bytes, g.name))
    if req.gpu.family == "unknown" and gpus is None:
        pool.insert(0, req.gpu)  # a GPU given by its size is one the user has
    pp = req.pipeline_parallel_size
    try:
        own_kv = replan(base, kv_cache_dtype="auto").kv_dtype_bytes
    except InputError:
        own_kv = 2.0
    kv_dtypes = ("auto", "fp8") if own_kv > 1 else ("auto",)
    planner = _Planner(base, scenario)
    prefill = Prefill(traffic, max_queue_wait, base.max_model_len)
    failed: list[Candidate] = []
    found: list[tuple[Candidate, Outcome]] = []
    planned = ruled_out = dominated = replayed = 0
    largest = 0

    def replay_at(c: Candidate, multiplier: float) -> Outcome:
        shares = prefill.share(c.replicas)

        def progress(done: float) -> None:
            if say is not None:
                say(
                    f"recommending: {c.gpus} GPUs · {describe(c)} · ×{multiplier:.3g}: "
                    f"{done:.0%} of the traffic replayed"
                )

        return _replay_shares(shares, c.config, multiplier, max_queue_wait, progress)

    def attempt(c: Candidate) -> Outcome | str:
        """The 1× replay of ``c``, or why it needs none: ``ruled_out`` (its prefill queue
        alone fails) or ``dominated`` (no better than one that failed)."""
        nonlocal planned, ruled_out, dominated, replayed
        planned += 1
        if prefill.fails(c.config, c.replicas):
            ruled_out += 1
            return "ruled_out"
        if any(_no_better(c, f) for f in failed):
            dominated += 1
            return "dominated"
        replayed += 1
        if say is not None:
            say(f"recommending: {c.gpus} GPUs · {describe(c)} · replay {replayed}")
        outcome = replay_at(c, 1.0)
        if not outcome.held:
            failed.append(c)
        return outcome

    capped = False
    for n in range(1, MAX_GPUS + 1):
        if found or capped:
            break
        largest = n
        for gpu in pool:
            if len(found) >= RECOMMENDATIONS or capped:
                break
            for tp in _tp_sizes(req.arch):
                if n % (tp * pp) or capped:
                    continue
                replicas = n // (tp * pp)
                for kv in kv_dtypes:
                    if replayed >= max_replays:
                        capped = True
                        break
                    held = _try_batches(planner, attempt, gpu, tp, kv, replicas)
                    if held is not None:
                        found.append(held)
                        break  # fp8 only where the model's own KV dtype did not hold
                if len(found) >= RECOMMENDATIONS:
                    break

    out: list[Recommendation] = []
    workers = _pool(traffic, max_queue_wait, jobs) if found and jobs > 1 else None
    try:
        for c, first in found:

            def evaluate(m: float, c: Candidate = c, first: Outcome = first) -> Outcome:
                if m == 1.0:
                    return first
                if say is not None:
                    say(f"recommending: {c.gpus} GPUs · {describe(c)} · ×{m:.3g}")
                return replay_at(c, m)

            many = None
            if workers is not None:

                def many(ms: Sequence[float], c: Candidate = c) -> Sequence[Outcome]:
                    assert workers is not None
                    if say is not None:
                        shown = ", ".join(f"×{m:.3g}" for m in ms)
                        say(f"recommending: {c.gpus} GPUs · {describe(c)} · {shown}")
                    tasks = [(c.config, c.replicas, m) for m in ms]
                    return list(workers.map(_replay_in_worker, tasks))

            limit = search(evaluate, precision=precision, width=max(jobs, 1), evaluate_many=many)
            out.append(Recommendation(c, first, limit))
    finally:
        if workers is not None:
            workers.shutdown(cancel_futures=True)
    # Fewest GPUs, then the smallest GPU, then the most headroom on it.
    out.sort(
        key=lambda r: (
            r.candidate.gpus,
            r.candidate.plan.request.gpu.total_bytes,
            -(r.limit.held or 0.0),
        )
    )
    return Recommendations(
        found=tuple(out),
        planned=planned,
        ruled_out=ruled_out,
        dominated=dominated,
        replayed=replayed,
        capped=capped and not out,
        largest=largest,
        wall_seconds=time.perf_counter() - started,
    )


def _replay_shares(
    shares: Sequence[Traffic],
    config: EngineConfig,
    multiplier: float,
    bound: float,
    progress: Callable[[float], None] | None = None,
) -> Outcome:
    """Every replica's share at ``multiplier``, the busiest first: where one fails, the
    others need no replay. ``progress`` gets the share of the first replica's traffic
    replayed, every ten seconds or so of a long replay."""
    order = sorted(shares, key=lambda t: -sum(a.prompt + a.generation for a in t.base))
    outcomes = []
    for share in order:
        outcomes.append(replay(share, config, multiplier, max_queue_wait=bound, progress=progress))
        progress = None
        if not outcomes[-1].held:
            break
    return _combine(multiplier, outcomes)


# Each worker holds the traffic once and splits it per replica count as asked.
_WORKER: dict[str, object] = {}


def _init_worker(traffic: Traffic, bound: float) -> None:
    _WORKER.update(traffic=traffic, bound=bound, shares={})


def _replay_in_worker(task: tuple[EngineConfig, int, float]) -> Outcome:
    config, replicas, multiplier = task
    traffic, bound, shares = _WORKER["traffic"], _WORKER["bound"], _WORKER["shares"]
    assert isinstance(traffic, Traffic)
    assert isinstance(bound, float)
    assert isinstance(shares, dict)
    if replicas not in shares:
        shares[replicas] = split_traffic(traffic, replicas)
    return _replay_shares(shares[replicas], config, multiplier, bound)


def _pool(traffic: Traffic, bound: float, jobs: int) -> ProcessPoolExecutor:
    return ProcessPoolExecutor(jobs, initializer=_init_worker, initargs=(traffic, float(bound)))


def _try_batches(
    planner: _Planner,
    attempt: Callable[[Candidate], Outcome | str],
    gpu: Gpu,
    tp: int,
    kv: str,
    replicas: int,
) -> tuple[Candidate, Outcome] | None:
    """The deployment at the default ``max_num_seqs`` (the one given, else vLLM's for the
    GPU); where its replay fails, once more at twice or half of it, as its failure points
    (the prefill bound does not depend on it)."""
    given = planner.base.request.max_num_seqs
    p = planner.plan(gpu, tp, kv, given)
    if p is None:
        return None
    c = planner.candidate(p, replicas)
    outcome = attempt(c)
    if not isinstance(outcome, Outcome):
        return None
    if outcome.held:
        return c, outcome
    other = None
    if outcome.binding == "max_num_seqs":
        other = p.max_num_seqs * 2
    elif outcome.binding == "kv_cache" and p.max_num_seqs > 1:
        other = p.max_num_seqs // 2
    if other is None:
        return None
    q = planner.plan(gpu, tp, kv, other)
    if q is None:
        return None
    c = planner.candidate(q, replicas)
    outcome = attempt(c)
    return (c, outcome) if isinstance(outcome, Outcome) and outcome.held else None
