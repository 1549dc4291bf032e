"""benchmarks/runway_frontier.py: its numpy re-implementation of the capacity runway is the
shipped rules' arithmetic (promtool evaluates the same), and it reads a linear truth within
the ±25 % the rules are held to."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import yaml

from benchmarks import runway_frontier as rf
from tests.rules.rulefiles import RULES_DIR
from tests.rules.runway_promtool import STEP_SECONDS, _series
from tests.rules.runway_truths import TRUTHS
from tests.rules.test_promtool import promtool

TRUTH = next(t for t in TRUTHS if t.name == "growth-10d")
DAYS = (35, 38, 42)  # from 34 days, the history the runway needs, to the end (42)
RECORDS = {
    "median3w": "model:kv_headroom_load_growth:median3w_delta1w",
    "runway": "model:kv_headroom_runway_days",
}
# The runway's group alone, fed the load record it reads as an input series: with the group
# that records the load beside it, promtool evaluates the two in either order at a time both
# are due, and a record may read the load's newest sample or the one before (this test
# failed 1 run in 8 that way; runway_promtool.exact_test says the same).
GROUPS = ("kv-headroom.capacity",)
LOAD = "model:kv_headroom_load:sum"
# Every other sample of the truth, and every group evaluated at each: half promtool's work
# of the 15-minute series, and still two ticks an hour (subqueries between hour marks).
THIN = 2
STEP = f"{STEP_SECONDS * THIN // 60}m"


def test_the_numpy_runway_and_growth_agree_with_promtool_to_1e_9(tmp_path: Path) -> None:
    rules = yaml.safe_load((RULES_DIR / "kv-headroom.rules.yml").read_text(encoding="utf-8"))
    groups = [g for g in rules["groups"] if g["name"] in GROUPS]
    assert [g["name"] for g in groups] == list(GROUPS)
    (tmp_path / "capacity.rules.yml").write_text(yaml.safe_dump({"groups": groups}))
    # The truth's series as runway_promtool writes them, thinned to every THIN-th sample
    # (the pods' kv_headroom_info is 1 throughout, only longer), the load as the traffic
    # group records it: 1 / the ratio written to 4 digits, the same floats numpy reads.
    *info, ratio_series = _series(TRUTH)
    load = [1 / float(r) for r in ratio_series["values"].split()[::THIN]]
    series = [
        *info,
        {"series": f'{LOAD}{{model="{TRUTH.name}"}}', "values": " ".join(map(repr, load))},
    ]
    g = rf.Grid(STEP_SECONDS * THIN)
    mine = rf.shipped(g, np.array(load), float(TRUTH.pods))
    checks = []
    for key, record in RECORDS.items():
        for day in DAYS:
            value = float(mine[key][day * g.D])
            assert 0 < value < math.inf, (key, day, value)  # present (not NaN), positive
            checks.append({
                "expr": f'abs({record}{{model="{TRUTH.name}"}} / {value!r} - 1) < bool 1e-9',
                "eval_time": f"{day}d",
                "exp_samples": [{"labels": f'{{model="{TRUTH.name}"}}', "value": 1}],
            })  # fmt: skip
    test_file = tmp_path / "capacity.test.yml"
    test_file.write_text(yaml.safe_dump({
        "rule_files": ["capacity.rules.yml"],
        "evaluation_interval": STEP,
        "tests": [{"interval": STEP, "input_series": series,
                   "promql_expr_test": checks}],
    }, sort_keys=False, width=10**9))  # fmt: skip
    result = promtool("test", "rules", test_file)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_shipped_runway_reads_linear_growth_within_25_percent_mid_range() -> None:
    g = rf.Grid(STEP_SECONDS)
    truth = rf.truth("lin 1%/d", 0)
    _, load = rf.series(truth, STEP_SECONDS)
    day = -10  # the true runway is 16 days: the middle of the 7-30 days held to ±25 %
    runway = rf.shipped(g, load, rf.CAPACITY)["runway"][(day + rf.HISTORY_DAYS) * g.D]
    assert abs(runway / (rf.R_END - day) - 1) <= 0.25, runway
