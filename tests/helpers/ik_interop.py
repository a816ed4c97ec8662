"""Our converted drafter in ik_llama.cpp beside laguna-run: where the peers live (``peer_root``,
``ik_bin_dir``, ``vendored_bin_dir``; ``scripts/bench/build_peer.sh`` builds them) and what they
were built from (``peer_snapshot``), a copy with ik's
tensor names, ik's ``llama-spec-bench`` run and its rows parsed, laguna-run's engine run the same
way (ending each generation with ik's budget rule, ``ik_tail_depth``, so that the last rounds
compare), and the two compared figure by figure.

ik names the pre-FFN norm ``blk.N.post_attention_norm``; converters that still write
``blk.N.ffn_norm`` are refused by ik's loader (``legacy_norm_tensors``, ``ik_named_copy``).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path


LEGACY_NORM = re.compile(r"^blk\.(\d+)\.ffn_norm\.weight$")
IK_NORM = "blk.{}.post_attention_norm.weight"
# lines of ik's log that say why a run failed
IK_ERROR = re.compile(r"error|failed|not found|wrong number|unknown|invalid|refus", re.IGNORECASE)


def peer_root() -> Path:
    from laguna_dflash.runtime import assets

    return Path(os.environ.get("PEER_DIR", assets.cache_dir() / "peer"))


def ik_bin_dir() -> Path | None:
    """The bin directory of an ik_llama.cpp build with llama-spec-bench, or None."""
    bin_dir = Path(os.environ.get("IK_LLAMA_BIN", peer_root() / "ik_llama.cpp" / "build" / "bin"))
    return bin_dir if (bin_dir / "llama-spec-bench").is_file() else None


def vendored_bin_dir() -> Path | None:
    """The bin directory of the vendored llama.cpp's own tools (llama-bench), or None."""
    bin_dir = Path(os.environ.get("VENDORED_LLAMA_BIN", peer_root() / "llama.cpp-vendored" / "build" / "bin"))
    return bin_dir if (bin_dir / "llama-bench").is_file() else None


def peer_snapshot(bin_dir: Path | None) -> str | None:
    """What build_peer.sh built ``bin_dir`` (its ``ROOT/build/bin``) from, as it noted in
    ``ROOT/.complete``: ik_llama.cpp's git commit, or the vendored llama.cpp's source key; None
    for no directory or a build it did not make."""
    if bin_dir is None:
        return None
    note = Path(bin_dir).parent.parent / ".complete"
    if not note.is_file():
        return None
    return note.read_text().strip() or None


# --------------------------------------------------------------------------- the file ik loads

def legacy_norm_tensors(drafter: Path) -> list[str]:
    """The ``blk.N.ffn_norm.weight`` tensors of a drafter GGUF (ik looks for post_attention_norm)."""
    import gguf

    return [t.name for t in gguf.GGUFReader(str(drafter), "r").tensors if LEGACY_NORM.match(t.name)]


