"""The rules an SRE writes in PromQL without the sidecar, evaluated on a replayed run's polls
the way Prometheus evaluates them, so the frontier (``benchmarks/fuzz_frontier.py``) can set
them beside the sidecar's page and warning.

* ``vllm:kv_cache_usage_perc > u``, held 15 s as the shipped page is;
* ``predict_linear(vllm:kv_cache_usage_perc[w], h) > 1``: Prometheus's least-squares line
  through the window's samples, read ``h`` seconds after the evaluation (its intercept is
  taken at the evaluation time, as ``funcPredictLinear`` does), held 15 s;
* llm-d's KV rules as its ``docs/monitoring/prometheus-alerting-rules.yaml`` writes them
  (llm-d/llm-d at ``bdd5e5b``): ``LLMDKVCacheSaturation`` (usage > 0.90 for 10m, warning),
  ``LLMDDecodeKVCacheCritical`` (usage > 0.95 for 5m, critical),
  ``LLMDRequestQueueBuildup`` (waiting > 50 for 5m) and ``LLMDHighPreemptions``
  (``rate(vllm:num_preemptions[5m]) > 1`` for 5m: after the fact).

Every rule is evaluated at every poll (2 s) of the replayed series, the sidecar's rules
too: a real Prometheus scraping every 15 s sees fewer samples, alike for all of them.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from benchmarks.alert_scoring import RULES, Condition, Rule, series_above
from exporter.replay import Tick
from exporter.risk.model import ALERT_FOR_SECONDS

PAGE = "kv_headroom"  # the alert benchmark's names for them
WARNING = "kv_headroom_warning"
HOLD = ALERT_FOR_SECONDS  # a plain rule held as long as the shipped page, to compare alike
USAGE = (0.5, 0.6, 0.7, 0.8, 0.9, 0.95)
# Windows and horizons an SRE would pick: a minute or a few of history, the page's own
# horizon (three minutes) or less ahead.
PREDICT_WINDOWS = (60.0, 120.0, 300.0)
PREDICT_HORIZONS = (60.0, 120.0, 180.0)


def predict_linear(ticks: Sequence[Tick], window: float, horizon: float) -> list[float]:
    """``predict_linear(vllm:kv_cache_usage_perc[window], horizon)`` at every poll: the
    least-squares line through the samples in ``(t - window, t]`` read at ``t + horizon``
    (NaN with fewer than two samples, where Prometheus returns nothing)."""
    t = np.array([x.t for x in ticks], dtype=float)
    v = np.array([x.usage for x in ticks], dtype=float)
    # Prefix sums over the samples give each window's sums in O(1).
    c1, ct, cv = (np.concatenate([[0.0], np.cumsum(a)]) for a in (np.ones_like(t), t, v))
    ctt, ctv = (np.concatenate([[0.0], np.cumsum(a)]) for a in (t * t, t * v))
    # A range selector's window is left-open: a sample exactly window seconds old is out.
    lo = np.searchsorted(t, t - window, side="right")
    hi = np.arange(1, len(t) + 1)
    n = c1[hi] - c1[lo]
    st, sv = ct[hi] - ct[lo], cv[hi] - cv[lo]
    stt, stv = ctt[hi] - ctt[lo], ctv[hi] - ctv[lo]
    with np.errstate(invalid="ignore", divide="ignore"):
        # Times relative to the evaluation, as Prometheus's linearRegression(interceptTime).
        cov = stv - st * sv / n
        var = stt - st * st / n
        slope = np.where(var > 0, cov / var, 0.0)
        mean_t, mean_v = st / n, sv / n
        at_now = mean_v + slope * (t - mean_t)
        out = np.where(n >= 2, at_now + slope * horizon, np.nan)
    return [float(x) for x in out]


def _predict_condition(window: float, horizon: float) -> Condition:
    return series_above(lambda ticks: predict_linear(ticks, window, horizon), 1.0)


def _usage_above(u: float) -> Condition:
    return lambda ticks, i: ticks[i].usage > u


def _preemption_rate_above(per_second: float, window: float = 300.0) -> Condition:
    """``rate(vllm:num_preemptions[5m]) > per_second`` from the counted preemptions."""

    def condition(ticks: Sequence[Tick], i: int) -> bool:
        now = ticks[i].t
        j = i
        while j > 0 and ticks[j - 1].t > now - window:
            j -= 1
        span = now - ticks[j].t
        return span > 0 and (ticks[i].preemptions_counted - ticks[j].preemptions_counted) / span > (
            per_second
        )

    return condition


def shipped() -> list[Rule]:
    """The sidecar's page and warning, as rules/kv-headroom.rules.yml writes them (the alert
    benchmark's own first two rules)."""
    return [r for r in RULES if r.name in (PAGE, WARNING)]


def plain() -> list[Rule]:
    """The plain PromQL rules, each named by its expression."""
    out = [
        Rule(
            f"usage > {u:g}",
            f"vllm:kv_cache_usage_perc > {u:g} for {HOLD:g}s",
            _usage_above(u),
            HOLD,
        )
        for u in USAGE
    ]
    for w in PREDICT_WINDOWS:
        for h in PREDICT_HORIZONS:
            name = f"predict_linear(usage[{w / 60:g}m], {h:g}) > 1"
            expr = f"predict_linear(vllm:kv_cache_usage_perc[{w / 60:g}m], {h:g}) > 1"
            out.append(Rule(name, f"{expr} for {HOLD:g}s", _predict_condition(w, h), HOLD))
    out += [
        Rule(
            "llm-d KVCacheSaturation",
            "avg by(pod, model_name) (vllm:kv_cache_usage_perc) > 0.90 for 10m",
            lambda ticks, i: ticks[i].usage > 0.90,
            600.0,
        ),
        Rule(
            "llm-d DecodeKVCacheCritical",
            "avg by(pod) (vllm:kv_cache_usage_perc) > 0.95 for 5m",
            lambda ticks, i: ticks[i].usage > 0.95,
            300.0,
        ),
        Rule(
            "llm-d RequestQueueBuildup",
            "sum by(pod, model_name) (vllm:num_requests_waiting) > 50 for 5m",
            lambda ticks, i: ticks[i].waiting > 50,
            300.0,
        ),
        Rule(
            "llm-d HighPreemptions",
            "sum by(pod) (rate(vllm:num_preemptions[5m])) > 1 for 5m",
            _preemption_rate_above(1.0),
            300.0,
        ),
    ]
    return out
