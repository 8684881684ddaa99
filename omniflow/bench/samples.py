"""The server's metrics as a job reads them, by replica: one reading from the in-process
registry (`registry.collect()`) or from a Ray deployment's merged `/metrics` text (parsed
into the same families, every series labelled with its `replica`), so that the job's sums
are one code path for both targets."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass

from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

REPLICA = "replica"
"""The label deploy/overview.py gives every series of the merged /metrics."""
LOCAL = "local"
"""The one server of an in-process job (its series carry no replica label)."""


@dataclass(frozen=True)
class Samples:
    """One server's samples: (sample name, labels, value) rows."""

    rows: tuple[tuple[str, tuple[tuple[str, str], ...], float], ...]

    def value(self, name: str, labels: dict[str, str] | None = None) -> float:
        """The sum of the `name` samples whose labels include `labels` (0 when none)."""
        return sum(v for _, v in self._matching(name, labels))

    def has(self, name: str, labels: dict[str, str] | None = None) -> bool:
        """Whether any `name` sample has `labels`."""
        return any(True for _ in self._matching(name, labels))

    def by_label(self, name: str, key: str, labels: dict[str, str] | None = None) -> dict:
        """The `name` samples with `labels`, summed by the value of their label `key`."""
        out: dict[str, float] = defaultdict(float)
        for row, value in self._matching(name, labels):
            out[dict(row)[key]] += value
        return dict(out)

    def _matching(self, name: str, labels: dict[str, str] | None) -> Iterable[tuple]:
        want = set((labels or {}).items())
        for sample, row, value in self.rows:
            if sample == name and want <= set(row):
                yield row, value


Reading = dict[str, Samples]
"""The samples of each server (each replica; `LOCAL` in-process), by its name."""


def reading_of(families: Iterable[Metric]) -> Reading:
    """Families (from a registry's `collect()` or the text parser) split by their `replica`
    label (none: `LOCAL`), which is dropped from the rows."""
    rows: dict[str, list] = defaultdict(list)
    for family in families:
        for sample in family.samples:
            labels = dict(sample.labels)
            server = labels.pop(REPLICA, LOCAL)
            rows[server].append((sample.name, tuple(sorted(labels.items())), sample.value))
    return {server: Samples(tuple(r)) for server, r in rows.items()}


def reading_of_text(text: str) -> Reading:
    """A `/metrics` exposition (the Ray deployment's merged one) as a reading."""
    return reading_of(text_string_to_metric_families(text))


def finished(samples: Samples) -> int:
    """Speech requests the server has finished, every outcome (`omniflow_requests_total`)."""
    return int(samples.value("omniflow_requests_total"))
