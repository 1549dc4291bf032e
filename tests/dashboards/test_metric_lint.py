"""Every metric a panel queries exists: the sidecar exports it, a real vLLM page carries it,
or it is a recording rule in rules/. And Prometheus's own parser accepts every query."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import yaml

from dashboards import generate
from exporter.metrics import METRICS
from tests.promql import metric_names

ROOT = Path(__file__).resolve().parents[2]
RECORDING_RULE = re.compile(r"^[a-z_]+:[a-z0-9_:]+$")


def sample_names(page: Path) -> set[str]:
    """Metric names of the samples (and declared families) of a text exposition page."""
    names: set[str] = set()
    for line in page.read_text().splitlines():
        if line.startswith("# TYPE "):
            names.add(line.split()[2])
        elif line and not line.startswith("#"):
            names.add(re.split(r"[{ ]", line, maxsplit=1)[0])
    return names


def exported() -> set[str]:
    from_specs = {s.full + ("_total" if s.kind == "counter" else "") for s in METRICS}
    from_golden = set().union(*(sample_names(p) for p in (ROOT / "tests/golden").glob("*.prom")))
    return from_specs | from_golden


def vllm() -> set[str]:
    pages = (ROOT / "tests/fixtures/vllm").glob("*.txt")
    return set().union(*(sample_names(p) for p in pages))


def recording_rules() -> set[str]:
    names: set[str] = set()
    for path in sorted((ROOT / "rules").glob("*.y*ml")):
        doc = yaml.safe_load(path.read_text())
        groups = doc.get("groups", []) if isinstance(doc, dict) else []
        for group in groups:
            names.update(r["record"] for r in group.get("rules", []) if "record" in r)
    return names


def unknown(name: str, rules: set[str]) -> bool:
    if name in exported() or name in vllm():
        return False
    return not (RECORDING_RULE.fullmatch(name) and name in rules)


def test_every_queried_metric_exists() -> None:
    rules = recording_rules()
    missing = sorted(
        f"{board} / {title}: {name}"
        for board, title, expr in generate.panel_queries()
        for name in metric_names(expr)
        if unknown(name, rules)
    )
    assert not missing


def test_the_lint_rejects_a_counter_without_its_total_suffix() -> None:
    assert unknown("kv_headroom_preemptions", set())


def test_the_lint_rejects_a_vllm_metric_no_page_carries() -> None:
    assert unknown("vllm:num_requests_swapped_by_magic", set())


def test_the_lint_accepts_histogram_buckets_from_a_vllm_page() -> None:
    assert not unknown("vllm:request_prompt_tokens_bucket", set())


def test_the_lint_accepts_only_recording_rules_that_exist() -> None:
    assert not unknown("kv_headroom:kv_free_tokens:sum", {"kv_headroom:kv_free_tokens:sum"})
    assert unknown("kv_headroom:kv_free_tokens:sum", set())


def promtool() -> str:
    path = shutil.which("promtool")
    assert path, "promtool is missing: install Debian's prometheus package (.ci/run does)"
    return path


def test_promtool_parses_every_query(tmp_path: Path) -> None:
    queries = generate.panel_queries()
    rules = {
        "groups": [
            {
                "name": "dashboards",
                "rules": [
                    {"record": f"dashboard:query_{i}:check", "expr": generate.runnable(expr)}
                    for i, (_, _, expr) in enumerate(queries)
                ],
            }
        ]
    }
    path = tmp_path / "queries.yml"
    path.write_text(yaml.safe_dump(rules))
    done = subprocess.run(
        [promtool(), "check", "rules", str(path)], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr
