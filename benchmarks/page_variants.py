"""Variants of the page, scored beside the shipped page on the frontier's families, so that a
tuning-log entry in docs/risk-model.md is a command, not a story.

    python benchmarks/page_variants.py     # ~2 min with the fuzz tier's caches

Stop 56's variant (not shipped): the page **stands down on an engine whose own record says
its page-level scores are not followed by preemptions**. Per engine, each poll with the
score above the page's threshold is judged as ``exporter/risk/odds.py`` judges a poll: a hit
if vLLM counts a preemption within the horizon, a miss once the horizon passes without one,
each weighed by its interval, decayed with a half-life (``Odds`` with the page's band as
its top one). The page's odds are
``(hits + PRIOR_SECONDS × PRIOR) / (judged + PRIOR_SECONDS)``, and the page fires only while
they are at least ``PRIOR × STAND_DOWN``: with no hit, until ``PRIOR_SECONDS`` of page-level
polls have been judged misses. ``PRIOR`` is the dev tier's share of such polls that a
counted preemption followed (0.211 on stop 55's recordings). One parameter set, written
before it ran; no sweep.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Sequence
from pathlib import Path

if __package__ in (None, ""):  # run as a script: the repository's root on the path
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.alert_scoring import RULES, Condition, Rule
from exporter.replay import Tick
from exporter.risk.model import ALERT_THRESHOLD, HORIZON
from exporter.risk.odds import Odds

PRIOR = 0.211  # dev polls with the score above 0.99 that a counted preemption followed
PRIOR_SECONDS = 600.0  # the prior weighs as much as ten minutes of page-level polls
STAND_DOWN = 0.5  # the page stands down below this share of the prior
HALF_LIFE_SECONDS = 3600.0  # what the record holds halves with each hour


def _page_band(threshold: float) -> tuple[float, float]:
    """Two bands whose upper one is the page's: a score above ``threshold`` (an ``Odds``
    band holds its lower bound)."""
    return 0.0, math.nextafter(threshold, math.inf)


def stood_down(
    ticks: Sequence[Tick],
    threshold: float = ALERT_THRESHOLD,
    horizon: float = HORIZON,
) -> list[bool]:
    """At each poll, whether the engine's own record of page-level scores has brought the
    page's odds below ``PRIOR × STAND_DOWN``. The record is ``Odds``' own judging, with the
    page's score as its top band."""
    odds = Odds(horizon, (0.0, PRIOR), _page_band(threshold), PRIOR_SECONDS, HALF_LIFE_SECONDS)
    out: list[bool] = []
    for tick in ticks:
        odds.observe(tick.t, tick.preemption_risk, tick.preemptions_counted)
        hits, judged = odds.record(1)
        # The top band's own odds, not the table's: pooling with the band below (which
        # keeps the table in order) is no part of the variant.
        out.append((hits + PRIOR_SECONDS * PRIOR) / (judged + PRIOR_SECONDS) < PRIOR * STAND_DOWN)
    return out


def prior_share(
    runs: Sequence[Sequence[Tick]], threshold: float = ALERT_THRESHOLD, horizon: float = HORIZON
) -> float:
    """``PRIOR`` measured: the share of polls (by their interval) with the score above
    ``threshold`` that a counted preemption followed within ``horizon``, over polls whose
    horizon ended within their run, each judged as ``Odds`` judges it (nothing decays)."""
    hit = seen = 0.0
    for ticks in runs:
        odds = Odds(horizon, (0.0, 0.0), _page_band(threshold), half_life=math.inf)
        for tick in ticks:
            odds.observe(tick.t, tick.preemption_risk, tick.preemptions_counted)
        h, s = odds.record(1)
        hit += h
        seen += s
    return hit / seen if seen else 0.0


def standing_down(page: Rule) -> Rule:
    """``page`` that does not hold where the engine's record stood it down."""
    memo: dict[int, tuple[list[Tick], list[bool]]] = {}

    def condition(ticks: list[Tick], i: int) -> bool:
        kept = memo.get(id(ticks))
        if kept is None or kept[0] is not ticks:
            kept = memo[id(ticks)] = (ticks, stood_down(ticks))
        return page.condition(ticks, i) and not kept[1][i]

    cond: Condition = condition
    return Rule(f"{page.name}_standing_down", f"{page.expr} (stood down by its record)",
                cond, page.for_seconds)  # fmt: skip


def _cell(v: float | None, fmt: str) -> str:
    return "n/a" if v is None else format(v, fmt)


def main() -> int:
    from benchmarks import fuzz_frontier
    from benchmarks.fuzz import run_fuzz

    page, warning = RULES[0], RULES[1]
    variant = standing_down(page)
    first, count = fuzz_frontier.HELD_OUT
    dev = run_fuzz(range(300), 2.0, 2, True)
    measured = prior_share([r.replay.ticks for r in dev if r.replay is not None])
    print(f"PRIOR {PRIOR} (the dev tier's, measured now: {measured:.3f})\n")
    families = [
        *fuzz_frontier.fuzz_families("dev", dev),
        *fuzz_frontier.fuzz_families(
            "held-out", run_fuzz(range(first, first + count), 2.0, 2, True)
        ),
        *fuzz_frontier.library_families(fuzz_frontier.library_runs(2)),
    ]
    print("| family | rule | FA min / safe h | recall | warned before 1st | ramp lead |")
    print("|---|---|---|---|---|---|")
    for fam in families:
        for rule in (page, variant, warning):
            s = fuzz_frontier.score_family(fam, rule)
            cells = (
                _cell(s.false_alarm, ".2f"), _cell(s.recall, ".2f"), _cell(s.warned, ".2f"),
                _cell(s.ramp_lead, "+.0f") + " s",
            )  # fmt: skip
            print(f"| {fam.name} | `{rule.name}` | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
