"""laguna-rpc-server: llama.cpp's rpc-server, as built into this install's wheel (patch 0020).

    laguna-rpc-server                                    # 127.0.0.1:50052, this machine only
    laguna-rpc-server --host 10.0.0.2 --port 50052 --expose --threads 16 --mem 60000

Run one on every machine that holds part of a target, then point ``laguna-run --rpc
HOST:PORT,...`` at them. The server is the same build as the wheel's RPC client, so their
protocol versions match. It binds to 127.0.0.1 unless told otherwise: the RPC protocol has no
authentication and no encryption, and anyone who reaches the port can run code-like graphs on
the host and read its buffers; binding another address needs ``--expose``.
"""

from __future__ import annotations

import ipaddress
import os
import socket
import sys
from pathlib import Path

from ..convert.command_line import App, run
from ..convert.errors import UserError
from .params import RPC_SERVER

app = App()

WARNING = ("laguna-rpc-server: WARNING: the RPC protocol has no authentication or encryption; anyone who can "
           "reach {addr} can use this machine's memory and compute. Expose it only on a trusted network.")


def server_binary() -> Path:
    from .bindings import SETUP, lowlevel

    path = Path(lowlevel().__file__).parent / "lib" / "ggml-rpc-server"  # llama_cpp/llama_cpp.py
    if not path.is_file() or not os.access(path, os.X_OK):
        raise UserError(f"{path}: no rpc-server in this llama-cpp-python (a wheel built without -DGGML_RPC=ON); "
                        f"run `{SETUP}` to rebuild it")
    return path


def check_host(host: str, expose: bool) -> str:
    """The IPv4 address to bind (rpc-server takes a literal), refused beyond loopback without --expose."""
    if host == "localhost":
        host = "127.0.0.1"
    try:
        addr = ipaddress.IPv4Address(host)
    except ValueError:
        raise UserError(f"--host: expected an IPv4 address of this machine (e.g. 127.0.0.1), found {host!r}") from None
    if not addr.is_loopback and not expose:
        raise UserError(f"--host {host}: binding beyond this machine needs --expose (the RPC protocol has no "
                        "authentication or encryption)")
    return host


def check_port_free(host: str, port: int) -> None:
    """rpc-server reports a taken port with a line and exit code 0; refuse it here instead."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as e:
            raise UserError(f"--host {host} --port {port}: cannot listen there ({e.strerror or e})") from None


@app.command()
def main_command(
    host: RPC_SERVER["host"].annotated() = RPC_SERVER["host"].default,
    port: RPC_SERVER["port"].annotated() = RPC_SERVER["port"].default,
    threads: RPC_SERVER["threads"].annotated() = RPC_SERVER["threads"].default,
    mem: RPC_SERVER["mem"].annotated() = RPC_SERVER["mem"].default,
    device: RPC_SERVER["device"].annotated() = RPC_SERVER["device"].default,
    cache: RPC_SERVER["cache"].annotated() = False,
    expose: RPC_SERVER["expose"].annotated() = False,
) -> None:
    """Serve this machine's memory and compute to laguna-run --rpc (llama.cpp's RPC protocol)."""
    RPC_SERVER.check_flags(locals())  # the arguments, by name
    host = check_host(host, expose)
    binary = server_binary()
    check_port_free(host, port)
    args = [str(binary), "--host", host, "--port", str(port)]
    if threads:
        args += ["--threads", str(threads)]
    if mem:
        args += ["--mem", str(mem)]
    if device:
        args += ["--device", device]
    if cache:
        args.append("--cache")
    if not ipaddress.IPv4Address(host).is_loopback:
        print(WARNING.format(addr=f"{host}:{port}"), file=sys.stderr, flush=True)
    sys.stdout.flush()
    os.execv(str(binary), args)  # the server becomes this process: signals reach it directly


def main(argv: list[str] | None = None) -> int:
    code = run(app, sys.argv[1:] if argv is None else argv, "laguna-rpc-server")
    if argv is None:
        sys.exit(code)
    return code
