"""The benchmarks' scenario library: the package's built-in scenarios and the real-traffic
ones in ``benchmarks/scenarios/``, by name.

The real-traffic scenarios replay 2 MB of Mooncake's public traces
(``benchmarks/scenarios/traces/``). Only the alert and load-headroom benchmarks and their
tests read them, so they live here and stay out of the wheel (``tests/test_wheel.py``);
``kv-headroom demo`` and ``plan --traffic`` still take one as a file:
``--scenario benchmarks/scenarios/trace-daily-ramp-safe.yaml``. The two functions are
named as the package's, whose names they extend.
"""

from __future__ import annotations

from pathlib import Path

from exporter.simulator import simulation
from exporter.simulator.scenario import Scenario

__all__ = ["FOLDER", "builtin_names", "load_scenario"]

FOLDER = Path(__file__).resolve().parent / "scenarios"


def builtin_names() -> list[str]:
    """Every scenario the library holds: the package's and the real-traffic ones."""
    return sorted([*simulation.builtin_names(), *(p.stem for p in FOLDER.glob("*.yaml"))])


def load_scenario(name_or_path: str) -> Scenario:
    """A library scenario by name, or a scenario file; logs are read beside the file."""
    path = FOLDER / f"{name_or_path}.yaml"
    return simulation.load_scenario(str(path) if path.is_file() else name_or_path)
