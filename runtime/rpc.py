"""llama.cpp's RPC backend: the target's layers on ``rpc-server`` processes (other machines, or
this one), registered through the ggml backend registry before a model loads.

    devices = rpc.connect(["10.0.0.2:50052", "10.0.0.3:50052"])   # probe, then register each once
    Model(path, n_gpu_layers=n_layer, devices=devices)            # layers to the servers, in order

Every server is probed from Python first (TCP connect with a timeout, then the protocol's HELLO
command): an unreachable server, one that does not answer, or one that speaks another protocol
version is a :class:`~convert.errors.UserError` naming it, before any model or context exists.
ggml-rpc's client itself would abort the process on each of these; with patch 0022 it records
the failure instead, and once the models are loaded a lost server (killed, or silent for longer
than the timeout) makes the next decode fail with :class:`RpcError` (see :func:`check`).

Registration is process-wide and permanent in ggml (a registered server's devices are then
offered to every model loaded with the default device list), so once any server is registered
every model passes an explicit device list (:func:`local_devices` for a local one).
"""

from __future__ import annotations

import ctypes
import socket
import struct
import threading
from dataclasses import dataclass
from functools import cache

from ..convert.errors import UserError

from .bindings import SETUP
from .errors import LlamaError

#: llama.cpp's rpc-server port
DEFAULT_PORT = 50052
#: seconds a probe waits for the TCP connection and the HELLO answer
PROBE_TIMEOUT_S = 5.0
#: RPC_CMD_HELLO (fixed at 14 in every protocol version) and the request's capability bytes
_CMD_HELLO = 14
_CONN_CAPS = 24


class RpcError(LlamaError):
    """An RPC server was lost (or refused a command) while the models were loaded or running."""


def parse_endpoints(value: str | list[str] | tuple[str, ...], flag: str = "--rpc") -> tuple[str, ...]:
    """``HOST:PORT[,HOST:PORT...]`` as a tuple of endpoints; UserError naming the bad one."""
    items = value.split(",") if isinstance(value, str) else [s for v in value for s in str(v).split(",")]
    out: list[str] = []
    for raw in items:
        item = raw.strip()
        host, sep, port = item.rpartition(":")
        if not sep or not host or not port.isdigit() or not 1 <= int(port) <= 65535 or ":" in host:
            raise UserError(f"{flag}: expected HOST:PORT[,HOST:PORT...] with a port 1..65535 (IPv4 or a name), "
                            f"found {item!r}")
        endpoint = f"{host}:{int(port)}"
        if endpoint in out:
            raise UserError(f"{flag}: {endpoint} is listed twice")
        out.append(endpoint)
    if not out:
        raise UserError(f"{flag}: expected HOST:PORT[,HOST:PORT...], found {value!r}")
    if len(out) > 16:  # GGML_RPC_MAX_SERVERS
        raise UserError(f"{flag}: expected at most 16 servers, found {len(out)}")
    return tuple(out)


def parse_tensor_split(value: str | None) -> tuple[float, ...]:
    """llama.cpp's ``--tensor-split``: comma- or slash-separated proportions, e.g. ``3,1``."""
    if value is None or not str(value).strip():
        return ()
    parts = [p.strip() for p in str(value).replace("/", ",").split(",")]
    try:
        props = tuple(float(p) for p in parts)
    except ValueError:
        raise UserError(f"--tensor-split: expected comma-separated proportions such as 3,1, found {value!r}") from None
    if any(not (p >= 0 and p < float("inf")) for p in props) or sum(props) <= 0:
        raise UserError(f"--tensor-split: expected finite proportions >= 0 with a positive sum, found {value!r}")
    return props


def format_version(v: tuple[int, int, int]) -> str:
    return ".".join(str(x) for x in v)


