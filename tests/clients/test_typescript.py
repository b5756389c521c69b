"""The generated TypeScript client (`make clients`: @hey-api/openapi-ts, plus the streaming
helper clients/typescript/src/streaming.ts) builds with no warnings under strict `tsc`, and
drives a whole conversation under Node against a live `threadline serve`: create, ask and
stream, disconnect and resume, fork, compact, history, search; and a browser's EventSource
with a stream token."""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import subprocess
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from testkit.proxy import CuttingProxy
from testkit.upstream import FakeUpstream, Hold, Text
from tests.e2e import Service

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "clients" / "typescript"
DOCUMENT = ROOT / "openapi" / "openapi.json"
# What `make clients` writes: everything else in the package's directory is installed or built.
SOURCES = ["package.json", "package-lock.json", "tsconfig.json", "openapi-ts.config.mjs", "src"]


def npm(*args: str, cwd: Path, env: dict[str, str] | None = None) -> str:
    """Run npm (or npx); its output, or a failure with it."""
    npm_bin = shutil.which(args[0])
    if npm_bin is None:
        pytest.fail(f"{args[0]} is not installed: Node.js 20.19+ is needed (see the README)")
    result = subprocess.run(
        [npm_bin, *args[1:]],
        cwd=cwd,
        env={**os.environ, **(env or {}), "NO_COLOR": "1", "FORCE_COLOR": "0"},
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, f"{' '.join(args)} failed:\n{output}"
    return output


def install_dependencies() -> None:
    """`npm ci` unless done since package-lock.json last changed (as `make test` does)."""
    stamp = PACKAGE / "node_modules" / ".installed"
    lock = PACKAGE / "package-lock.json"
    if stamp.exists() and stamp.stat().st_mtime >= lock.stat().st_mtime:
        return
    npm("npm", "ci", "--no-audit", "--no-fund", cwd=PACKAGE)
    stamp.touch()


def readme_example() -> str:
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("### TypeScript client") :]
    start = section.index("```ts\n") + len("```ts\n")
    return section[start : section.index("```\n", start)]


