"""Scrape a live service's /metrics and read its samples (tests and benchmarks)."""

from __future__ import annotations

from collections.abc import Mapping

import httpx
from prometheus_client.parser import text_string_to_metric_families


class Samples:
    """The samples of one scrape, by name and labels."""

    def __init__(self, text: str) -> None:
        self.text = text
        self._values: dict[tuple[str, frozenset[tuple[str, str]]], float] = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                key = (sample.name, frozenset(sample.labels.items()))
                self._values[key] = sample.value

    def get(self, name: str, labels: Mapping[str, str] | None = None) -> float:
        """The sample's value; 0 when it is not there (a labelled child not yet used)."""
        return self._values.get((name, frozenset((labels or {}).items())), 0.0)

    def total(self, name: str, **labels: str) -> float:
        """The sum of the samples of `name` whose labels include `labels`."""
        wanted = set(labels.items())
        return sum(v for (n, ls), v in self._values.items() if n == name and wanted <= ls)

    def names(self) -> set[str]:
        return {name for name, _ in self._values}


def scrape(url: str, token: str | None = None) -> Samples:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    response = httpx.get(f"{url}/metrics", headers=headers, timeout=30)
    response.raise_for_status()
    return Samples(response.text)


async def ascrape(client: httpx.AsyncClient, url: str = "") -> Samples:
    response = await client.get(f"{url}/metrics")
    response.raise_for_status()
    return Samples(response.text)
