"""The deployed vLLM flags, read from the vLLM process's command line in the same pod.

The pod shares its process namespace, so ``/proc/PID/cmdline`` of the vLLM API server is
readable from the sidecar. Given::

    vllm serve /models/llama --max_model_len=32K -tp 2 --no-enable-prefix-caching \\
        --config /etc/vllm.yaml          # holds gpu-memory-utilization: 0.9, max-model-len: 8192

``parse_flags`` gives ``values`` ``{"model": "/models/llama", "max_model_len": 32768,
"tensor_parallel_size": 2, "enable_prefix_caching": False, "gpu_memory_utilization": 0.9}``,
``origin`` ``"config file /etc/vllm.yaml"`` for the utilization and ``"cmdline"`` for the rest
(explicit flags override the file, as in vLLM), and ``model`` ``"/models/llama"``.

Suffixes follow vLLM's ``human_readable_int``: ``k``/``m``/``g``/``t`` are powers of 1000,
``K``/``M``/``G``/``T`` powers of 1024 (``32k`` = 32,000; ``32K`` = 32,768).
"""

from __future__ import annotations

import ipaddress
import json
import math
import os
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import MappingProxyType
from urllib.parse import urlsplit

import yaml

from exporter.errors import InputError
from exporter.log import get_logger
from exporter.sources.base import Jobs, Outcome, Plugin, Readings, Slot, SourceContext, Stage
from exporter.sources.records import Flags, VllmProcess

PROCESS_SCAN_SECONDS = 30.0
VLLM_DEFAULT_PORT = 8000  # vLLM's --port when the command line does not set it


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise ValueError("not an integer") from None