def probe(endpoint: str, timeout: float = PROBE_TIMEOUT_S) -> tuple[int, int, int]:
    """The protocol version an rpc-server at ``endpoint`` answers HELLO with; UserError when it
    cannot be reached or does not answer within ``timeout`` seconds."""
    host, _, port = endpoint.rpartition(":")
    try:
        sock = socket.create_connection((host, int(port)), timeout=timeout)
    except socket.timeout:
        raise UserError(f"--rpc {endpoint}: no answer within {timeout:g} s (is laguna-rpc-server running there, "
                        "and the port open?)") from None
    except OSError as e:
        raise UserError(f"--rpc {endpoint}: cannot connect ({e.strerror or e}; start laguna-rpc-server "
                        f"--host {host} --port {port} there)") from None
    with sock:
        sock.settimeout(timeout)
        try:
            sock.sendall(struct.pack("<BQ", _CMD_HELLO, _CONN_CAPS) + bytes(_CONN_CAPS))
            size = struct.unpack("<Q", _recv_exact(sock, 8))[0]
            if not 3 <= size <= 256:
                raise UserError(f"--rpc {endpoint}: not an RPC server (a HELLO answer of {size} bytes)")
            major, minor, patch = _recv_exact(sock, size)[:3]
        except socket.timeout:
            raise UserError(f"--rpc {endpoint}: the server accepted the connection but did not answer within "
                            f"{timeout:g} s (it serves one client at a time: is another one connected?)") from None
        except (ConnectionError, EOFError):
            client = format_version(client_version())
            raise UserError(f"--rpc {endpoint}: the server closed the connection during the handshake (not an RPC "
                            f"server, or one refusing protocol {client} of this client)") from None
    return major, minor, patch


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise EOFError
        buf += chunk
    return buf


def check_version(endpoint: str, server: tuple[int, int, int]) -> None:
    """ggml-rpc's rule: same major version, and the server's minor no newer than the client's."""
    client = client_version()
    if server[0] != client[0] or server[1] > client[1]:
        raise UserError(f"--rpc {endpoint}: the server speaks RPC protocol {format_version(server)}, this client "
                        f"{format_version(client)} (run the laguna-rpc-server of this same laguna-dflash install "
                        "on every host)")


# ---------------------------------------------------------------------------- the registry


class _Ggml:
    """ctypes declarations of the ggml backend registry and of ggml-rpc's proc addresses."""

    def __init__(self) -> None:
        import llama_cpp.llama_cpp as ll

        from . import bindings

        bindings.lib()
        h = ll._lib  # libllama: dlsym on it finds libggml's and libggml-base's symbols too
        vp, sz = ctypes.c_void_p, ctypes.c_size_t
        sig = {
            "ggml_backend_reg_by_name": ([ctypes.c_char_p], vp),
            "ggml_backend_reg_get_proc_address": ([vp, ctypes.c_char_p], vp),
            "ggml_backend_register": ([vp], None),
            "ggml_backend_reg_dev_count": ([vp], sz),
            "ggml_backend_reg_dev_get": ([vp, sz], vp),
            "ggml_backend_reg_name": ([vp], ctypes.c_char_p),
            "ggml_backend_dev_count": ([], sz),
            "ggml_backend_dev_get": ([sz], vp),
            "ggml_backend_dev_name": ([vp], ctypes.c_char_p),
            "ggml_backend_dev_description": ([vp], ctypes.c_char_p),
            "ggml_backend_dev_type": ([vp], ctypes.c_int),
            "ggml_backend_dev_backend_reg": ([vp], vp),
        }
        self.fn = {}
        for name, (args, res) in sig.items():
            f = h[name]
            f.argtypes, f.restype = args, res
            self.fn[name] = f
        self.reg = self.fn["ggml_backend_reg_by_name"](b"RPC")
        self.add_server = self.failures = self.last_error = self.version = self.set_timeout = None
        if not self.reg:
            return

        def proc(name: str, restype, *argtypes):
            addr = self.fn["ggml_backend_reg_get_proc_address"](self.reg, name.encode())
            return ctypes.CFUNCTYPE(restype, *argtypes)(addr) if addr else None

        self.add_server = proc("ggml_backend_rpc_add_server", vp, ctypes.c_char_p)
        self.failures = proc("ggml_backend_rpc_client_failures", ctypes.c_uint64)
        self.last_error = proc("ggml_backend_rpc_client_last_error", sz, ctypes.c_char_p, sz)
        self.version = proc("ggml_backend_rpc_proto_version", ctypes.c_uint32)
        self.set_timeout = proc("ggml_backend_rpc_set_timeout_ms", None, ctypes.c_uint32)


