"""Draws docs/img/capacity-runway.png from the end-to-end test's data: a growing model's
daily and weekly peaks and capacity as the real Prometheus records them from backfilled
weeks, the forecast line the capacity dashboard draws ahead of the last sample, and the
truth it forecasts.

    python -m tests.rules.runway_plot docs/img/capacity-runway.png
"""

from __future__ import annotations

import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # a file, no display
import matplotlib.pyplot as plt

from dashboards.capacity import FORECAST
from dashboards.generate import runnable
from tests.rules.rulefiles import RULE_FILES
from tests.rules.runway_backfill import HistoricalPrometheus, backfill
from tests.rules.test_runway_e2e import END, RECORDS, TRUTHS

MODEL = "growth-20d"
DAY = 86400


def _series(
    prom: HistoricalPrometheus, expr: str, start: int, end: int
) -> list[tuple[float, float]]:
    data = prom.api("query_range", query=expr, start=str(start), end=str(end), step="3600")
    if not data["result"]:
        return []
    return [((int(t) - END) / DAY, float(v)) for t, v in data["result"][0]["values"]]


def main(argv: list[str]) -> int:
    out = Path(argv[0]) if argv else Path("docs/img/capacity-runway.png")
    truth = next(t for t in TRUTHS if t.name == MODEL)
    with HistoricalPrometheus() as prom:
        backfill(prom, TRUTHS, RULE_FILES, RECORDS, END)
        start = END - 42 * DAY
        sel = f'{{model="{MODEL}"}}'
        daily = _series(prom, f"model:kv_headroom_load:max1d{sel}", start, END)
        weekly = _series(prom, f"model:kv_headroom_load:max1w{sel}", start, END)
        capacity = _series(prom, f"model:kv_headroom_pods:capacity{sel}", start, END)
        forecast = _series(prom, runnable(FORECAST, {"model": MODEL}), END, END + 30 * DAY)
        (result,) = prom.api("query", query=f"model:kv_headroom_runway_days{sel}", time=str(END))[
            "result"
        ]
        runway = float(result["value"][1])
    fig, ax = plt.subplots(figsize=(9, 4))
    ax.plot(*zip(*daily, strict=True), lw=0.8, color="tab:blue", label="daily peak (busy hour)")
    ax.plot(*zip(*weekly, strict=True), lw=1.4, color="tab:purple", label="weekly peak")
    cap = [(d, v) for d, v in capacity] + [(30.0, capacity[-1][1])]
    ax.plot(*zip(*cap, strict=True), lw=1.2, color="black", label=f"capacity ({truth.pods} pods)")
    ax.plot(*zip(*forecast, strict=True), lw=1.4, ls="--", color="tab:red",
            label=f"forecast: runway {runway:.0f} days")  # fmt: skip
    days = [d / 4 for d in range(-42 * 4, 30 * 4 + 1)]
    ax.plot(days, [truth.envelope(d) for d in days], lw=0.8, ls=":", color="gray",
            label=f"true weekday peak: runway {truth.runway_days:.0f} days")  # fmt: skip
    ax.axvline(0, color="gray", lw=0.6)
    ax.set_xlabel("days from now (synthetic weeks backfilled into Prometheus)")
    ax.set_ylabel("load (pods' worth of traffic)")
    ax.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    fig.savefig(out, dpi=90)
    plt.close(fig)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
