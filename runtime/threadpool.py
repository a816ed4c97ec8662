"""ggml's CPU thread pool, one per engine: a target context and the contexts that borrow from it.

The CPU wheel is built without OpenMP, so ggml runs its own worker threads, and they live in a
pool attached to a context (llama.cpp's ``llama_attach_threadpool``). A context without one gets
a new pool, and new threads, at every decode. A target and its drafter decode in turn and never
at once, so they share one pool: two pools would keep two sets of workers polling against each
other on the same cores (docs/results/peer, run 9). The pool's lock makes "never at once" a rule
rather than a habit. In an OpenMP build (the CUDA wheel) a pool holds no threads and
attaching one changes nothing.
"""

from __future__ import annotations

import ctypes
import functools
import threading

#: GGML_MAX_N_THREADS: the size of the pool parameters' CPU mask
_MAX_THREADS = 512
#: ggml's polling level (0-100): how long an idle worker spins for the next graph before it
#: sleeps. At 1 it spins about as long as libgomp's default spin (a few milliseconds), which
#: covers the host's work between a round's decodes and decoded as fast as llama.cpp's default
#: of 50, which keeps a core spinning about 50 times longer after each graph.
POLL = 1


class PoolParams(ctypes.Structure):
    # struct ggml_threadpool_params (ggml.h)
    _fields_ = [("cpumask", ctypes.c_bool * _MAX_THREADS), ("n_threads", ctypes.c_int), ("prio", ctypes.c_int),
                ("poll", ctypes.c_uint32), ("strict_cpu", ctypes.c_bool), ("paused", ctypes.c_bool)]


@functools.cache
def _cpu_backend() -> ctypes.CDLL | None:
    """ggml's CPU backend as llama.cpp loaded it (dlopen finds a loaded object by its soname);
    None where it is not there by that name, and contexts then run without a pool of ours."""
    try:
        lib = ctypes.CDLL("libggml-cpu.so.0")
        lib.ggml_threadpool_new  # noqa: B018 (a missing symbol raises here)
    except (OSError, AttributeError):
        return None
    lib.ggml_threadpool_new.argtypes = [ctypes.POINTER(PoolParams)]
    lib.ggml_threadpool_new.restype = ctypes.c_void_p
    lib.ggml_threadpool_free.argtypes = [ctypes.c_void_p]
    lib.ggml_threadpool_free.restype = None
    return lib


def pool_params(n_threads: int) -> PoolParams:
    """The parameters of a pool of ``n_threads`` workers that poll POLL before they sleep."""
    return PoolParams(n_threads=n_threads, prio=0, poll=POLL, strict_cpu=False, paused=False)


class ThreadPool:
    """``n_threads`` workers (the caller's thread among them), freed when the last context
    using the pool is closed."""

    def __init__(self, n_threads: int) -> None:
        params = pool_params(n_threads)
        self.n_threads = n_threads
        backend = _cpu_backend()
        self.ptr = backend.ggml_threadpool_new(ctypes.byref(params)) if backend else None
        self.lock = threading.Lock()  # one graph at a time on these workers
        self._users = 0

    def attach(self, llama_lib, ctx_ptr) -> None:
        if self.ptr:  # without a pool, ggml makes one for each decode
            llama_lib.llama_attach_threadpool(ctx_ptr, self.ptr, self.ptr)
        self._users += 1

    def detach(self) -> None:
        """A context that used the pool is freed; the last one frees the pool."""
        self._users -= 1
        if self._users == 0 and self.ptr:
            _cpu_backend().ggml_threadpool_free(self.ptr)
            self.ptr = None
