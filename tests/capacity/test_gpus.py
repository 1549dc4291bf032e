"""GPU names as people write them: catalogue names, family names, counts, typos."""

from __future__ import annotations

import pytest

from exporter.capacity.gpus import CATALOGUE, lookup_gpu, resolve_gpu
from exporter.errors import InputError


@pytest.mark.parametrize(
    ("typed", "name"),
    [
        ("h100", "H100-80GB"),
        ("H100 80GB", "H100-80GB"),
        ("RTX4090", "RTX-4090"),
        ("gh200", "GH200-96GB"),
        ("a100_40gb", "A100-SXM4-40GB"),
    ],
)
def test_case_spaces_dashes_and_underscores_are_ignored(typed: str, name: str) -> None:
    assert lookup_gpu(typed).name == name


def test_a100_takes_the_80_gb_part_and_says_so() -> None:
    choice = resolve_gpu("A100")
    assert choice.gpu.name == "A100-SXM4-80GB"
    assert choice.note == (
        "--gpu A100 taken as A100-SXM4-80GB, the common one; "
        "name A100-SXM4-40GB or A100-PCIE-40GB if that is yours"
    )


def test_a_full_catalogue_name_carries_no_note() -> None:
    assert resolve_gpu("A100-SXM4-40GB").note is None


@pytest.mark.parametrize(
    ("typed", "count", "name"),
    [
        ("2xH100", 2, "H100-80GB"),
        ("8xH200", 8, "H200-141GB"),
        ("4x L40S", 4, "L40S"),
        ("2 × A100", 2, "A100-SXM4-80GB"),
    ],
)
def test_a_count_in_front_is_the_number_of_gpus(typed: str, count: int, name: str) -> None:
    choice = resolve_gpu(typed)
    assert (choice.count, choice.gpu.name) == (count, name)


def test_a_name_without_a_count_leaves_the_count_unsaid() -> None:
    assert resolve_gpu("H100").count is None


def test_zero_gpus_are_refused() -> None:
    with pytest.raises(InputError, match="the GPU count must be at least 1"):
        resolve_gpu("0xH100")


def test_an_unknown_gpu_suggests_the_close_names() -> None:
    with pytest.raises(InputError) as e:
        lookup_gpu("H100-9000")
    assert e.value.problem.startswith("unknown GPU; did you mean H100-80GB or ")


def test_an_unknown_gpu_does_not_list_the_whole_catalogue() -> None:
    with pytest.raises(InputError) as e:
        lookup_gpu("Q7")
    listed = [g.name for g in CATALOGUE if g.name in e.value.problem]
    assert listed == []
    assert f"`kv-headroom plan --list-gpus` lists all {len(CATALOGUE)}" in e.value.problem


def test_an_unknown_gpu_after_a_count_names_the_value_as_typed() -> None:
    with pytest.raises(InputError) as e:
        resolve_gpu("2xZ9000")
    assert e.value.value == "2xZ9000"
    assert e.value.problem.startswith("unknown GPU")
