"""The sidecar as a whole: HTTP endpoints, NVML and the vLLM command line feeding it."""

from __future__ import annotations

import asyncio
import gzip
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import structlog
from aiohttp.test_utils import TestClient, TestServer

from exporter.config import Config
from exporter.poller import PollerDeps
from exporter.server import create_app
from exporter.sources.cmdline import PROCESS_SCAN_SECONDS
from exporter.sources.nvml import NvmlReader
from exporter.status import status_page
from tests.sidecar.conftest import TINYLLAMA, FakeVllm, MakeRig, unused_port
from tests.sidecar.test_failures import value
from tests.sources.test_nvml import MIB, FakeGpu, FakeNvml


async def ready_client(config: Config) -> TestClient:  # type: ignore[type-arg]
    client = TestClient(TestServer(create_app(config), host="127.0.0.1"))
    await client.start_server()
    for _ in range(100):  # bounded: 5 s for the first good poll
        if (await client.get("/readyz")).status == 200:
            break
        await asyncio.sleep(0.05)
    return client


def app_config(url: str, **kw: object) -> Config:
    base: dict[str, object] = {
        "vllm_url": url,
        "vllm_timeout_seconds": 0.2,
        "poll_interval_seconds": 0.3,
        "nvml_enabled": False,
        "model_path": TINYLLAMA,
    }
    base.update(kw)
    return Config(**base)  # type: ignore[arg-type]


async def test_readyz_turns_ready_after_vllm_answers(fake_vllm: FakeVllm) -> None:
    client = await ready_client(app_config(fake_vllm.url))
    try:
        assert (await client.get("/readyz")).status == 200
        resp = await client.get("/metrics")
        assert resp.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        assert "kv_headroom_kv_capacity_blocks" in await resp.text()
    finally:
        await client.close()


async def test_gzip_is_served_when_asked(fake_vllm: FakeVllm) -> None:
    client = await ready_client(app_config(fake_vllm.url))
    try:
        resp = await client.get(
            "/metrics", headers={"Accept-Encoding": "gzip"}, auto_decompress=False
        )
        assert resp.headers["Content-Encoding"] == "gzip"
        assert b"kv_headroom_source_up" in gzip.decompress(await resp.read())
    finally:
        await client.close()


async def test_concurrent_scrapes_see_the_same_snapshot(fake_vllm: FakeVllm) -> None:
    client = await ready_client(app_config(fake_vllm.url, poll_interval_seconds=5.0))
    try:
        bodies = await asyncio.gather(*(client.get("/metrics") for _ in range(20)))
        texts = {await b.text() for b in bodies}
        assert len(texts) == 1
    finally:
        await client.close()


async def test_status_page_escapes_label_values(fake_vllm: FakeVllm) -> None:
    evil = '<script>alert("x")</script>'
    fake_vllm.page = fake_vllm.page.replace(
        'model_name="tinyllama"', f'model_name="{evil.replace(chr(34), chr(92) + chr(34))}"'
    )
    fake_vllm.model = evil
    client = await ready_client(app_config(fake_vllm.url, model_path=None))
    try:
        html = await (await client.get("/")).text()
        assert "<script>" not in html
        assert "&lt;script&gt;" in html
    finally:
        await client.close()


async def test_nvml_gpus_and_foreign_memory_are_exported(
    fake_vllm: FakeVllm, make_rig: MakeRig
) -> None:
    # One H100; vLLM may use 0.92 of CUDA's total plus its context; 10 GiB more is in use.
    cuda_total = 85_028_896_768
    used = int(cuda_total * 0.92) + (1 << 29) + 10 * (1 << 30)
    gpu = FakeGpu("GPU-aaaa", used=used, processes=[(1, used)])
    fake_vllm.page = fake_vllm.page.replace(
        'kv_cache_memory_bytes="1073741824"', 'kv_cache_memory_bytes="None"'
    )
    rig = await make_rig(fake_vllm.url, deps=PollerDeps(nvml=NvmlReader(FakeNvml(gpu))))
    await rig.poll()
    assert value(rig.text, "kv_headroom_source_up", source="nvml") == 1
    assert value(rig.text, "kv_headroom_gpu_memory_total_bytes", gpu="0") == 81_559 * MIB
    foreign = value(rig.text, "kv_headroom_gpu_memory_foreign_bytes", gpu="0")
    assert foreign is not None
    assert abs(foreign - 10 * (1 << 30)) < (1 << 20)


