"""The printed CUDA-graph estimates (tests/fixtures/sizing/cudagraph_estimates.csv) agree with
their own quoted lines, with the release model and with the catalogue's configs."""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path

from exporter.capacity.arch import parse_config
from exporter.capacity.releases import release

SIZING = Path(__file__).resolve().parent.parent / "fixtures" / "sizing"
ESTIMATES = SIZING / "cudagraph_estimates.csv"
CONFIG_DIRS = (SIZING / "configs", SIZING.parent / "models")


def rows() -> list[dict[str, str]]:
    with ESTIMATES.open(newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def test_each_row_holds_the_figures_its_quoted_lines_print() -> None:
    for row in rows():
        printed = re.search(r"Estimated CUDA graph memory: ([\d.]+) GiB", row["quote"])
        assert printed, row["model"]
        assert float(printed.group(1)) == float(row["estimate_gib"]), row["model"]
        for mode in ("piecewise", "full"):
            count = re.search(rf"{mode.upper()}=(\d+)", row["quote"])
            recorded = row[f"{mode}_graphs"]
            assert (count.group(1) if count else "") == recorded, (row["model"], mode)


def test_subtracted_is_what_the_release_does_by_default() -> None:
    # No recorded start sets VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS, so whether the estimate
    # came off the KV budget is the release's default (0 before 0.20, 1 from 0.20).
    for row in rows():
        default = release(row["vllm_version"]).subtracts_cudagraph_estimate
        assert default == (row["subtracted"] == "yes"), row["vllm_version"]


def test_recorded_layer_counts_match_the_catalogue_configs() -> None:
    checked = 0
    for row in rows():
        folder = row["model"].replace("/", "__")
        found = [d / folder / "config.json" for d in CONFIG_DIRS if (d / folder).is_dir()]
        if not found or not row["num_layers"]:
            continue
        config = json.loads(found[0].read_text(encoding="utf-8"))
        assert parse_config(config, row["model"]).num_layers == int(row["num_layers"])
        checked += 1
    assert checked >= 3  # the three Qwen2.5-7B-geometry rows whose configs the project holds


def test_the_shipped_graph_estimate_is_the_median_of_the_subtracted_printed_ones() -> None:
    # Not refit on start-up rows: the constant is what vLLM printed as its estimate where the
    # estimate came off the budget (to the two decimals of GiB the docs give).
    from statistics import median

    from exporter.capacity.gpus import GIB
    from exporter.capacity.memory import OverheadModel

    subtracted = [float(r["estimate_gib"]) for r in rows() if r["subtracted"] == "yes"]
    assert len(subtracted) >= 5
    assert round(OverheadModel().cuda_graph / GIB, 2) == round(median(subtracted), 2)
