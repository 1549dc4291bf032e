"""A randomized family of deployments and hours of traffic: the alert benchmark's fuzz tier.

The scenario library describes the classes someone thought of; this family draws hours
nobody described, so a risk model cannot be tuned class by class to pass it. Every draw
is a function of its seed alone, and every range below was fixed before the risk model
was measured on the family (``FAMILY_VERSION`` 1; docs/risk-model.md says what was tuned
after). One draw is:

* **a deployment** — a model of the catalogue on a GPU of the table that vLLM would start
  (``plan``), with ``max_model_len``, ``max_num_seqs``, ``max_num_batched_tokens``, the KV
  dtype, ``gpu_memory_utilization`` and prefix caching drawn, small batches and budgets
  included on purpose (``max_num_seqs``- and compute-bound servers);
* **one to three tenants**, each with its own lengths (lognormal prompts and answers, their
  medians and spreads drawn, a Pareto tail of long prompts in some), shared system
  prompts, multi-turn sessions whose turns reuse the cached context, ``n > 1`` requests,
  and an arrival process: Poisson, Markov-modulated (calm and burst states, bursts up to
  a hundred times the calm rate) or self-exciting (Hawkes, clusters of follow-ups);
* **a shape over the hour** — flat, a daily ramp (the rate growing two- to six-fold), a
  wave, or an abrupt start (a light load, then a step to the full rate) — and a kind:
  ``safe-near-edge``, ``safe-light``, ``ramp-overload`` or ``abrupt-overload``.

``place`` then does what ``plan --traffic`` does: it searches the largest multiple of the
hour the deployment holds without preempting (``traffic.search``, coupled samples), and the
draw runs at a drawn fraction of it — 0.8–0.95× for a near-edge hour, 0.5–0.8× for a light
one, 1.1–2× for an overload. Pure but for running the simulator; the same seed gives the
same hour on any machine.

The engines are sized with the residuals of ``plan``'s memory model pinned
(``TIER_OVERHEAD``), not with today's: the alert is judged on engines that stay put.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from exporter.capacity.gpus import GIB
from exporter.capacity.memory import DEFAULT_OVERHEAD
from exporter.capacity.plan import Plan
from exporter.errors import InputError
from exporter.plan.traffic import Limit, Traffic, replay, search
from exporter.simulator.engine import EngineConfig
from exporter.simulator.scenario import Arrival, Scenario
from exporter.simulator.simulation import engine_config, size

FAMILY_VERSION = 1
HOUR = 3600.0
# The residuals ``benchmarks/plan_accuracy.py`` refits (memory.py), as they stood when the
# tier was last placed (stop 51, 42 start-ups). Each refit moves every engine by a few per
# cent, which re-places all 479 hours and re-draws the alert's figures without telling
# anything about the alert (stop 51: the page's dev near-edge family 1.16 -> 1.76 false-alarm
# minutes per safe hour from the new draw alone). The sidecar reads each engine's blocks from
# its page, as it reads vLLM's, so the alert does not need the latest residuals; re-pin, and
# re-place, only when the tier should follow a change in how vLLM accounts its memory.
TIER_OVERHEAD = replace(
    DEFAULT_OVERHEAD,
    # Counted from vLLM's code in stop 52 (memory.sampler_state_bytes), after the tier was
    # placed: left out, so that the tier's engines stay where they were placed.
    v2_sampler_state=False,
    cuda_graph=int(0.62 * GIB),
    # The per-layer × width form of the compile transient, as placed (stop 53 made it a
    # constant per worker).
    compile_bytes=0.0,
    compile_layer_width_bytes=1.91 * 1024,
    non_torch_single_by_era=(
        ((0, 27, 0), int(0.41 * GIB)),
        ((0, 8, 0), int(0.063 * GIB)),
        ((0, 6, 5), int(0.10 * GIB)),
        ((0, 0, 0), int(0.35 * GIB)),
    ),
    non_torch_tp_by_era=(
        ((0, 27, 0), int(0.65 * GIB)),
        ((0, 8, 0), int(0.19 * GIB)),
        ((0, 6, 5), int(0.10 * GIB) + int(1.79 * GIB)),
        ((0, 0, 0), int(0.35 * GIB) + int(1.79 * GIB)),
    ),
)
KINDS = ("safe-near-edge", "safe-light", "ramp-overload", "abrupt-overload")
KIND_WEIGHTS = (0.35, 0.2, 0.25, 0.2)
# Where each kind runs, as a fraction of the largest multiple held.
FRACTIONS = {
    "safe-near-edge": (0.8, 0.95),
    "safe-light": (0.5, 0.8),
    "ramp-overload": (1.1, 2.0),
    "abrupt-overload": (1.1, 2.0),
}
# Models with a config in the catalogue, and the GPUs they are drawn on (weights must fit
# with room for a cache; TP where one GPU is too small).
MODELS: tuple[tuple[str, tuple[str, ...], int], ...] = (
    ("meta-llama/Llama-3.1-8B-Instruct", ("L4", "A10G", "L40S", "A100-SXM4-40GB", "H100-80GB"), 1),
    ("Qwen/Qwen2.5-7B-Instruct", ("L4", "A10G", "L40S", "A100-SXM4-40GB", "H100-80GB"), 1),
    ("Qwen/Qwen3-8B", ("L40S", "A100-SXM4-40GB", "H100-80GB"), 1),
    ("Qwen/Qwen3-14B", ("L40S", "A100-SXM4-80GB", "H100-80GB"), 1),
    ("mistralai/Mistral-7B-Instruct-v0.3", ("L4", "A10G", "L40S", "A100-SXM4-40GB"), 1),
    ("google/gemma-3-4b-it", ("L4", "A10G", "L40S"), 1),
    ("google/gemma-2-9b-it", ("L40S", "A100-SXM4-40GB"), 1),
    ("microsoft/phi-4", ("A100-SXM4-80GB", "H100-80GB", "L40S"), 1),
    ("ibm-granite/granite-3.3-8b-instruct", ("L40S", "A100-SXM4-40GB"), 1),
    ("deepseek-ai/DeepSeek-V2-Lite", ("A100-SXM4-80GB", "H100-80GB"), 1),
    ("Qwen/Qwen3-30B-A3B", ("H100-80GB", "A100-SXM4-80GB"), 1),
    ("meta-llama/Llama-3.1-70B-Instruct", ("H100-80GB", "A100-SXM4-80GB"), 4),
    ("Qwen/Qwen3-32B", ("H100-80GB",), 2),
)
CONTEXTS = (4096, 8192, 16384, 32768)
MAX_NUM_SEQS = (8, 16, 32, 64, 128)  # drawn half the time; else vLLM's default
BATCHED_TOKENS = (512, 1024, 2048, 4096)  # drawn 40 % of the time; else the default
# The search's precision: held and failed within 15 % (plan --traffic uses 5 %; the
# fraction drawn on top spans more than the difference, and each probe that holds
# simulates the whole hour).
PRECISION = 0.15
# A draw whose 1× hour would need more requests than this is re-drawn at a shorter
# context (the simulator's cost, not a property of traffic): at most this many arrivals
# at the multiple run.
MAX_REQUESTS = 30_000


@dataclass(frozen=True)
class Tenant:
    share: float  # of the hour's requests
    process: str  # poisson | mmpp | hawkes
    process_params: dict[str, float]
    prompt_median: float
    prompt_sigma: float
    tail_share: float  # of prompts drawn from a Pareto tail instead
    tail_alpha: float
    output_median: float
    output_sigma: float
    system_tokens: int  # a shared system prompt, 0 for none
    system_groups: int
    session_share: float  # of arrivals that open a multi-turn conversation
    turns_mean: float
    think_seconds: float
    n_share: float  # of requests asking for n > 1 samples
    n: int


@dataclass(frozen=True)
class Draw:
    """One hour of the family, at 1× (before placement)."""

    seed: int
    kind: str
    deployment: dict[str, Any]
    shape: str
    shape_params: dict[str, float]
    tenants: tuple[Tenant, ...]
    rate: float  # mean requests per second at 1×
    fraction: float  # of the largest multiple held, at which the hour runs
    arrivals: tuple[Arrival, ...] = field(repr=False)

    @property
    def name(self) -> str:
        return f"fuzz-{self.seed}"

    def describe(self) -> str:
        d = self.deployment
        flags = [f"{k}={v}" for k, v in sorted(d.items()) if k not in ("model", "gpu")]
        tenants = " + ".join(
            f"{t.process} P~{t.prompt_median:.0f} G~{t.output_median:.0f}"
            + (f" sessions {t.session_share:.0%}" if t.session_share else "")
            + (f" n={t.n} {t.n_share:.0%}" if t.n_share else "")
            for t in self.tenants
        )
        return (
            f"{self.name} {self.kind} · {d['model']} on {d['gpu']} ({', '.join(flags)}) · "
            f"{self.shape} · {tenants}"
        )


def _log_uniform(rng: random.Random, low: float, high: float) -> float:
    return math.exp(rng.uniform(math.log(low), math.log(high)))


def _deployment(rng: random.Random) -> dict[str, Any]:
    model, gpus, tp = MODELS[rng.randrange(len(MODELS))]
    d: dict[str, Any] = {"model": model, "gpu": rng.choice(gpus), "max_model_len": 8192}
    if tp > 1:
        d["tensor_parallel_size"] = tp
    d["max_model_len"] = rng.choice(CONTEXTS)
    if rng.random() < 0.5:
        d["max_num_seqs"] = rng.choice(MAX_NUM_SEQS)
    if rng.random() < 0.4:
        d["max_num_batched_tokens"] = rng.choice(BATCHED_TOKENS)
    if rng.random() < 0.2:
        d["kv_cache_dtype"] = "fp8"
    if rng.random() < 0.4:
        d["gpu_memory_utilization"] = round(rng.uniform(0.8, 0.95), 2)
    if rng.random() < 0.15:
        d["enable_prefix_caching"] = False
    return d


def _tenant(rng: random.Random, share: float) -> Tenant:
    process = rng.choice(("poisson", "mmpp", "hawkes"))
    params: dict[str, float] = {}
    if process == "mmpp":
        # Calm and burst states; the burst rate is 3–100× the calm one, bursts last
        # 20 s – 4 min and take 5–30 % of the time.
        params = {
            "ratio": _log_uniform(rng, 3.0, 100.0),
            "burst_share": rng.uniform(0.05, 0.3),
            "burst_seconds": _log_uniform(rng, 20.0, 240.0),
        }
    elif process == "hawkes":
        # Each request brings on average ``branching`` follow-ups, ``decay`` seconds apart.
        params = {"branching": rng.uniform(0.3, 0.85), "decay": _log_uniform(rng, 2.0, 60.0)}
    sessions = rng.random() < 0.4
    with_n = rng.random() < 0.25
    system = rng.random() < 0.5
    return Tenant(
        share=share,
        process=process,
        process_params=params,
        prompt_median=_log_uniform(rng, 50.0, 6000.0),
        prompt_sigma=rng.uniform(0.3, 1.6),
        tail_share=rng.uniform(0.0, 0.1) if rng.random() < 0.4 else 0.0,
        tail_alpha=rng.uniform(1.1, 2.0),
        output_median=_log_uniform(rng, 20.0, 1000.0),
        output_sigma=rng.uniform(0.3, 1.4),
        system_tokens=round(_log_uniform(rng, 200.0, 4000.0)) if system else 0,
        system_groups=rng.randint(1, 8),
        session_share=rng.uniform(0.1, 0.7) if sessions else 0.0,
        turns_mean=rng.uniform(2.0, 6.0),
        think_seconds=_log_uniform(rng, 5.0, 90.0),
        n_share=rng.uniform(0.05, 0.5) if with_n else 0.0,
        n=rng.choice((2, 3, 4, 8)),
    )


def _shape(rng: random.Random, kind: str) -> tuple[str, dict[str, float]]:
    if kind == "ramp-overload":
        name = "ramp"
    elif kind == "abrupt-overload":
        name = "abrupt"
    else:
        name = rng.choice(("flat", "ramp", "wave", "abrupt"))
    if name == "ramp":
        return name, {
            "growth": rng.uniform(2.0, 6.0),
            "ramp_from": rng.uniform(0.0, 0.3) * HOUR,
            "ramp_seconds": rng.uniform(20.0, 50.0) * 60,
        }
    if name == "abrupt":
        return name, {"before": rng.uniform(0.0, 0.3), "at": rng.uniform(5.0, 25.0) * 60}
    if name == "wave":
        return name, {"depth": rng.uniform(0.2, 0.8), "period": rng.uniform(10.0, 40.0) * 60}
    return name, {}


def shape_at(shape: str, params: dict[str, float], t: float) -> float:
    """The rate's multiplier at ``t`` (its peak is 1)."""
    if shape == "ramp":
        x = min(1.0, max(0.0, (t - params["ramp_from"]) / params["ramp_seconds"]))
        return (1.0 + (params["growth"] - 1.0) * x) / params["growth"]
    if shape == "abrupt":
        return 1.0 if t >= params["at"] else params["before"]
    if shape == "wave":
        phase = math.cos(2 * math.pi * t / params["period"])
        return 1.0 - params["depth"] * (1 - phase) / 2
    return 1.0


