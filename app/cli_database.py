"""The database a command works on: the configured one, or the embedded cluster started for it
(shared by `threadline serve`, `migrate` and the admin commands of app/cli_admin.py)."""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterator
from contextlib import contextmanager

from app.config import Settings


@contextmanager
def database(settings: Settings, *, own_cluster: bool) -> Iterator[Settings]:
    """Settings with a database URL: the configured one, or the embedded cluster's.

    With `own_cluster`, the embedded cluster is stopped on exit even if it was already running
    (serve owns it); otherwise only if this call started it.
    """
    if settings.database_url is not None:
        yield settings
        return
    from app.db.embedded import EmbeddedPostgres

    cluster = EmbeddedPostgres(settings.data_dir)
    progress(f"starting the embedded PostgreSQL in {cluster.pgdata}")
    url = cluster.start()
    try:
        yield settings.model_copy(update={"database_url": url})
    finally:
        if own_cluster or cluster.started_here:
            cluster.stop()


def progress(step: str) -> None:
    """A startup step that may take seconds, on stderr (stdout carries what commands print);
    a log line when logs are JSON."""
    from app.telemetry.logging import logs_json

    if logs_json():
        logging.getLogger("threadline").info(step)
    else:
        print(f"==> {step}", file=sys.stderr, flush=True)
