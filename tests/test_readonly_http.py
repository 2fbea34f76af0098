"""The training process's read-only HTTP servers (`rlkube.readonly_http`), over real sockets:
idle connections cost no thread, are bounded and closed once idle, and a request is still
answered beside them; the RL trainer's `/metrics` and the SFT trainer's `/status` are served so."""

import contextlib
import socket
import threading
import time
import urllib.request

import pytest
from rlkube import readonly_http
from rlkube.metrics import MetricsSink
from rlkube.trainer.sft.status import StatusServer


def idle_sockets(port: int, n: int) -> list[socket.socket]:
    """`n` connections that send nothing."""
    return [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(n)]


def closed_by_server(sock: socket.socket, within: float) -> bool:
    """Whether the server closes `sock` (EOF or reset) within `within` seconds."""
    sock.settimeout(within)
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


def still_open(sock: socket.socket) -> bool:
    """Whether `sock` is open with nothing to read (the server neither answered nor closed it)."""
    sock.setblocking(False)
    try:
        return sock.recv(1) != b""
    except BlockingIOError:
        return True
    except ConnectionResetError:
        return False
    finally:
        sock.setblocking(True)


def until(predicate, seconds: float = 5.0) -> bool:
    end = time.monotonic() + seconds
    while not predicate():
        if time.monotonic() > end:
            return False
        time.sleep(0.02)
    return True


def assert_bounded(port: int, path: str, expected: bytes) -> None:
    """For a server bounded at 8 connections and 2 s idle: connections over the bound are closed
    as they are made while those under it stay open; idle ones, and a request trickled slower
    than the timeout, are closed once it passes; a request is answered once the bound is free."""
    sockets = idle_sockets(port, 8)
    over = idle_sockets(port, 3)
    assert all(closed_by_server(s, 1.0) for s in over), "a connection over the bound was kept"
    assert all(still_open(s) for s in sockets), "the bound closed connections under it"
    started = time.monotonic()
    assert all(closed_by_server(s, 4.0) for s in sockets), "an idle connection was kept"
    assert time.monotonic() - started < 3.5
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as response:
        assert expected in response.read()
    slow = idle_sockets(port, 1)[0]
    slow.sendall(b"G")
    assert closed_by_server(slow, 4.0), "a request trickled slower than the timeout was kept"


@contextlib.contextmanager
def metrics_server(tmp_path):
    with MetricsSink(tmp_path, "trainer", console=False, prometheus=("127.0.0.1", 0)) as sink:
        sink.log(1, {"loss/mean": 0.5})
        yield sink._prometheus_server.server_port, "/metrics", b"rlkube_trainer_loss_mean 0.5"


@contextlib.contextmanager
def sft_status(tmp_path):
    server = StatusServer("127.0.0.1", 0, step=3, max_steps=10)
    try:
        yield server.port, "/status", b'"step": 3'
    finally:
        server.close()


@pytest.mark.parametrize("serving", [metrics_server, sft_status], ids=["trainer-metrics", "sft-status"])
def test_idle_sockets_cost_the_trainer_no_thread_and_a_request_is_still_answered(serving, tmp_path):
    with serving(tmp_path) as (port, path, expected):
        threads = threading.active_count()
        sockets = idle_sockets(port, readonly_http.MAX_CONNECTIONS - 2)
        try:
            time.sleep(0.3)  # the server has accepted them all by now
            assert threading.active_count() == threads, "a thread per idle socket"
            with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as response:
                assert expected in response.read()
            assert until(lambda: threading.active_count() == threads), "the request's thread did not end"
        finally:
            for s in sockets:
                s.close()


def test_connections_over_the_bound_are_closed_and_idle_ones_after_the_timeout():
    server = readonly_http.ReadOnlyHTTPServer(("127.0.0.1", 0), StatusServer.handler_for(lambda: {"step": 1}),
                                              max_connections=8, handlers=2, request_timeout=2.0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        assert_bounded(server.server_port, "/status", b'"step": 1')
    finally:
        server.shutdown()
        server.server_close()
