"""Pages of servers that re-export vLLM's series under other names (sources/dialects.py).

The real NIM and Ray Serve 2.32 pages are read in test_real_pages.py. No real page of a
V1 engine under Ray is public here, so the pages below are written the way vLLM's Ray
wrapper names and labels its series (``vllm/v1/metrics/ray_wrappers.py``: ``:`` becomes
``_``, a ``ReplicaId`` label on every series) under Ray's ``ray_`` prefix and tags.
"""

from __future__ import annotations

from exporter.sources.dialects import as_vllm
from exporter.sources.vllm import read_page
from tests.sidecar.conftest import fixture_page

RAY_TAGS = 'Component="core_worker",NodeAddress="10.0.0.4",SessionName="s1",Version="2.49.0"'


def ray_v1(replica: str, worker: str, engine: str, running: int, usage: float) -> str:
    tags = f'{RAY_TAGS},ReplicaId="{replica}",WorkerId="{worker}",engine="{engine}"'
    model = 'model_name="Qwen/Qwen3-8B"'
    return (
        f"ray_vllm_num_requests_running{{{tags},{model}}} {running}.0\n"
        f"ray_vllm_num_requests_waiting{{{tags},{model}}} 0.0\n"
        f"ray_vllm_kv_cache_usage_perc{{{tags},{model}}} {usage}\n"
        f'ray_vllm_cache_config_info{{{tags},block_size="16",num_gpu_blocks="4096"}} 1.0\n'
    )


def test_ray_v1_names_are_read_per_replica_and_engine() -> None:
    page = read_page(ray_v1("r1", "w1", "0", 3, 0.25).encode())
    (e,) = page.engines
    assert page.dialect == "ray-serve"
    assert e.engine == "r1/0"
    assert (e.running, e.waiting, e.kv_usage) == (3, 0, 0.25)
    assert e.cache_config is not None
    assert (e.cache_config.block_size, e.cache_config.num_gpu_blocks) == (16, 4096)
    # Ray's own labels are not vLLM's cache configuration
    assert set(e.cache_config) == {"block_size", "num_gpu_blocks"}


def test_two_replicas_on_one_ray_node_are_two_engines() -> None:
    text = ray_v1("r1", "w1", "0", 3, 0.25) + ray_v1("r2", "w2", "0", 5, 0.5)
    page = read_page(text.encode())
    assert [(e.engine, e.running) for e in page.engines] == [("r1/0", 3), ("r2/0", 5)]
    assert page.problems == ()


def test_a_ray_pages_process_start_time_is_not_taken_for_vllms() -> None:
    text = "process_start_time_seconds 1.7e+09\n" + ray_v1("r1", "w1", "0", 1, 0.1)
    assert read_page(text.encode()).process_start_time is None


def test_vllms_own_page_is_not_rewritten() -> None:
    text = fixture_page("vllm-0.32-cpu-preempted.txt")
    assert read_page(text.encode()).dialect == "vllm"
    assert as_vllm(text) is None


def test_a_page_with_the_running_count_alone_is_no_nim_page() -> None:
    # Another exporter's num_requests_running, with no KV usage beside it, is not vLLM's.
    assert as_vllm("num_requests_running 3\n") is None
