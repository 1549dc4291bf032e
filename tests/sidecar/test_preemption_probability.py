"""The calibrated probability the sidecar exports beside its score (risk/odds.py), read
from /metrics after polling a real vLLM page."""

from __future__ import annotations

import pytest

from exporter.risk import odds
from tests.exposition import families_by_name
from tests.sidecar.conftest import FakeVllm, MakeRig, fixture_page
from tests.sidecar.test_golden import exported


async def test_a_fresh_engine_exports_the_prior_of_its_scores_band(
    fake_vllm: FakeVllm, make_rig: MakeRig
) -> None:
    text = await exported(fake_vllm, make_rig, "vllm-0.32-cpu-preempted.txt")
    families = families_by_name(text)
    [(_, score)] = families["kv_headroom_preemption_risk"]
    [(labels, probability)] = families["kv_headroom_preemption_probability"]
    assert labels == {"engine": "0"}
    assert probability == pytest.approx(odds.PRIOR[odds.band(score)])


async def test_a_page_without_vllms_preemption_counter_exports_no_probability(
    fake_vllm: FakeVllm, make_rig: MakeRig
) -> None:
    page = "vllm-0.32-cpu-preempted.txt"
    text = "".join(
        line
        for line in fixture_page(page).splitlines(keepends=True)
        if "vllm:num_preemptions" not in line
    )
    families = families_by_name(await exported(fake_vllm, make_rig, page, text))
    assert "kv_headroom_preemption_risk" in families
    assert "kv_headroom_preemption_probability" not in families