def renamed_copy(src: Path, out: Path, rename: Callable[[str], str]) -> Path:
    """``src`` written to ``out`` with each tensor named ``rename(name)``; metadata and tensor
    bytes copied unchanged."""
    import gguf
    import numpy as np

    from laguna_dflash.convert.target import field_kv

    reader = gguf.GGUFReader(str(src), "r")
    arch = field_kv(reader, "general.architecture").value
    tmp = out.with_name(out.name + ".partial")
    writer = gguf.GGUFWriter(tmp, arch.decode() if isinstance(arch, bytes) else arch)
    for key in reader.fields:
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        kv = field_kv(reader, key)
        writer.add_key_value(key, kv.value, kv.type, kv.sub_type)
    for t in reader.tensors:
        shape = tuple(int(n) for n in reversed(t.shape))  # numpy order: GGUF's ne reversed
        writer.add_tensor_info(rename(t.name), shape, np.dtype(np.float32), int(t.n_bytes), raw_dtype=t.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for t in reader.tensors:
        writer.write_tensor_data(t.data)
    writer.close()
    tmp.replace(out)
    return out


def ik_name(name: str) -> str:
    m = LEGACY_NORM.match(name)
    return IK_NORM.format(m.group(1)) if m else name


def ik_named_copy(drafter: Path, out: Path | None = None) -> Path:
    """``drafter`` with each ``blk.N.ffn_norm.weight`` renamed to ik's ``blk.N.post_attention_norm.weight``
    (a file converted before the converter wrote ik's name), written to ``out`` (default: next to
    ``drafter``, named ``<stem>-ik-names.gguf``). Returns ``drafter`` itself when nothing needs renaming."""
    if not legacy_norm_tensors(drafter):
        return drafter
    return renamed_copy(drafter, out or drafter.with_name(drafter.stem + "-ik-names.gguf"), ik_name)


# --------------------------------------------------------------------------- running ik

@dataclass
class IkAttempt:
    """One prompt's run in llama-spec-bench (its JSONL attempt row, detailed form)."""

    prompt_id: str
    text: str
    generated: int
    decode_s: float
    rounds: int
    drafted: int
    accepted: int
    accepted_at: list[int] = field(default_factory=list)
    drafted_at: list[int] = field(default_factory=list)
    prompt_tokens: int = 0
    effective_prompt: str = ""

    @property
    def tokens_per_s(self) -> float:
        return self.generated / self.decode_s if self.decode_s > 0 else 0.0


class IkFailed(RuntimeError):
    """ik did not run the pair; ``lines`` are its own words about why."""

    def __init__(self, command: list[str], returncode: int, lines: list[str]) -> None:
        said = " | ".join(lines) or "no error line"
        super().__init__(f"{Path(command[0]).name} exited with {returncode}: {said}")
        self.command, self.returncode, self.lines = command, returncode, lines


def ik_command(bin_dir: Path, target: Path, drafter: Path | None, n_max: int, prompts_jsonl: Path,
               n_predict: int, threads: int, n_ctx: int = 4096) -> list[str]:
    """llama-spec-bench, greedy, on a JSONL prompt file; n_max 0 (or no drafter): plain decoding.

    ``--in-prefix ''`` is there for its side effect: spec-bench wraps every prompt in the
    model's chat template (chatml when it has none) unless chat templates are disabled, and an
    input prefix is what disables them; the prefix itself is unused outside interactive mode."""
    cmd = [str(bin_dir / "llama-spec-bench"), "-m", str(target), "--prompts", str(prompts_jsonl),
           "-n", str(n_predict), "-t", str(threads), "-c", str(n_ctx), "--temp", "0", "--seed", "1",
           "--in-prefix", "", "--output-format", "jsonl", "--output-details"]
    if drafter is not None and n_max > 0:
        cmd += ["-md", str(drafter), "-td", str(threads), "--spec-type", f"dflash:n_max={n_max}"]
    return cmd


def write_prompts_jsonl(prompts: list[str], path: Path, warmup_tokens: int = 0) -> Path:
    """ik's prompt file: one {"id", "prompt"} object a line; a first ``warmup`` row (the first
    prompt, ``warmup_tokens`` long) pays for the process's cold start when warmup_tokens > 0."""
    with open(path, "w") as f:
        if warmup_tokens > 0:
            f.write(json.dumps({"id": "warmup", "prompt": prompts[0], "max_tokens": warmup_tokens}) + "\n")
        for i, p in enumerate(prompts):
            f.write(json.dumps({"id": f"p{i}", "prompt": p}) + "\n")
    return path


def parse_ik_rows(stdout: str) -> list[IkAttempt]:
    attempts = []
    for line in stdout.splitlines():
        line = line.strip()
        if not line.startswith("{"):
            continue
        row = json.loads(line)
        if row.get("row_type") != "attempt":
            continue
        if not row["quality"]["ok"]:
            raise RuntimeError(f"llama-spec-bench: prompt {row['task_id']}: {row['quality']['error']}")
        spec = row["speculative"]
        stage = spec["stages"][0] if spec["stages"] else {}
        attempts.append(IkAttempt(
            prompt_id=row["task_id"], text=row["output"], generated=row["tokens"]["generated"],
            decode_s=row["timing"]["decode_s"], rounds=spec["num_drafts"], drafted=spec["draft_tokens"],
            accepted=spec["accepted_tokens"], accepted_at=list(stage.get("accepted_by_position", [])),
            drafted_at=list(stage.get("drafted_by_position", [])), prompt_tokens=row["tokens"]["prompt"],
            effective_prompt=row["prompt"]))
    return attempts


def run_ik(bin_dir: Path, target: Path, drafter: Path | None, n_max: int, prompts: list[str], n_predict: int,
           threads: int, warmup_tokens: int = 0, timeout: float = 600) -> list[IkAttempt]:
    """Run the prompts in one llama-spec-bench process; the warmup row (if any) is left out."""
    with tempfile.TemporaryDirectory(prefix="ik-prompts-") as tmp:
        jsonl = write_prompts_jsonl(prompts, Path(tmp) / "prompts.jsonl", warmup_tokens)
        cmd = ik_command(bin_dir, target, drafter, n_max, jsonl, n_predict, threads)
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if r.returncode != 0:
        lines = [ln.strip() for ln in (r.stderr + r.stdout).splitlines() if IK_ERROR.search(ln)]
        raise IkFailed(cmd, r.returncode, lines[-6:])
    return [a for a in parse_ik_rows(r.stdout) if a.prompt_id != "warmup"]


# --------------------------------------------------------------------------- the comparison

@dataclass
class Ours:
    text: str
    generated: int
    rounds: int
    drafted: int
    accepted: int
    accepted_at: list[int]
    drafted_at: list[int]
    prompt_tokens: int


def ik_tail_depth(depth: int, n_predict: int):
    """A fixed depth that ends a generation the way llama-spec-bench does, so that the two
    engines' counts compare round for round: ik drafts at most (tokens left) - 2 per round, where
    the first round's tokens left include the token it samples before drafting, and it stops
    drafting when fewer than 3 tokens are left. laguna-run drafts up to (tokens left) - 1."""
    from laguna_dflash.runtime.tuner import DepthPolicy

    class IkTailDepth(DepthPolicy):
        def __init__(self) -> None:
            self.emitted = 1  # the first bonus token, sampled from the prompt's last row

        def choose(self) -> int:
            left = n_predict - (0 if self.emitted == 1 else self.emitted)
            return max(0, min(depth, left - 2)) if left >= 3 else 0

        def observe(self, depth: int, accepted: int, t_round: float, t_catchup: float = 0.0) -> None:
            self.emitted += accepted + 1

        def describe(self) -> dict:
            return {"policy": "fixed, ik's tail", "depth": depth}

    return IkTailDepth()


def run_ours(target: Path, drafter: Path, n_max: int, prompts: list[str], n_predict: int, threads: int,
             ik_tail: bool = True) -> list[Ours]:
    """laguna-run's engine on each prompt at depth ``n_max``; ``ik_tail``: end each generation
    with ik's budget rule (:func:`ik_tail_depth`) instead of laguna-run's own."""
    from laguna_dflash.runtime.engine import Engine, EngineConfig, GenerateOptions

    out = []
    with Engine.load(target, drafter, EngineConfig(n_threads=threads)) as engine:
        for p in prompts:
            depth = ik_tail_depth(n_max, n_predict) if ik_tail and n_max > 0 else n_max
            res = engine.generate(p, GenerateOptions(n_predict=n_predict, n_max=depth))
            s = res.stats
            drafting_rounds = sum(v for depth, v in s.depth_rounds.items() if depth > 0)
            out.append(Ours(res.text, s.n_generated, drafting_rounds, s.drafted, s.accepted,
                            list(s.accepted_at), list(s.drafted_at), s.n_prompt))
    return out


COUNTS = ("rounds", "drafted", "accepted", "accepted by position")


def mean_accepted(runs) -> float:
    """Accepted drafts per drafting round, over all runs."""
    return sum(r.accepted for r in runs) / max(1, sum(r.rounds for r in runs))


def compare(ours: list[Ours], theirs: list[IkAttempt]) -> list[dict]:
    """Per prompt, the figures both report and whether each matches."""
    rows = []
    for i, (o, t) in enumerate(zip(ours, theirs, strict=True)):
        pairs = {"prompt tokens": (o.prompt_tokens, t.prompt_tokens), "rounds": (o.rounds, t.rounds),
                 "drafted": (o.drafted, t.drafted), "accepted": (o.accepted, t.accepted),
                 "accepted by position": (o.accepted_at, t.accepted_at), "text": (o.text, t.text)}
        rows.append({"prompt": i, "ours": {k: v[0] for k, v in pairs.items()},
                     "ik": {k: v[1] for k, v in pairs.items()},
                     "equal": {k: v[0] == v[1] for k, v in pairs.items()}})
    return rows
