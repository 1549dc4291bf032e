"""Request logs: read as written, cut and scaled as asked, bad lines named exactly."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from exporter.cli import main
from exporter.errors import InputError
from exporter.simulator.requestlog import (
    DEFAULT_COLUMNS,
    LogFormat,
    LoggedRequest,
    TrafficSpec,
    parse_request_log,
    window,
)

MOONCAKE = LogFormat(
    "jsonl",
    {"time": "timestamp", "prompt": "input_length", "output": "output_length",
     "hashes": "hash_ids"},
    "ms",
)  # fmt: skip
CSV = LogFormat(
    "csv",
    {"time": "t", "prompt": "in", "output": "out", "session": "conv", "n": "n",
     "hashes": "blocks"},
)  # fmt: skip


def jsonl(*rows: dict[str, object]) -> str:
    return "".join(json.dumps(r) + "\n" for r in rows)


def test_a_jsonl_log_reads_its_mapped_columns_and_time_unit() -> None:
    text = jsonl(
        {"timestamp": 1500, "input_length": 700, "output_length": 20, "hash_ids": [0, 1]},
        {"timestamp": 0, "input_length": 300, "output_length": 9, "hash_ids": []},
    )
    records = parse_request_log(text, "log.jsonl", MOONCAKE)
    assert records == [
        LoggedRequest(0.0, 300, 9),
        LoggedRequest(1.5, 700, 20, hashes=(0, 1)),
    ]


def test_a_csv_log_reads_sessions_n_and_space_separated_hashes() -> None:
    text = "t,in,out,conv,n,blocks\n0.5,100,10,a,2,3 4 5\n1,50,5,,,\n"
    records = parse_request_log(text, "log.csv", CSV)
    assert records == [
        LoggedRequest(0.5, 100, 10, 2, "a", (3, 4, 5)),
        LoggedRequest(1.0, 50, 5),
    ]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("t,in,out,conv,n,blocks\n0,100,ten,,,\n", "log.csv: line 2, column out = 'ten'"),
        ("t,in,out,conv,n,blocks\n0,100,10,,0,\n", "log.csv: line 2, column n = 0"),
        ("t,in,out,conv,n,blocks\n-1,100,10,,,\n", "log.csv: line 2, column t = '-1'"),
        ("t,in,out,conv,n,blocks\n0,100,10,,,3 x\n", "log.csv: line 2, column blocks = 'x'"),
        ("t,in,out,conv,n,blocks\n0,,10,,,\n", "log.csv: line 2, column in: is missing"),
        ("t,input,out,conv,n,blocks\n", "log.csv: line 1: has no column 'in'"),
    ],
)
def test_a_bad_csv_value_names_the_file_line_and_column(text: str, message: str) -> None:
    with pytest.raises(InputError) as e:
        parse_request_log(text, "log.csv", CSV)
    assert str(e.value).startswith(message)


DEFAULTS = LogFormat("csv", dict(DEFAULT_COLUMNS))


@pytest.mark.parametrize(
    ("header", "row"),
    [
        ("timestamp,prompt_tokens,output_tokens", "2.5,700,20"),
        ("TIMESTAMP,ContextTokens,GeneratedTokens", "2.5,700,20"),  # the Azure traces
        (
            "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type",  # BurstGPT
            "2.5,ChatGPT,700,20,720,Conversation log",
        ),
        ("arrival_time,input_tokens,completion_tokens", "2.5,700,20"),
        ("time,prompt_len,output_len", "2.5,700,20"),
    ],
)
def test_a_log_with_usual_column_names_reads_without_a_mapping(header: str, row: str) -> None:
    text = f"{header}\n{row}\n"
    assert parse_request_log(text, "log.csv", DEFAULTS) == [LoggedRequest(2.5, 700, 20)]


def test_the_default_column_is_read_before_a_usual_name() -> None:
    text = "timestamp,prompt_tokens,input_length,output_length\n0,1,2,3\n"
    assert parse_request_log(text, "log.csv", DEFAULTS)[0].prompt == 2


def test_a_column_mapped_by_name_is_not_guessed() -> None:
    fmt = LogFormat("csv", {**DEFAULT_COLUMNS, "prompt": "in"})
    with pytest.raises(InputError, match="has no column 'in' \\(the prompt column\\);"):
        parse_request_log("timestamp,prompt_tokens,output_length\n0,1,2\n", "log.csv", fmt)


def test_no_usual_name_says_which_columns_the_log_has_and_how_to_map_them() -> None:
    with pytest.raises(InputError) as e:
        parse_request_log("when,a,output_tokens\n0,1,2\n", "log.csv", DEFAULTS)
    assert str(e.value) == (
        "log.csv: line 1: has no column 'timestamp' (the time column or a usual name for it), "
        "nor 'input_length' (the prompt column or a usual name for it); its columns: when, a, "
        "output_tokens; map them with columns: {time: COLUMN, prompt: COLUMN}"
    )


def test_a_jsonl_log_is_recognised_by_its_first_requests_keys() -> None:
    text = jsonl({"created_at": 3, "prompt_tokens": 10, "completion_tokens": 4})
    fmt = LogFormat("jsonl", dict(DEFAULT_COLUMNS))
    assert parse_request_log(text, "log.jsonl", fmt) == [LoggedRequest(3.0, 10, 4)]


def test_optional_columns_are_not_guessed() -> None:
    text = "timestamp,input_length,output_length,session_id,hash_ids\n0,1,2,a,7\n"
    assert parse_request_log(text, "log.csv", DEFAULTS) == [LoggedRequest(0.0, 1, 2)]


def test_dates_and_times_are_read_as_seconds_apart_whatever_the_time_unit() -> None:
    text = (
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2023-11-16 18:15:46.6805900,10,1\n2023-11-16 18:16:01.1805900,10,1\n"
    )
    records = parse_request_log(text, "log.csv", LogFormat("csv", dict(DEFAULT_COLUMNS), "ms"))
    assert records[1].time - records[0].time == pytest.approx(14.5)


def test_a_line_that_is_not_json_names_its_line_and_column() -> None:
    text = jsonl({"timestamp": 0, "input_length": 1, "output_length": 1}) + '{"timestamp": 1,\n'
    with pytest.raises(InputError, match=r"^log.jsonl: line 2, column 17: is not JSON"):
        parse_request_log(text, "log.jsonl", MOONCAKE)


def test_a_jsonl_value_of_the_wrong_type_names_its_line_and_column() -> None:
    text = jsonl({"timestamp": 0, "input_length": 1.5, "output_length": 1})
    with pytest.raises(InputError, match=r"^log.jsonl: line 1, column input_length = 1.5"):
        parse_request_log(text, "log.jsonl", MOONCAKE)


def reqs(*times: float) -> list[LoggedRequest]:
    return [LoggedRequest(t, 100, 10) for t in times]


def test_the_window_cuts_start_and_duration_and_stretches_time() -> None:
    spec = TrafficSpec(start=10.0, duration=20.0, time_scale=2.0)
    out = list(window(reqs(0, 5, 10, 15, 29, 30, 40), spec, seed=0, until=1e9))
    assert [r.time for r in out] == [0.0, 10.0, 38.0]


def test_the_window_starts_at_the_offset() -> None:
    out = list(window(reqs(3, 4), TrafficSpec(offset=60.0), seed=0, until=1e9))
    assert [r.time for r in out] == [60.0, 61.0]


def test_rate_scale_below_one_thins_reproducibly_per_seed() -> None:
    records = reqs(*range(1000))
    half = [r.time for r in window(records, TrafficSpec(rate_scale=0.5), 1, 1e9)]
    assert 430 < len(half) < 570
    assert half == [r.time for r in window(records, TrafficSpec(rate_scale=0.5), 1, 1e9)]
    assert half != [r.time for r in window(records, TrafficSpec(rate_scale=0.5), 2, 1e9)]


def test_rate_scale_above_one_adds_copies_in_time_order() -> None:
    out = [r.time for r in window(reqs(*range(100)), TrafficSpec(rate_scale=3.0), 0, 1e9)]
    assert len(out) == 300
    assert out == sorted(out)


def test_a_copy_of_a_logged_request_has_prefix_blocks_of_its_own_repeating_as_its_originals() -> (
    None
):
    records = [
        LoggedRequest(0.0, 64, 8, hashes=(1, 2)),
        LoggedRequest(1.0, 96, 8, hashes=(1, 2, 3)),
    ]
    out = list(window(records, TrafficSpec(rate_scale=2.0), 0, 1e9))
    originals = [r.hashes for r in out if set(r.hashes) <= {1, 2, 3}]
    copies = [r.hashes for r in out if not set(r.hashes) & {1, 2, 3}]
    assert sorted(originals) == [(1, 2), (1, 2, 3)]
    assert len(copies) == 2
    shorter, longer = sorted(copies, key=len)
    assert longer[:2] == shorter  # the copy's second request extends its first's prefix


def test_thinning_keeps_or_drops_a_session_whole() -> None:
    records = [LoggedRequest(float(t), 100, 10, session=str(t % 50)) for t in range(500)]
    kept = list(window(records, TrafficSpec(rate_scale=0.5), 3, 1e9))
    per_session = {r.session: 0 for r in kept}
    for r in kept:
        per_session[r.session] += 1
    assert set(per_session.values()) == {10}


def test_a_looped_window_repeats_until_the_scenario_ends() -> None:
    out = list(window(reqs(0, 1, 2, 3), TrafficSpec(loop=True), seed=0, until=10.0))
    assert [r.time for r in out] == [0, 1, 2, 3, 4, 5, 6, 7, 8, 9]


SCENARIO = """\
name: replayed
duration: 10m
deployment: {model: meta-llama/Llama-3.1-8B-Instruct, gpu: L4, max_model_len: 8192}
traffic:
  file: requests.jsonl
  columns: {hashes: hash_ids}
  time_unit: ms
