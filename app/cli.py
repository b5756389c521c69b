"""The `threadline` command: serve, worker, migrate, keys, tenants, usage, export, import,
openapi, events, chat."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import sys
from pathlib import Path
from typing import Any

from app import cli_admin, cli_session_files, heap
from app.cli_database import database, progress
from app.config import Settings


def runs_at_once(settings: Settings, requested: int | None = None) -> int:
    """Runs this process executes at once: as requested or configured, else what it can carry
    (app/worker/capacity.py). The open-file limit is raised either way: runs hold sockets."""
    from app.worker.capacity import default_concurrency, raise_open_file_limit

    if requested is not None:
        raise_open_file_limit()
        return requested
    if settings.worker_concurrency is not None:
        raise_open_file_limit()
        return settings.worker_concurrency
    return default_concurrency()


def capacity_lines(settings: Settings, workers: int) -> list[str]:
    """What serve says about the runs it executes: a number a person can act on, and where it
    comes from (a bare "Runs executed at once: 4936" on a 2-core machine read as a bug)."""
    if not workers:
        return ["Runs: none executed here (--workers 0); `threadline worker` processes run them"]
    if settings.worker_concurrency is not None:
        lines = [f"Runs at once: {workers} (THREADLINE_WORKER_CONCURRENCY or --workers)"]
    else:
        lines = [
            f"Runs at once: up to {workers:,}: a run mostly waits on its model, so this is what "
            "memory and open files allow, not CPU cores (THREADLINE_WORKER_CONCURRENCY sets it)"
        ]
    if settings.default_model.startswith("local:"):
        from app.llm.local_provider import installed

        state = (
            "loading in the background"
            if installed("llama_cpp")
            else "waiting for llama.cpp's build (its asks fail until then, saying so)"
        )
        lines.append(
            f"Local model: {settings.default_model}, {state}; it answers one ask at a time "
            "(others queue), on this machine's CPU"
        )
    return lines


def serve(settings: Settings) -> None:
    import uvicorn

    from app.credentials import vault_for
    from app.db.engine import create_engine
    from app.db.migrate import upgrade_to_head
    from app.main import create_app
    from app.services.keys import ensure_dev_key
    from app.telemetry.logging import configure, log_config

    # uvicorn re-raises SIGTERM after its graceful shutdown; as an exception it unwinds through
    # the `finally` below and the embedded cluster is stopped instead of orphaned.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    configure(settings.log_level, settings.log_format)
    embedded = settings.database_url is None
    with database(settings, own_cluster=True) as ready:
        assert ready.database_url is not None
        progress(upgrade_to_head(ready.direct_url, vault_for(settings)).describe())
        if embedded and ready.dev_key:
            key_file = ready.data_dir / "dev-key"
            kept = key_file.read_text().strip() if key_file.exists() else None

            async def dev_key() -> str:
                engine = create_engine(ready)
                try:
                    return await ensure_dev_key(engine, kept)
                finally:
                    await engine.dispose()

            key = asyncio.run(dev_key())
            if key != kept:
                key_file.touch(mode=0o600)
                key_file.write_text(key + "\n")
            print(f"Development API key: {key}", flush=True)
        workers = runs_at_once(ready)
        print(f"Threadline serving on http://{ready.host}:{ready.port}", flush=True)
        print(f"Chat in the browser: http://{ready.host}:{ready.port}/ui/", flush=True)
        for line in capacity_lines(ready, workers):
            print(line, flush=True)
        processes = serve_processes(ready)
        logs = log_config(ready.log_level, ready.log_format)
        if processes == 1:
            app = create_app(ready, workers=workers)
            uvicorn.run(
                app, host=ready.host, port=ready.port, log_level=ready.log_level, log_config=logs
            )
            return
        print(f"Processes: {processes}, on one port (THREADLINE_PROCESSES or --processes)")
        os.environ.update(child_environment(ready))
        # uvicorn's supervisor: the socket bound once and shared, a process that dies started
        # again, SIGINT/SIGTERM passed on to every process.
        uvicorn.run(
            "app.cli:served_app",
            factory=True,
            workers=processes,
            host=ready.host,
            port=ready.port,
            log_level=ready.log_level,
            log_config=logs,
        )


def serve_processes(settings: Settings) -> int:
    if settings.processes is not None:
        return settings.processes
    if settings.default_model.startswith("local:"):
        return 1  # the local model's inference uses every core: more processes only compete
    return max(1, len(os.sched_getaffinity(0)))


def child_environment(settings: Settings) -> dict[str, str]:
    """What the processes of `serve --processes N` need to build the parent's settings: the
    database it started or was given, and what the command line set. Their metrics are summed
    across processes (a directory of their own, unless one is set)."""
    assert settings.database_url is not None
    env = {
        "THREADLINE_DATABASE_URL": settings.database_url,
        "THREADLINE_HOST": settings.host,
        "THREADLINE_PORT": str(settings.port),
        "THREADLINE_PROCESSES": "1",
    }
    if settings.worker_concurrency is not None:
        env["THREADLINE_WORKER_CONCURRENCY"] = str(settings.worker_concurrency)
    if not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        metrics_dir = settings.data_dir.resolve() / f"metrics-{settings.port}"
        shutil.rmtree(metrics_dir, ignore_errors=True)
        metrics_dir.mkdir(parents=True)
        env["PROMETHEUS_MULTIPROC_DIR"] = str(metrics_dir)
    return env


def served_app() -> Any:
    """One process of `threadline serve --processes N`: its settings from the environment
    the parent prepared (child_environment)."""
    from app.main import create_app
    from app.telemetry.logging import configure

    settings = Settings()
    configure(settings.log_level, settings.log_format)
    return create_app(settings, workers=runs_at_once(settings))


def worker(settings: Settings, concurrency: int) -> None:
    """Run workers alone (no API): more capacity against the same database, on any host."""
    from app.telemetry import metrics, tracing
    from app.telemetry.logging import configure
    from app.worker.pool import worker_pool

    configure(settings.log_level, settings.log_format)
    tracing.configure(settings)
    metrics.configure(settings.metrics_enabled)
    metrics.forget_dead_processes()
    if settings.database_url is None:
        raise SystemExit("threadline worker needs THREADLINE_DATABASE_URL (the API's database)")

    if settings.worker_metrics_port is not None and settings.metrics_enabled:
        from app.telemetry import metrics_server

        port, token = settings.worker_metrics_port, settings.metrics_token
        metrics_server.serve(settings.host, port, token)

    async def run() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, stop.set)
        async with worker_pool(settings, concurrency):
            heap.settle()
            print(f"Threadline worker running {concurrency} at once", flush=True)
            await stop.wait()

    try:
        asyncio.run(run())
    finally:
        metrics.process_stopped()


def migrate(settings: Settings) -> None:
    from app.credentials import vault_for
    from app.db.migrate import upgrade_to_head

    with database(settings, own_cluster=False) as ready:
        assert ready.database_url is not None
        print(upgrade_to_head(ready.direct_url, vault_for(settings)).describe(), flush=True)


def print_openapi() -> None:
    from app.main import create_app

    print(json.dumps(create_app(Settings()).openapi(), indent=2, sort_keys=True))


EVENTS_START, EVENTS_END = "<!-- events:start -->", "<!-- events:end -->"
STATES_START, STATES_END = "<!-- run-states:start -->", "<!-- run-states:end -->"


def run_reference() -> dict[tuple[str, str], str]:
    """The generated sections of the run reference, by their markers: the run's transitions
    (app/runs/machine.py) and its events (app/eventlog/registry.py)."""
    from app.eventlog.registry import markdown_table
    from app.runs.machine import transition_table

    return {
        (STATES_START, STATES_END): transition_table() + "\n",
        (EVENTS_START, EVENTS_END): markdown_table(),
    }


def print_events(update: str | None) -> None:
    """Print the run reference (markdown: transitions, then events), or write each part between
    its markers in a file (the README's sections)."""
    sections = run_reference()
    if update is None:
        print("\n".join(sections.values()), end="", flush=True)
        return
    path = Path(update)
    text = path.read_text()
    for (start, end), table in sections.items():
        text = with_section(text, start, end, table)
    path.write_text(text)


def with_section(text: str, start_marker: str, end_marker: str, table: str) -> str:
    """`text` with what lies between the two markers replaced by `table`."""
    start, end = text.find(start_marker), text.find(end_marker)
    if start < 0 or end < start:
        raise SystemExit(f"no {start_marker} ... {end_marker} section to update")
    return f"{text[: start + len(start_marker)]}\n{table}{text[end:]}"


def at_least_zero(value: str) -> int:
    count = int(value)
    if count < 0:
        raise argparse.ArgumentTypeError(f"{value} is negative")
    return count


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="threadline", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    serve_cmd = commands.add_parser("serve", help="run the API (embedded Postgres by default)")
    serve_cmd.add_argument("--host")
    serve_cmd.add_argument("--port", type=int)
    serve_cmd.add_argument(
        "--workers",
        type=at_least_zero,
        metavar="N",
        help="runs this process executes at once (THREADLINE_WORKER_CONCURRENCY; 0: API only, "
        "runs left to `threadline worker` processes)",
    )
    serve_cmd.add_argument(
        "--processes",
        type=int,
        metavar="N",
        help="processes, each the API and workers, sharing the port (THREADLINE_PROCESSES; "
        "default: the CPU cores, or 1 with a local default model)",
    )
    worker_cmd = commands.add_parser("worker", help="run workers only (needs a database URL)")
    worker_cmd.add_argument("--concurrency", type=int, default=None)
    commands.add_parser("migrate", help="apply database migrations")
    cli_admin.add_commands(commands)  # keys, tenants, usage
    cli_session_files.add_commands(commands)  # export, import
    commands.add_parser("openapi", help="print the OpenAPI document")
    events = commands.add_parser(
        "events", help="print the run reference: its transitions and events (markdown)"
    )
    events.add_argument(
        "--update",
        metavar="FILE",
        help=f"write it into FILE, between {STATES_START} ... and {EVENTS_START} ... markers",
    )
    chat = commands.add_parser(
        "chat", help="chat in the terminal with a running service (a client of its API)"
    )
    chat.add_argument("--url", help="the service (THREADLINE_URL; default: where serve listens)")
    chat.add_argument(
        "--key", help="an API key (THREADLINE_API_KEY; default: the development key file)"
    )
    chat.add_argument(
        "--hide-reasoning",
        action="store_true",
        help="do not show the model's reasoning (shown dimmed by default; /reasoning toggles)",
    )
    start = chat.add_mutually_exclusive_group()
    start.add_argument("--resume", metavar="ID", help="continue a session")
    start.add_argument("--fork", metavar="ID[@SEQ]", help="fork a session (at a seq) and chat")
    start.add_argument("--new", action="store_true", help="a new session (the default)")
    start.add_argument(
        "--agent", metavar="NAME[@VERSION]", help="a new session from an agent (its version)"
    )
    return parser


def command_names() -> list[str]:
    """The top-level commands (`threadline <name>`)."""
    (commands,) = [a for a in parser()._actions if isinstance(a, argparse._SubParsersAction)]
    return list(commands.choices)


def main(argv: list[str] | None = None) -> None:
    args = parser().parse_args(argv)
    if args.command == "chat":  # a client: no settings of the service's own
        from app.chat.repl import main as chat

        raise SystemExit(
            chat(
                args.url,
                args.key,
                args.resume,
                args.fork,
                hide_reasoning=args.hide_reasoning,
                agent=args.agent,
            )
        )

    settings = Settings()
    if args.command == "serve":
        flags = (
            ("host", args.host),
            ("port", args.port),
            ("worker_concurrency", args.workers),
            ("processes", args.processes),
        )
        overrides = {k: v for k, v in flags if v is not None}
        serve(settings.model_copy(update=overrides))
    elif args.command == "worker":
        worker(settings, runs_at_once(settings, args.concurrency) or 1)
    elif args.command == "migrate":
        migrate(settings)
    elif args.command in cli_admin.COMMANDS:
        cli_admin.run(settings, args)
    elif args.command in cli_session_files.COMMANDS:
        cli_session_files.run(settings, args)
    elif args.command == "openapi":
        print_openapi()
    elif args.command == "events":
        print_events(args.update)


if __name__ == "__main__":
    main()
