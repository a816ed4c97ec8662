"""What bounds the work one client can cause, and how the server stops.

- :class:`BodyLimitMiddleware`: a request body over ``--max-body-bytes`` is answered 413
  before anything parses it (``Content-Length`` first, then the bytes as they arrive).
- :class:`PreparePool`: chat templates and the tokenizer run in a few daemon threads of their
  own, with a bounded queue in front (503 beyond it), so they cannot take the event loop's
  default executor or the slots' threads; a worker busy for longer than ``stuck_after_s`` is
  reported by ``/health``.
- :func:`lone_surrogate`: JSON may carry ``"\\ud800"``, which no UTF-8 encoder takes: a 400.
- :func:`exposure_problem`: a non-loopback ``--host`` without an API key is refused unless
  ``--expose`` accepts it.
- :class:`GracefulServer`: on SIGTERM/SIGINT new completions are answered 503 ``shutting_down`` and
  running ones may finish for ``--shutdown-timeout`` seconds; then the jobs left are cut (a stream
  ends with a finish reason, an error event naming the shutdown and ``[DONE]``). The listening
  socket closes once every connection the kernel accepted is answered; a second signal exits at
  once.
"""

from __future__ import annotations

import asyncio
import ipaddress
import os
import queue
import selectors
import signal
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

import uvicorn

#: a body may hold a whole context of text, JSON-escaped, plus this much for everything else
BODY_BASE_BYTES = 1 << 20
#: bytes of request body per context token: a token is a few characters of text on average; an
#: escaped non-ASCII character is up to 12 bytes of JSON. Raise --max-body-bytes for more.
BODY_BYTES_PER_TOKEN = 64
#: a preparation (template + tokenizer) running longer than this is reported as stuck
STUCK_AFTER_S = 10.0
#: after --shutdown-timeout, the cut streams get this long to write their last events
CUT_GRACE_S = 5.0
#: while draining, how often the server looks whether everything accepted is answered
DRAIN_POLL_S = 0.05


def default_max_body_bytes(n_ctx: int) -> int:
    return BODY_BASE_BYTES + BODY_BYTES_PER_TOKEN * n_ctx


class BodyLimitMiddleware:
    """Reads the whole request body, at most ``max_bytes``, before the app sees it; over the
    limit the answer is 413 (``request_too_large``) and the body is not parsed."""

    def __init__(self, app, max_bytes: int, error_response: Callable[[int, str, str], Any]) -> None:
        self.app, self.max_bytes, self._error = app, max_bytes, error_response

    def _too_large(self, found: str):
        return self._error(413, f"the request body is {found}, over this server's limit of {self.max_bytes} bytes "
                                "(--max-body-bytes)", "request_too_large")

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        for name, value in scope.get("headers", ()):
            if name == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    declared = -1
                if declared > self.max_bytes:
                    await self._too_large(f"{declared} bytes")(scope, receive, send)
                    return
        chunks, n = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return  # the client left before its request was complete: nothing to answer
            body = message.get("body", b"")
            n += len(body)
            if n > self.max_bytes:
                await self._too_large(f"over {self.max_bytes} bytes")(scope, receive, send)
                return
            chunks.append(body)
            if not message.get("more_body", False):
                break
        replayed = False

        async def replay():
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": b"".join(chunks), "more_body": False}
            return await receive()  # then the disconnect, when it comes

        await self.app(scope, replay, send)


class PreparePool:
    """``workers`` daemon threads running request preparation, at most ``max_waiting`` waiting.

    Daemon threads, so a preparation that never returns (none should: templates have a
    deadline) cannot keep the process alive at exit."""

    class Full(Exception):
        pass

    def __init__(self, workers: int, max_waiting: int, stuck_after_s: float = STUCK_AFTER_S) -> None:
        self.workers, self.max_waiting, self.stuck_after_s = workers, max_waiting, stuck_after_s
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._pending = 0  # queued + running
        self._busy_since: list[float | None] = [None] * workers
        self._threads = [threading.Thread(target=self._work, args=(i,), name=f"laguna-prepare-{i}", daemon=True)
                         for i in range(workers)]
        for t in self._threads:
            t.start()

    async def run(self, fn: Callable, *args) -> Any:
        with self._lock:
            if self._pending >= self.workers + self.max_waiting:
                raise PreparePool.Full()
            self._pending += 1
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self._queue.put((loop, future, fn, args))
        return await future

    def _work(self, index: int) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            loop, future, fn, args = item
            try:
                if future.cancelled():  # its client left while it waited
                    continue
                self._busy_since[index] = time.monotonic()
                try:
                    result, error = fn(*args), None
                except BaseException as e:  # noqa: BLE001 (handed to the awaiting request)
                    result, error = None, e
                finally:
                    self._busy_since[index] = None
                try:
                    loop.call_soon_threadsafe(_settle, future, result, error)
                except RuntimeError:  # the loop is closed: nobody waits any more
                    pass
            finally:
                with self._lock:
                    self._pending -= 1

    def status(self) -> dict:
        now = time.monotonic()
        since = list(self._busy_since)
        return {"prepare_workers": self.workers, "prepare_busy": sum(s is not None for s in since),
                "prepare_stuck": sum(s is not None and now - s > self.stuck_after_s for s in since)}

    def close(self) -> None:
        for _ in self._threads:
            self._queue.put(None)


