"""``kv-headroom demo`` runs end to end without a GPU or vLLM, from a fresh install too."""

from __future__ import annotations

import asyncio
import io
import math
import os
import re
import socket
import subprocess
import sys
import time
import venv
from pathlib import Path

import pytest

from exporter.cli import main
from exporter.demo_cli import HeldLines, demo, plain_line, risk_line, summary
from exporter.simulator.simulation import Simulation, load_scenario
from tests.sidecar.conftest import unused_port
from tests.test_status_page import demo_stack

ROOT = Path(__file__).resolve().parent.parent


def run_demo(python: str, seconds: int, cwd: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    flags = flags or ("--web.listen-address", f"127.0.0.1:{unused_port()}", "--poll.interval", "1s")
    return subprocess.run(
        [python, "-m", "exporter", "demo", "--duration", f"{seconds}s", "--plain", *flags],
        capture_output=True, text=True, timeout=seconds + 60, check=False, cwd=cwd,
    )  # fmt: skip


def test_demo_runs_non_interactively_and_stops_by_itself() -> None:
    proc = run_demo(sys.executable, 8, ROOT)
    assert proc.returncode == 0, proc.stderr
    assert "sidecar metrics  http://127.0.0.1:" in proc.stdout
    usages = [float(u) for u in re.findall(r"usage=([\d.]+)%", proc.stdout)]
    assert usages
    assert max(usages) > 0  # the simulated server is serving traffic
    assert proc.stdout.rstrip().endswith("stopped.")
    assert "Traceback" not in proc.stderr


def test_demo_plain_lines_lead_with_the_risk_and_what_limits_the_engine() -> None:
    proc = run_demo(sys.executable, 6, ROOT)
    lines = [line for line in proc.stdout.splitlines() if "usage=" in line]
    assert lines
    lead = (
        r"t=\d+s sim=\d+s risk=\S+ forecast=\S+ exhaustion=\S+ load_headroom=\S+ binds=\S+ "
        r"limit=\S+ "
    )
    assert all(re.match(lead, x) for x in lines)
    assert any(re.search(r' why="[^"]+"$', x) for x in lines)  # the bottleneck's evidence


def test_demo_live_screen_shows_the_load_headroom_under_the_risk() -> None:
    # The terminal's own path (live=True), not the piped lines: it redraws a screen.
    out = io.StringIO()
    scenario = load_scenario("demo")
    code = asyncio.run(
        demo(
            scenario_name="demo",
            sim=Simulation(scenario, start_time=time.time()),
            host="127.0.0.1",
            port=unused_port(),
            interval=1.0,
            speed=20.0,
            duration=8.0,
            live=True,
            out=out,
        )
    )
    text = out.getvalue()
    screens = text.split("\x1b[H\x1b[2J")
    assert code == 0
    assert len(screens) > 2  # redrawn in place
    held = [re.search(r"\nrisk [^\n]*\nload +(\S+) today's traffic fits", s) for s in screens]
    assert any(m and re.fullmatch(r"\d+\.\d\d×", m.group(1)) for m in held), screens[-1]
    assert text.rstrip().endswith("stopped.")


def test_demo_logs_nothing_below_warning_by_default() -> None:
    # Sources coming up are info events: on a terminal they would interleave with the lines.
    proc = run_demo(sys.executable, 4, ROOT)
    assert proc.returncode == 0
    assert proc.stderr == ""


def test_demo_logs_at_the_level_asked_to_stderr_never_among_the_lines() -> None:
    port = unused_port()
    proc = run_demo(
        sys.executable, 3, ROOT, "--web.listen-address", f"127.0.0.1:{port}", "--log.level", "info"
    )
    assert "source_up" in proc.stderr
    assert "source_up" not in proc.stdout


def test_demo_keeps_the_old_flag_spellings_as_aliases() -> None:
    proc = run_demo(
        sys.executable, 3, ROOT, "--listen", f"127.0.0.1:{unused_port()}", "--poll-interval", "1s"
    )
    assert proc.returncode == 0, proc.stderr


def test_demo_bad_flag_value_is_one_line_and_exit_2() -> None:
    proc = run_demo(sys.executable, 3, ROOT, "--poll.interval", "0s")
    assert proc.returncode == 2
    assert proc.stderr == (
        "kv-headroom demo: --poll.interval: poll.interval = '0s': must be greater than 0\n"
    )


def test_demo_falls_back_to_a_free_port_when_its_own_is_taken_and_says_which() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = run_demo(sys.executable, 3, ROOT, "--web.listen-address", f"127.0.0.1:{port}")
    assert proc.returncode == 0, proc.stderr
    moved = re.search(
        rf"127.0.0.1:{port} is taken .*; listening on port (\d+) instead", proc.stderr
    )
    assert moved
    assert f"sidecar metrics  http://127.0.0.1:{moved.group(1)}/metrics" in proc.stdout
    assert f"note             127.0.0.1:{port} is taken" in proc.stdout


def test_demo_banner_suggests_a_faster_speed() -> None:
    proc = run_demo(sys.executable, 2, ROOT)
    assert "kv-headroom demo --speed 5" in proc.stdout


def test_demo_works_in_a_fresh_venv_after_the_readme_install(tmp_path: Path) -> None:
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    python = str(env_dir / "bin" / "python")
    install = subprocess.run(
        [python, "-m", "pip", "install", "--quiet", str(ROOT)],
        capture_output=True, text=True, timeout=600, check=False,
        env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"},
    )  # fmt: skip
    assert install.returncode == 0, install.stderr[-2000:]
    proc = run_demo(python, 30, tmp_path)  # run outside the checkout: the installed package
    assert proc.returncode == 0, proc.stderr
    assert re.search(r"preemptions=\d+", proc.stdout)
    assert proc.stdout.rstrip().endswith("stopped.")


def test_demo_help_shows_defaults_and_no_markup(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "``" not in text
    assert "(default: 127.0.0.1:9847)" in text
    assert "(default: warning)" in text


def test_log_lines_held_behind_the_live_screen_keep_the_latest() -> None:
    held = HeldLines()
    for i in range(HeldLines.MAX_HELD + 5):
        held.write(f"event {i}\n")
    lines = held.text().splitlines()
    assert len(lines) == HeldLines.MAX_HELD
    assert lines[-1] == f"event {HeldLines.MAX_HELD + 4}"


async def test_the_risk_line_shows_the_forecast_usage_the_risk_rests_on() -> None:
    async with demo_stack() as stack:
        v = (await stack.run(58)).engines[0]
        assert v.risk is not None
        assert f"   forecast {v.risk.forecast_usage:.2f} of the cache   " in risk_line(v)


async def test_the_risk_line_says_not_on_this_trend_when_the_forecast_never_reaches_the_top() -> (
    None
):
    # A minute in there is no trend yet (it waits for two minutes of history) and the
    # forecast level stays below the cache: +Inf, said in words.
    async with demo_stack() as stack:
        v = (await stack.run(58)).engines[0]
        assert v.risk is not None
        assert math.isinf(v.risk.seconds_to_exhaustion)
        line = risk_line(v)
        assert "   exhaustion: not on this trend   " in line
        assert "inf" not in line


async def test_the_risk_line_gives_the_seconds_when_the_forecast_crosses_the_top() -> None:
    # Two minutes in, the ramp's trend carries the forecast over the cache.
    async with demo_stack() as stack:
        v = (await stack.run(128)).engines[0]
        assert v.risk is not None
        assert v.risk.forecast_usage > 1
        assert f"   exhaustion in {v.risk.seconds_to_exhaustion:,.0f} s   " in risk_line(v)


async def test_the_plain_line_says_not_on_this_trend_in_one_word() -> None:
    async with demo_stack() as stack:
        snap = await stack.run(58)
        risk = snap.engines[0].risk
        assert risk is not None
        assert math.isinf(risk.seconds_to_exhaustion)
        line = plain_line(snap, stack.sim, 58.0)
        assert f" forecast={risk.forecast_usage:.2f} exhaustion=not-on-this-trend " in line


@pytest.mark.parametrize("doc", ["README.md", "docs/demo.md"])
async def test_the_documented_demo_screen_is_what_the_demo_shows_at_that_time(doc: str) -> None:
    # The screen quoted in the docs must be a state the model produces, not an old one:
    # the docs once showed "exhaustion in 25 s" where the model says "not on this trend".
    text = (ROOT / doc).read_text()
    quoted = re.search(r"\n(t = +(\d+) s +simulated[^\n]*\n(?:[^\n`…]+\n)+)", text)
    assert quoted, f"{doc} quotes no demo screen"
    seconds = int(quoted.group(2))
    async with demo_stack() as stack:
        snap = await stack.run(seconds)
        shown = summary(snap, stack.sim, seconds).splitlines()
    lines = quoted.group(1).splitlines()
    assert lines[1].startswith("risk ")  # the headline is among what is compared
    assert lines == shown[: len(lines)]
