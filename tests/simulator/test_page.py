"""The simulator speaks vLLM 0.32's /metrics: nothing a real 0.32 page lacks, and the
sidecar reads it as it reads the real one."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from exporter.simulator.simulation import Simulation, load_scenario
from exporter.sources.vllm import incomplete
from exporter.sources.vllm_page import parse_page
from tests.conftest import FIXTURES

REAL = (FIXTURES / "vllm" / "vllm-0.32-cpu-preempted.txt").read_text()


def shape(text: str) -> dict[str, tuple[str, str, frozenset[str], frozenset[str]]]:
    """Per sample name: family type, help, label names, and bucket bounds."""
    out: dict[str, tuple[str, str, frozenset[str], frozenset[str]]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = frozenset(k for k in s.labels if k != "le")
            prev = out.get(s.name)
            les = frozenset([s.labels["le"]]) if "le" in s.labels else frozenset()
            if prev:
                les |= prev[3]
                labels |= prev[2]
            out[s.name] = (family.type, family.documentation, labels, les)
    return out


def busy_page() -> str:
    sim = Simulation(load_scenario("ramp-to-overload"))
    sim.advance_to(1300.0)  # past the first preemption (~1190 s)
    return sim.page()


def test_simulated_page_has_no_name_label_or_help_real_0_32_lacks() -> None:
    real, sim = shape(REAL), shape(busy_page())
    for name, (kind, help_text, labels, _) in sim.items():
        assert name in real, name
        assert (kind, help_text) == real[name][:2], name
        assert labels <= real[name][2], name


def test_simulated_buckets_are_vllms() -> None:
    real, sim = shape(REAL), shape(busy_page())
    for name, (*_, les) in sim.items():
        if not les:
            continue
        if name.startswith(("vllm:request_prompt", "vllm:request_generation",
                            "vllm:request_max_num", "vllm:request_params_max",
                            "vllm:request_prefill_kv")):  # fmt: skip
            continue  # 1-2-5 up to max_model_len: 8192 here, 2048 on the real page
        assert les == real[name][3], name


def test_token_buckets_follow_the_simulated_max_model_len() -> None:
    les = shape(busy_page())["vllm:request_prompt_tokens_bucket"][3]
    assert "5000.0" in les
    assert "10000.0" not in les


def test_cache_config_info_has_0_32_labels() -> None:
    real = parse_page(REAL).engines[0].cache_config
    sim = parse_page(busy_page()).engines[0].cache_config
    assert real is not None
    assert sim is not None
    assert set(sim) == set(real)


def test_the_sidecar_accepts_the_page_as_complete() -> None:
    text = busy_page()
    page = parse_page(text)
    assert incomplete(page, text) is None
    assert page.engines[0].preemptions is not None
    assert page.engines[0].preemptions > 0
