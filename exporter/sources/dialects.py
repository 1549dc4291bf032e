"""Pages of servers that re-export vLLM's series under other names, rewritten into vLLM's
own, so that the one parser (``vllm_page``) reads them. Pure.

- **Ray Serve LLM** re-exports every series with Ray's ``ray_`` prefix and Ray's own
  labels (``WorkerId``, ``ReplicaId``, ``NodeAddress``, …): ``ray_vllm:<name>`` (Ray 2.32
  over a V0 engine, as captured in DataDog/integrations-core's fixture), or
  ``ray_vllm_<name>`` once vLLM's Ray wrapper replaced ``:`` by ``_`` for OpenTelemetry
  (``vllm/v1/metrics/ray_wrappers.py``, ``_get_sanitized_opentelemetry_name``). One Ray
  node's page holds every replica on that node, so each replica is an engine here:
  ``<ReplicaId or WorkerId>`` (``/<engine>`` after it where vLLM's own ``engine`` label is
  there too), and Ray's labels are dropped, as is the page's process start time (Ray's
  metrics agent's, not vLLM's).
- **NVIDIA NIM** (its vLLM backend) exposes vLLM's V0 series with no prefix at all
  (``num_requests_running``, ``gpu_cache_usage_perc``, …; DataDog's NIM fixture).

Only a page with no ``vllm:`` series is looked at here, so vLLM's own pages never pay for it.
"""

from __future__ import annotations

from exporter.labels import escape_label
from exporter.sources.vllm_page import START_TIME_SERIES, WANTED_SERIES, parse_labels

RAY_PREFIXES = ("ray_vllm:", "ray_vllm_")
# Labels Ray adds to every application metric (and vLLM's Ray wrapper adds ReplicaId).
RAY_LABELS = frozenset(
    {"Component", "NodeAddress", "SessionName", "Version", "WorkerId", "ReplicaId", "JobId"}
)
_VLLM = "vllm:"
_BARE = frozenset(n[len(_VLLM) :] for n in WANTED_SERIES if n.startswith(_VLLM))
# A NIM page is recognised by the two series every vLLM release exposes.
_BARE_RUNNING = "num_requests_running"
_BARE_USAGE = ("gpu_cache_usage_perc", "kv_cache_usage_perc")


def as_vllm(text: str) -> tuple[str, str] | None:
    """``(dialect, the page in vLLM's names)`` for a Ray Serve or NIM page, else None."""
    lines = text.split("\n")
    if "ray_vllm" in text:
        return "ray-serve", "\n".join(_ray_line(line) for line in lines)
    if any(_name(ln) == _BARE_RUNNING for ln in lines) and any(
        _name(ln) in _BARE_USAGE for ln in lines
    ):
        return "nim", "\n".join(_VLLM + ln if _name(ln) in _BARE else ln for ln in lines)
    return None


def _name(line: str) -> str:
    end = len(line)
    for sep in ("{", " "):
        i = line.find(sep)
        if 0 <= i < end:
            end = i
    return line[:end]


def _ray_line(line: str) -> str:
    if line.startswith(START_TIME_SERIES):
        # The process that serves a Ray node's page is Ray's metrics agent, not vLLM: its
        # start time says nothing of a replica's restart (the counters' fall does).
        return ""
    if not line.startswith(RAY_PREFIXES):
        return line
    name = _name(line)
    canonical = _VLLM + name[len(RAY_PREFIXES[0]) :]  # both prefixes are 9 characters
    if canonical not in WANTED_SERIES:
        return line  # not a series the sidecar reads: left for the parser to skip
    rest = line[len(name) :]
    if not rest.startswith("{"):
        return canonical + rest
    end = rest.rfind("}")
    labels = parse_labels(rest[1:end]) if end > 0 else None
    if labels is None:
        return canonical + rest  # the parser reports the malformed label set
    replica = labels.get("ReplicaId") or labels.get("WorkerId") or ""
    engine = labels.get("engine")
    key = "/".join(part for part in (replica, engine) if part) or "0"
    kept = {k: v for k, v in labels.items() if k not in RAY_LABELS and k != "engine"}
    kept["engine"] = key
    return (
        canonical
        + "{"
        + ",".join(f'{k}="{escape_label(v)}"' for k, v in kept.items())
        + "}"
        + (rest[end + 1 :])
    )
