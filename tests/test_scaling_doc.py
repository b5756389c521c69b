"""docs/scaling.md stays true to the code: its connection counts are computed here from the
pool sizes the code actually uses, with the default settings."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from app.config import Settings
from app.db.engine import create_engine, pool_limit
from app.worker.capacity import runs_capacity
from app.worker.pool import queue_pool_size

ROOT = Path(__file__).resolve().parents[1]
DOC = (ROOT / "docs" / "scaling.md").read_text()
README = (ROOT / "README.md").read_text()
START, END = "<!-- connections:start -->", "<!-- connections:end -->"
# One LISTEN connection per API process (app/eventlog/hub.py), one lease per worker process
# (app/worker/lease.py).
HUB, LEASE = 1, 1
TIMES = "\N{MULTIPLICATION SIGN}"  # the doc writes its products as people do


@pytest.fixture
def defaults(monkeypatch: pytest.MonkeyPatch) -> Settings:
    for name in Settings.model_fields:
        monkeypatch.delenv(f"THREADLINE_{name.upper()}", raising=False)
    return Settings(_env_file=None)


def table() -> dict[str, list[int]]:
    """The doc's table: each process's label and its counts."""
    rows = DOC[DOC.index(START) + len(START) : DOC.index(END)].strip().splitlines()[2:]
    cells = [[c.strip() for c in row.strip("|").split("|")] for row in rows]
    return {label: [int(n) for n in numbers] for label, *numbers in cells}


def test_the_engine_opens_what_pool_limit_says(defaults: Settings) -> None:
    engine = create_engine(defaults.model_copy(update={"database_url": "postgresql://x@h/d"}))
    pool = engine.pool
    assert pool.size() + pool._max_overflow == pool_limit(defaults)  # type: ignore[attr-defined]


def default_runs_at_once(defaults: Settings) -> int:
    """Unset, runs at once follow what the process carries: the doc counts a host whose
    limits cannot be read, which carries the fewest of any ordinary host."""
    assert defaults.worker_concurrency is None
    return runs_capacity(None, None)


def test_the_connection_table_matches_the_code(defaults: Settings) -> None:
    pools, queue = pool_limit(defaults), queue_pool_size(default_runs_at_once(defaults))
    api = [pools, HUB, 0, 0]
    worker = [pools, 0, LEASE, queue]
    # `threadline serve` with workers: the API and the workers share one engine
    served = [pools, HUB, LEASE, queue]
    expected = {
        "`threadline serve --workers 0` (API)": [*api, sum(api)],
        "`threadline worker`": [*worker, sum(worker)],
        "`threadline serve` (API and workers)": [*served, sum(served)],
    }
    assert table() == expected


def test_the_formula_of_the_queue_pool_is_the_codes() -> None:
    (formula,) = set(re.findall(r"`(max\(4, min\(C // 4 \+ 4, 32\)\))`", DOC))
    for concurrency in (0, 1, 7, 8, 16, 40, 111, 112, 500):
        assert eval(formula, {"C": concurrency}) == queue_pool_size(concurrency)


def test_the_worked_examples_add_up(defaults: Settings) -> None:
    pools, queue = pool_limit(defaults), queue_pool_size(default_runs_at_once(defaults))
    api, worker = pools + HUB, pools + LEASE + queue
    apis, workers = 2, 1
    assert f"{apis} {TIMES} {api} + {worker} = **{apis * api + workers * worker}**" in DOC
    direct = apis * HUB + workers * (LEASE + queue)
    assert f"{apis} {TIMES} 1 + {workers} {TIMES} (1 + {queue}) = **{direct}**" in DOC
    assert f"= **{(apis + workers) * pools}**" in DOC  # the pooler's client connections


def test_the_readme_links_the_scaling_doc() -> None:
    assert "(docs/scaling.md)" in README