"""


def test_demo_names_the_bad_line_of_a_scenarios_log_and_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "s.yaml").write_text(SCENARIO)
    (tmp_path / "requests.jsonl").write_text(
        jsonl({"timestamp": 0, "input_length": 10, "output_length": 5})
        + jsonl({"timestamp": 9, "input_length": "many", "output_length": 5})
    )
    assert main(["demo", "--scenario", str(tmp_path / "s.yaml"), "--duration", "1s"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        f"kv-headroom demo: {tmp_path / 'requests.jsonl'}: line 2, column input_length = "
        "'many': must be a whole number ≥ 0"
    ]


def test_demo_names_a_missing_log(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "s.yaml").write_text(SCENARIO)
    assert main(["demo", "--scenario", str(tmp_path / "s.yaml"), "--duration", "1s"]) == 2
    assert "requests.jsonl: cannot be read" in capsys.readouterr().err


def test_rate_scale_to_ramps_the_kept_share_over_the_window() -> None:
    spec = TrafficSpec(rate_scale=0.0, rate_scale_to=1.0, duration=1000.0)
    out = [r.time for r in window(reqs(*range(1000)), spec, 4, 1e9)]
    early = sum(1 for t in out if t < 250)
    late = sum(1 for t in out if t >= 750)
    assert late > 4 * early


def test_jitter_spreads_requests_logged_at_one_instant_over_the_resolution() -> None:
    out = [r.time for r in window(reqs(*[5.0] * 50), TrafficSpec(jitter=1.0), 0, 1e9)]
    assert out == sorted(out)
    assert len(set(out)) == 50
    assert min(out) >= 0.0
    assert max(out) < 1.0
