"""What `laguna-run setup --check` reports: the llama-cpp-python installed here, whether it carries
the Laguna patches this runtime needs, and what it runs on (backends, devices, CPU features)."""

from __future__ import annotations

import ctypes
from dataclasses import dataclass, field

from .. import patch_series
from ..cores import cpu_features
from . import wheel


@dataclass
class Report:
    version: str | None = None           # llama-cpp-python's installed version; None: not installed
    patched: bool = False                 # has the Laguna entry points, at the ABI this runtime expects
    this_build: bool = False              # the CPU wheel of this install's patches and flags
    this_series: bool = False             # built from this install's patches (any flags)
    problem: str | None = None            # why it cannot be used, in one line
    backends: list[str] = field(default_factory=list)
    devices: list[str] = field(default_factory=list)
    cpu_features: list[str] = field(default_factory=list)
    rpc: bool = False                     # the RPC backend with the client that survives a lost server

    @property
    def ready(self) -> bool:
        return self.version is not None and self.patched and self.problem is None


def _names(h: ctypes.CDLL) -> tuple[list[str], list[str]]:
    """The ggml backends registered in this build, and their devices (name: description)."""
    vp, sz = ctypes.c_void_p, ctypes.c_size_t
    sig = {"ggml_backend_reg_count": ([], sz), "ggml_backend_reg_get": ([sz], vp),
           "ggml_backend_reg_name": ([vp], ctypes.c_char_p), "ggml_backend_dev_count": ([], sz),
           "ggml_backend_dev_get": ([sz], vp), "ggml_backend_dev_name": ([vp], ctypes.c_char_p),
           "ggml_backend_dev_description": ([vp], ctypes.c_char_p)}
    fn = {}
    for name, (args, res) in sig.items():
        f = h[name]  # item access: a function object of our own, llama_cpp's declarations untouched
        f.argtypes, f.restype = args, res
        fn[name] = f
    backends = [fn["ggml_backend_reg_name"](fn["ggml_backend_reg_get"](i)).decode()
                for i in range(fn["ggml_backend_reg_count"]())]
    devices = []
    for i in range(fn["ggml_backend_dev_count"]()):
        dev = fn["ggml_backend_dev_get"](i)
        devices.append(f"{fn['ggml_backend_dev_name'](dev).decode()}: {fn['ggml_backend_dev_description'](dev).decode()}")
    return backends, devices


def gather() -> Report:
    r = Report(version=wheel.installed_version())
    if r.version is None:
        r.problem = "llama-cpp-python is not installed"
        return r
    r.this_build = r.version == wheel.plan().version
    r.this_series = patch_series.series_of(r.version) == patch_series.this_series()
    try:
        import llama_cpp.llama_cpp as ll
    except Exception as e:  # a library that does not load (a CUDA build without its runtime, say)
        r.problem = f"llama-cpp-python {r.version} does not load: {' '.join(str(e).split())}"
        return r
    from .. import bindings, rpc

    try:
        bindings.lib()
        r.patched = True
    except bindings.PatchedWheelMissing as e:
        r.problem = str(e)
    r.backends, r.devices = _names(ll._lib)
    r.cpu_features = cpu_features(ll.llama_print_system_info().decode(errors="replace"))
    r.rpc = r.patched and rpc.supported()
    return r
