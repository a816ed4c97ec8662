"""A laguna-run server on 127.0.0.1 inside the test process: uvicorn in a thread, an ephemeral
port, bounded start and stop."""

from __future__ import annotations

import json
import socket
import threading
import time
from contextlib import contextmanager

from laguna_dflash.runtime.engine import EngineConfig
from laguna_dflash.runtime.lanes import make_engine
from laguna_dflash.runtime.open_pair import resolve_pair
from laguna_dflash.runtime.llama import Model
from laguna_dflash.runtime.server.pool import SlotPool

#: a Laguna-style template for the bundled target, whose GGUF has none
TEMPLATE = ("{% for m in messages %}<{{ m.role }}>{{ m.content }}</{{ m.role }}>{% endfor %}"
            "{% if add_generation_prompt %}<assistant>{% endif %}")


@contextmanager
def bundled_models(bundled: str = "code"):
    """A bundled pair (``assets.BUNDLED``) loaded: the target Model, the converted drafter's path
    and its Model; both closed on exit."""
    from laguna_dflash.runtime.drafter_cache import native_drafter_path
    from laguna_dflash.runtime import assets

    _, target_path, convert = assets.BUNDLED[bundled]
    target = Model(target_path)
    drafter_path = native_drafter_path(convert(), target.path)
    drafter = Model(drafter_path)
    try:
        yield target, drafter_path, drafter
    finally:
        drafter.close()
        target.close()


def make_pool(target: Model, drafter_path, drafter_model: Model | None, parallel: int = 1, max_queue: int = 8,
              lanes: int = 1, **cfg) -> SlotPool:
    config = EngineConfig(**{"n_ctx": 2048, "kv_type": "f32", "n_threads": 1, **cfg})
    pair = resolve_pair(target.path, drafter_path)
    return SlotPool(make_engine(target, pair, config, parallel, lanes, drafter_model), max_queue)


def openai_client(server: "LiveServer", key: str = "unused", timeout: float = 120, **kw):
    """The official client on a live server: no retries, so a failure shows as itself."""
    import openai

    return openai.OpenAI(base_url=server.url + "/v1", api_key=key, max_retries=0, timeout=timeout, **kw)


def laguna_chat_server(models, **settings) -> "LiveServer":
    """One slot with Laguna 2.1's own chat template (tests/fixtures) on the bundled pair."""
    from laguna_chat import TEMPLATE_TEXT

    target, path, drafter = models
    return LiveServer(make_pool(target, path, drafter, parallel=1), chat_template=TEMPLATE_TEXT,
                      chat_template_source="laguna-2.1-chat-template.jinja", **settings)


class LiveServer:
    def __init__(self, pool: SlotPool, **settings) -> None:
        import uvicorn

        from laguna_dflash.runtime.server.app import ServerSettings, create_app

        self.pool = pool
        self.settings = ServerSettings(**{"model_id": "laguna-tiny", "chat_template": TEMPLATE,
                                          "chat_template_source": "test template", **settings})
        self.app = create_app(pool, self.settings)
        # IPPROTO_TCP: asyncio sets TCP_NODELAY on accepted connections only then
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(128)
        self.port = self.sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = uvicorn.Server(uvicorn.Config(self.app, log_level="warning", access_log=False,
                                                    lifespan="on", timeout_graceful_shutdown=5))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)

    def __enter__(self) -> "LiveServer":
        self.thread.start()
        deadline = time.monotonic() + 60
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the test server did not start")
            time.sleep(0.02)
        return self

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(60)
        self.sock.close()
        assert not self.thread.is_alive(), "the test server did not stop"


def completion_request(body: dict) -> bytes:
    """The raw bytes of a POST of ``body`` to /v1/completions, for a client on a bare socket."""
    text = json.dumps(body)
    return (f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(text)}\r\n\r\n{text}").encode()
