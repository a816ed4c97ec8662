"""ctypes declarations of the C entry points our patches add to libllama (``laguna_ext_*``).

Everything else comes from ``llama_cpp.llama_cpp`` (llama-cpp-python's own thin layer); this
module only adds what the stock wheel lacks, and refuses a wheel built without our patches.
"""

from __future__ import annotations

import ctypes
from functools import cache
from types import ModuleType

from ..convert.errors import UserError
from . import patch_series

#: Must equal laguna_ext_abi_version() in the patched libllama (patches 0002 and 0003).
EXPECTED_ABI = 2

#: what every message about a missing or wrong llama-cpp-python tells the user to run
SETUP = "laguna-run setup"


class PatchedWheelMissing(UserError):
    """llama-cpp-python is missing or not the patched build; the message says how to get it."""


def lowlevel() -> ModuleType:
    """``llama_cpp.llama_cpp``, or a one-line error when llama-cpp-python is not installed."""
    try:
        import llama_cpp.llama_cpp as llama_cpp_lowlevel
    except ImportError:
        raise PatchedWheelMissing(f"llama-cpp-python is not installed: run `{SETUP}` to build (or reuse) "
                                  "and install the patched wheel") from None
    return llama_cpp_lowlevel


@cache
def lib() -> ctypes.CDLL:
    llama_cpp_lowlevel = lowlevel()
    handle = llama_cpp_lowlevel._lib
    if not hasattr(handle, "laguna_ext_abi_version"):
        raise PatchedWheelMissing(
            f"llama-cpp-python {getattr(llama_cpp_lowlevel, '__version__', '?')} lacks the Laguna patches; "
            f"run `{SETUP}` to build and install the patched wheel"
        )
    _declare(handle)
    abi = handle.laguna_ext_abi_version()
    if abi != EXPECTED_ABI:
        raise PatchedWheelMissing(
            f"patched libllama has ABI {abi}, this runtime expects {EXPECTED_ABI}; run `{SETUP}` to rebuild it"
        )
    check_series(installed_llama_cpp_version())
    return handle


def installed_llama_cpp_version() -> str | None:
    """The version of the llama_cpp package this process imports (its ``__version__``, which the
    wheel build writes)."""
    import llama_cpp

    return getattr(llama_cpp, "__version__", None)


def check_series(version: str | None) -> None:
    """Refuse a patched wheel built from other patches than this install's: the runtime relies on
    what its own series' kernels do (which pass sizes compute each row as alone), so an older
    wheel under a newer runtime could part a sequence from its output alone without an error."""
    want = patch_series.this_series()
    if patch_series.series_of(version) != want:
        raise PatchedWheelMissing(
            f"llama-cpp-python {version} is not built from this laguna-dflash's patches (series {want}); "
            f"run `{SETUP}` to build and install it"
        )


def _declare(h: ctypes.CDLL) -> None:
    ctx_p = ctypes.c_void_p
    model_p = ctypes.c_void_p
    sig = {
        "laguna_ext_abi_version": ([], ctypes.c_int32),
        "laguna_ext_n_capture_slots": ([ctx_p], ctypes.c_int32),
        "laguna_ext_set_capture": ([ctx_p, ctypes.c_int32, ctypes.c_bool], ctypes.c_int32),
        "laguna_ext_get_capture": ([ctx_p, ctypes.c_int32], ctypes.POINTER(ctypes.c_float)),
        "laguna_ext_model_is_dflash_laguna": ([model_p], ctypes.c_bool),
        "laguna_ext_model_target_layer_ids": ([model_p, ctypes.POINTER(ctypes.c_int32), ctypes.c_int32],
                                              ctypes.c_int32),
        # llama.cpp's own, which llama-cpp-python does not bind (runtime/threadpool.py)
        "llama_attach_threadpool": ([ctx_p, ctypes.c_void_p, ctypes.c_void_p], None),
    }
    for name, (args, res) in sig.items():
        fn = getattr(h, name, None)
        if fn is None:
            raise PatchedWheelMissing(f"patched libllama lacks {name}; run `{SETUP}` to rebuild it")
        fn.argtypes = args
        fn.restype = res


@cache
def address_fns() -> tuple:
    """(llama_get_logits_ith, laguna_ext_get_capture) returning plain int addresses (0 for NULL).

    The hot path keys cached numpy views by address; a POINTER(c_float) result would need a cast
    and a new ctypes array type per call. These are separate function objects (CDLL item access
    makes a new one), so llama_cpp's own declarations stay as they are."""
    h = lib()
    logits = h["llama_get_logits_ith"]
    logits.argtypes, logits.restype = [ctypes.c_void_p, ctypes.c_int32], ctypes.c_void_p
    capture = h["laguna_ext_get_capture"]
    capture.argtypes, capture.restype = [ctypes.c_void_p, ctypes.c_int32], ctypes.c_void_p
    return logits, capture
