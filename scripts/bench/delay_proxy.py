"""A TCP proxy on loopback that adds a fixed latency to every byte the client sends, and counts
the bytes in each direction: a stand-in for a network between laguna-run and an rpc-server.

    proxy = DelayProxy("127.0.0.1:50052", delay_ms=5)   # listens on proxy.endpoint
    ... laguna-run --rpc {proxy.endpoint} ...
    proxy.sent, proxy.received                         # bytes client->server, server->client

Each chunk read from the client is forwarded to the server ``delay_ms`` after it arrived, in
order; chunks in flight overlap (a latency, not a bandwidth limit), so an RPC command that
waits for its answer costs one ``delay_ms`` more, and commands that need no answer pipeline.
The server's answers go back at once. Python forwarding itself adds tens of microseconds per
hop, so ``delay_ms=0`` is the proxy's own cost (compare it with a direct connection).
"""

from __future__ import annotations

import collections
import socket
import threading
import time


class DelayProxy:
    def __init__(self, upstream: str, delay_ms: float, host: str = "127.0.0.1") -> None:
        up_host, _, up_port = upstream.rpartition(":")
        self.upstream = (up_host, int(up_port))
        self.delay = delay_ms / 1000.0
        self.sent = 0  # client -> server bytes
        self.received = 0  # server -> client bytes
        self._lock = threading.Lock()
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind((host, 0))
        self._listener.listen(4)
        self.endpoint = f"{host}:{self._listener.getsockname()[1]}"
        self._closed = threading.Event()
        self._sockets: list[socket.socket] = []
        self._threads = [threading.Thread(target=self._accept, daemon=True)]
        self._threads[0].start()

    def counters(self) -> tuple[int, int]:
        with self._lock:
            return self.sent, self.received

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            server = socket.create_connection(self.upstream)
            for s in (client, server):
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                self._sockets.append(s)
            queue: collections.deque = collections.deque()
            ready = threading.Condition()
            for target in (lambda: self._read_client(client, queue, ready),
                           lambda: self._write_server(server, queue, ready),
                           lambda: self._pipe_back(server, client)):
                t = threading.Thread(target=target, daemon=True)
                t.start()
                self._threads.append(t)

    def _read_client(self, client, queue, ready) -> None:
        while True:
            try:
                data = client.recv(1 << 20)
            except OSError:
                data = b""
            with ready:
                queue.append((time.perf_counter() + self.delay, data))
                ready.notify()
            if not data:
                return
            with self._lock:
                self.sent += len(data)

    def _write_server(self, server, queue, ready) -> None:
        while True:
            with ready:
                while not queue:
                    ready.wait()
                due, data = queue.popleft()
            wait = due - time.perf_counter()
            if wait > 0:
                time.sleep(wait)
            if not data:
                _shutdown(server)
                return
            try:
                server.sendall(data)
            except OSError:
                return

    def _pipe_back(self, server, client) -> None:
        while True:
            try:
                data = server.recv(1 << 20)
            except OSError:
                data = b""
            if not data:
                _shutdown(client)
                return
            with self._lock:
                self.received += len(data)
            try:
                client.sendall(data)
            except OSError:
                return

    def close(self) -> None:
        self._closed.set()
        self._listener.close()
        for s in self._sockets:
            _shutdown(s)
            s.close()


def _shutdown(s: socket.socket) -> None:
    try:
        s.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
