"""GPUs by name, with their memory as the CUDA driver reports it to vLLM.

vLLM sizes its budget from ``torch.cuda.mem_get_info()``'s total, which is less than the
marketing figure and less than NVML's ``memory.total`` (the driver keeps a reserve): an
"80 GB" H100 reports 79.19 GiB. Figures below are what PyTorch/vLLM printed in public
logs and issues (``total_memory=``, "GPU 0 has a total capacity of X GiB"); where only two
decimals of GiB were published, the byte count is that figure × 2**30 and carries its
rounding (±0.005 GiB). The figure also moves a little with the driver branch (an H100 reads
79.33 GiB on CUDA 12.2 drivers, 79.18-79.20 on 12.7-13.0): pass ``--gpu`` a byte count
when you know yours. Sources of every figure: ``docs/gpu-memory-sources.json``.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass

from exporter.errors import InputError

GIB = 1 << 30


@dataclass(frozen=True)
class Gpu:
    name: str
    total_bytes: int  # as CUDA reports it (what vLLM multiplies by the utilization)
    family: str  # ampere, ada, hopper, blackwell, volta, turing, cdna3, cpu, unknown
    source: str  # where the figure comes from
    aliases: tuple[str, ...] = ()
    # Datasheet figures, used only to give the simulator realistic step times.
    memory_bandwidth: float = 1.0e12  # bytes/s
    bf16_flops: float = 100e12  # dense tensor FLOP/s

    @property
    def platform(self) -> str:
        return "cpu" if self.family == "cpu" else "cuda"


def _gib(value: float) -> int:
    return round(value * GIB)


CATALOGUE: tuple[Gpu, ...] = (
    Gpu(
        "H100-80GB",
        85028896768,
        "hopper",
        "CUDA total 85,028,896,768 B (79.19 GiB)",
        (
            "nvidia h100 80gb hbm3",
            "nvidia h100 80gb",
            "h100 sxm5 80gb",
            "h100-80gb-hbm3",
            "h100",
            "h100-sxm-80gb",
        ),
        memory_bandwidth=3.35e12,
        bf16_flops=9.89e14,
    ),
    Gpu(
        "H100-PCIe-80GB",
        _gib(79.19),
        "hopper",
        "PyTorch total 79.19 GiB",
        ("nvidia h100 pcie", "h100 pcie"),
        memory_bandwidth=2e12,
        bf16_flops=7.56e14,
    ),
    Gpu(
        "H100-NVL-94GB",
        99960750080,
        "hopper",
        "CUDA total 99,960,750,080 B (93.10 GiB)",
        ("nvidia h100 nvl", "h100 nvl", "h100 94gb"),
        memory_bandwidth=3.9e12,
        bf16_flops=8.35e14,
    ),
    Gpu(
        "H200-141GB",
        _gib(139.80),
        "hopper",
        "PyTorch total 139.80 GiB",
        ("nvidia h200", "h200 sxm 141gb", "h200"),
        memory_bandwidth=4.8e12,
        bf16_flops=9.89e14,
    ),
    Gpu(
        "H20-96GB",
        _gib(95.00),
        "hopper",
        "PyTorch total 95.00 GiB",
        ("nvidia h20", "h20"),
        memory_bandwidth=4e12,
        bf16_flops=1.48e14,
    ),
    Gpu(
        "GH200-96GB",
        102005473280,
        "hopper",
        "CUDA total 102,005,473,280 B (95.00 GiB)",
        ("nvidia gh200 480gb", "gh200 96gb hbm3", "gh200"),
        memory_bandwidth=4e12,
        bf16_flops=9.89e14,
    ),
    Gpu(
        "B200",
        _gib(178.35),
        "blackwell",
        "PyTorch total 178.35 GiB",
        ("nvidia b200", "b200 180gb", "b200 sxm"),
        memory_bandwidth=8e12,
        bf16_flops=2.25e15,
    ),
    Gpu(
        "GB10",
        _gib(121.69),
        "blackwell",
        "CUDA total 121.69 GiB (DGX Spark, unified memory; "
        "github.com/MiaAI-Lab/GLM-5.3-Flash-EXL3-2x-DGX-Sparks/issues/47)",
        ("nvidia gb10", "dgx spark", "dgx-spark", "spark"),
        memory_bandwidth=2.73e11,
        bf16_flops=1.25e14,
    ),
    Gpu(
        "A100-SXM4-80GB",
        85100068864,
        "ampere",
        "CUDA total 85,100,068,864 B (79.26 GiB)",
        ("nvidia a100-sxm4-80gb", "a100 80gb sxm", "a100-80gb"),
        memory_bandwidth=2.039e12,
        bf16_flops=3.12e14,
    ),
    Gpu(
        "A100-PCIE-40GB",
        42406903808,
        "ampere",
        "CUDA total 42,406,903,808 B (39.49 GiB)",
        ("nvidia a100-pcie-40gb", "a100 40gb pcie"),
        memory_bandwidth=1.555e12,
        bf16_flops=3.12e14,
    ),
    Gpu(
        "A100-SXM4-40GB",
        42298834944,
        "ampere",
        "CUDA total 42,298,834,944 B (39.39 GiB)",
        ("nvidia a100-sxm4-40gb", "a100 40gb sxm", "a100-40gb"),
        memory_bandwidth=1.555e12,
        bf16_flops=3.12e14,
    ),
    Gpu(
        "L40S",
        47803596800,
        "ada",
        "CUDA total 47,803,596,800 B (44.52 GiB)",
        ("nvidia l40s", "l40s 48gb"),
        memory_bandwidth=8.64e11,
        bf16_flops=3.62e14,
    ),
    Gpu(
        "L40",
        _gib(44.40),
        "ada",
        "PyTorch total 44.40 GiB",
        ("nvidia l40", "l40 48gb"),
        memory_bandwidth=8.64e11,
        bf16_flops=1.81e14,
    ),
    Gpu(
        "L4",
        23570219008,
        "ada",
        "CUDA total 23,570,219,008 B (21.95 GiB)",
        ("nvidia l4", "l4 24gb"),
        memory_bandwidth=3e11,
        bf16_flops=1.21e14,
    ),
    Gpu(
        "A10G",
        _gib(22.06),
        "ampere",
        "PyTorch total 22.06 GiB",
        ("nvidia a10g", "a10g 24gb", "aws g5"),
        memory_bandwidth=6e11,
        bf16_flops=1.25e14,
    ),
    Gpu(
        "A10",
        23696375808,
        "ampere",
        "CUDA total 23,696,375,808 B (22.07 GiB)",
        ("nvidia a10", "a10 24gb"),
        memory_bandwidth=6e11,
        bf16_flops=1.25e14,
    ),
    Gpu(
        "T4",
        15843721216,
        "turing",
        "CUDA total 15,843,721,216 B (14.76 GiB)",
        ("tesla t4", "nvidia t4", "t4 16gb"),
        memory_bandwidth=3.2e11,
        bf16_flops=6.5e13,
    ),
    Gpu(
        "V100-SXM2-16GB",
        16928342016,
        "volta",
        "CUDA total 16,928,342,016 B (15.77 GiB)",
        ("tesla v100-sxm2-16gb", "v100 16gb"),
        memory_bandwidth=9e11,
        bf16_flops=1.25e14,
    ),
    Gpu(
        "V100-SXM2-32GB",
        34072559616,
        "volta",
        "CUDA total 34,072,559,616 B (31.73 GiB)",
        ("tesla v100-sxm2-32gb", "v100 32gb"),
        memory_bandwidth=9e11,
        bf16_flops=1.25e14,
    ),
    Gpu(
        "RTX-4090",
        25386352640,
        "ada",
        "CUDA total 25,386,352,640 B (23.64 GiB, Linux)",
        ("nvidia geforce rtx 4090", "rtx 4090", "4090"),
        memory_bandwidth=1.008e12,
        bf16_flops=1.65e14,
    ),
    Gpu(
        "RTX-3090",
        25327697920,
        "ampere",
        "CUDA total 25,327,697,920 B (23.59 GiB)",
        ("nvidia geforce rtx 3090", "rtx 3090", "3090"),
        memory_bandwidth=9.36e11,
        bf16_flops=7.1e13,
    ),
    Gpu(
        "RTX-A6000",
        51160023040,
        "ampere",
        "CUDA total 51,160,023,040 B (47.65 GiB)",
        ("nvidia rtx a6000", "rtx a6000", "a6000"),
        memory_bandwidth=7.68e11,
        bf16_flops=1.55e14,
    ),
    Gpu(
        "MI300X",
        206141652992,
        "cdna3",
        "HIP total 206,141,652,992 B (191.98 GiB)",
        ("amd instinct mi300x", "mi300x 192gb"),
        memory_bandwidth=5.3e12,
        bf16_flops=1.307e15,
    ),
    Gpu(
        "MI325X",
        274861129728,
        "cdna3",
        "ROCm pool 274,861,129,728 B (PyTorch total not seen)",
        ("amd instinct mi325x", "mi325x 256gb"),
        memory_bandwidth=6e12,
        bf16_flops=1.307e15,
    ),
)

# The GPUs ``plan``'s what-ifs compare with: per vendor, one data-centre GPU per memory
# class, the ones clouds rent for inference today (L4 24 GB, L40S 48 GB, H100 80 GB,
# H200 141 GB, B200 180 GB; MI300X 192 GB, MI325X 256 GB). A planner's next question is
# "one class up or down", not "the A10G next to my L4": a GPU of the same memory class
# says nothing new about the cache. Older or workstation parts (V100, T4, RTX) are not
# rungs but get neighbours on their vendor's ladder.
LADDERS: tuple[tuple[str, ...], ...] = (
    ("L4", "L40S", "H100-80GB", "H200-141GB", "B200"),
    ("MI300X", "MI325X"),
)
SAME_CLASS = 1.1  # memory within 10 % of each other: the same class


def neighbours(gpu: Gpu) -> tuple[Gpu | None, Gpu | None]:
    """The rungs of ``gpu``'s vendor ladder just below and just above its memory class
    (None at either end, and for the CPU or a GPU given by size)."""
    if gpu.family in ("cpu", "unknown"):
        return None, None
    names = LADDERS[1] if gpu.family == "cdna3" else LADDERS[0]
    rungs = [lookup_gpu(n) for n in names]
    below = [g for g in rungs if g.total_bytes * SAME_CLASS < gpu.total_bytes]
    above = [g for g in rungs if g.total_bytes > gpu.total_bytes * SAME_CLASS]
    return (below[-1] if below else None), (above[0] if above else None)


CPU = Gpu("cpu", 0, "cpu", "vLLM's CPU backend: KV memory is VLLM_CPU_KVCACHE_SPACE", ("cpu",))

# Names people type for a GPU sold in several memory sizes. Each takes the variant clouds
# rent for inference today, and ``resolve_gpu`` says so: a silent pick would plan the
# wrong memory for whoever has the other part, a refusal would make everyone look up a
# catalogue name for the common case.
COMMON_VARIANTS: dict[str, tuple[str, str]] = {
    "a100": ("A100-SXM4-80GB", "A100-SXM4-40GB or A100-PCIE-40GB"),
    "v100": ("V100-SXM2-16GB", "V100-SXM2-32GB"),
}


def _key(name: str) -> str:
    """A name as compared: case, spaces, dashes and underscores ignored, so that
    ``H100 80GB``, ``h100-80gb`` and ``RTX4090`` find their catalogue entries."""
    return re.sub(r"[\s_-]+", "", name.strip().lower())


_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(gib|gb|mib|mb|b)?\s*$", re.IGNORECASE)
_UNITS = {"b": 1, "mb": 10**6, "gb": 10**9, "mib": 1 << 20, "gib": GIB}
# ``2xH100``, ``8 x H200``, ``4×L40S``: how many GPUs, then which.
_COUNT_RE = re.compile(r"^\s*(\d+)\s*[x×*]\s*(\S.*)$", re.IGNORECASE)


def parse_bytes(text: str, where: str) -> int:
    """``"85031714816"``, ``"79.19GiB"``, ``"80GB"``, ``"512MiB"`` → bytes."""
    m = _SIZE_RE.match(text)
    if not m:
        raise InputError(where, "", text, "not a size; write bytes or e.g. 79.19GiB, 80GB")
    unit = (m.group(2) or "b").lower()
    value = float(m.group(1)) * _UNITS[unit]
    if value <= 0:
        raise InputError(where, "", text, "must be greater than 0")
    return round(value)


@dataclass(frozen=True)
class GpuChoice:
    """What ``--gpu`` named: the GPU, how many of them (None: not said), and a line to
    tell the user where a short name was taken as one of its variants."""

    gpu: Gpu
    count: int | None = None
    note: str | None = None


def resolve_gpu(name: str, where: str = "--gpu") -> GpuChoice:
    """``--gpu`` as people write it: a catalogue name or alias, a family name sold in
    several sizes (``A100``: the common variant, with a note), a count in front
    (``2xH100``), or a memory size."""
    m = _COUNT_RE.match(name)
    count = None
    if m:
        count = int(m.group(1))
        if count == 0:
            raise InputError(where, "", name, "the GPU count must be at least 1")
        name = m.group(2)
        try:
            lookup_gpu(name, where)
        except InputError as e:  # name the value as typed, count and all
            raise InputError(where, "", m.group(0).strip(), e.problem) from None
    key = _key(name)
    if key in COMMON_VARIANTS:
        taken, others = COMMON_VARIANTS[key]
        note = (
            f"{where} {name.strip()} taken as {taken}, the common one; "
            f"name {others} if that is yours"
        )
        return GpuChoice(lookup_gpu(taken), count, note)
    return GpuChoice(lookup_gpu(name, where), count)


def lookup_gpu(name: str, where: str = "--gpu") -> Gpu:
    """A catalogue GPU by name or alias (case and separators ignored), or a size in bytes."""
    key = _key(name)
    for gpu in (*CATALOGUE, CPU):
        if key == _key(gpu.name) or key in (_key(a) for a in gpu.aliases):
            return gpu
    if key in COMMON_VARIANTS:
        return lookup_gpu(COMMON_VARIANTS[key][0])
    if _SIZE_RE.match(name):
        total = parse_bytes(name, where)
        return Gpu(f"custom ({name.strip()})", total, "unknown", "--gpu as given")
    raise InputError(where, "", name, f"unknown GPU; {_suggest(key)}")


def _suggest(key: str) -> str:
    """The catalogue names closest to a name not found, without listing all of them:
    a line of two dozen names hides the one the user meant."""
    names: dict[str, str] = {}
    for gpu in CATALOGUE:
        for alias in (gpu.name, *gpu.aliases):
            names.setdefault(_key(alias), gpu.name)
    for short, (taken, _) in COMMON_VARIANTS.items():
        names.setdefault(short, taken)
    close = difflib.get_close_matches(key, names, n=6, cutoff=0.6)
    matches = list(dict.fromkeys(names[k] for k in close))[:3]
    rest = (
        f"`kv-headroom plan --list-gpus` lists all {len(CATALOGUE)}; "
        "or give its memory, e.g. 79.19GiB"
    )
    if not matches:
        return rest
    return f"did you mean {' or '.join(matches)}? {rest}"