def _mean_shape(shape: str, params: dict[str, float]) -> float:
    return sum(shape_at(shape, params, t) for t in range(0, int(HOUR), 10)) / (HOUR / 10)


def _times(
    rng: random.Random, tenant: Tenant, peak: float, shape: str, sp: dict[str, float]
) -> list[float]:
    """Arrival times over the hour: the tenant's process at ``peak`` × the shape, by thinning."""
    out: list[float] = []
    p = tenant.process_params
    if tenant.process == "hawkes":
        # Cluster form: immigrants at (1 − branching) of the rate, each bringing a
        # Poisson number of follow-ups (mean ``branching``) that bring their own.
        base = peak * (1 - p["branching"])
        t = 0.0
        while True:
            t += rng.expovariate(base)
            if t >= HOUR:
                break
            if rng.random() > shape_at(shape, sp, t):
                continue
            todo = [t]
            while todo:
                parent = todo.pop()
                out.append(parent)
                for _ in range(_poisson(rng, p["branching"])):
                    child = parent + rng.expovariate(1.0 / p["decay"])
                    if child < HOUR:
                        todo.append(child)
        return sorted(out)
    if tenant.process == "mmpp":
        share, ratio = p["burst_share"], p["ratio"]
        calm = 1.0 / (1 - share + share * ratio)  # the mean multiplier is 1
        burst = calm * ratio
        calm_seconds = p["burst_seconds"] * (1 - share) / share
        t, in_burst = 0.0, rng.random() < share
        while t < HOUR:
            dwell = rng.expovariate(1.0 / (p["burst_seconds"] if in_burst else calm_seconds))
            rate = peak * (burst if in_burst else calm)
            end = min(HOUR, t + dwell)
            s = t
            while True:
                s += rng.expovariate(rate)
                if s >= end:
                    break
                if rng.random() <= shape_at(shape, sp, s):
                    out.append(s)
            t, in_burst = end, not in_burst
        return out
    t = 0.0
    while True:
        t += rng.expovariate(peak)
        if t >= HOUR:
            return out
        if rng.random() <= shape_at(shape, sp, t):
            out.append(t)


