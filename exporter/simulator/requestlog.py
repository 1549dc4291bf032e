"""Request logs: real traffic as a file of requests, read into plain records.

A log is CSV (with a header row) or JSON Lines, one request a line. Which column holds
what is the caller's to say (``LogFormat.columns``): arrival time, prompt tokens and
output tokens are required; where a required column keeps its default name and the log
has none of that name, a column of a usual name for it (``KNOWN_COLUMNS``: those of
OpenAI-style usage, the Azure LLM inference traces, BurstGPT, vLLM's benchmarks) is
read. ``n`` (parallel sampling), a session/conversation id and prefix-block hashes (a
list of ints in JSON Lines; in CSV a list of ints separated by spaces, ``;`` or ``|``)
are read when mapped. Arrival times are numbers in the log's time unit, or ISO 8601
dates and times. ``parse_request_log`` is pure — text in, records out — so the
simulator and ``plan --traffic`` read logs the same way; every problem is one
``InputError`` naming the file, the line and the column.

``window`` then cuts and rescales what was read (``TrafficSpec``): the window
``[start, start + duration)`` of log time, stretched by ``time_scale``, thinned or
multiplied by ``rate_scale`` (seeded; ramping linearly to ``rate_scale_to`` over the
window, so real traffic can grow like a busy morning; a copy is another user's request,
with its own session and prefix blocks), repeated end to end with ``loop``.
"""

from __future__ import annotations

import csv
import io
import json
import math
import random
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

from exporter.errors import InputError

# The roles a column can play; time, prompt and output are required.
ROLES = ("time", "prompt", "output", "n", "session", "hashes")
REQUIRED = ("time", "prompt", "output")
TIME_UNITS = {"s": 1.0, "ms": 1e-3, "us": 1e-6}
DEFAULT_COLUMNS = {"time": "timestamp", "prompt": "input_length", "output": "output_length"}
_HASH_SPLIT = re.compile(r"[\s;|,]+")

# Usual names of the required columns, compared with case, spaces, dashes and
# underscores ignored, in order of preference. Only where the default name is absent:
# a log that has ``input_length`` reads it as before. Optional roles (sessions, prefix
# hashes) are not guessed: reading a column nobody mapped would change what a log replays.
KNOWN_COLUMNS: dict[str, tuple[str, ...]] = {
    "time": (
        "timestamp",  # also the Azure traces' TIMESTAMP and BurstGPT's Timestamp
        "time",
        "arrival_time",
        "arrival_timestamp",
        "arrival",
        "request_time",
        "start_time",
        "created_at",
        "created",
        "ts",
    ),
    "prompt": (
        "input_length",
        "prompt_tokens",  # OpenAI-style usage
        "input_tokens",
        "context_tokens",  # Azure LLM inference traces: ContextTokens
        "request_tokens",  # BurstGPT: Request tokens
        "prompt_len",
        "prompt_length",
        "input_len",
        "num_prompt_tokens",
        "prompt_token_count",
        "input_token_count",
        "num_input_tokens",
    ),
    "output": (
        "output_length",
        "output_tokens",
        "completion_tokens",  # OpenAI-style usage
        "generated_tokens",  # Azure LLM inference traces: GeneratedTokens
        "response_tokens",  # BurstGPT: Response tokens
        "output_len",
        "completion_length",
        "num_output_tokens",
        "num_completion_tokens",
        "output_token_count",
        "completion_token_count",
        "generation_tokens",
        "decode_tokens",
    ),
}


def _loose(name: str) -> str:
    return re.sub(r"[\s_-]+", "", name.strip().lower())


def scenario_hint(roles: Sequence[str]) -> str:
    """How a scenario maps columns: its log's ``columns:`` key."""
    return "columns: {" + ", ".join(f"{role}: COLUMN" for role in roles) + "}"


def resolve_columns(
    header: Sequence[str],
    where: str,
    columns: Mapping[str, str],
    hint: Callable[[Sequence[str]], str] = scenario_hint,
    *,
    line: int = 1,
    optional_may_lack: bool = False,
) -> dict[str, str]:
    """``columns`` with each required role that keeps its default name, where the log
    lacks that name, moved to the log's column of a usual name for it. Mapped names the
    log does not have are one error naming them, the columns the log has, and how to map
    them (``hint`` of the roles: ``--traffic-columns time=COLUMN`` for ``plan``).
    ``optional_may_lack``: a JSON Lines log's first request stands for its header, and
    may leave out an optional key that others have."""
    out = dict(columns)
    by_loose: dict[str, str] = {}
    for name in header:
        by_loose.setdefault(_loose(name), name)
    missing: list[tuple[str, str]] = []  # (role, what the error says of it)
    for role, name in columns.items():
        if name in header or (optional_may_lack and role not in REQUIRED):
            continue
        usual = KNOWN_COLUMNS.get(role, ()) if name == DEFAULT_COLUMNS.get(role) else ()
        found = next((by_loose[_loose(u)] for u in usual if _loose(u) in by_loose), None)
        if found is not None:
            out[role] = found
        else:
            either = " or a usual name for it" if usual else ""
            missing.append((role, f"{name!r} (the {role} column{either})"))
    if missing:
        has = ", ".join(header) if header else "none"
        raise InputError(
            where,
            f"line {line}",
            None,
            f"has no column {', nor '.join(what for _, what in missing)}; its columns: "
            f"{has}; map {'them' if len(missing) > 1 else 'it'} with "
            f"{hint([role for role, _ in missing])}",
        )
    return out


