"""Reading rules/: the rule files, their alerts and records, the promtool tests, the
runbook's anchors, and the metric names a PromQL expression reads."""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
RULES_DIR = ROOT / "rules"
RULE_FILES = tuple(sorted(RULES_DIR.glob("*.rules.yml")))
TEST_FILES = tuple(sorted((RULES_DIR / "tests").glob("*.yml")))
RUNBOOK = RULES_DIR / "RUNBOOK.md"
# The group whose records need weeks of history (the capacity runway): empty in a stack
# started minutes ago, checked on backfilled weeks by tests/rules/test_runway_e2e.py.
HISTORY_GROUP = "kv-headroom.capacity"
# Documented in RUNBOOK.md ("Using these rules"), which says how to replace it.
RUNBOOK_BASE = "https://github.com/OWNER/vllm-kv-headroom/blob/main/rules/RUNBOOK.md"


@dataclass(frozen=True)
class Rule:
    file: str
    group: str
    body: dict[str, Any]

    @property
    def name(self) -> str:
        return str(self.body.get("alert") or self.body["record"])

    @property
    def is_alert(self) -> bool:
        return "alert" in self.body

    @property
    def expr(self) -> str:
        return str(self.body["expr"])


@cache
def rules() -> tuple[Rule, ...]:
    out = []
    for path in RULE_FILES:
        for group in yaml.safe_load(path.read_text())["groups"]:
            for body in group["rules"]:
                out.append(Rule(path.name, group["name"], body))
    return tuple(out)


def alerts() -> tuple[Rule, ...]:
    return tuple(r for r in rules() if r.is_alert)


def records() -> tuple[Rule, ...]:
    return tuple(r for r in rules() if not r.is_alert)


@cache
def promtool_tests() -> tuple[dict[str, Any], ...]:
    return tuple(t for p in TEST_FILES for t in yaml.safe_load(p.read_text())["tests"])


_DURATION = re.compile(r"(\d+)(ms|s|m|h|d|w|y)")
_UNIT_SECONDS = {
    "ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800, "y": 31536000,
}  # fmt: skip


def seconds(duration: str) -> float:
    """A Prometheus duration ("15s", "1m30s") in seconds."""
    parts = _DURATION.findall(duration)
    if not parts or "".join(n + u for n, u in parts) != duration:
        raise ValueError(f"not a Prometheus duration: {duration!r}")
    return sum(int(n) * _UNIT_SECONDS[u] for n, u in parts)


def github_anchor(heading: str) -> str:
    """The anchor GitHub gives a Markdown heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def runbook_anchors() -> set[str]:
    return {
        github_anchor(m.group(1))
        for m in re.finditer(r"^#{1,6}\s+(.+?)\s*$", RUNBOOK.read_text(), re.MULTILINE)
    }
