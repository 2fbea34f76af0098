"""The SFT trainer's `GET /status` on rank 0, read by the operator for an SFTRun's progress
columns: the SFT counterpart of the orchestrator's (orchestrator/status.py), with the keys an
SFT run has: `{"phase": "running|finished|failed", "step": int, "max_steps": int,
"loss": float|null, "last_checkpoint_step": int|null}`.

The standard library's HTTP handling, on a daemon thread: the training loop is synchronous,
and a request only copies a small dict under a lock. Bounded connections, a deadline on each
request (`readonly_http`): it runs inside the training process.
"""

import json
import logging
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler

from rlkube import readonly_http

logger = logging.getLogger(__name__)


class StatusServer:
    def __init__(self, host: str, port: int, *, step: int, max_steps: int):
        self._lock = threading.Lock()
        self._status = {"phase": "running", "step": step, "max_steps": max_steps, "loss": None,
                        "last_checkpoint_step": None}
        try:
            self._http = readonly_http.serve(host, port, self.handler_for(self.snapshot), "sft-status")
        except OSError as e:
            raise OSError(e.errno, f"status_port: cannot serve on {host}:{port}: {e.strerror}") from e
        self.port = self._http.server_port
        logger.info("SFT status (GET /status) on %s:%d", host, self.port)

    @staticmethod
    def handler_for(snapshot: Callable[[], dict]) -> type[BaseHTTPRequestHandler]:
        """Answers `GET /status` with `snapshot()` as JSON, anything else 404."""

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path != "/status":
                    self.send_error(404)
                    return
                body = json.dumps(snapshot()).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args) -> None:  # one request per reconcile: no access log
                pass

        return Handler

    def update(self, **fields) -> None:
        with self._lock:
            self._status.update(fields)

    def snapshot(self) -> dict:
        with self._lock:
            return dict(self._status)

    def close(self) -> None:
        self._http.shutdown()
        self._http.server_close()