@cache
def _ggml() -> _Ggml:
    return _Ggml()


def supported() -> bool:
    """Whether this llama-cpp-python has the RPC backend with the graceful client (patch 0022)."""
    g = _ggml()
    return bool(g.reg) and g.failures is not None


def _require() -> _Ggml:
    g = _ggml()
    if not g.reg:
        raise UserError(f"--rpc: this llama-cpp-python was built without the RPC backend; run `{SETUP}` "
                        "to rebuild it (it passes -DGGML_RPC=ON)")
    if g.failures is None:
        raise UserError("--rpc: this llama-cpp-python's RPC client lacks patch 0022 (it would abort on a lost "
                        f"server); run `{SETUP}` to rebuild it")
    return g


def client_version() -> tuple[int, int, int]:
    v = int(_require().version())
    return (v >> 16) & 0xFF, (v >> 8) & 0xFF, v & 0xFF


_lock = threading.Lock()
_registered: dict[str, int] = {}  # endpoint -> its ggml_backend_reg_t, registered once per process


@dataclass(frozen=True)
class Device:
    handle: int  # ggml_backend_dev_t
    name: str
    description: str
    endpoint: str | None  # the RPC server it lives on; None: this machine

    def __str__(self) -> str:
        return f"{self.name} ({self.description})"


def connect(endpoints, timeout_s: float = 60.0, probe_timeout: float = PROBE_TIMEOUT_S) -> list[Device]:
    """Probe every server, then register each with ggml (once per process); the devices of all
    of them in the order given. ``timeout_s``: a connection silent for longer fails (0: never)."""
    g = _require()
    endpoints = parse_endpoints(endpoints)
    for ep in endpoints:  # all of them checked before any is registered
        if _held.get(ep):  # this process is the server's client already (it serves one at a time)
            continue
        check_version(ep, probe(ep, probe_timeout))
    g.set_timeout(int(max(0.0, timeout_s) * 1000))
    devices: list[Device] = []
    with _lock:
        for ep in endpoints:
            reg = _registered.get(ep)
            if reg is None:
                before = failures()
                reg = g.add_server(ep.encode())
                if not reg:
                    msg = last_error() if failures() != before else "it reported no devices"
                    raise UserError(f"--rpc {ep}: {msg}")
                g.fn["ggml_backend_register"](reg)
                _registered[ep] = reg
            for i in range(g.fn["ggml_backend_reg_dev_count"](reg)):
                dev = g.fn["ggml_backend_reg_dev_get"](reg, i)
                devices.append(Device(dev, g.fn["ggml_backend_dev_name"](dev).decode(),
                                      g.fn["ggml_backend_dev_description"](dev).decode(), ep))
    return devices


_held: dict[str, int] = {}  # endpoint -> models of this process holding buffers there


def hold(endpoints: set[str]) -> set[str]:
    with _lock:
        for ep in endpoints:
            _held[ep] = _held.get(ep, 0) + 1
    return endpoints


def release(endpoints: set[str]) -> None:
    with _lock:
        for ep in endpoints:
            _held[ep] = max(0, _held.get(ep, 0) - 1)


def any_registered() -> bool:
    return bool(_registered)


_DEV_GPU, _DEV_IGPU = 1, 2  # ggml_backend_dev_type (CPU 0, GPU 1, IGPU 2, ACCEL 3)


