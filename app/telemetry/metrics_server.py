"""GET /metrics of a `threadline worker`, which serves no API: a small HTTP server in a thread,
with the API route's token rule. Its scrape has the worker's own counts (runs, model calls,
tokens, compactions; with PROMETHEUS_MULTIPROC_DIR, every process on the host); the queue's
depth is the API's to report."""

from __future__ import annotations

import hmac
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CONTENT_TYPE_LATEST

from app.telemetry.metrics import exposition


def serve(host: str, port: int, token: str | None) -> ThreadingHTTPServer:
    """Serve until the returned server's shutdown()."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path.partition("?")[0] != "/metrics":
                self._error(404, "not_found", "only GET /metrics is served here")
                return
            if token is not None:
                scheme, _, given = (self.headers.get("Authorization") or "").partition(" ")
                if scheme.lower() != "bearer" or not hmac.compare_digest(
                    given.strip().encode(), token.encode()
                ):
                    message = "send Authorization: Bearer <THREADLINE_METRICS_TOKEN>"
                    self._error(401, "unauthorized", message)
                    return
            self._send(200, CONTENT_TYPE_LATEST, exposition(None))

        def _error(self, status: int, code: str, message: str) -> None:
            body = {"error": {"code": code, "message": message, "details": {}}}
            self._send(status, "application/json", json.dumps(body).encode())

        def _send(self, status: int, content_type: str, body: bytes) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            if status == 401:
                self.send_header("WWW-Authenticate", "Bearer")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            """Scrapes are not logged (one line every few seconds, forever)."""

    server = ThreadingHTTPServer((host, port), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="metrics", daemon=True).start()
    return server