def _poisson(rng: random.Random, mean: float) -> int:
    k, p, limit = 0, 1.0, math.exp(-mean)
    while True:
        p *= rng.random()
        if p < limit:
            return k
        k += 1


def _length(rng: random.Random, median: float, sigma: float, low: int, high: int) -> int:
    return max(low, min(high, round(median * math.exp(sigma * rng.gauss(0.0, 1.0)))))


def _requests(
    rng: random.Random, tenant: Tenant, index: int, times: Sequence[float], context: int
) -> list[Arrival]:
    out: list[Arrival] = []
    for session, t in enumerate(times, start=1):
        turns = 1
        if tenant.session_share and rng.random() < tenant.session_share:
            turns = 1 + _poisson(rng, tenant.turns_mean - 1)
        n = tenant.n if tenant.n_share and rng.random() < tenant.n_share else 1
        system_key = None
        if tenant.system_tokens:
            system_key = 1_000_000 * (index + 1) + rng.randrange(tenant.system_groups)
        key = (index + 1) * (1 << 36) + session
        history, at = 0, t
        for turn in range(turns):
            if rng.random() < tenant.tail_share:
                user = round(tenant.prompt_median * 4 * rng.paretovariate(tenant.tail_alpha))
            else:
                user = _length(rng, tenant.prompt_median, tenant.prompt_sigma, 1, context)
            output = _length(rng, tenant.output_median, tenant.output_sigma, 1, context)
            system = tenant.system_tokens if turn == 0 else 0
            prompt = min(context - 2, history + system + user)
            output = min(output, context - 1 - prompt)
            if turns > 1:
                # A conversation: each turn's prompt starts with what the last turn left.
                out.append(
                    Arrival(
                        at, prompt, max(1, output), n, key, min(history, prompt), prompt + output
                    )
                )
            elif system_key is not None:
                shared = min(tenant.system_tokens, prompt)
                out.append(Arrival(at, prompt, max(1, output), n, system_key, shared, shared))
            else:
                out.append(Arrival(at, prompt, max(1, output), n))
            history = prompt + output
            # The next turn comes after the answer (about 30 ms a token) and a pause.
            at += output * 0.03 + rng.expovariate(1.0 / tenant.think_seconds)
            if at >= HOUR or history >= context - 64:
                break
    return out


