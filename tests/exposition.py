"""Reading the sidecar's exposition back, for tests and benchmarks (not shipped: the
sidecar only writes it)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.parser import text_string_to_metric_families

from exporter.metrics import SnapshotCollector
from exporter.snapshot import Snapshot


def families_by_name(text: str) -> Mapping[str, list[tuple[dict[str, str], float]]]:
    """Parse an exposition back into {name: [(labels, value)]}."""
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, []).append((dict(sample.labels), sample.value))
    return out


class ClientFamilies:
    """A snapshot's samples as prometheus_client metric families: a collector for
    ``generate_latest``, to hold the sidecar's own writer to the client library's."""

    def __init__(self, snapshot: Snapshot) -> None:
        self._snapshot = snapshot

    def collect(self) -> Iterator[Metric]:
        for spec, samples in SnapshotCollector(self._snapshot).samples():
            cls = CounterMetricFamily if spec.kind == "counter" else GaugeMetricFamily
            family = cls(spec.full, spec.help, labels=spec.labels)
            for labels, value in samples:
                family.add_metric(list(labels), value)
            yield family