@dataclass(frozen=True)
class LogFormat:
    """How to read one log: its format, its column names, and its time unit."""

    format: str = "jsonl"  # csv | jsonl
    columns: Mapping[str, str] = field(default_factory=lambda: dict(DEFAULT_COLUMNS))
    time_unit: str = "s"


@dataclass(frozen=True)
class LoggedRequest:
    """One request of a log; ``time`` in seconds of log time."""

    time: float
    prompt: int
    output: int
    n: int = 1
    session: str | None = None
    hashes: tuple[int, ...] = ()


@dataclass(frozen=True)
class TrafficSpec:
    """What part of a log a scenario replays, and how fast."""

    time_scale: float = 1.0  # log seconds × time_scale = scenario seconds
    rate_scale: float = 1.0  # < 1 keeps each request with this chance; > 1 adds copies
    rate_scale_to: float | None = None  # the scale at the window's end: a ramp
    start: float = 0.0  # log seconds after the first request
    duration: float | None = None  # log seconds; None: to the end
    loop: bool = False  # repeat the window until the scenario ends
    offset: float = 0.0  # scenario seconds before the first replayed request
    jitter: float = 0.0  # log seconds: spread requests over the log's time resolution


def parse_request_log(
    text: str, where: str, fmt: LogFormat, hint: Callable[[Sequence[str]], str] = scenario_hint
) -> list[LoggedRequest]:
    """Every request of a log, in time order (a stable sort keeps the file's ties).
    ``hint`` is how the caller's user maps a column, named when one is missing."""
    missing = [role for role in REQUIRED if role not in fmt.columns]
    if missing:
        raise InputError(where, "columns", None, f"map the {missing[0]} column")
    if fmt.time_unit not in TIME_UNITS:
        raise InputError(where, "time_unit", fmt.time_unit, "must be s, ms or us")
    unit = TIME_UNITS[fmt.time_unit]
    rows = list(_csv_rows(text, where) if fmt.format == "csv" else _jsonl_rows(text, where))
    if fmt.format == "csv":
        header = list(csv.DictReader(io.StringIO(text)).fieldnames or [])
        columns = resolve_columns(header, where, fmt.columns, hint) if header else {}
    elif rows:  # JSON Lines has no header: the first request's keys stand for one
        first_line, first = rows[0]
        columns = resolve_columns(
            [str(k) for k in first],
            where,
            fmt.columns,
            hint,
            line=first_line,
            optional_may_lack=True,
        )
    else:
        columns = {}
    out = [_record(row, line, where, columns, unit) for line, row in rows]
    out.sort(key=lambda r: r.time)
    return out


def _jsonl_rows(text: str, where: str) -> Iterator[tuple[int, Mapping[str, object]]]:
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise InputError(
                where, f"line {number}, column {e.colno}", None, f"is not JSON: {e.msg}"
            ) from None
        if not isinstance(row, dict):
            raise InputError(where, f"line {number}", None, "must be a JSON object")
        yield number, row


def _csv_rows(text: str, where: str) -> Iterator[tuple[int, Mapping[str, object]]]:
    reader = csv.DictReader(io.StringIO(text))
    for row in reader:
        yield reader.line_num, row


def _record(
    row: Mapping[str, object], line: int, where: str, columns: Mapping[str, str], unit: float
) -> LoggedRequest:
    def value(role: str, *, required: bool) -> object:
        name = columns.get(role)
        if name is None:
            return None
        v = row.get(name)
        if (v is None or v == "") and required:
            raise InputError(where, f"line {line}, column {name}", None, "is missing")
        return None if v == "" else v

    def integer(role: str, default: int | None) -> int:
        v = value(role, required=default is None)
        if v is None and default is not None:
            return default
        number = _as_number(v)
        if number is None or not float(number).is_integer() or number < 0:
            raise InputError(
                where, f"line {line}, column {columns[role]}", v, "must be a whole number ≥ 0"
            )
        return int(number)

    raw_time = value("time", required=True)
    t, scale = _as_number(raw_time), unit
    if t is None:
        # Logs kept by a gateway (the Azure traces among them) write a date and time;
        # only differences between requests matter, so the epoch serves as the origin.
        t, scale = _as_datetime(raw_time), 1.0
    if t is None or not math.isfinite(t) or t < 0:
        raise InputError(
            where,
            f"line {line}, column {columns['time']}",
            raw_time,
            "must be a time ≥ 0 (a number, or a date and time like 2023-11-16 18:15:46.68)",
        )
    n = integer("n", 1)
    if n < 1:
        raise InputError(where, f"line {line}, column {columns['n']}", n, "must be at least 1")
    session = value("session", required=False)
    return LoggedRequest(
        time=t * scale,
        prompt=integer("prompt", None),
        output=integer("output", None),
        n=n,
        session=None if session is None else str(session),
        hashes=_hashes(value("hashes", required=False), line, where, columns.get("hashes", "")),
    )


