"""Slow clients against the read-only servers inside the training process (`rlkube.readonly_http`:
the RL trainer's `/metrics`, the SFT trainer's `/status`), the operator's `/metrics` and the
orchestrator's `/status` (aiohttp): sockets
that trickle their request a byte at a time, faster than any per-read timeout, more of them than
the server has handler threads. A legitimate request beside them is still answered at once, and
each trickler is closed at its request's deadline. With a timeout on each read instead (as the
servers had), the tricklers held every handler and the request was closed unanswered."""

import asyncio
import contextlib
import socket
import threading
import time
import urllib.request

import pytest
from rlkube import readonly_http
from rlkube.metrics import PrometheusMetrics
from rlkube.orchestrator.status import make_app, start_http
from rlkube_operator import metrics as operator_metrics

from tests.test_readonly_http import closed_by_server, idle_sockets, metrics_server, sft_status

TRICKLERS = readonly_http.HANDLERS + 4
EVERY_S = 1.0
"""A byte per trickler this often: well under the deadline, so a per-read timeout never fires."""


@contextlib.contextmanager
def operator_metrics_server(tmp_path):
    operator_metrics.record_run("RLRun", "team-a", "slow", {"phase": "Running", "restarts": 0})
    server = operator_metrics.serve("127.0.0.1", 0)
    try:
        yield server.server_port, "/metrics", b'rlkube_run_phase{kind="RLRun",name="slow",namespace="team-a",phase="Running"} 1.0'
    finally:
        server.shutdown()
        server.server_close()
        operator_metrics.forget_run("RLRun", "team-a", "slow")


SERVERS = pytest.mark.parametrize("serving", [metrics_server, sft_status, operator_metrics_server],
                                  ids=["trainer-metrics", "sft-status", "operator-metrics"])


@contextlib.contextmanager
def trickling(port: int, n: int, every_s: float):
    """`n` sockets, each sending a request head (never ending it) a byte every `every_s` seconds
    until the server closes it; yields them."""
    sockets = idle_sockets(port, n)
    stop = threading.Event()

    def trickle():
        head = b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"z" * 1000
        for byte in head:
            for sock in sockets:
                with contextlib.suppress(OSError):  # closed by the server: what should happen
                    sock.send(bytes([byte]))
            if stop.wait(every_s):
                return

    thread = threading.Thread(target=trickle, daemon=True)
    thread.start()
    try:
        yield sockets
    finally:
        stop.set()
        thread.join()
        for sock in sockets:
            sock.close()


def answered_within(port: int, path: str, expected: bytes, seconds: float) -> float:
    started = time.monotonic()
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as response:
        assert expected in response.read()
    took = time.monotonic() - started
    assert took < seconds, f"answered after {took:.1f} s"
    return took


@SERVERS
def test_a_request_is_answered_while_more_clients_than_handlers_trickle(serving, tmp_path):
    with serving(tmp_path) as (port, path, expected), trickling(port, TRICKLERS, EVERY_S) as sockets:
        connected = time.monotonic()
        time.sleep(2.5 * EVERY_S)  # every trickler is mid-request, past a handler's first read
        for _ in range(3):
            answered_within(port, path, expected, 1.0)
        left = readonly_http.REQUEST_TIMEOUT - (time.monotonic() - connected)
        assert all(closed_by_server(s, left + 1.5) for s in sockets), "a trickler outlived its request's deadline"
        assert time.monotonic() - connected < readonly_http.REQUEST_TIMEOUT + 1.5
        answered_within(port, path, expected, 1.0)


def test_the_operators_metrics_cost_no_thread_per_socket_and_bound_connections(tmp_path):
    """The operator's `/metrics` (served as `rlkube-operator --metrics-port` serves it): idle
    sockets start no thread, those over the bound are closed as they are made, and a request
    is answered again once the idle ones are closed at their deadline."""
    with operator_metrics_server(tmp_path) as (port, path, expected):
        threads = threading.active_count()
        sockets = idle_sockets(port, readonly_http.MAX_CONNECTIONS)
        try:
            time.sleep(0.3)  # the server has accepted them all by now
            assert threading.active_count() == threads, "a thread per idle socket"
            over = idle_sockets(port, 3)
            sockets += over
            assert all(closed_by_server(s, 1.0) for s in over), "a connection over the bound was kept"
            assert all(closed_by_server(s, readonly_http.REQUEST_TIMEOUT + 1.0) for s in sockets[:-3]), \
                "an idle connection was kept past the deadline"
            answered_within(port, path, expected, 1.0)
        finally:
            for s in sockets:
                s.close()


@contextlib.contextmanager
def orchestrator_status(max_connections: int, idle_timeout: float):
    """The orchestrator's `/status` port (`rlkube.orchestrator.status.start_http`), served on an
    event loop of its own thread as the orchestrator serves it; yields its port."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    status = {"phase": "running", "step": 4, "max_steps": 10, "reward": 0.5, "eval_reward": None,
              "policy_step": 4, "off_policy_lag": 0, "last_checkpoint_step": None}
    started = asyncio.run_coroutine_threadsafe(start_http(
        make_app(lambda: status, PrometheusMetrics("orchestrator")), "127.0.0.1", 0,
        max_connections=max_connections, idle_timeout=idle_timeout), loop)
    runner, port = started.result(10)
    try:
        yield port
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join()
        loop.close()


def test_the_orchestrators_status_closes_tricklers_holding_every_connection_at_the_head_deadline():
    """As many tricklers as the orchestrator's port takes connections (it is async: there are no
    handler threads, the bound is on connections), a byte each every second: a legitimate request
    is refused while they hold the port, and answered once they are closed, `idle_timeout` after
    their accept. A trickle after an answer on a kept-alive connection is closed likewise. With
    aiohttp's own idle timeout (3630 s), or a timer that each byte resets, they would hold it."""
    bound, deadline = 8, 2.0
    with orchestrator_status(bound, deadline) as port, trickling(port, bound, EVERY_S) as sockets:
        connected = time.monotonic()
        time.sleep(EVERY_S)  # every trickler is mid-request
        with pytest.raises(OSError):  # the port is full: refused, as the bound says
            answered_within(port, "/status", b'"step": 4', 1.0)
        left = deadline - (time.monotonic() - connected)
        assert all(closed_by_server(s, left + 1.5) for s in sockets), "a trickler outlived its request's deadline"
        answered_within(port, "/status", b'"step": 4', 1.0)

        kept = socket.create_connection(("127.0.0.1", port), timeout=10)
        kept.sendall(b"GET /status HTTP/1.1\r\nHost: x\r\n\r\n")
        assert kept.recv(65536).startswith(b"HTTP/1.1 200")
        answered = time.monotonic()
        with contextlib.suppress(OSError):
            for byte in b"GET /status HTTP/1.1\r\nHost: x\r\nX-Slow: zzzzzzzz":
                kept.send(bytes([byte]))
                if time.monotonic() - answered > deadline + 2:
                    break
                time.sleep(EVERY_S / 4)
        assert closed_by_server(kept, 0.5) and time.monotonic() - answered < deadline + 1.5, \
            "a request trickled on a kept-alive connection outlived its deadline"
        kept.close()