async def test_a_cache_vllm_sized_after_warmup_is_vllms_memory_not_foreign(
    fake_vllm: FakeVllm, make_rig: MakeRig
) -> None:
    # vLLM 0.34's extensible KV cache: utilization unset (1.0), the cache measured after
    # warmup, so vLLM takes nearly all of the GPU: none of it is another process's.
    cuda_total = 85_028_896_768
    used = cuda_total - (3 << 29)  # all but a 1.5 GiB margin
    gpu = FakeGpu("GPU-aaaa", used=used, processes=[(1, used)])
    fake_vllm.version = "0.34.0"
    fake_vllm.page = (
        fake_vllm.page.replace('kv_cache_memory_bytes="1073741824"', 'kv_cache_memory_bytes="None"')
        .replace('num_gpu_blocks_override="48"', 'num_gpu_blocks_override="None"')
        .replace(
            'gpu_memory_utilization="0.92"',
            'enable_extensible_kv_cache="True",gpu_memory_utilization="None"',
        )
    )
    rig = await make_rig(fake_vllm.url, deps=PollerDeps(nvml=NvmlReader(FakeNvml(gpu))))
    await rig.poll()
    assert value(rig.text, "kv_headroom_gpu_memory_foreign_bytes", gpu="0") == 0
    assert value(rig.text, "kv_headroom_memory_ceiling_bytes") == cuda_total
    # ... and the expected budget is the one sized after warmup, set beside vLLM's; the
    # status page's capacity chain shows the cap that sets it.
    assert value(rig.text, "kv_headroom_kv_budget_bytes", engine="0", source="expected")
    page = status_page(rig.poller.snapshot, rig.poller.config)
    assert "capped after warmup at" in page


async def test_nvml_unavailable_is_a_down_source_not_a_crash(
    fake_vllm: FakeVllm, make_rig: MakeRig
) -> None:
    import pynvml

    fake = FakeNvml()
    fake.fail["nvmlInit"] = pynvml.NVML_ERROR_LIBRARY_NOT_FOUND
    rig = await make_rig(fake_vllm.url, deps=PollerDeps(nvml=NvmlReader(fake)))
    await rig.poll()
    assert value(rig.text, "kv_headroom_source_up", source="nvml") == 0
    assert value(rig.text, "kv_headroom_source_up", source="vllm") == 1


async def test_flags_are_read_from_the_vllm_command_line(
    fake_vllm: FakeVllm, make_rig: MakeRig, tmp_path: Path
) -> None:
    proc = tmp_path / "4242"
    proc.mkdir()
    port = fake_vllm.url.rsplit(":", 1)[1].strip("/")  # the vLLM that serves --vllm.url
    argv = ["vllm", "serve", TINYLLAMA, "--max-num-seqs", "16", "--enforce-eager", "--port", port]
    (proc / "cmdline").write_bytes(b"\0".join(a.encode() for a in argv) + b"\0")
    (proc / "environ").write_bytes(b"CUDA_VISIBLE_DEVICES=0\0")
    rig = await make_rig(fake_vllm.url, scan=True, proc_path=str(tmp_path))
    await rig.poll()
    text = rig.text
    assert 'flag="max_num_seqs",source="vllm command line",value="16"' in text
    # max_num_seqs 16 against 3 sequences that fit at p95: the configuration will preempt.
    overcommit = value(text, "kv_headroom_config_overcommit_ratio")
    fits = value(text, "kv_headroom_max_sequences", context="p95")
    assert fits is not None
    assert overcommit == 16 / fits