def _as_datetime(v: object) -> float | None:
    """An ISO 8601 date and time as seconds since the epoch (UTC where no zone is given),
    or None."""
    if not isinstance(v, str):
        return None
    try:
        when = datetime.fromisoformat(v.strip())
    except ValueError:
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return when.timestamp()


def _as_number(v: object) -> float | None:
    if isinstance(v, bool):
        return None
    if isinstance(v, int | float):
        return float(v)
    if isinstance(v, str):
        try:
            return float(v.strip())
        except ValueError:
            return None
    return None


def _hashes(v: object, line: int, where: str, column: str) -> tuple[int, ...]:
    if v is None:
        return ()
    items: list[object]
    if isinstance(v, list):
        items = list(v)
    elif isinstance(v, str):
        items = [s for s in _HASH_SPLIT.split(v.strip().strip("[]")) if s]
    else:
        items = [v]
    out = []
    for item in items:
        number = _as_number(item)
        if number is None or not float(number).is_integer():
            raise InputError(
                where, f"line {line}, column {column}", item, "must be a list of integer hashes"
            )
        out.append(int(number))
    return tuple(out)


def window(
    records: list[LoggedRequest], spec: TrafficSpec, seed: int, until: float
) -> Iterator[LoggedRequest]:
    """The requests a scenario replays, with scenario times, in time order, up to
    ``until`` scenario seconds. Thinning and copies draw from ``random.Random(seed)``,
    so each seed replays a different sample of the same traffic."""
    if not records:
        return
    rng = random.Random(seed)  # noqa: S311 - a reproducible sample, not a secret
    first = records[0].time + spec.start
    last = records[-1].time
    end = last if spec.duration is None else min(last, first + spec.duration)
    span = max(end - first, 0.0)
    chosen = [r for r in records if first <= r.time < end or (r.time == end == last)]
    if not chosen:
        return
    # A looped window repeats after its duration; a whole log after its span plus one
    # mean gap, so that its last and first requests do not land on the same instant.
    if spec.duration is not None and first + spec.duration <= last:
        period = spec.duration
    else:
        period = span + (span / (len(chosen) - 1) if len(chosen) > 1 and span > 0 else 1.0)
    lap = 0
    while True:
        base = spec.offset + lap * period * spec.time_scale
        if base >= until:
            return
        batch = []
        # Thinning keeps or drops a session whole: a conversation missing turns would
        # lose the prefix reuse its later turns rely on.
        session_copies: dict[str, int] = {}
        for r in chosen:
            # A log that keeps whole seconds lands a second's requests on one instant;
            # spreading them over that second is what the real arrivals did.
            spread = rng.uniform(0.0, spec.jitter) if spec.jitter else 0.0
            t = base + (r.time - first + spread) * spec.time_scale
            copies = session_copies.get(r.session, -1) if r.session is not None else -1
            if copies < 0:
                scale = spec.rate_scale
                if spec.rate_scale_to is not None and period > 0:
                    scale += (spec.rate_scale_to - scale) * (r.time - first) / period
                copies = int(scale)
                if rng.random() < scale - copies:
                    copies += 1
                if r.session is not None:
                    session_copies[r.session] = copies
            for c in range(copies):
                # A copy is another user sending the same request moments later.
                jitter = 0.0 if c == 0 else rng.uniform(0.0, 1.0) * spec.time_scale
                if t + jitter < until:
                    batch.append(_at(r, t + jitter, c))
        batch.sort(key=lambda r: r.time)
        yield from batch
        lap += 1
        if not spec.loop:
            return


def _at(r: LoggedRequest, t: float, copy: int) -> LoggedRequest:
    if copy == 0:
        return LoggedRequest(t, r.prompt, r.output, r.n, r.session, r.hashes)
    # A copy is another user's: its own session and prompt content (prefix-block
    # hashes), which repeat within the copy as the original's repeat within the log.
    session = None if r.session is None else f"{r.session}#{copy}"
    return LoggedRequest(t, r.prompt, r.output, r.n, session, copy_hashes(r.hashes, copy))


def copy_hashes(hashes: tuple[int, ...], copy: int) -> tuple[int, ...]:
    """The prefix-block hashes of copy ``copy`` (≥ 1) of a request: the same pattern of
    repeats, none of the original's blocks. Kept as they are, every copy would be served
    from the original's prefix cache and share its KV blocks: scaled traffic would seem
    to cost almost nothing more. Deterministic (a tuple of ints hashes the same in every
    process)."""
    return tuple(hash((h, copy)) for h in hashes)
