"""The bundled demo pair (laguna-tiny) and prompt files, and where converted copies are cached."""

from __future__ import annotations

import sys
from pathlib import Path

from ..convert.errors import UserError
from ..convert.files import cache_root

PACKAGE = Path(__file__).resolve().parent
TINY_DIR = PACKAGE / "data" / "laguna-tiny"
TINY_TARGET = TINY_DIR / "Laguna-Tiny-target-Q8_0.gguf"
TINY_DRAFTER_HF = TINY_DIR / "Laguna-Tiny-DFlash"
#: the agent pair: speaks Laguna 2.1's chat format and calls tools (scripts/train_agent_pair.py)
AGENT_DIR = PACKAGE / "data" / "laguna-tiny-agent"
AGENT_TARGET = AGENT_DIR / "Laguna-Tiny-Agent-target-Q8_0.gguf"
AGENT_DRAFTER_HF = AGENT_DIR / "Laguna-Tiny-Agent-DFlash"
PROMPTS_DIR = PACKAGE / "data" / "prompts"
CODE_PROMPTS = PROMPTS_DIR / "code.txt"


#: the cache folder, by the name scripts/ use
cache_dir = cache_root


def drafter_digest(drafter_hf: Path = TINY_DRAFTER_HF) -> str:
    """Short digest of a shipped HF drafter's files: names converted copies by content."""
    import hashlib

    h = hashlib.sha256()
    for f in sorted(drafter_hf.glob("*")):
        h.update(f.name.encode() + f.read_bytes())
    return h.hexdigest()[:12]


def converted_drafter(drafter_hf: Path, target: Path, outtype: str = "q8_0") -> Path:
    """A shipped HF drafter converted with laguna-gguf convert, once per checkpoint content."""
    from ..convert import converter
    from .drafter_cache import layout_version
    from ..convert.target import read_target

    # keyed by the converter's code too: a cached file from before a layout change (e.g. the
    # pre-FFN norm's name) would still load here but not in ik_llama.cpp
    out = cache_dir() / "demo" / f"{drafter_hf.name}-{outtype}-{drafter_digest(drafter_hf)}-{layout_version()}.gguf"
    if not out.exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        converter.convert(drafter_hf, read_target(target), out, converter.OutType(outtype))
    return out


def converted_tiny_drafter(outtype: str = "q8_0") -> Path:
    return converted_drafter(TINY_DRAFTER_HF, TINY_TARGET, outtype)


def converted_agent_drafter(outtype: str = "q8_0") -> Path:
    return converted_drafter(AGENT_DRAFTER_HF, AGENT_TARGET, outtype)


#: the pairs that run without -m, by --bundled name: (folder, target, drafter converter)
BUNDLED = {"code": (TINY_DIR, TINY_TARGET, converted_tiny_drafter),
           "agent": (AGENT_DIR, AGENT_TARGET, converted_agent_drafter)}


def default_pair(drafter: Path | None, bundled: str = "code") -> tuple[Path, Path | None]:
    _, target, convert = BUNDLED[bundled]
    if not target.exists():
        raise UserError(f"{target}: the bundled {bundled} target is missing; give -m TARGET.gguf")
    return target, drafter or convert()


#: the prompt "file" that is standard input
STDIN = Path("-")


def read_prompt_text(path: Path) -> str:
    """A prompt file's text: UTF-8 (a leading byte-order mark is dropped), whatever the locale.
    ``-`` is standard input; so is any pipe or device path (/dev/stdin). Invalid bytes are
    refused with their offset rather than guessed at: a replaced byte would change the tokens
    the model sees without a word."""
    path = Path(path)
    if path != STDIN:
        if not path.exists():
            raise UserError(f"{path}: no such prompt file")
        if path.is_dir():
            raise UserError(f"{path}: expected a prompt file, found a directory")
    try:
        data = sys.stdin.buffer.read() if path == STDIN else path.read_bytes()
    except OSError as e:
        raise UserError(f"{path}: cannot read the prompt file ({e.strerror or e})") from None
    bom = b"\xef\xbb\xbf"
    start = len(bom) if data.startswith(bom) else 0
    try:
        return data[start:].decode("utf-8")
    except UnicodeDecodeError as e:
        offset = start + e.start
        raise UserError(f"{path}: expected UTF-8 text, found byte 0x{data[offset]:02x} at byte offset {offset} "
                        f"({e.reason})") from None


def read_prompts(path: Path) -> list[str]:
    """Prompts separated by lines holding only '---'."""
    prompts, cur = [], []
    for line in read_prompt_text(path).splitlines(keepends=True):
        if line.strip() == "---":
            prompts.append("".join(cur))
            cur = []
        else:
            cur.append(line)
    prompts.append("".join(cur))
    prompts = [p.rstrip("\n") for p in prompts if p.strip()]
    if not prompts:
        raise UserError(f"{path}: no prompts (separate them with lines holding only ---)")
    return prompts
