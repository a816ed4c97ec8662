"""What the converter needs from the *target* model: layer count, hidden size, vocabulary, tokenizer.

The target is given either as its GGUF file (read with gguf-py's ``GGUFReader``) or as its
Hugging Face directory (``config.json`` for the sizes; the tokenizer comes from llama.cpp's own
``convert_hf_to_gguf.py --vocab-only``, so it is byte-for-byte what a converted target holds).

    target = read_target(Path("Laguna-XS-2.1-Q4_K_M.gguf"))
    target.n_layer, target.hidden_size, target.vocab_size, target.tokenizer["tokenizer.ggml.model"]
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGUFReader, GGUFValueType

from .files import cache_root
from .gguf import keys as K
from .errors import ContractError, UserError
from .gguf.header import read_header
from .gguf.rules import check_header
from .writer import KV

DRAFT_ARCHITECTURES = K.DRAFTER_ARCHS
TOKENIZER_PREFIX = "tokenizer."
LLAMA_CPP_ENV = "LAGUNA_LLAMA_CPP_DIR"
VENDORED_LLAMA_CPP = "llama_cpp_python-0.3.36/vendor/llama.cpp"

#: Builds a vocab-only GGUF for an HF model directory into the given path (injectable for tests).
VocabStep = Callable[[Path, Path], None]


@dataclass(frozen=True)
class TargetInfo:
    """The facts about a target model that a drafter must agree with."""

    source: Path
    name: str  # general.name, or the file/directory stem
    architecture: str
    n_layer: int
    hidden_size: int
    vocab_size: int
    tokenizer: dict[str, KV] = field(default_factory=dict)  # every tokenizer.* key, with its exact type

    def tokens(self) -> list[bytes]:
        kv = self.tokenizer.get(K.TOKENS)
        return [] if kv is None else [_as_bytes(t) for t in kv.value]

    def spec(self):
        """The GGUF-side type of a target (convert/gguf/specs.py), for the pair rules; no
        sliding window is read here (0)."""
        from .gguf.specs import TargetSpec

        return TargetSpec(path=self.source, arch=self.architecture, name=self.name, n_layer=self.n_layer,
                          n_embd=self.hidden_size, n_vocab=self.vocab_size, sliding_window=0, tokens=self.tokens())


def _as_bytes(v: str | bytes) -> bytes:
    return v.encode("utf-8") if isinstance(v, str) else v


def read_target(path: Path | str, *, vocab_step: VocabStep | None = None) -> TargetInfo:
    """A target from its GGUF file or its HF directory (``vocab_step`` overrides the llama.cpp call)."""
    path = Path(path)
    if path.is_dir():
        return read_target_hf(path, vocab_step=vocab_step)
    if path.is_file():
        return read_target_gguf(path)
    raise UserError(f"{path}: target not found (give the target's .gguf file or its Hugging Face directory)")


# --------------------------------------------------------------------------- GGUF


def open_gguf(path: Path) -> GGUFReader:
    try:
        return GGUFReader(path, "r")
    except (ValueError, OSError, IndexError, KeyError) as e:
        raise UserError(f"{path}: not a readable GGUF file ({e})") from None


def field_kv(reader: GGUFReader, key: str) -> KV | None:
    """One metadata field as a :class:`KV`, strings as raw bytes (exact copy)."""
    f = reader.fields.get(key)
    if f is None:
        return None
    main = f.types[0]
    if main == GGUFValueType.ARRAY:
        sub = f.types[1] if len(f.types) > 1 else GGUFValueType.UINT8
        if sub == GGUFValueType.ARRAY:
            raise UserError(f"{reader.data.filename}: {key}: nested arrays are not supported")
        if sub == GGUFValueType.STRING:
            values: list[Any] = [f.parts[i].tobytes() for i in f.data]
        elif f.data:
            values = np.concatenate([f.parts[i] for i in f.data]).tolist()
        else:
            values = []
        return KV(values, main, sub)
    if main == GGUFValueType.STRING:
        return KV(f.parts[f.data[0]].tobytes(), main)
    return KV(f.parts[f.data[0]][0].item(), main)


def kv_text(kv: KV | None) -> str | None:
    if kv is None or kv.type != GGUFValueType.STRING:
        return None
    return _as_bytes(kv.value).decode("utf-8", errors="replace")


def kv_int(kv: KV | None) -> int | None:
    if kv is None or kv.type in (GGUFValueType.STRING, GGUFValueType.ARRAY, GGUFValueType.BOOL):
        return None
    return int(kv.value)


def tokenizer_kvs(reader: GGUFReader) -> dict[str, KV]:
    """Every ``tokenizer.*`` key of a GGUF, in file order, with its exact type."""
    out: dict[str, KV] = {}
    for key in reader.fields:
        if key.startswith(TOKENIZER_PREFIX):
            kv = field_kv(reader, key)
            assert kv is not None
            out[key] = kv
    return out


def read_target_gguf(path: Path) -> TargetInfo:
    # every value llama.cpp will read, in range (convert/gguf/rules.py), before anything else reads it
    check_header(read_header(path), require=False)
    reader = open_gguf(path)
    arch = kv_text(field_kv(reader, K.GENERAL_ARCHITECTURE))
    if not arch:
        raise ContractError(path, K.GENERAL_ARCHITECTURE, "a string naming the target architecture", "nothing")
    if arch in DRAFT_ARCHITECTURES:
        raise ContractError(path, K.GENERAL_ARCHITECTURE, "the target model (e.g. laguna)",
                            f"{arch!r}, a drafter")

    def need_int(key: str) -> int:
        v = kv_int(field_kv(reader, key))
        if v is None or v <= 0:
            raise ContractError(path, key, "a positive integer", "nothing" if v is None else v)
        return v

    n_layer = need_int(K.for_arch(arch, K.BLOCK_COUNT))
    hidden = need_int(K.for_arch(arch, K.EMBEDDING_LENGTH))
    tok = tokenizer_kvs(reader)
    tokens = tok.get(K.TOKENS)
    if tokens is None or tokens.sub_type != GGUFValueType.STRING or not tokens.value:
        raise ContractError(path, K.TOKENS, "the target's vocabulary (array of strings)", "nothing")
    name = kv_text(field_kv(reader, K.GENERAL_NAME)) or path.stem
    return TargetInfo(path, name, arch, n_layer, hidden, len(tokens.value), tok)


# --------------------------------------------------------------------------- Hugging Face directory


def find_llama_cpp_dir() -> Path:
    """The llama.cpp tree whose ``convert_hf_to_gguf.py`` reads HF tokenizers.

    ``$LAGUNA_LLAMA_CPP_DIR`` if set, else the newest patched source that
    ``laguna-run setup`` unpacked under ``$LAGUNA_DFLASH_CACHE/src`` (default
    ``~/.cache/laguna-dflash``).
    """
    explicit = os.environ.get(LLAMA_CPP_ENV)
    if explicit:
        d = Path(explicit).expanduser()
        if not (d / "convert_hf_to_gguf.py").is_file():
            raise UserError(f"{LLAMA_CPP_ENV}={explicit}: expected a llama.cpp tree with convert_hf_to_gguf.py, "
                            "found none")
        return d
    cache = cache_root()
    found = [p for p in cache.glob(f"src/*/{VENDORED_LLAMA_CPP}") if (p / "convert_hf_to_gguf.py").is_file()]
    if not found:
        raise UserError(
            f"cannot find llama.cpp's convert_hf_to_gguf.py (needed to read an HF target's tokenizer): "
            f"set {LLAMA_CPP_ENV}, run `laguna-run setup --source-dir` (it unpacks one under {cache}/src), "
            "or pass the target's .gguf instead")
    return max(found, key=lambda p: p.stat().st_mtime)


def llama_cpp_vocab_step(hf_dir: Path, out: Path) -> None:
    """Run ``convert_hf_to_gguf.py HF_DIR --vocab-only --outfile OUT`` from the vendored llama.cpp."""
    script = find_llama_cpp_dir() / "convert_hf_to_gguf.py"
    cmd = [sys.executable, str(script), str(hf_dir), "--vocab-only", "--outfile", str(out)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0 or not out.is_file():
        lines = [ln for ln in (r.stderr + r.stdout).splitlines() if ln.strip(" ^~\t")]
        last = lines[-1].strip() if lines else f"exit code {r.returncode}"
        if ":" not in last and len(lines) > 1:  # a bare exception name: show the failing line too
            last = f"{last} at `{lines[-2].strip()}`"
        raise UserError(f"{hf_dir}: reading the tokenizer with {script} failed: {last}")


def read_target_hf(hf_dir: Path, *, vocab_step: VocabStep | None = None) -> TargetInfo:
    cfg_path = hf_dir / "config.json"
    try:
        raw = json.loads(cfg_path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UserError(f"{cfg_path}: not found (a target's HF directory holds config.json)") from None
    except (OSError, ValueError) as e:
        raise UserError(f"{cfg_path}: not readable JSON ({e})") from None
    if not isinstance(raw, dict):
        raise ContractError(cfg_path, "(top level)", "a JSON object", type(raw).__name__)
    archs = raw.get("architectures") or []
    if "dflash_config" in raw or any("DFlash" in str(a) for a in archs):
        raise ContractError(cfg_path, "architectures", "the target model (e.g. LagunaForCausalLM)",
                            f"{json.dumps(archs)}, a drafter")

    def need_int(key: str) -> int:
        v = raw.get(key)
        if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
            raise ContractError(cfg_path, key, "a positive integer", json.dumps(v) if v is not None else "nothing")
        return v

    n_layer = need_int("num_hidden_layers")
    hidden = need_int("hidden_size")
    vocab = need_int("vocab_size")
    with tempfile.TemporaryDirectory(prefix="laguna-gguf-vocab-") as tmp:
        out = Path(tmp) / "vocab.gguf"
        (vocab_step or llama_cpp_vocab_step)(hf_dir, out)
        reader = open_gguf(out)
        tok = tokenizer_kvs(reader)
        name = kv_text(field_kv(reader, K.GENERAL_NAME))
        del reader  # release the memory map before the directory goes
    tokens = tok.get(K.TOKENS)
    n_tokens = len(tokens.value) if tokens is not None else 0
    if n_tokens != vocab:
        raise ContractError(cfg_path, "vocab_size", f"{n_tokens} (tokens in the target's tokenizer)", vocab)
    model_type = raw.get("model_type")
    return TargetInfo(hf_dir, name or hf_dir.name, str(model_type or "hf"), n_layer, hidden, vocab, tok)