_SUFFIX = {"k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}
_SUFFIX |= {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


def _human_int(text: str) -> int:
    match = re.fullmatch(r"(\d+(?:\.\d+)?)([kmgtKMGT])", text.strip())
    if match is None:
        try:
            return int(text)
        except ValueError:
            raise ValueError("not an integer (suffixes k/K, m/M, g/G, t/T allowed)") from None
    number, suffix = str(match[1]), str(match[2])
    if suffix.islower():
        return int(float(number) * _SUFFIX[suffix])
    if "." in number:  # vLLM refuses these too: 1.5K is not a whole number of KiB
        raise ValueError(f"decimals are not allowed with binary suffix {suffix}")
    return int(number) * _SUFFIX[suffix]


def _human_int_or_auto(text: str) -> int:
    # Newer vLLM fits max_model_len to memory for -1 / auto; -1 is what it stores.
    return -1 if text.strip().lower() in ("-1", "auto") else _human_int(text)


def _float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ValueError("not a number") from None
    if not math.isfinite(value):
        raise ValueError("not a finite number")
    return value


def _json_object(text: str) -> str:
    """A JSON object flag (``--speculative-config``), kept as its JSON text."""
    try:
        doc = json.loads(text)
    except ValueError:
        raise ValueError("not a JSON object") from None
    if not isinstance(doc, dict):
        raise ValueError("not a JSON object")
    return json.dumps(doc, sort_keys=True)


def _json_scalar(text: str) -> object:
    """A dotted JSON flag's value as vLLM reads it: JSON where it parses, else the text."""
    try:
        return json.loads(text)
    except ValueError:
        return text


_BOOL = None  # the flag is a switch: it takes no value, and --no-FLAG sets False
CANONICAL: dict[str, tuple[str, Callable[[str], object] | None]] = {
    "model": ("model", str),
    "served-model-name": ("served_model_name", str),
    "tensor-parallel-size": ("tensor_parallel_size", _int),
    "pipeline-parallel-size": ("pipeline_parallel_size", _int),
    "data-parallel-size": ("data_parallel_size", _int),
    "max-model-len": ("max_model_len", _human_int_or_auto),
    "max-num-seqs": ("max_num_seqs", _int),
    "max-num-batched-tokens": ("max_num_batched_tokens", _human_int),
    "gpu-memory-utilization": ("gpu_memory_utilization", _float),
    "kv-cache-dtype": ("kv_cache_dtype", str),
    "dtype": ("dtype", str),
    "quantization": ("quantization", str),
    "block-size": ("block_size", _int),
    "enforce-eager": ("enforce_eager", _BOOL),
    "enable-prefix-caching": ("enable_prefix_caching", _BOOL),
    "num-gpu-blocks-override": ("num_gpu_blocks_override", _int),
    "kv-cache-memory-bytes": ("kv_cache_memory_bytes", _human_int),
    "swap-space": ("swap_space", _float),
    "cpu-offload-gb": ("cpu_offload_gb", _float),
    # Flags that move the budget or the blocks (exporter/capacity/deploy_flags.py).
    "speculative-config": ("speculative_config", _json_object),
    "enable-lora": ("enable_lora", _BOOL),
    "max-loras": ("max_loras", _int),
    "max-lora-rank": ("max_lora_rank", _int),
    "fully-sharded-loras": ("fully_sharded_loras", _BOOL),
    "lora-dtype": ("lora_dtype", str),
    "kv-offloading-size": ("kv_offloading_size", _float),
    "skip-mm-profiling": ("skip_mm_profiling", _BOOL),
    "limit-mm-per-prompt": ("limit_mm_per_prompt", _json_object),
    "mm-processor-kwargs": ("mm_processor_kwargs", _json_object),
    "language-model-only": ("language_model_only", _BOOL),
    "max-num-partial-prefills": ("max_num_partial_prefills", _int),
    "disable-hybrid-kv-cache-manager": ("disable_hybrid_kv_cache_manager", _BOOL),
    "async-scheduling": ("async_scheduling", _BOOL),
    "enable-extensible-kv-cache": ("enable_extensible_kv_cache", _BOOL),
    "mamba-cache-dtype": ("mamba_cache_dtype", str),
    "mamba-ssm-cache-dtype": ("mamba_ssm_cache_dtype", str),
    "port": ("port", _int),
    "host": ("host", str),
}
_JSON_FLAGS = frozenset(("speculative-config", "limit-mm-per-prompt", "mm-processor-kwargs"))
_SHORT = {"-tp": "tensor-parallel-size", "-pp": "pipeline-parallel-size"}
_SHORT |= {"-dp": "data-parallel-size", "-q": "quantization"}
# Unknown flags are assumed to take a value, so `--seed 0 MODEL` does not make "0" the model;
# vLLM's switches are the exceptions, so `vllm serve --trust-remote-code M` keeps M: every
# boolean field of EngineArgs and the frontend's args, and the serve command's store_true
# flags, in the 0.32, 0.33 and 0.34 wheels (vllm/engine/arg_utils.py, vllm/entrypoints/),
# plus two switches of older releases.
_OTHER_BOOLEANS = frozenset(
    [
        "aggregate-engine-logging", "allow-credentials", "allow-deprecated-quantization",
        "checkpoint-prepare-on-startup", "cohere-is-reasoning-model", "cudagraph-metrics",
        "data-parallel-external-lb", "data-parallel-hybrid-lb",
        "data-parallel-multi-port-external-lb", "dcp-q-replicate", "disable-cascade-attn",
        "disable-chunked-mm-input", "disable-custom-all-reduce", "disable-fastapi-docs",
        "disable-frontend-multiprocessing", "disable-log-requests", "disable-log-stats",
        "disable-nccl-for-dp-synchronization", "disable-sliding-window",
        "disable-uvicorn-access-log", "enable-auto-tool-choice",
        "enable-batch-sharded-sampling", "enable-chunked-prefill", "enable-cumem-allocator",
        "enable-dbo", "enable-elastic-ep", "enable-ep-weight-filter", "enable-eplb",
        "enable-expert-parallel", "enable-extensible-kv-cache", "enable-fault-tolerance",
        "enable-flash-late-interaction", "enable-flashinfer-autotune",
        "enable-force-include-usage", "enable-hc-sp", "enable-layerwise-nvtx-tracing",
        "enable-log-deltas", "enable-log-outputs", "enable-log-requests",
        "enable-logging-iteration-details", "enable-mamba-cache-stochastic-rounding",
        "enable-mamba-shared-prefix-checkpoint", "enable-mfu-metrics",
        "enable-mixed-moe-lora-format", "enable-mm-embeds", "enable-mm-processor-stats",
        "enable-moe-shared-loras", "enable-nccl-comm-suspend", "enable-offline-docs",
        "enable-per-request-metrics", "enable-prompt-embeds", "enable-prompt-tokens-details",
        "enable-request-id-headers", "enable-return-routed-experts", "enable-scale-out",
        "enable-server-load-tracking", "enable-shm-tensor-arena", "enable-sleep-mode",
        "enable-ssl-refresh", "enable-tokenizer-info-endpoint", "enable-tower-connector-lora",
        "enable-trace-replay", "exclude-tools-when-tool-choice-none",
        "fail-on-environ-validation", "grpc", "headless", "interleave-mm-strings",
        "jit-monitor-verbose", "kv-cache-metrics", "kv-sharing-fast-prefill",
        "log-error-stack", "long-prefill-token-threshold-adaptive", "mm-device-do-normalize",
        "mm-encoder-only", "monokernel", "numa-bind", "ray-workers-use-nsight",
        "return-sampling-mask", "return-tokens-as-token-ids", "scheduler-reserve-full-isl",
        "shuffle-safetensors-files", "skip-tokenizer-init", "sleep-mode-offload-cudagraph",
        "specialize-active-lora", "swa-bounded-replay", "tokens-only", "trust-remote-code",
        "trust-request-chat-template", "trust-request-mm-kwargs", "use-fp64-gumbel",
        "use-replayssm", "use-tqdm-on-load",
    ]
)  # fmt: skip
_SERVER_MODULE = "vllm.entrypoints.openai.api_server"
_PYTHON = re.compile(r"python[0-9.]*")


def _at(argv: Sequence[str], i: int) -> str | None:
    return argv[i] if i < len(argv) else None


def _server_args_start(argv: Sequence[str]) -> tuple[int, bool] | None:
    """Where the server's own arguments begin, and whether ``serve``'s positional model
    tag is allowed; None when argv is no vLLM API server (VLLM::EngineCore, the sidecar…)."""
    if not argv:
        return None
    if os.path.basename(argv[0]) == "vllm":
        return (2, True) if _at(argv, 1) == "serve" else None
    if not _PYTHON.fullmatch(os.path.basename(argv[0])):
        return None
    i = 1
    while i < len(argv):  # skip interpreter options: python3 -u -X dev -m …
        tok = argv[i]
        if tok == "-m":
            if _at(argv, i + 1) == _SERVER_MODULE:
                return i + 2, False
            cli = _at(argv, i + 1) == "vllm.entrypoints.cli.main" and _at(argv, i + 2) == "serve"
            return (i + 3, True) if cli else None
        if tok in ("-c", "-") or not tok.startswith("-"):
            # A script: console scripts run through their shebang show up as
            # `python3 /usr/local/bin/vllm serve …`.
            script = os.path.basename(tok) == "vllm" and _at(argv, i + 1) == "serve"
            return (i + 2, True) if script else None
        i += 2 if tok in ("-X", "-W") else 1
    return None


def _is_flag(tok: str) -> bool:
    # argparse reads "-1" as a value, not an option, when no option looks like a number.
    return tok.startswith("-") and re.fullmatch(r"-\d+(\.\d*)?", tok) is None


def _is_switch(flag: str) -> bool:
    return flag in CANONICAL and CANONICAL[flag][1] is _BOOL


def _problem(where: str, key: str, value: object, why: str) -> str:
    return f"{InputError(where, key, value, why)}; ignored"


class _Collector:
    """Typed values and where each came from; a later ``set`` overrides an earlier one."""

    def __init__(self) -> None:
        self.values: dict[str, object] = {}
        self.origin: dict[str, str] = {}
        self.problems: list[str] = []

    def set(self, flag: str, raw: object, origin: str, where: str, key: str = "") -> None:
        name, parse = CANONICAL[flag]
        if flag == "served-model-name" and isinstance(raw, list) and raw:
            raw = raw[0]  # vLLM answers to every name; the first is the one it reports
        value: object
        if parse is None:
            if not isinstance(raw, bool):
                self.problems.append(_problem(where, key, raw, "is a switch: takes no value"))
                return
            value = raw
        elif raw is None or raw in ("", "None"):  # vLLM's optional_type: back to the default
            self.values.pop(name, None)
            self.origin.pop(name, None)
            return
        elif isinstance(raw, dict) and parse is _json_object:  # from a --config file
            value = json.dumps(raw, sort_keys=True)
        elif isinstance(raw, bool | list | dict):
            self.problems.append(_problem(where, key, raw, "expected a single value"))
            return
        else:
            try:
                value = parse(str(raw))
            except ValueError as e:
                self.problems.append(_problem(where, key, raw, str(e)))
                return
        self.values[name] = value
        self.origin[name] = origin


def _default_read_text(path: str) -> str:
    return Path(path).read_text(encoding="utf-8")


def parse_flags(argv: Sequence[str], read_text: Callable[[str], str] = _default_read_text) -> Flags:
    """Parse a vLLM argv into canonical typed flags. Unknown flags are ignored (vLLM has
    hundreds); an argv that is not a vLLM server is read as a bare list of flags. Never raises.
    """
    start = _server_args_start(argv)
    args = list(argv[start[0] :] if start else argv)
    allow_positional = start is not None and start[1]
    explicit: list[tuple[str, object, str]] = []  # (flag, raw value, as written)
    positional: str | None = None
    config: str | None = None
    dotted: dict[str, dict[str, object]] = {}  # --speculative-config.method ngram …
    found = _Collector()
    i = 0
    while i < len(args):
        tok = args[i]
        i += 1
        if not _is_flag(tok):
            if allow_positional and positional is None:
                positional = tok  # `vllm serve MODEL`
            continue
        head, eq, inline = tok.partition("=")
        base, dot, key = head[2:].partition(".")
        if head.startswith("--") and dot and base.replace("_", "-") in _JSON_FLAGS:
            # vLLM's dotted form of a JSON flag: --speculative-config.method ngram
            if not eq and i < len(args) and not _is_flag(args[i]):
                inline, i = args[i], i + 1
            dotted.setdefault(base.replace("_", "-"), {})[key] = _json_scalar(inline)
            continue
        if head in _SHORT:
            flag = _SHORT[head]
        elif head.startswith("--"):
            flag = head[2:].replace("_", "-")  # vLLM accepts --max_model_len too
        else:
            continue  # an unknown short option such as -O3: its value is attached
        negated = flag.startswith("no-") and _is_switch(flag[3:])
        if negated or _is_switch(flag):
            explicit.append((flag.removeprefix("no-"), inline if eq else not negated, head))
            continue
        if flag not in CANONICAL and flag != "config":
            takes_value = not (flag.startswith("no-") or flag in _OTHER_BOOLEANS)
            if not eq and takes_value and i < len(args) and not _is_flag(args[i]):
                i += 1  # skip the unknown flag's value so it is not taken for the model
            continue
        if eq:
            value: object = inline
        elif i < len(args) and not _is_flag(args[i]):
            value, i = args[i], i + 1
            if flag == "served-model-name":  # nargs="+": the names run to the next flag
                names = [args[i - 1]]
                while i < len(args) and not _is_flag(args[i]):
                    names.append(args[i])
                    i += 1
                value = names
        else:
            found.problems.append(_problem(head, "", None, "needs a value"))
            continue
        if flag == "config":
            config = str(value)
        else:
            explicit.append((flag, value, head))

    for flag, fields in dotted.items():  # merged over the flag's JSON, as vLLM merges them
        given = [raw for name, raw, _ in explicit if name == flag]
        try:
            doc = json.loads(str(given[-1])) if given else {}
        except ValueError:
            doc = {}
        merged = {**doc, **fields} if isinstance(doc, dict) else fields
        explicit.append((flag, json.dumps(merged, sort_keys=True), f"--{flag}.*"))
    if config is not None:  # the file first, so that explicit flags override it
        _apply_config(found, config, read_text)
    for flag, raw, written in explicit:
        found.set(flag, raw, "cmdline", written)
    if positional is not None:  # `vllm serve` lets the positional tag win over --model
        found.set("model", positional, "cmdline", "model")
    model = found.values.get("model")
    return Flags(
        values=MappingProxyType(found.values),
        origin=MappingProxyType(found.origin),
        model=model if isinstance(model, str) else None,
        problems=tuple(found.problems),
    )


def _load_config(path: str, read_text: Callable[[str], str]) -> tuple[dict[object, object], str]:
    """The file's mapping, or {} and why it was ignored."""
    try:
        doc = yaml.safe_load(read_text(path))
    except OSError as e:
        return {}, e.strerror or str(e)
    except UnicodeDecodeError:
        return {}, "not UTF-8 text"
    except (ValueError, yaml.YAMLError):
        return {}, "not valid YAML"
    if doc is None:  # an empty file sets nothing, as in vLLM
        return {}, ""
    if not isinstance(doc, dict):
        return {}, "not a mapping of flag names to values"
    return doc, ""


def _apply_config(found: _Collector, path: str, read_text: Callable[[str], str]) -> None:
    # A relative path is relative to vLLM's working directory, not ours: a caller that knows
    # the pid can pass a read_text that resolves it under /proc/PID/cwd.
    doc, why = _load_config(path, read_text)
    if why:
        found.problems.append(str(InputError(path, "", None, f"--config file ignored: {why}")))
    for key, raw in doc.items():
        flag = str(key).replace("_", "-")
        if flag.startswith("no-") and _is_switch(flag[3:]) and isinstance(raw, bool):
            flag, raw = flag[3:], not raw
        if flag in CANONICAL:
            found.set(flag, raw, f"config file {path}", path, str(key))


def _read_nul_separated(path: Path) -> tuple[str, ...] | None:
    try:
        data = path.read_bytes()
    except OSError:  # vanished (the process exited), or not ours to read
        return None
    parts = data.split(b"\0")
    while parts and not parts[-1]:  # the terminator, and setproctitle's padding
        parts.pop()
    return tuple(p.decode("utf-8", "replace") for p in parts)


def _read_environ(path: Path) -> Mapping[str, str]:
    pairs = (entry.partition("=") for entry in _read_nul_separated(path) or ())
    return MappingProxyType({key: value for key, eq, value in pairs if eq})


def _parent_pid(proc: Path) -> int | None:
    try:  # "pid (comm) state ppid …"; comm may hold spaces and parentheses
        return int((proc / "stat").read_text().rpartition(")")[2].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def find_vllm_processes(proc_path: str = "/proc") -> list[VllmProcess]:
    """The vLLM API servers among ``proc_path/*/cmdline``, lowest pid first. Unreadable and
    vanished entries are skipped: racing exiting processes is normal. Never raises."""
    root = Path(proc_path)
    try:
        pids = sorted(int(name) for name in os.listdir(root) if name.isdigit())
    except OSError:
        return []
    found: dict[int, VllmProcess] = {}
    for pid in pids:
        argv = _read_nul_separated(root / str(pid) / "cmdline")
        if argv and _server_args_start(argv) is not None:
            found[pid] = VllmProcess(pid, argv, _read_environ(root / str(pid) / "environ"))
    # A forked child (an engine core) shows its parent's argv until it renames itself to
    # VLLM::EngineCore: keep only the parent.
    return [
        proc
        for proc in found.values()
        if (parent := _parent_pid(root / str(proc.pid))) not in found
        or found[parent].argv != proc.argv
    ]


def _loopback(host: str) -> bool:
    if host in ("localhost", "localhost.localdomain", "ip6-localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _every_interface(bound: str) -> bool:
    """vLLM without --host (uvicorn binds every interface), or with 0.0.0.0 / ::."""
    try:
        return not bound or ipaddress.ip_address(bound).is_unspecified
    except ValueError:
        return False


def serves(flags: Flags, host: str, port: int) -> bool:
    """Whether the vLLM started with ``flags`` is the one answering at ``host:port``.

    The port must be its ``--port`` (vLLM's default when unset). The address must be its
    ``--host``, or a loopback one when it listens on every interface (no ``--host``,
    0.0.0.0, ::) or on loopback: the pod's own vLLM seen through localhost. Anything else
    (a remote URL, a Service) cannot be told apart from an unrelated vLLM on this machine.
    """
    if flags.values.get("port", VLLM_DEFAULT_PORT) != port:
        return False
    bound = str(flags.values.get("host") or "").strip("[]").lower()
    host = host.strip("[]").lower()
    if bound and host == bound:
        return True
    return _loopback(host) and (_every_interface(bound) or _loopback(bound))


# What this source reads: the vLLM process (when its /proc entry is visible) and its flags.
PROCESS: Slot[VllmProcess] = Slot("process")
FLAGS: Slot[Flags] = Slot("flags")


class ProcessSource:
    """The vLLM process and its flags, rescanned every 30 s and after a restart.

    A helper, not a health source: most pods do not share their process namespace, and
    that is no failure. Only a process that serves ``--vllm.url`` (``serves``) is believed:
    on a shared host another vLLM's model and flags would describe the wrong server.
    """

    name = "process"
    stage = Stage.FIRST
    reports_health = False

    def __init__(
        self,
        *,
        proc_path: str,
        host: str,
        port: int,
        within: float,
        find: Callable[[str], list[VllmProcess]],
        read_flags: Callable[[VllmProcess], Flags],
    ) -> None:
        self._proc, self._host, self._port, self._within = proc_path, host, port, within
        self._find, self._read_flags = find, read_flags
        self._due = 0.0
        self._jobs = Jobs()
        self._ignored: frozenset[int] = frozenset()
        self._log = get_logger()

    def _scan(self) -> list[tuple[VllmProcess, Flags]]:
        return [(p, self._read_flags(p)) for p in self._find(self._proc)]

    def _choose(self, found: list[tuple[VllmProcess, Flags]]) -> tuple[VllmProcess, Flags] | None:
        """The first process serving our URL (several vLLMs on one host: the one on our
        port); the others are logged once per change, so a missing flag source is explained."""
        serving = [(p, f) for p, f in found if serves(f, self._host, self._port)]
        ignored = frozenset(p.pid for p, _ in found) - {p.pid for p, _ in serving}
        if ignored and ignored != self._ignored:
            others = [
                f"pid {p.pid} at {f.values.get('host') or '*'}:"
                f"{f.values.get('port', VLLM_DEFAULT_PORT)}"
                for p, f in found
                if p.pid in ignored
            ]
            url = f"{self._host}:{self._port}"
            self._log.info("vllm_process_ignored", serves=others, not_serving=url)
        self._ignored = ignored
        return serving[0] if serving else None

    def due(self, now: float) -> bool:
        return now >= self._due

    async def poll(self, now: float, readings: Readings) -> Outcome:
        if not self.due(now):  # the poller asks first; a direct call keeps the schedule too
            return None
        self._due = now + PROCESS_SCAN_SECONDS
        try:
            found = await self._jobs.run("scan", self._scan, self._within)
        except TimeoutError:
            return None
        except Exception as e:  # an unreadable /proc entry is not worth a failed poll
            self._log.debug("process_scan_failed", error=f"{type(e).__name__}: {e}")
            return None
        result = self._choose(found)
        if result is None:
            # Nothing found (vLLM between processes, or out of sight): the last flags seen
            # stay the best word on the deployment until a scan finds a process again.
            return None
        process, flags = result
        before = readings.get(PROCESS)
        if before is None or process.pid != before.pid:
            self._log.info("vllm_process_found", pid=process.pid, problems=list(flags.problems))
        readings.put(PROCESS, self.name, process)
        readings.put(FLAGS, self.name, flags)
        return None

    async def on_restart(self, now: float, readings: Readings) -> None:
        self._due = now  # the flags may have changed with the restart: scan next poll


def _read_flags(process: VllmProcess) -> Flags:
    return parse_flags(process.argv)


def _make(context: SourceContext) -> ProcessSource:
    # Only a process that serves the configured URL's port is believed (``serves``).
    config, deps = context.config, context.deps
    url = urlsplit(config.vllm_url)
    return ProcessSource(
        proc_path=config.proc_path,
        host=url.hostname or "",
        port=url.port or (443 if url.scheme == "https" else 80),
        within=context.within,
        find=deps.find_processes or find_vllm_processes,
        read_flags=deps.read_flags or _read_flags,
    )


PLUGIN = Plugin("process", _make)
