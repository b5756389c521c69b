"""A TCP proxy that cuts a stream mid-way: real dropped connections for resumption tests."""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable


class CuttingProxy:
    """A TCP proxy to the service that cuts the first connection whose response carries
    `marker`, right after forwarding it: a connection dropped mid-stream, for real."""

    def __init__(self, target: str, marker: bytes, on_cut: Callable[[], None]) -> None:
        host, port = target.removeprefix("http://").split(":")
        self.target = (host, int(port))
        self.marker = marker
        self.on_cut = on_cut
        self.cut = threading.Event()
        self.connections = 0
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:  # closed
                return
            self.connections += 1
            upstream = socket.create_connection(self.target)
            threading.Thread(target=self._pipe, args=(client, upstream), daemon=True).start()
            threading.Thread(target=self._answer, args=(upstream, client), daemon=True).start()

    def _pipe(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        finally:
            sink.close()

    def _answer(self, upstream: socket.socket, client: socket.socket) -> None:
        seen = b""
        try:
            while data := upstream.recv(65536):
                client.sendall(data)
                seen = seen[-len(self.marker) :] + data
                if not self.cut.is_set() and self.marker in seen:
                    self.cut.set()
                    client.shutdown(socket.SHUT_RDWR)
                    self.on_cut()
                    break
        except OSError:
            pass
        finally:
            client.close()
            upstream.close()

    def close(self) -> None:
        self.listener.close()