def _expected_rate(plan: Plan, tenants: Sequence[Tenant], sequences: float) -> float:
    """Requests per second whose occupancy would about fill the cache (Little's law at the
    step time of a half-full cache): a start for the search, not an answer."""
    from exporter.capacity.steptime import step_times

    steps = step_times(plan)
    capacity = plan.cap.capacity_tokens
    step = steps.base_s + steps.per_kv_token_s * capacity / 2
    held = 0.0
    for t in tenants:
        # Token-steps a request holds: E[G]·E[P] + E[G²]/2, lognormal moments (capped at
        # the context, which the heaviest spreads would otherwise dwarf).
        p = min(plan.max_model_len, t.prompt_median * math.exp(t.prompt_sigma**2 / 2))
        g = min(plan.max_model_len, t.output_median * math.exp(t.output_sigma**2 / 2))
        g2 = min(plan.max_model_len**2, t.output_median**2 * math.exp(2 * t.output_sigma**2))
        held += t.share * ((p + t.system_tokens) * g + g2 / 2) * step
    return capacity / max(held * sequences, 1e-9)


def draw(seed: int) -> Draw:
    """The hour of seed ``seed`` (at 1×, unplaced): its deployment, tenants and arrivals."""
    # A reproducible draw, not a secret.
    rng = random.Random(f"kv-headroom family {FAMILY_VERSION} seed {seed}")  # noqa: S311
    kind = rng.choices(KINDS, KIND_WEIGHTS)[0]
    low, high = FRACTIONS[kind]
    fraction = rng.uniform(low, high)
    for _attempt in range(20):
        deployment = _deployment(rng)
        try:
            sized = size(_sizing_scenario("fuzz", seed, deployment))
        except InputError:
            continue  # vLLM would not start this one: draw another
        plan = sized.plan
        count = rng.choice((1, 1, 2, 3))
        weights = [rng.random() + 0.2 for _ in range(count)]
        tenants = tuple(_tenant(rng, w / sum(weights)) for w in weights)
        shape, sp = _shape(rng, kind)
        sequences = sum(t.share * (1 + t.n_share * (t.n - 1)) for t in tenants)
        rate = _expected_rate(plan, tenants, sequences)
        if rate * HOUR * 2 > MAX_REQUESTS:
            continue  # too many requests to simulate in seconds: draw another deployment
        peak = rate / _mean_shape(shape, sp)
        arrivals: list[Arrival] = []
        for i, tenant in enumerate(tenants):
            times = _times(rng, tenant, peak * tenant.share, shape, sp)
            arrivals += _requests(rng, tenant, i, times, plan.max_model_len)
        arrivals.sort(key=lambda a: a.time)
        if not arrivals:
            continue
        return Draw(seed, kind, deployment, shape, sp, tenants, rate, fraction, tuple(arrivals))
    raise RuntimeError(f"family seed {seed}: no deployment drawn in 20 attempts")


