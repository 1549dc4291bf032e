"""Weeks of sidecar series in a real Prometheus TSDB, and the recording rules over them.

Recording rules only compute from the moment Prometheus loads them; ``promtool tsdb
create-blocks-from rules`` computes them over the past by querying a running Prometheus,
and writes blocks. It evaluates every rule over the source data only, so a rule that
reads another record needs that record in the TSDB first: the records are backfilled in
layers (each layer reads only the raw series and the layers before it), Prometheus
restarted on the new blocks between layers. This is also how a site gets the runway from
its existing history on the day it loads the rules (docs/rules.md#capacity-runway).
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import yaml

from tests.processes import Prometheus
from tests.promql import metric_names
from tests.rules.runway_truths import HISTORY_DAYS, Truth
from tests.rules.test_promtool import promtool

JOB = "kv-headroom"
SAMPLE_SECONDS = 300
PROMTOOL_TIMEOUT_S = 120
# Blocks default to 2 hours: weeks of them is hundreds of blocks, each parsing the whole
# input again and each written with an fsync (a minute for one series here). The flag is
# hidden in promtool's help but has been there since create-blocks-from was (2.24+).
MAX_BLOCK = "--max-block-duration=2000h"


def openmetrics(truths: Iterable[Truth], end: int, step_seconds: int = SAMPLE_SECONDS) -> str:
    """The sidecar series of each truth's pods ending at unix time `end`: every pod a
    kv_headroom_info{model} and one engine holding an equal share of the model's load
    (kv_headroom_load_headroom_ratio = pods / load, so the model's load is the sum of
    1 / ratio), one sample every step_seconds."""
    info: list[str] = []
    ratio: list[str] = []
    for truth in truths:
        samples = list(truth.samples(step_seconds))
        for pod in range(truth.pods):
            labels = f'job="{JOB}",instance="{truth.name}-{pod}:9847"'
            for t, load in samples:
                ts = end + round(t * 86400)
                info.append(f'kv_headroom_info{{{labels},model="{truth.name}"}} 1 {ts}')
                ratio.append(
                    f'kv_headroom_load_headroom_ratio{{{labels},engine="0"}} '
                    f"{truth.pods / load:.6g} {ts}"
                )
    return "\n".join([
        "# HELP kv_headroom_info The sidecar's model.",
        "# TYPE kv_headroom_info gauge",
        *info,
        "# HELP kv_headroom_load_headroom_ratio How many times its traffic the engine holds.",
        "# TYPE kv_headroom_load_headroom_ratio gauge",
        *ratio,
        "# EOF",
        "",
    ])  # fmt: skip


def record_layers(rule_files: Sequence[Path], wanted: Iterable[str]) -> list[dict[str, Any]]:
    """Rule files' contents, one per layer, holding the records `wanted` and those they
    read, each in a layer after every record it reads; groups keep their interval."""
    records: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {}
    for path in rule_files:
        for group in yaml.safe_load(path.read_text())["groups"]:
            for rule in group["rules"]:
                if "record" in rule:
                    records[rule["record"]] = (group, rule)
    needed: set[str] = set()
    todo = list(wanted)
    while todo:
        name = todo.pop()
        if name in needed:
            continue
        needed.add(name)
        todo.extend(n for n in metric_names(records[name][1]["expr"]) if n in records)
    depth: dict[str, int] = {}

    def layer(name: str) -> int:
        if name not in depth:
            reads = [n for n in metric_names(records[name][1]["expr"]) if n in records]
            depth[name] = 1 + max((layer(n) for n in reads), default=-1)
        return depth[name]

    layers: list[dict[str, Any]] = []
    for name in sorted(needed, key=layer):
        while len(layers) <= layer(name):
            layers.append({"groups": []})
        group, rule = records[name]
        groups = layers[layer(name)]["groups"]
        target = next((g for g in groups if g["name"] == group["name"]), None)
        if target is None:
            target = {k: v for k, v in group.items() if k != "rules"} | {"rules": []}
            groups.append(target)
        target["rules"].append(rule)
    return layers


class HistoricalPrometheus(Prometheus):
    """A Prometheus on a TSDB filled beforehand: no scraping, no rules, and a retention
    long enough to keep weeks-old blocks (the default 15 days would delete them)."""

    retention = "10y"

    def __init__(self) -> None:
        super().__init__({}, rules=())
        self.data = self.dir / "data"  # where Prometheus.start keeps its TSDB

    def add_blocks(self, blocks: Path) -> int:
        """Moves the blocks under `blocks` into the TSDB; Prometheus must be stopped."""
        moved = 0
        for block in sorted(p for p in blocks.iterdir() if (p / "meta.json").exists()):
            shutil.move(str(block), self.data / block.name)
            moved += 1
        return moved


def backfill(
    prom: HistoricalPrometheus,
    truths: Sequence[Truth],
    rule_files: Sequence[Path],
    records: Iterable[str],
    end: int,
) -> dict[str, float]:
    """Fills prom's TSDB with the truths' sidecar series and then, layer by layer, the
    records; leaves it running. Returns seconds spent per stage."""
    timings: dict[str, float] = {}
    work = prom.dir / "work"
    work.mkdir()
    start = end - HISTORY_DAYS * 86400
    t0 = time.monotonic()
    source = work / "series.om.txt"
    source.write_text(openmetrics(truths, end))
    result = promtool(
        "tsdb", "create-blocks-from", "openmetrics", "-q", MAX_BLOCK, source, work / "raw",
        timeout=PROMTOOL_TIMEOUT_S,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    prom.data.mkdir(parents=True, exist_ok=True)
    prom.add_blocks(work / "raw")
    timings["openmetrics"] = time.monotonic() - t0
    for i, layer in enumerate(record_layers(rule_files, records)):
        t0 = time.monotonic()
        rules = work / f"layer{i}.rules.yml"
        rules.write_text(yaml.safe_dump(layer, sort_keys=False))
        prom.start()
        result = promtool(
            "tsdb", "create-blocks-from", "rules", "-q", MAX_BLOCK, f"--url={prom.url}",
            f"--start={start}", f"--end={end}", "--eval-interval=5m",
            f"--output-dir={work / f'layer{i}'}", rules, timeout=PROMTOOL_TIMEOUT_S,
        )  # fmt: skip
        prom.stop()
        assert result.returncode == 0, result.stdout + result.stderr
        prom.add_blocks(work / f"layer{i}")
        timings[f"layer {i}"] = time.monotonic() - t0
    prom.start()
    return timings
