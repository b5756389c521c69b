"""A real uvicorn in a thread of this process, on a free port of 127.0.0.1; and the wait for a
service started as a process of its own."""

from __future__ import annotations

import socket
import subprocess
import threading
import time
from pathlib import Path

import httpx
import uvicorn
from starlette.types import ASGIApp


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def serve_in_thread(
    app: ASGIApp, port: int | None = None
) -> tuple[uvicorn.Server, threading.Thread, str]:
    """A real uvicorn on 127.0.0.1 in a thread with its own event loop (SSE needs real HTTP),
    on `port` or a free one."""
    port = port or free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.05)
    return server, thread, f"http://127.0.0.1:{port}"


def stop_thread_server(server: uvicorn.Server, thread: threading.Thread) -> None:
    server.should_exit = True
    thread.join(timeout=30)


def stop_process(process: subprocess.Popen[bytes], timeout: float = 30) -> None:
    """SIGTERM and wait; SIGKILL if it has not exited after `timeout` seconds."""
    if process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=timeout)


def wait_ready(
    url: str, server: subprocess.Popen[bytes], log: Path | None = None
) -> httpx.Response:
    """Poll `url`/readyz until it answers 200; fails with the server's log if it exits first."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and server.poll() is None:
        try:
            response = httpx.get(f"{url}/readyz", timeout=5)
            if response.status_code == 200:
                return response
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    output = log.read_text(errors="replace")[-3000:] if log else ""
    raise RuntimeError(f"{url} never became ready (exit: {server.poll()})\n{output}")
