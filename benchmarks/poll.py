"""Speed and memory of the sidecar's hot paths, measured against baselines in the same run.

1. Parsing the real vLLM 0.32 page (and the same page with 8 engines) against
   ``prometheus_client.parser.text_string_to_metric_families`` (target ≥ 10× faster).
2. The poll-to-snapshot cycle: HTTP fetch from a local vLLM stand-in, parse, fold into
   the history, snapshot (target ≤ 1 ms per engine), against the same cycle run by the
   code of a pinned revision, ``BASELINE``: 1ae06a7, main just before issue 17's second
   pass made the poll cheaper and moved rendering from the poll to the first scrape (it
   renders every snapshot in the poll), so the ratio is everything that pass and the
   later ones bought, against the revision docs/reliability.md has always named. That
   revision is checked out with ``git worktree add --detach`` into a
   temporary directory and run unedited, in a child process with the worktree on
   ``PYTHONPATH``; today's code runs in a child of its own, both driven by
   ``benchmarks/poll_worker.py``, against the same stand-in page, in blocks of ``BLOCK``
   polls taken in turn in one run. Today a snapshot is rendered by the first scrape that
   asks for it (``poll_worker.SCRAPE_EVERY``): that time is printed apart. Without
   git, or in a clone without the revision (CI clones with full history), the benchmark
   fails with one line; it never falls back to another baseline.
3. ``/metrics`` latency p99 with 50 concurrent scrapers against a real ``kv-headroom
   serve`` process (target ≤ 10 ms).
4. Resident memory of the polling process after 10,000 polls (target ≤ 60 MB, flat after
   warm-up).

    python benchmarks/poll.py [--polls 10000] [--output json]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import aiohttp
from aiohttp import web
from prometheus_client.parser import text_string_to_metric_families

from exporter.config import Config
from exporter.log import configure
from exporter.poller import Poller, PollerDeps
from exporter.sources import vllm_page
from exporter.sources.vllm import VllmClient, client_session
from exporter.sources.vllm_page import parse_page

ROOT = Path(__file__).resolve().parent.parent
PAGE = (ROOT / "tests" / "fixtures" / "vllm" / "vllm-0.32-cpu-preempted.txt").read_text()
MODEL = str(ROOT / "tests" / "fixtures" / "vllm" / "tinyllama.config.json")
WORKER = ROOT / "benchmarks" / "poll_worker.py"
# main before issue 17's second pass: the poll every later speed-up is measured against.
BASELINE = "1ae06a757125d807780df989bab964afae93009b"


def engines(page: str, n: int) -> str:
    """The page as a data-parallel server with ``n`` engines exposes it."""
    out = []
    for line in page.splitlines():
        out.append(line)
        if line.startswith("vllm:") and 'engine="0"' in line:
            out.extend(line.replace('engine="0"', f'engine="{i}"') for i in range(1, n))
    return "\n".join(out) + "\n"


def best_of(fn: Any, repeat: int, number: int) -> float:
    """Seconds per call: the best of ``repeat`` runs of ``number`` calls (least noise)."""
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        for _ in range(number):
            fn()
        best = min(best, (time.perf_counter() - t) / number)
    return best


def bench_parse() -> dict[str, Any]:
    out = {}

    def cold(text: str) -> None:
        vllm_page._LABEL_CACHE.clear()  # as on the first poll: every label set is new
        vllm_page._CACHE_CONFIGS.clear()
        parse_page(text)

    for label, text in (("1 engine", PAGE), ("8 engines", engines(PAGE, 8))):
        warm = best_of(lambda t=text: parse_page(t), 5, 200)
        first = best_of(lambda t=text: cold(t), 5, 50)
        reference = best_of(lambda t=text: list(text_string_to_metric_families(t)), 5, 10)
        out[label] = {
            "page_bytes": len(text),
            "ours_ms": warm * 1e3,
            "ours_first_poll_ms": first * 1e3,
            "prometheus_client_ms": reference * 1e3,
            "speedup": reference / warm,
            "speedup_first_poll": reference / first,
        }
    return out


def rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


async def fake_vllm(page: str) -> tuple[web.AppRunner, str]:
    async def metrics(_: web.Request) -> web.Response:
        return web.Response(text=page, content_type="text/plain")

    async def models(_: web.Request) -> web.Response:
        return web.json_response({"data": [{"id": "tinyllama", "max_model_len": 2048}]})

    async def version(_: web.Request) -> web.Response:
        return web.json_response({"version": "0.32.0"})

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/version", version)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    return runner, f"http://127.0.0.1:{port}"


# Polls alternate between today's code and the baseline in blocks of this many: both see
# the same machine, and each runs a block's polls back to back, as production runs one of
# them. Poll-by-poll alternation read ~0.2 ms a poll slower for both.
BLOCK = 50


def _poller(url: str, session: aiohttp.ClientSession) -> tuple[Poller, list[float]]:
    clock = [1_800_000_000.0]
    config = Config(vllm_url=url, nvml_enabled=False, model_path=MODEL)
    client = VllmClient(session, url, timeout_seconds=1.5, max_bytes=16 << 20)
    deps = PollerDeps(clock=lambda: clock[0], find_processes=lambda _p: [])
    return Poller(config, client, deps), clock


def _fail(message: str) -> SystemExit:
    """One line on stderr and exit status 1: the baseline is never skipped or replaced."""
    return SystemExit(f"benchmarks/poll.py: {message}")


@contextlib.contextmanager
def pinned_worktree(revision: str) -> Iterator[Path]:
    """``revision`` checked out, unedited, in a temporary git worktree (removed after)."""
    git = shutil.which("git")
    if git is None:
        raise _fail(f"the baseline is git revision {revision[:7]}, and git is not installed")
    found = subprocess.run(
        [git, "-C", str(ROOT), "cat-file", "-e", f"{revision}^{{commit}}"],
        capture_output=True,
        check=False,
    )
    if found.returncode != 0:
        raise _fail(
            f"the baseline revision {revision[:7]} is not in this clone (clone with full history)"
        )
    with tempfile.TemporaryDirectory(prefix="poll-baseline-") as tmp:
        tree = Path(tmp) / revision[:7]
        added = subprocess.run(
            [git, "-C", str(ROOT), "worktree", "add", "--detach", "--quiet", str(tree), revision],
            capture_output=True,
            text=True,
            check=False,
        )
        if added.returncode != 0:
            last = (added.stderr.strip().splitlines() or ["no message"])[-1]
            raise _fail(f"git worktree add {revision[:7]} failed: {last}")
        try:
            yield tree
        finally:
            subprocess.run(
                [git, "-C", str(ROOT), "worktree", "remove", "--force", str(tree)],
                capture_output=True,
                check=False,
            )


async def _worker(root: Path, url: str) -> asyncio.subprocess.Process:
    """``poll_worker.py`` polling ``url`` with the ``exporter`` of ``root`` alone."""
    return await asyncio.create_subprocess_exec(
        sys.executable, str(WORKER), str(root), url, MODEL,
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(root)},
    )  # fmt: skip


async def _polls(worker: asyncio.subprocess.Process, n: int) -> dict[str, list[float]]:
    assert worker.stdin is not None
    assert worker.stdout is not None
    worker.stdin.write(f"{n}\n".encode())
    await worker.stdin.drain()
    line = await worker.stdout.readline()
    if not line:
        raise _fail("a poll worker ended before answering (its error is above)")
    answer: dict[str, list[float]] = json.loads(line)
    return answer


async def bench_cycle(polls: int, baseline: Path) -> dict[str, Any]:
    """Per-poll time (HTTP + fold + snapshot; + render for the baseline) at 1 and 8 engines,
    today's code against the worktree at ``baseline``; vLLM's stand-in runs in a child
    process, as vLLM does in production.

    Each side polls from a child of its own, a block at a time in turn, so both see the
    same load from whatever else runs on the machine, and the same inputs: one stand-in
    page, one model config, a clock that advances 2 s a poll.
    """
    out = {}
    for n in (1, 8):
        child = await asyncio.create_subprocess_exec(
            sys.executable, __file__, "--serve-engines", str(n),
            stdout=asyncio.subprocess.PIPE,
        )  # fmt: skip
        assert child.stdout is not None
        url = (await child.stdout.readline()).decode().strip()
        times: dict[bool, list[float]] = {False: [], True: []}
        cpu: dict[bool, list[float]] = {False: [], True: []}
        render: list[float] = []
        workers = {False: await _worker(ROOT, url), True: await _worker(baseline, url)}
        try:
            for block in range(2 * polls // BLOCK):
                before = block % 2 == 1
                answer = await _polls(workers[before], BLOCK)
                times[before] += answer["wall"]
                cpu[before] += answer["cpu"]
                if not before:
                    render += answer["render"]
        finally:
            for worker in workers.values():
                assert worker.stdin is not None
                worker.stdin.write(b"\n")  # an empty line: close and exit
                with contextlib.suppress(ConnectionError):
                    await worker.stdin.drain()
                await worker.wait()
            child.terminate()
            await child.wait()
        ours, before_ = (sorted(times[b][len(times[b]) // 10 :]) for b in (False, True))  # warm
        median, median_before = statistics.median(ours) * 1e3, statistics.median(before_) * 1e3
        # The sidecar's own CPU time per poll: the wall time less the wait for the stand-in's
        # answer (another process, as vLLM is; a real vLLM renders its page in milliseconds).
        cpu_ours, cpu_before = (
            statistics.median(cpu[b][len(cpu[b]) // 10 :]) for b in (False, True)
        )
        # On a shared machine the neighbours' load moves every figure by half from minute
        # to minute (measured here: 1.1 then 1.7 ms for the same code, three minutes
        # apart). The quietest block's median is what the code costs when nothing else
        # runs, as timeit's best-of-repeats is; the medians above are what it cost today.
        quiet, quiet_before = (_quietest(times[b][len(times[b]) // 10 :]) for b in (False, True))
        out[f"{n} engine" + ("s" if n > 1 else "")] = {
            "median_ms": median,
            "quietest_block_median_ms_per_engine": quiet * 1e3 / n,
            "before_quietest_block_median_ms_per_engine": quiet_before * 1e3 / n,
            "p99_ms": ours[int(0.99 * (len(ours) - 1))] * 1e3,
            "median_ms_per_engine": median / n,
            "before_median_ms_per_engine": median_before / n,
            "speedup": median_before / median,
            "quietest_block_speedup": quiet_before / quiet,
            "cpu_median_ms_per_engine": cpu_ours * 1e3 / n,
            "before_cpu_median_ms_per_engine": cpu_before * 1e3 / n,
            "render_on_scrape_median_ms": statistics.median(render[len(render) // 10 :]) * 1e3,
        }
    return out


def _quietest(times: list[float]) -> float:
    """The lowest of the per-block medians (blocks of ``BLOCK`` consecutive polls)."""
    blocks = [times[i : i + BLOCK] for i in range(0, len(times) - BLOCK + 1, BLOCK)]
    return min(statistics.median(b) for b in blocks) if blocks else statistics.median(times)


async def serve_engines(n: int) -> None:
    _runner, url = await fake_vllm(engines(PAGE, n))
    print(url, flush=True)
    await asyncio.Event().wait()


async def bench_memory(polls: int) -> dict[str, Any]:
    """RSS of a process that only polls (as the sidecar does), over ``polls`` polls.

    vLLM's stand-in runs here; the poller runs in a child, so its RSS holds the sidecar's
    code and data alone. The baseline is the child's RSS after imports, before polling.
    """
    runner, url = await fake_vllm(PAGE)
    try:
        child = await asyncio.create_subprocess_exec(
            sys.executable, __file__, "--memory-child", url, str(polls),
            stdout=asyncio.subprocess.PIPE,
        )  # fmt: skip
        out, _ = await child.communicate()
    finally:
        await runner.cleanup()
    result: dict[str, Any] = json.loads(out)
    samples = {int(k): v for k, v in result["rss_mb_by_poll"].items()}
    result["rss_mb_by_poll"] = samples
    result["growth_after_warmup_mb"] = samples[polls] - samples[polls // 10]
    result["rss_after_mb"] = samples[polls]
    return result


async def memory_child(url: str, polls: int) -> None:
    configure("error", "json", sys.stderr)  # stdout carries the result
    before = rss_mb()
    samples = {}
    async with client_session() as session:
        poller, clock = _poller(url, session)
        for i in range(1, polls + 1):
            await poller.poll_once()
            clock[0] += 2.0
            if i in (polls // 10, polls // 2, polls):
                samples[i] = rss_mb()
        await poller.close()
    print(json.dumps({"rss_before_mb": before, "rss_mb_by_poll": samples}))


async def bench_scrapes(scrapers: int, seconds: int) -> dict[str, Any]:
    """A real ``kv-headroom serve`` in a child process, scraped by ``scrapers`` at once.

    The load comes from ``wrk`` (C, two threads) when installed, so the figure is the
    sidecar's latency rather than a Python client's; else from aiohttp clients here.
    """
    runner, url = await fake_vllm(PAGE)
    port = _free_port()
    child = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "exporter", "serve", "--vllm.url", url,
        "--web.listen-address", f"127.0.0.1:{port}", "--model.path", MODEL,
        "--no-nvml.enabled", "--log.level", "error", cwd=ROOT,
    )  # fmt: skip
    target = f"http://127.0.0.1:{port}/metrics"
    try:
        async with aiohttp.ClientSession() as session:
            for _ in range(200):  # bounded wait for the sidecar to come up
                try:
                    async with session.get(f"http://127.0.0.1:{port}/readyz") as r:
                        if r.status == 200:
                            break
                except aiohttp.ClientError:
                    pass
                await asyncio.sleep(0.05)
        wrk = shutil.which("wrk")
        if wrk:
            proc = await asyncio.create_subprocess_exec(
                wrk, "-t2", f"-c{scrapers}", f"-d{seconds}s", "--latency", target,
                stdout=asyncio.subprocess.PIPE,
            )  # fmt: skip
            out, _ = await proc.communicate()
            return {"load": "wrk", "scrapers": scrapers, **_wrk_figures(out.decode())}
        return {"load": "aiohttp", **await _python_load(target, scrapers, seconds)}
    finally:
        child.terminate()
        await child.wait()
        await runner.cleanup()


def _wrk_figures(report: str) -> dict[str, float]:
    def ms(text: str) -> float:
        m = re.match(r"([\d.]+)(us|ms|s)", text)
        assert m, text
        return float(m.group(1)) * {"us": 1e-3, "ms": 1.0, "s": 1e3}[m.group(2)]

    p = dict(re.findall(r"^\s+(50|99)%\s+(\S+)", report, re.M))
    rate = re.search(r"Requests/sec:\s+([\d.]+)", report)
    return {
        "p50_ms": ms(p["50"]),
        "p99_ms": ms(p["99"]),
        "requests_per_second": float(rate.group(1)) if rate else float("nan"),
    }


async def _python_load(target: str, scrapers: int, seconds: int) -> dict[str, float]:
    latencies: list[float] = []
    deadline = time.perf_counter() + seconds
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=scrapers)) as session:

        async def scraper() -> None:
            while time.perf_counter() < deadline:
                t = time.perf_counter()
                async with session.get(target) as r:
                    await r.read()
                latencies.append(time.perf_counter() - t)

        await asyncio.gather(*(scraper() for _ in range(scrapers)))
    latencies.sort()
    return {
        "p50_ms": latencies[len(latencies) // 2] * 1e3,
        "p99_ms": latencies[int(0.99 * (len(latencies) - 1))] * 1e3,
        "requests_per_second": len(latencies) / seconds,
    }


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--polls", type=int, default=10_000)
    parser.add_argument("--output", choices=("table", "json"), default="table")
    parser.add_argument("--memory-child", nargs=2, help=argparse.SUPPRESS)
    parser.add_argument("--serve-engines", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_engines:
        asyncio.run(serve_engines(args.serve_engines))
        return 0
    if args.memory_child:
        asyncio.run(memory_child(args.memory_child[0], int(args.memory_child[1])))
        return 0
    configure("error", "json", sys.stderr)  # the pollers' own log lines are not the report
    with pinned_worktree(BASELINE) as baseline:  # first: a missing baseline fails at once
        result: dict[str, Any] = {
            "baseline": BASELINE,
            "parse": bench_parse(),
            "cycle": asyncio.run(bench_cycle(min(args.polls, 2000), baseline)),
            "scrapes": asyncio.run(bench_scrapes(50, 10)),
            "memory": asyncio.run(bench_memory(args.polls)),
        }
    if args.output == "json":
        print(json.dumps(result, indent=2))
        return 0
    print("parse, best of 5       ours (first poll)     prometheus_client   speedup (first)")
    for label, r in result["parse"].items():
        ours = f"{r['ours_ms']:6.3f} ms ({r['ours_first_poll_ms']:.3f})"
        speedup = f"{r['speedup']:9.1f}× ({r['speedup_first_poll']:.1f}×)"
        print(
            f"  {label:<10} {r['page_bytes']:>8,} B {ours} {r['prometheus_client_ms']:9.3f} ms"
            f" {speedup}   target ≥10×"
        )
    print(
        f"poll → snapshot (HTTP, parse, fold, snapshot) against {BASELINE[:7]}"
        "       target ≤1 ms/engine"
    )
    for label, r in result["cycle"].items():
        print(
            f"  {label:<10} median {r['median_ms']:.2f} ms  p99 {r['p99_ms']:.2f} ms"
            f"  = {r['median_ms_per_engine']:.2f} ms per engine;"
            f" {BASELINE[:7]} {r['before_median_ms_per_engine']:.2f} ms: {r['speedup']:.2f}×"
        )
        print(
            f"  {'':<10} quietest block of {BLOCK} polls:"
            f" {r['quietest_block_median_ms_per_engine']:.2f} ms per engine;"
            f" {BASELINE[:7]} {r['before_quietest_block_median_ms_per_engine']:.2f} ms:"
            f" {r['quietest_block_speedup']:.2f}×"
        )
        print(
            f"  {'':<10} the sidecar's CPU time {r['cpu_median_ms_per_engine']:.2f} ms per engine;"
            f" {BASELINE[:7]} {r['before_cpu_median_ms_per_engine']:.2f} ms"
        )
        print(
            f"  {'':<10} rendering, on the first scrape of a snapshot (before: in every poll):"
            f" {r['render_on_scrape_median_ms']:.2f} ms"
        )
    s = result["scrapes"]
    load = f"{s['load']}, {s['requests_per_second']:,.0f} req/s"
    print(
        f"/metrics under 50 concurrent scrapers ({load}): "
        f"p50 {s['p50_ms']:.2f} ms, p99 {s['p99_ms']:.2f} ms   target p99 ≤10 ms"
    )
    m = result["memory"]
    marks = ", ".join(f"{k:,}: {v:.1f} MB" for k, v in m["rss_mb_by_poll"].items())
    print(
        f"RSS of the polling process: {m['rss_before_mb']:.1f} MB before, after polls {marks}; "
        f"growth after warm-up {m['growth_after_warmup_mb']:+.1f} MB   target ≤60 MB, flat"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
