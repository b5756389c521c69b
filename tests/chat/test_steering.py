"""The steer reader: whole lines typed during an answer are sent, one each, and nothing is
read while it is paused or after it stops (the next prompt gets what is typed then)."""

from __future__ import annotations

import os
import queue
from collections.abc import Callable

from app.chat.steering import SteerReader


def test_lines_are_sent_and_nothing_is_read_while_paused_or_stopped() -> None:
    read_end, write_end = os.pipe()
    sent: queue.Queue[str] = queue.Queue()
    shown: list[str] = []

    def send(line: str) -> Callable[[], None]:
        sent.put(line)
        return lambda: shown.append(line)

    reader = SteerReader(read_end, send)
    try:
        with reader:
            os.write(write_end, b"in French\n\n  and briefly  \n")
            assert [sent.get(timeout=60), sent.get(timeout=60)] == ["in French", "and briefly"]
            with reader.paused():
                os.write(write_end, b"y\n")  # a prompt's answer: not the reader's
                assert os.read(read_end, 10) == b"y\n"
        os.write(write_end, b"next question\n")
        assert os.read(read_end, 100) == b"next question\n"
        assert sent.empty()
    finally:
        os.close(read_end)
        os.close(write_end)