def local_devices() -> list[Device]:
    """This machine's GPU devices (what llama.cpp's default device list holds besides RPC
    servers): none in a CPU build."""
    g = _ggml()
    out = []
    for i in range(g.fn["ggml_backend_dev_count"]()):
        dev = g.fn["ggml_backend_dev_get"](i)
        if g.fn["ggml_backend_dev_type"](dev) not in (_DEV_GPU, _DEV_IGPU):
            continue
        if g.fn["ggml_backend_reg_name"](g.fn["ggml_backend_dev_backend_reg"](dev)) == b"RPC":
            continue
        out.append(Device(dev, g.fn["ggml_backend_dev_name"](dev).decode(),
                          g.fn["ggml_backend_dev_description"](dev).decode(), None))
    return out


def failures() -> int:
    """How many RPC connection failures this process has seen (patch 0022's counter)."""
    g = _ggml()
    return int(g.failures()) if g.failures is not None else 0


def last_error() -> str:
    g = _ggml()
    if g.last_error is None:
        return ""
    buf = ctypes.create_string_buffer(1024)
    g.last_error(buf, len(buf))
    return buf.value.decode("utf-8", errors="replace")


def device_array(devices: list[Device]):
    """A NULL-terminated ``ggml_backend_dev_t[]`` for llama_model_params.devices (keep it alive
    for the duration of the load)."""
    arr = (ctypes.c_void_p * (len(devices) + 1))(*[d.handle for d in devices], None)
    return arr


# ---------------------------------------------------------------------------- placement

#: the target's output head (and a tied head's embedding) stays in this machine's memory: a
#: local drafter borrows it (its context cannot run an op on a server's buffer), and a verify
#: pass then brings back n_embd floats a row instead of n_vocab logits
HEAD_TENSORS = r"^(output|output_norm|token_embd)\.weight$"
ALL_LAYERS = 999


def model_options(cfg) -> tuple[dict, dict]:
    """Model(...) keyword arguments of the target and of the drafter for an EngineConfig with
    ``rpc`` servers: the servers are probed and registered here, before any model loads.

    The target's layers go to the servers' devices in the order given (then this machine's GPUs
    with ``rpc_local_gpu``), split by ``tensor_split`` (llama.cpp's meaning: proportions per
    device; default by free memory); ``n_gpu_layers`` > 0 offloads only the last that many
    layers (the rest run here, as with llama.cpp's -ngl). The drafter runs on this machine
    unless ``draft_rpc``."""
    servers = connect(cfg.rpc, cfg.rpc_timeout_s)
    local = local_devices()
    target_devs = servers + (local if cfg.rpc_local_gpu else [])
    split = tuple(cfg.tensor_split or ())
    if len(split) > len(target_devs):
        raise UserError(f"--tensor-split: {len(split)} proportions for {len(target_devs)} device(s): "
                        f"{', '.join(map(str, target_devs))}")
    if split and sum(split) <= 0:
        raise UserError(f"--tensor-split: expected a positive sum, found {','.join(map(str, split))}")
    ngl = cfg.n_gpu_layers if cfg.n_gpu_layers > 0 else ALL_LAYERS
    target = dict(n_gpu_layers=ngl, devices=target_devs, tensor_split=split, cpu_tensors=HEAD_TENSORS)
    if cfg.draft_rpc:
        draft = dict(n_gpu_layers=cfg.n_gpu_layers_draft or ALL_LAYERS, devices=target_devs)
    else:
        draft = dict(n_gpu_layers=cfg.n_gpu_layers_draft, devices=local)
    return target, draft


def describe(cfg) -> str:
    where = ", ".join(cfg.rpc)
    split = f" split {','.join(f'{p:g}' for p in cfg.tensor_split)}" if cfg.tensor_split else ""
    layers = f"the last {cfg.n_gpu_layers} layers" if cfg.n_gpu_layers > 0 else "all layers"
    local = " and this machine's GPU" if cfg.rpc_local_gpu else ""
    draft = "on the RPC servers" if cfg.draft_rpc else "on this machine"
    return f"target: {layers} on RPC {where}{local}{split} (head here); drafter {draft}"
