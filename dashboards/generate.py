"""Generate the Grafana dashboards in this folder from code.

    python dashboards/generate.py           # rewrite dashboards/*.json
    python dashboards/generate.py --check   # exit 1 when a committed file is out of date

In the monitoring-mixin shape: ``lib/`` holds the query builders (``queries``), the panel
builders (``panels``) and the shared frame (``frame``); each dashboard is one module
(``capacity``, ``pressure``, ``context_lengths``, ``gpu_memory``) registered in
``DASHBOARDS`` below; this file only renders. The JSON is written with sorted keys, fixed
uids and fixed panel ids, so a regeneration without a change in the code is byte-identical.

Every panel selects with ``namespace=~"$namespace", pod=~"$pod"``. The three variables are
multi-select with "All" = ``.*``, and ``.*`` also matches a series that lacks the label, so
the same dashboards work under Kubernetes service discovery and against a plain Prometheus
with static targets. The sidecar's metrics carry no model label: they are joined with
``kv_headroom_info{model=~"$model"}`` on ``(job, instance)`` — the one series every sidecar
target exports — which also adds ``model`` to each result. vLLM's own series come from
another target (vLLM's port), so they are filtered on their ``model_name`` label instead.

``panel_queries()`` lists every query, and ``runnable(expr)`` substitutes the dashboard
variables so that a test can run each of them against a real Prometheus.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: the repository root holds the package
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import dashboard as dashboard_m

from dashboards import capacity, context_lengths, fleet, gpu_memory, pressure
from dashboards.pressure import EXHAUSTION_CLAMP_SECONDS

__all__ = [
    "DASHBOARDS",
    "EXHAUSTION_CLAMP_SECONDS",
    "main",
    "panel_queries",
    "panels",
    "rendered",
    "runnable",
]

HERE = Path(__file__).resolve().parent

# One line per dashboard: its file and the module that builds it.
DASHBOARDS: dict[str, Callable[[], dashboard_m.Dashboard]] = {
    "kv-cache-capacity.json": capacity.capacity,
    "kv-cache-pressure.json": pressure.pressure,
    "context-lengths.json": context_lengths.context_lengths,
    "gpu-memory.json": gpu_memory.gpu_memory,
    "fleet-overview.json": fleet.fleet_overview,
}

# --- rendering ----------------------------------------------------------------------------


def _number_panels(board: dict[str, Any]) -> None:
    """Fixed ids in layout order: Grafana would otherwise assign them on every import."""
    for i, panel in enumerate(board.get("panels", []), start=1):
        panel["id"] = i


def render(build: Callable[[], dashboard_m.Dashboard]) -> str:
    board: dict[str, Any] = json.loads(json.dumps(build(), cls=JSONEncoder))
    _number_panels(board)
    return json.dumps(board, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def rendered() -> dict[str, str]:
    """Each dashboard file's name and its JSON text."""
    return {name: render(build) for name, build in DASHBOARDS.items()}


def _walk_panels(panels: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for p in panels:
        yield p
        yield from _walk_panels(p.get("panels", []))


def panels(board: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Every panel of a dashboard (rows and what collapsed rows hold included)."""
    yield from _walk_panels(board.get("panels", []))


def panel_queries(folder: Path | None = None) -> list[tuple[str, str, str]]:
    """(dashboard title, panel title, expr) for every query of every panel.

    From the committed JSON in ``folder`` when given, else freshly generated."""
    if folder is None:
        boards = [json.loads(text) for text in rendered().values()]
    else:
        boards = [json.loads((folder / name).read_text()) for name in DASHBOARDS]
    return [
        (board["title"], p["title"], t["expr"])
        for board in boards
        for p in panels(board)
        for t in p.get("targets", [])
        if t.get("expr")
    ]


# What a Prometheus integration test puts in place of the dashboard's variables: every
# namespace, model and pod; the range and step Grafana would send on a short range.
SUBSTITUTIONS = {
    "namespace": ".*",
    "model": ".*",
    "pod": ".*",
    "datasource": "prometheus",
    "__rate_interval": "1m",
    "__interval": "15s",
    "__range": "1h",
}
_VARIABLE = re.compile(r"\$\{(\w+)\}|\$(\w+)")


def runnable(expr: str, substitutions: dict[str, str] | None = None) -> str:
    """``expr`` with the dashboard variables replaced, ready for Prometheus's API.

    Other ``$`` references (label_replace's ``$1``) are left as they are."""
    values = SUBSTITUTIONS | (substitutions or {})

    def replace(m: re.Match[str]) -> str:
        name = m.group(1) or m.group(2)
        return values.get(name, m.group(0))

    return _VARIABLE.sub(replace, expr)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument(
        "--check", action="store_true", help="exit 1 if a committed file differs; write nothing"
    )
    parser.add_argument("--out", type=Path, default=HERE, help="folder of the JSON files")
    args = parser.parse_args(argv)
    stale = []
    for name, text in rendered().items():
        path: Path = args.out / name
        current = path.read_text() if path.exists() else None
        if current == text:
            continue
        stale.append(name)
        if not args.check:
            path.write_text(text)
    if args.check and stale:
        print(
            f"out of date: {', '.join(stale)}; run python dashboards/generate.py",
            file=sys.stderr,
        )
        return 1
    for name in stale:
        print(f"wrote {args.out / name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
