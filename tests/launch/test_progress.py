"""The console progress of `rlkube rl`, read over HTTP from a /status server like the
orchestrator's: a plain line per new step off a terminal, a live line on one."""

import io
import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from rich.console import Console
from rlkube.launch.progress import RunProgress, format_duration


class StatusServer:
    def __init__(self):
        self.status = None  # None: answers 503, as before the orchestrator is up
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                if server.status is None:
                    self.send_error(503)
                    return
                body = json.dumps(server.status).encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_port}/status"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def set(self, step, reward=None, ckpt=None):
        self.status = {"phase": "running", "step": step, "max_steps": 10, "reward": reward,
                       "policy_step": step, "off_policy_lag": 1, "last_checkpoint_step": ckpt}


@pytest.fixture
def server():
    server = StatusServer()
    yield server
    server.httpd.shutdown()


def ticks(progress, clock, server, steps):
    """One tick per (seconds later, step, reward, checkpoint)."""
    for dt, step, reward, ckpt in steps:
        clock[0] += dt
        server.set(step, reward, ckpt)
        progress.next_poll = 0  # every tick polls
        progress.tick()


def test_plain_lines_off_a_terminal(server, monkeypatch):
    clock = [1000.0]
    monkeypatch.setattr("rlkube.launch.progress.time.monotonic", lambda: clock[0])
    out = io.StringIO()
    with RunProgress(server.url, 10, console=Console(file=out, force_terminal=False, width=200)) as progress:
        progress.tick()  # the orchestrator is not up: nothing printed, no error
        ticks(progress, clock, server, [(5, 1, 0.25, None), (3, 2, 0.5, 2), (3, 2, 0.5, 2), (3, 3, 0.75, 2)])
    lines = out.getvalue().splitlines()
    assert lines == [
        "step 1/10 | reward 0.250",
        "step 2/10 | reward 0.500 | 3.0 s/step | ETA 24s | ckpt 2",
        "step 3/10 | reward 0.750 | 4.5 s/step | ETA 32s | ckpt 2",
    ], "one line per new step; s/step from when steps were first seen (3 s, then 9 s for 2)"


@pytest.mark.parametrize("width", [120, 30])
def test_a_live_line_on_a_terminal_one_row_wide(server, width):
    out = io.StringIO()
    server.set(4, 0.5, 4)
    with RunProgress(server.url, 10, console=Console(file=out, force_terminal=True, width=width)) as progress:
        progress.tick()
    assert "step 4/10 | reward 0.500 | ckpt 4"[: width - 1] in out.getvalue()
    assert "\x1b[" in out.getvalue(), "drawn with terminal control codes"
    assert ("━" in out.getvalue()) == (width == 120), "a bar where it fits on the row"
    rows = {row for row in re.sub(r"\x1b\[[0-9;?]*[a-zA-Z]", "", out.getvalue()).replace("\r", "\n").split("\n") if row.strip()}
    assert all(len(row) <= width for row in rows) and len(rows) == 1, rows


def test_durations():
    assert [format_duration(s) for s in (7, 75, 3725)] == ["7s", "1m15s", "1h02m"]