@pytest.fixture(scope="module")
def package(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A copy of the package, generated and compiled as `make clients` does, with the tests'
    scripts (test/, and the README's example as test/readme.ts) compiled beside it."""
    install_dependencies()
    root = tmp_path_factory.mktemp("typescript-client")
    for name in SOURCES:
        source = PACKAGE / name
        if source.is_dir():
            shutil.copytree(source, root / name, ignore=shutil.ignore_patterns("generated"))
        else:
            shutil.copy(source, root / name)
    shutil.copytree(PACKAGE / "test", root / "test")
    (root / "test" / "readme.ts").write_text(readme_example())
    (root / "node_modules").symlink_to(PACKAGE / "node_modules")

    log = npm("npm", "run", "generate", cwd=root, env={"OPENAPI_DOCUMENT": str(DOCUMENT)})
    assert not re.search(r"warn|error", log, re.IGNORECASE), log
    npm("npx", "tsc", "--noEmit", cwd=root)  # strict, over the generated code and the helper
    npm("npx", "tsc", cwd=root)
    yield root


def test_every_operation_is_generated(package: Path) -> None:
    document = json.loads(DOCUMENT.read_text())
    operations = [
        op["operationId"]
        for path in document["paths"].values()
        for op in path.values()
        if isinstance(op, dict) and "operationId" in op
    ]
    sdk = (package / "src" / "generated" / "sdk.gen.ts").read_text()
    exported = set(re.findall(r"^export const (\w+) =", sdk, re.MULTILINE))

    def camel(name: str) -> str:
        head, *rest = name.split("_")
        return head + "".join(part.capitalize() for part in rest)

    assert operations and {camel(op) for op in operations} <= exported, exported
    types = (package / "src" / "generated" / "types.gen.ts").read_text()
    for schema in document["components"]["schemas"]:
        assert re.search(rf"^export type {schema} =", types, re.MULTILINE), schema


class Script:
    """`node dist/test/<file>.js ARGS` in the package, its `step:` lines handed to `on_step`
    as they come (to act on the service while the script waits)."""

    def __init__(self, package: Path, service_url: str, key: str) -> None:
        self.package = package
        self.env = {**os.environ, "API": service_url, "KEY": key}

    def run(self, file: str, *args: str, on_step: Callable[[str], None] = lambda _: None) -> str:
        node = shutil.which("node")
        assert node is not None, "node is not installed"
        process = subprocess.Popen(
            [node, f"dist/test/{file}.js", *args],
            cwd=self.package,
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        stderr: list[str] = []
        reader = threading.Thread(target=lambda: stderr.extend(process.stderr or []))
        reader.start()
        lines = []
        assert process.stdout is not None
        for line in process.stdout:
            lines.append(line)
            if line.startswith("step: "):
                on_step(line.removeprefix("step: ").strip())
        code = process.wait(timeout=300)
        reader.join()
        output = "".join(lines)
        assert code == 0, f"{file} {' '.join(args)} exited with {code}:\n{output}{''.join(stderr)}"
        return output


def test_the_streaming_helper_with_scripted_answers(package: Path) -> None:
    """Heartbeats inside a stream, a stream ended before its run, error answers (the API's
    JSON one and a proxy's page), a 204, an abort: a client whose fetch answers from a script
    (clients/typescript/test/helper.ts)."""
    output = Script(package, "http://threadline.test", "sk-test").run("helper")
    assert output.count("ok: ") == 5, output


def key_of(api: httpx.AsyncClient) -> str:
    return api.headers["Authorization"].removeprefix("Bearer ")


async def test_a_conversation_with_the_generated_typescript_client(
    package: Path, api: httpx.AsyncClient, service: Service, upstream: FakeUpstream
) -> None:
    release = threading.Event()
    upstream.script(Text("Oslo is "), Text("rainy."))
    upstream.script(Text("Bring "), Hold(release), Text("an umbrella."))
    upstream.script(Text("The user asked about Oslo's weather."))

    def on_step(name: str) -> None:
        if name == "left":  # the client left the stream and was refused a second ask
            release.set()

    script = Script(package, service.url, key_of(api))
    try:
        output = await asyncio.to_thread(
            script.run, "conversation", "conversation", on_step=on_step
        )
    finally:
        release.set()
    steps = re.findall(r"^step: (\S+)", output, re.MULTILINE)
    assert steps == [
        "created",
        "asked",
        "left",
        "resumed",
        "forked",
        "compacted",
        "history",
        "searched",
        "done",
    ]


async def test_a_dropped_stream_is_resumed_by_the_helper(
    package: Path, api: httpx.AsyncClient, service: Service, upstream: FakeUpstream
) -> None:
    """The connection of an ask is cut after its first delta, for real: the helper goes on
    with the run's events after the last one it got (Last-Event-ID), as one stream."""
    release = threading.Event()
    upstream.script(Text("Bring "), Hold(release), Text("an umbrella."))
    proxy = CuttingProxy(service.url, b"event: message.delta", on_cut=release.set)
    try:
        script = Script(package, proxy.url, key_of(api))
        output = await asyncio.to_thread(script.run, "conversation", "dropped")
    finally:
        release.set()
        proxy.close()
    assert proxy.cut.is_set() and proxy.connections >= 2  # the cut one, and the resumption
    assert output.endswith("step: done\n")


async def test_a_browser_event_source_with_a_stream_token(
    package: Path, api: httpx.AsyncClient, service: Service, upstream: FakeUpstream
) -> None:
    """The `eventsource` package (the browser's EventSource, for Node) opens a run's stream
    with a stream token from the generated client, and no API key."""
    upstream.script(Text("Hello "), Text("from the model."))
    script = Script(package, service.url, key_of(api))
    output = await asyncio.to_thread(script.run, "conversation", "browser")
    assert output.endswith("step: streamed\nstep: done\n")


async def test_the_readme_example_runs_as_written(
    package: Path, api: httpx.AsyncClient, service: Service, upstream: FakeUpstream
) -> None:
    upstream.script(Text("Rain, "), Text("then sun."))
    script = Script(package, service.url, key_of(api))
    output = await asyncio.to_thread(script.run, "readme")
    lines = output.splitlines()
    assert lines[:2] == ["Rain, then sun.", "[stop]"], output
    assert re.fullmatch(r"\d+ events", lines[2]), output
