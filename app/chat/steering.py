"""Lines typed while an answer streams: each is sent to the running run (a steer).

A terminal in canonical mode hands over a line only once Enter is pressed, so the reader
waits on the descriptor (a short select, to notice when it is stopped) and reads what is
there: whole lines. What is typed without Enter stays in the terminal for the next prompt.
The reader runs in a thread beside the stream; `lock` guards the screen both write to.
"""

from __future__ import annotations

import contextlib
import os
import select
import threading
from collections.abc import Callable, Iterator

POLL_SECONDS = 0.1


class SteerReader:
    def __init__(self, fd: int, send: Callable[[str], Callable[[], None]]) -> None:
        self.fd = fd
        # Called in the reader's thread with each line; what it returns (what to show) is
        # called under `lock`, unless the reader is stopped meanwhile (the main thread may
        # hold the lock while it stops the reader).
        self.send = send
        self.lock = threading.RLock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> SteerReader:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self._read, name="steer-reader", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """No reading meanwhile (a prompt reads the terminal)."""
        self.stop()
        try:
            yield
        finally:
            self.start()

    def _read(self) -> None:
        while not self._stop.is_set():
            ready, _, _ = select.select([self.fd], [], [], POLL_SECONDS)
            if not ready or self._stop.is_set():
                continue
            data = os.read(self.fd, 65536)
            if not data:
                return  # end of input
            for line in data.decode(errors="replace").splitlines():
                if line.strip():
                    self._show(self.send(line.strip()))

    def _show(self, what: Callable[[], None]) -> None:
        while not self._stop.is_set():
            if self.lock.acquire(timeout=POLL_SECONDS):
                try:
                    what()
                finally:
                    self.lock.release()
                return


class NoSteering:
    """Where nothing can be read beside the stream (input that is no terminal)."""

    def __init__(self) -> None:
        self.lock = threading.RLock()

    def __enter__(self) -> NoSteering:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def stop(self) -> None:
        pass

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        yield
