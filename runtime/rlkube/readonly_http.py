"""The training process's small read-only HTTP servers (the RL trainer's `/metrics`, the SFT
trainer's `/status`): the standard library's HTTP handling, with no thread per idle or slow
socket, a bounded number of connections, and one deadline on each request.

They run inside rank 0's training process and take no token: whatever reaches the port (what the
run's NetworkPolicy admits; any pod without an enforcing network plugin) may connect. The
standard library's `ThreadingHTTPServer`, and prometheus_client's `start_http_server`, start a
thread per connection and keep it while the client keeps the socket open, so idle sockets would
pile up threads in the trainer without end. Here one thread accepts and, in a selector, reads
each connection's request head (request line and headers, at most `MAX_HEAD` bytes) as it
arrives; only a complete head goes to a handler thread (at most `handlers` at once), which
parses it from memory and answers. The deadline is on the whole head, `request_timeout` from the
accept, not on each read: a client that trickles a byte every few seconds is closed when it
passes, having held no handler meanwhile (with a per-read timeout, four such clients held every
handler for as long as they liked and each legitimate request was closed). At most
`max_connections` are open (one more is closed on accept), and each response closes its
connection (HTTP/1.0). These servers answer GETs: a request body is not read.
"""

import io
import logging
import selectors
import socket
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, HTTPServer

logger = logging.getLogger(__name__)

MAX_CONNECTIONS = 64
HANDLERS = 4
REQUEST_TIMEOUT = 5.0
"""Seconds from a connection's accept to the end of its request head: Prometheus and the
operator send theirs at once."""
MAX_HEAD = 64 * 1024
"""Bytes a request head may take (the standard library's limit on one header line): a longer
one is closed unanswered."""
HEAD_ENDS = (b"\r\n\r\n", b"\n\n")


@dataclass
class _Waiting:
    """A connection whose request head is still arriving."""

    address: tuple
    deadline: float
    head: bytearray = field(default_factory=bytearray)

    def add(self, data: bytes) -> bool:
        """Append `data`; whether the head is complete (searched where `data` may end it)."""
        start = max(0, len(self.head) - 3)
        self.head += data
        return any(self.head.find(end, start) >= 0 for end in HEAD_ENDS)


class _HeadRead:
    """The connection as the handler sees it: reading gives the head the server has read,
    writing and the rest go to the socket."""

    def __init__(self, conn: socket.socket, head: bytes):
        self._conn, self._head = conn, head

    def makefile(self, mode: str = "r", *args, **kwargs):
        if "r" in mode:
            return io.BytesIO(self._head)
        return self._conn.makefile(mode, *args, **kwargs)

    def __getattr__(self, name: str):
        return getattr(self._conn, name)


class ReadOnlyHTTPServer(HTTPServer):
    request_queue_size = MAX_CONNECTIONS
    """The listen backlog: the standard library's 5 drops the SYNs of a burst of connections (each
    then retried a second later)."""

    def __init__(self, address: tuple[str, int], handler: type[BaseHTTPRequestHandler], *,
                 max_connections: int = MAX_CONNECTIONS, handlers: int = HANDLERS,
                 request_timeout: float = REQUEST_TIMEOUT):
        super().__init__(address, handler)
        self.socket.setblocking(False)  # a connection reset before its accept leaves nothing to wait for
        self.max_connections, self.request_timeout = max_connections, request_timeout
        self._handlers = threading.BoundedSemaphore(handlers)
        self._open = 0  # connections waiting or being handled
        self._lock = threading.Lock()
        self._stop, self._stopped = threading.Event(), threading.Event()

    def serve_forever(self, poll_interval: float = 0.5) -> None:
        """Accept, read request heads, hand complete ones to handler threads, close connections
        past their deadline; until `shutdown`."""
        self._stopped.clear()
        with selectors.DefaultSelector() as waiting:
            waiting.register(self.socket, selectors.EVENT_READ)
            try:
                while not self._stop.is_set():
                    for key, _ in waiting.select(poll_interval):
                        if key.fileobj is self.socket:
                            self._accept(waiting)
                        else:
                            self._read(waiting, key.fileobj, key.data)
                    now = time.monotonic()
                    for key in [k for k in waiting.get_map().values() if k.data and k.data.deadline < now]:
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
        waiting.register(conn, selectors.EVENT_READ, _Waiting(address, time.monotonic() + self.request_timeout))

    def _read(self, waiting: selectors.BaseSelector, conn: socket.socket, request: _Waiting) -> None:
        """What arrived of the request head; a complete one is dispatched, a closed or oversized
        one closed."""
        try:
            data = conn.recv(MAX_HEAD + 1 - len(request.head))
        except BlockingIOError:
            return
        except OSError:  # reset by the client
            data = b""
        complete = request.add(data)
        if data and not complete and len(request.head) <= MAX_HEAD:
            return
        waiting.unregister(conn)
        if complete:
            self._dispatch(conn, request.address, bytes(request.head))
        else:
            self._close(conn)

    def _dispatch(self, conn: socket.socket, address, head: bytes) -> None:
        """The request's head is in: a handler thread answers it, if one is free."""
        if not self._handlers.acquire(blocking=False):
            self._close(conn)
            return
        conn.setblocking(True)
        conn.settimeout(self.request_timeout)  # for writing the answer
        threading.Thread(target=self._handle, args=(conn, address, head),
                         name=f"{threading.current_thread().name}-request", daemon=True).start()

    def _handle(self, conn: socket.socket, address, head: bytes) -> None:
        try:
            self.finish_request(_HeadRead(conn, head), address)
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