async def test_of_several_vllms_on_the_host_the_one_serving_our_port_is_read(
    fake_vllm: FakeVllm, make_rig: MakeRig, tmp_path: Path
) -> None:
    port = fake_vllm.url.rsplit(":", 1)[1].strip("/")
    for pid, seqs, serves in ((4242, "16", "8001"), (4343, "24", port)):
        proc = tmp_path / str(pid)
        proc.mkdir()
        argv = ["vllm", "serve", TINYLLAMA, "--max-num-seqs", seqs, "--port", serves]
        (proc / "cmdline").write_bytes(b"\0".join(a.encode() for a in argv) + b"\0")
    rig = await make_rig(fake_vllm.url, scan=True, proc_path=str(tmp_path))
    await rig.poll()
    assert 'flag="max_num_seqs",source="vllm command line",value="24"' in rig.text


async def test_a_vllm_on_the_host_that_does_not_serve_the_url_is_ignored_and_said_once(
    fake_vllm: FakeVllm, make_rig: MakeRig, tmp_path: Path
) -> None:
    proc = tmp_path / "4242"
    proc.mkdir()
    argv = ["vllm", "serve", "other/model", "--max-num-seqs", "16"]  # on vLLM's port 8000
    (proc / "cmdline").write_bytes(b"\0".join(a.encode() for a in argv) + b"\0")
    rig = await make_rig(fake_vllm.url, scan=True, proc_path=str(tmp_path))
    with structlog.testing.capture_logs() as logs:
        await rig.poll(2, every=PROCESS_SCAN_SECONDS)  # two scans
    assert 'source="vllm command line"' not in rig.text
    ignored = [e for e in logs if e["event"] == "vllm_process_ignored"]
    assert [e["serves"] for e in ignored] == [["pid 4242 at *:8000"]]


def test_check_config_validates_and_exits_0(tmp_path: Path) -> None:
    cfg = tmp_path / "kv.yaml"
    cfg.write_text("vllm:\n  url: http://127.0.0.1:8000\npoll:\n  interval: 5s\n")
    proc = subprocess.run(
        [sys.executable, "-m", "exporter", "serve", "--config.file", str(cfg), "--check-config"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert "poll.interval" in proc.stdout
    assert "5s" in proc.stdout


def test_bad_config_exits_2_with_every_problem_and_no_traceback(tmp_path: Path) -> None:
    cfg = tmp_path / "kv.yaml"
    cfg.write_text("poll:\n  interval: fast\nvllm:\n  urll: x\n")
    proc = subprocess.run(
        [sys.executable, "-m", "exporter", "serve", "--config.file", str(cfg)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert "poll.interval" in proc.stderr
    assert "vllm.urll" in proc.stderr


def test_port_taken_exits_1_with_one_event(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "exporter",
                "serve",
                "--web.listen-address",
                f"127.0.0.1:{port}",
                "--vllm.url",
                f"http://127.0.0.1:{unused_port()}",
                "--no-nvml.enabled",
                "--log.format",
                "json",
            ],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    assert proc.returncode == 1
    assert '"event": "listen_failed"' in proc.stdout
    assert "Traceback" not in proc.stderr + proc.stdout


def test_sigterm_stops_the_sidecar_cleanly(tmp_path: Path) -> None:
    port = unused_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "exporter",
            "serve",
            "--web.listen-address",
            f"127.0.0.1:{port}",
            "--vllm.url",
            f"http://127.0.0.1:{unused_port()}",
            "--no-nvml.enabled",
            "--log.format",
            "json",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ},
    )
    try:
        for _ in range(100):  # bounded: up to 10 s to start listening
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            if proc.poll() is not None:
                break
            import time

            time.sleep(0.1)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    assert '"event": "stopping"' in out
    assert "Traceback" not in err
