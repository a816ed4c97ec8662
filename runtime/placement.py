"""Where the target and the drafter run: CPU or CUDA, and how many layers go to the GPU.

Published measurements (ik_llama.cpp, RTX 4070): a drafter on the CPU next to a GPU target
loses at every depth (0.63x-0.95x), so that split is refused unless forced.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..convert.errors import UserError

from .bindings import SETUP

ALL_LAYERS = 999
DEVICES = ("auto", "cpu", "cuda")


@dataclass(frozen=True)
class Placement:
    target_device: str  # "cpu" | "cuda"
    draft_device: str
    n_gpu_layers: int
    n_gpu_layers_draft: int
    n_threads: int | None = None  # CPU threads of each context, once chosen (runtime/cores.py)

    def describe(self) -> str:
        threads = f", {self.n_threads} CPU thread{'s' * (self.n_threads != 1)}" if self.n_threads else ""
        return (f"target on {self.target_device} (ngl {self.n_gpu_layers}), "
                f"drafter on {self.draft_device} (ngld {self.n_gpu_layers_draft}){threads}")


def gpu_available() -> bool:
    from .llama import gpu_offload_supported

    return gpu_offload_supported()


def resolve(device: str = "auto", draft_device: str | None = None, n_gpu_layers: int | None = None,
            n_gpu_layers_draft: int | None = None, force: bool = False,
            has_gpu: bool | None = None) -> Placement:
    for flag, value in (("--device", device), ("--draft-device", draft_device)):
        if value is not None and value not in DEVICES:
            raise UserError(f"{flag}: expected one of {', '.join(DEVICES)}, found {value!r}")
    has_gpu = gpu_available() if has_gpu is None else has_gpu
    target = ("cuda" if has_gpu else "cpu") if device == "auto" else device
    draft = target if draft_device in (None, "auto") else draft_device
    for flag, dev in (("--device", target), ("--draft-device", draft)):
        if dev == "cuda" and not has_gpu:
            raise UserError(f"{flag} cuda: this llama-cpp-python has no usable GPU "
                            f"(no CUDA device, or a CPU-only wheel: run `{SETUP} --cuda`)")
    if target == "cuda" and draft == "cpu" and not force:
        raise UserError("--draft-device cpu with the target on cuda: the drafter must sit where the target "
                        "sits (published runs lose at every depth, 0.63x-0.95x); pass --force-placement to insist")
    ngl = n_gpu_layers if n_gpu_layers is not None else (ALL_LAYERS if target == "cuda" else 0)
    ngld = n_gpu_layers_draft if n_gpu_layers_draft is not None else (ALL_LAYERS if draft == "cuda" else 0)
    if target == "cpu" and ngl > 0:
        raise UserError(f"-ngl {ngl} with --device cpu: expected 0 GPU layers on the CPU")
    if draft == "cpu" and ngld > 0:
        raise UserError(f"-ngld {ngld} with --draft-device cpu: expected 0 GPU layers on the CPU")
    return Placement(target, draft, ngl, ngld)
