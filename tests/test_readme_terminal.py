"""The README's first command, exactly as written, in a terminal, on a fresh copy.

Every other demo test pipes its output; users run it in a terminal, where the demo draws a
live screen. This test types the README's command into a pseudo-terminal in a fresh copy
of the checkout (its tracked files, no ``.venv``), waits for the live screen to show the
preemption risk, presses Ctrl-C and expects exit 0 and no traceback.
"""

from __future__ import annotations

import fcntl
import os
import pty
import re
import select
import shutil
import signal
import struct
import subprocess
import termios
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()


def first_command() -> str:
    """The first shell block of the README: the install-and-run command."""
    block = re.search(r"```sh\n(.*?)\n```", README, re.S)
    assert block, "the README has no ```sh block"
    return block.group(1).strip()


def fresh_copy(dest: Path) -> Path:
    """The tracked files of this checkout (as edited), as a fresh clone would have them."""
    files = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT, capture_output=True, check=True,
    ).stdout.decode().split("\0")  # fmt: skip
    for name in filter(None, files):
        src = ROOT / name
        if src.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)
    return dest


def read_until(fd: int, pattern: re.Pattern[str], seen: list[str], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], 1.0)
        if ready:
            try:
                chunk = os.read(fd, 65536)
            except OSError:  # the child closed the terminal
                return bool(pattern.search("".join(seen)))
            if not chunk:
                return bool(pattern.search("".join(seen)))
            seen.append(chunk.decode(errors="replace"))
            if pattern.search("".join(seen)[-20000:]):
                return True
    return False


def test_readme_first_command_shows_the_risk_in_a_terminal_and_stops_on_ctrl_c(
    tmp_path: Path,
) -> None:
    command = first_command()
    assert command.endswith("kv-headroom demo"), command  # defaults only
    workdir = fresh_copy(tmp_path / "clone")
    pid, fd = pty.fork()
    if pid == 0:  # the child: a login-less shell on the terminal, as a user would type it
        os.chdir(workdir)
        os.environ["TERM"] = "xterm-256color"
        os.environ["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
        os.execvp("bash", ["bash", "-c", command])
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
    seen: list[str] = []
    try:
        live = re.compile(r"risk +(\d\.\d\d|–)[^\n]*\n")
        assert read_until(fd, re.compile(r"status page"), seen, timeout=900), "".join(seen)[-3000:]
        # A live screen is redrawn in place and shows the risk line from the first poll on.
        assert read_until(fd, live, seen, timeout=60), "".join(seen)[-3000:]
        assert "\x1b[2J" in "".join(seen)
        time.sleep(3)  # a few redraws
        os.write(fd, b"\x03")  # Ctrl-C, through the terminal's line discipline
        read_until(fd, re.compile(r"stopped\."), seen, timeout=30)
        _, status = os.waitpid(pid, 0)
        pid = 0
    finally:
        if pid:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        os.close(fd)
    out = "".join(seen)
    assert "Traceback" not in out, out[-3000:]
    assert os.waitstatus_to_exitcode(status) == 0, out[-3000:]
    assert "stopped." in out
    assert re.search(r"\nload +(\d+\.\d\d× today's traffic fits|– )", out)  # under the risk