def _settle(future: asyncio.Future, result, error) -> None:
    if future.done():
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)


def lone_surrogate(value: Any, where: str = "") -> tuple[str, int, str] | None:
    """(field path, character index, the character) of the first string in ``value`` (dicts,
    lists, strings) that UTF-8 cannot encode, or None."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as e:
            return where or "body", e.start, value[e.start]
        return None
    if isinstance(value, dict):
        items = value.items()
    elif isinstance(value, (list, tuple)):
        items = enumerate(value)
    else:
        return None
    for key, item in items:
        found = lone_surrogate(item, f"{where}.{key}" if where else str(key))
        if found is not None:
            return found
    return None


def is_loopback(host: str) -> bool:
    """Whether every address ``host`` names is a loopback one (127.0.0.0/8, ::1)."""
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except socket.gaierror:
        return False
    return bool(infos) and all(ipaddress.ip_address(info[4][0].split("%")[0]).is_loopback for info in infos)


def exposure_problem(host: str, api_key: str | None, expose: bool) -> tuple[str | None, str | None]:
    """(error, warning) for listening on ``host``: without a key, a non-loopback address lets anyone
    who can reach the port use the model; that takes ``--expose``, and is said aloud."""
    if api_key or is_loopback(host):
        return None, None
    if not expose:
        return (f"--host {host}: a non-loopback address without an API key would serve anyone who can reach it; "
                "set LAGUNA_API_KEY (or --api-key), or add --expose to accept that"), None
    return None, (f"laguna-run serve: warning: listening on {host} without an API key (--expose): anyone who can "
                  "reach this port can use the model")


class GracefulServer(uvicorn.Server):
    """uvicorn's Server with this project's shutdown (module docstring). ``on_drain()`` is called
    when the first signal arrives, ``on_cut()`` when ``shutdown_timeout`` has passed."""

    def __init__(self, config, *, shutdown_timeout: float, on_drain: Callable[[], None],
                 on_cut: Callable[[], int]) -> None:
        super().__init__(config)
        self.shutdown_timeout = shutdown_timeout
        self.on_drain, self.on_cut = on_drain, on_cut
        self.signal: int | None = None
        self.cut_jobs = 0
        _keep_streams_open_on_exit()

    def handle_exit(self, sig: int, frame) -> None:
        if self.should_exit:  # a second signal: at once
            name = signal.Signals(sig).name if sig else "signal"
            os.write(2, f"laguna-run serve: {name} again: exiting now\n".encode())
            os._exit(128 + (sig or 0))
        self.signal = sig
        self.should_exit = True

    async def shutdown(self, sockets=None) -> None:
        self.on_drain()
        loop = asyncio.get_running_loop()

        def cut() -> None:
            self.cut_jobs = self.on_cut()

        timer = loop.call_later(self.shutdown_timeout, cut)
        deadline = loop.time() + self.shutdown_timeout + CUT_GRACE_S
        try:
            # uvicorn's shutdown closes the listening socket at once, which resets every connection
            # the kernel holds in its backlog, and closes accepted connections whose request it has
            # not read yet, a reset too. Serving on while draining answers each of them instead (the
            # app says 503 shutting_down); the socket closes once nothing accepted is unanswered,
            # checked and acted on in one step of the loop (only a connection the kernel completes
            # in the microseconds between the two can still be reset, as with any TCP server).
            # Simpler than answering the backlog by hand: uvicorn reads the requests, the app has
            # the one 503, and kept-alive connections are served the same way.
            while not self._settled() and loop.time() < deadline:
                await asyncio.sleep(DRAIN_POLL_S)
            self.config.timeout_graceful_shutdown = max(0.0, deadline - loop.time())
            await super().shutdown(sockets)
        finally:
            timer.cancel()

    def _settled(self) -> bool:
        """Whether everything the kernel accepted is answered: no request running, no connection
        waiting in a listening socket's backlog and no unread bytes on an open connection."""
        if self.server_state.tasks:
            return False
        waiting = [sock for server in self.servers for sock in server.sockets]
        for connection in self.server_state.connections:
            transport = getattr(connection, "transport", None)
            if transport is not None and not transport.is_closing():
                waiting.append(transport.get_extra_info("socket"))
        with selectors.DefaultSelector() as selector:
            for sock in waiting:
                if sock is not None:
                    selector.register(sock, selectors.EVENT_READ)
            return not selector.select(0)


def _keep_streams_open_on_exit() -> None:
    """sse-starlette ends every stream as soon as uvicorn sees a signal, mid-text and without a
    finish reason; streams here end the way :class:`GracefulServer` decides instead."""
    try:
        from sse_starlette.sse import AppStatus
    except ImportError:
        return
    disable = getattr(AppStatus, "disable_automatic_graceful_drain", None)
    if disable is not None:  # sse-starlette 3: it also watches uvicorn's should_exit itself
        disable()
