"""The training process's small read-only HTTP servers (the RL trainer's `/metrics`, the SFT
trainer's `/status`): the standard library's HTTP handling, with no thread per idle socket, a
bounded number of connections, and idle ones closed.

They run inside rank 0's training process and take no token: whatever reaches the port (what the
run's NetworkPolicy admits; any pod without an enforcing network plugin) may connect. The
standard library's `ThreadingHTTPServer`, and prometheus_client's `start_http_server`, start a
thread per connection and keep it while the client keeps the socket open, so idle sockets would
pile up threads in the trainer without end. Here one thread accepts and waits, in a selector, for
each connection's request to arrive; only then does a handler thread (at most `handlers` at once)
read and answer it, with `idle_timeout` on every read. At most `max_connections` are open (one
more is closed on accept), a connection that sends nothing for `idle_timeout` seconds is closed,
and each response closes its connection (HTTP/1.0).
"""

import logging
import selectors
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, HTTPServer

logger = logging.getLogger(__name__)

MAX_CONNECTIONS = 64
HANDLERS = 4
IDLE_TIMEOUT = 5.0
"""Seconds a connection may wait before its request, and between two reads of it: Prometheus and
the operator send theirs at once."""


class ReadOnlyHTTPServer(HTTPServer):
    request_queue_size = MAX_CONNECTIONS
    """The listen backlog: the standard library's 5 drops the SYNs of a burst of connections (each
    then retried a second later)."""

    def __init__(self, address: tuple[str, int], handler: type[BaseHTTPRequestHandler], *,
                 max_connections: int = MAX_CONNECTIONS, handlers: int = HANDLERS,
                 idle_timeout: float = IDLE_TIMEOUT):
        super().__init__(address, handler)
        self.socket.setblocking(False)  # a connection reset before its accept leaves nothing to wait for
        self.max_connections, self.idle_timeout = max_connections, idle_timeout
        self._handlers = threading.BoundedSemaphore(handlers)
        self._open = 0  # connections waiting or being handled
        self._lock = threading.Lock()
        self._stop, self._stopped = threading.Event(), threading.Event()

    def serve_forever(self, poll_interval: float = 0.5) -> None:
        """Accept, wait for requests, hand them to handler threads, close idle connections;
        until `shutdown`."""
        self._stopped.clear()
        with selectors.DefaultSelector() as waiting:
            waiting.register(self.socket, selectors.EVENT_READ)
            try:
                while not self._stop.is_set():
                    for key, _ in waiting.select(poll_interval):
                        if key.fileobj is self.socket:
                            self._accept(waiting)
                        else:
                            waiting.unregister(key.fileobj)
                            self._dispatch(key.fileobj, key.data[0])
                    now = time.monotonic()
                    for key in [k for k in waiting.get_map().values() if k.data and k.data[1] < now]:
                        waiting.unregister(key.fileobj)
                        self._close(key.fileobj)
            finally:
                for key in [k for k in waiting.get_map().values() if k.fileobj is not self.socket]:
                    self._close(key.fileobj)
                self._stopped.set()

    def shutdown(self) -> None:
        self._stop.set()
        self._stopped.wait()

    def _accept(self, waiting: selectors.BaseSelector) -> None:
        try:
            conn, address = self.socket.accept()
        except OSError:  # BlockingIOError: gone before its accept
            return
        with self._lock:
            full = self._open >= self.max_connections
            self._open += not full
        if full:
            logger.debug("%s: %d connections open, closing one from %s", self.server_address,
                         self.max_connections, address)
            conn.close()
            return
        conn.setblocking(False)
        waiting.register(conn, selectors.EVENT_READ, (address, time.monotonic() + self.idle_timeout))

    def _dispatch(self, conn: socket.socket, address) -> None:
        """The request's first bytes are there: a handler thread reads and answers it, if one is free."""
        if not self._handlers.acquire(blocking=False):
            self._close(conn)
            return
        conn.setblocking(True)
        conn.settimeout(self.idle_timeout)
        threading.Thread(target=self._handle, args=(conn, address), name=f"{threading.current_thread().name}-request",
                         daemon=True).start()

    def _handle(self, conn: socket.socket, address) -> None:
        try:
            self.finish_request(conn, address)
        except OSError as e:  # the client went away mid-answer: no error of the trainer's
            logger.debug("%s: request from %s: %s", self.server_address, address, e)
        finally:
            self._close(conn)
            self._handlers.release()

    def _close(self, conn: socket.socket) -> None:
        self.shutdown_request(conn)
        with self._lock:
            self._open -= 1


def serve(host: str, port: int, handler: type[BaseHTTPRequestHandler], name: str) -> ReadOnlyHTTPServer:
    """A `ReadOnlyHTTPServer` on (host, port), serving from a daemon thread named `name`;
    `.shutdown()` and `.server_close()` stop it, `.server_port` is the bound port."""
    server = ReadOnlyHTTPServer((host, port), handler)
    threading.Thread(target=server.serve_forever, name=name, daemon=True).start()
    return server