@dataclass(frozen=True)
class Placed:
    """A draw placed by the search: the largest multiple held and the one it runs at."""

    draw: Draw
    limit: Limit
    multiple: float | None  # None: the search found no bracket (never preempts, or always)

    def scenario(self) -> Scenario:
        assert self.multiple is not None
        traffic = Traffic.of(self.draw.name, self.draw.arrivals, self.draw.seed)
        return Scenario(
            name=self.draw.name,
            description=self.draw.describe(),
            expect="overload" if "overload" in self.draw.kind else "safe",
            duration=HOUR,
            seed=self.draw.seed,
            deployment=self.draw.deployment,
            engine={},
            tags=(self.draw.kind, "fuzz"),
            requests=tuple(traffic.at(self.multiple)),
            overhead=TIER_OVERHEAD,
        )


def _sizing_scenario(name: str, seed: int, deployment: dict[str, Any]) -> Scenario:
    """The deployment alone, sized with the tier's pinned residuals."""
    return Scenario(name, "", "safe", HOUR, seed, deployment, {}, overhead=TIER_OVERHEAD)


def engine_for(d: Draw) -> EngineConfig:
    """The simulated engine of the draw's deployment, as ``plan`` sizes it (with the tier's
    pinned residuals)."""
    scenario = _sizing_scenario(d.name, d.seed, d.deployment)
    sized = size(scenario)
    return engine_config(scenario, sized.plan, sized.gpu)


def place(d: Draw) -> Placed:
    """``plan --traffic``'s search on the draw (a multiple holds when the hour never
    preempts; queue waits do not count: a long queue is the alert's business only when it
    ends in preemption), then the draw's fraction of the largest multiple held."""
    config = engine_for(d)
    traffic = Traffic.of(d.name, d.arrivals, d.seed)
    cap = MAX_REQUESTS / max(1, len(d.arrivals))

    def evaluate(m: float) -> Any:
        if m > cap:
            # Beyond the simulator's budget: call it failed without running (the search
            # then brackets below it; the draw is dropped if nothing held).
            return _unrun(m)
        return replay(traffic, config, m, max_queue_wait=math.inf)

    limit = search(evaluate, precision=PRECISION, start=1.0, step=1.6)
    if limit.held is None or limit.failed is None or limit.failed > cap:
        return Placed(d, limit, None)
    return Placed(d, limit, limit.held * d.fraction)


def _unrun(m: float) -> Any:
    from exporter.plan.traffic import Outcome

    return Outcome(m, 0, 0, None, 0.0, 0.0, {}, {}, 0.0, 0.0, False, False)
