"""The README.md model card that `laguna-gguf upload` publishes next to the GGUF files.

Everything here is pure: the caller reads the GGUF metadata and the benchmark JSON
and hands plain values in; these functions only build text (or reject a malformed
benchmark file with a one-line :class:`UserError`). That keeps the card easy to test
and lets `--dry-run` show exactly what a real upload would write.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Any, Sequence

from .files import human_size
from .gguf import keys as K
from .errors import UserError

#: `general.architecture` of the drafter files this project writes (SPEC §5a).
DRAFTER_ARCH = K.ARCH
#: `general.architecture` of Poolside's own drafter GGUFs (SPEC §5b).
POOLSIDE_DRAFTER_ARCH = K.POOLSIDE_ARCH
#: `general.architecture` of a Laguna target GGUF.
TARGET_ARCH = "laguna"

HUB_URL = "https://huggingface.co"


@dataclass(frozen=True)
class OfficialTarget:
    label: str
    repo: str
    n_layer: int


#: The target GGUF repositories Poolside publishes, keyed by their layer count.
OFFICIAL_TARGETS: dict[int, OfficialTarget] = {
    40: OfficialTarget("Laguna XS 2.1", "poolside/Laguna-XS-2.1-GGUF", 40),
    48: OfficialTarget("Laguna S 2.1", "poolside/Laguna-S-2.1-GGUF", 48),
}

# llama.cpp `general.file_type` values (LLAMA_FTYPE_*) that our files use, plus the
# common ones a target uploaded alongside may carry. Unknown values print as a number.
_FILE_TYPES: dict[int, str] = {
    0: "F32",
    1: "F16",
    2: "Q4_0",
    3: "Q4_1",
    7: "Q8_0",
    8: "Q5_0",
    9: "Q5_1",
    10: "Q2_K",
    11: "Q3_K_S",
    12: "Q3_K_M",
    13: "Q3_K_L",
    14: "Q4_K_S",
    15: "Q4_K_M",
    16: "Q5_K_S",
    17: "Q5_K_M",
    18: "Q6_K",
    32: "BF16",
}


@dataclass(frozen=True)
class GGUFInfo:
    """What the card says about one uploaded file (read from its GGUF header)."""

    filename: str
    size: int
    sha256: str
    architecture: str
    name: str | None = None
    file_type: int | None = None
    #: (tensor type name, count), the type holding most of the weights first.
    tensor_types: tuple[tuple[str, int], ...] = ()
    block_count: int | None = None
    embedding_length: int | None = None
    # Drafter-only keys (None when absent).
    laguna: bool | None = None
    block_size: int | None = None
    mask_token_id: int | None = None
    target_layer_ids: tuple[int, ...] | None = None
    target_name: str | None = None
    target_n_layer: int | None = None
    # Provenance.
    source_repo: str | None = None
    license: str | None = None

    @property
    def is_drafter(self) -> bool:
        """A drafter in the layout laguna-run and ik_llama.cpp load."""
        return self.architecture == DRAFTER_ARCH

    @property
    def is_any_drafter(self) -> bool:
        return self.architecture in (DRAFTER_ARCH, POOLSIDE_DRAFTER_ARCH)


@dataclass(frozen=True)
class BenchRow:
    content: str
    n_max: int
    tokens_per_s: float
    speedup: float
    mean_accepted: float | None = None


@dataclass(frozen=True)
class BenchResults:
    rows: tuple[BenchRow, ...]
    machine: str | None = None
    command: str | None = None


@dataclass(frozen=True)
class Pairing:
    """Which target a drafter goes with, as far as its metadata tells."""

    lines: tuple[str, ...]
    #: An official target repository to suggest, when the metadata points at one.
    official: OfficialTarget | None = None
    #: A target file in this same upload that fits the drafter.
    uploaded_target: str | None = None
    n_layer: int | None = None
    certain: bool = False


# --------------------------------------------------------------------------- bench JSON


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def parse_bench(data: Any, source: str) -> BenchResults:
    """Validate the object loaded from `laguna-run bench --json` output.

    Expected shape::

        {"rows": [{"content": "code", "n_max": 4, "tokens_per_s": 31.2,
                   "speedup": 1.5, "mean_accepted": 2.8}, ...],
         "machine": "...", "command": "..."}

    `mean_accepted`, `machine` and `command` are optional. A problem raises a
    one-line UserError naming the file and the field.
    """

    def bad(where: str, expected: str, found: Any) -> UserError:
        shown = json.dumps(found) if not isinstance(found, (dict, list)) else type(found).__name__
        if len(shown) > 60:
            shown = shown[:57] + "..."
        return UserError(f"{source}: {where}: expected {expected}, found {shown}")

    if not isinstance(data, dict):
        raise bad("top level", 'an object with a "rows" list', data)
    rows = data.get("rows")
    if not isinstance(rows, list) or not rows:
        raise bad("rows", "a non-empty list of benchmark rows", rows)
    parsed: list[BenchRow] = []
    for i, row in enumerate(rows):
        where = f"rows[{i}]"
        if not isinstance(row, dict):
            raise bad(where, "an object", row)
        content = row.get("content")
        if not isinstance(content, str) or not content.strip():
            raise bad(f"{where}.content", "a non-empty string", content)
        n_max = row.get("n_max")
        if not isinstance(n_max, int) or isinstance(n_max, bool) or n_max < 0:
            raise bad(f"{where}.n_max", "an integer >= 0", n_max)
        values: dict[str, float] = {}
        for key in ("tokens_per_s", "speedup"):
            value = row.get(key)
            if not _is_number(value) or value < 0:
                raise bad(f"{where}.{key}", "a number >= 0", value)
            values[key] = float(value)
        mean_accepted = row.get("mean_accepted")
        if mean_accepted is not None and (not _is_number(mean_accepted) or mean_accepted < 0):
            raise bad(f"{where}.mean_accepted", "a number >= 0 (or absent)", mean_accepted)
        parsed.append(
            BenchRow(
                content=content.strip(),
                n_max=n_max,
                tokens_per_s=values["tokens_per_s"],
                speedup=values["speedup"],
                mean_accepted=None if mean_accepted is None else float(mean_accepted),
            )
        )
    texts: dict[str, str | None] = {}
    for key in ("machine", "command"):
        value = data.get(key)
        if value is not None and not isinstance(value, str):
            raise bad(key, "a string (or absent)", value)
        texts[key] = value.strip() if isinstance(value, str) and value.strip() else None
    return BenchResults(rows=tuple(parsed), machine=texts["machine"], command=texts["command"])


# --------------------------------------------------------------------------- small helpers


def file_type_label(file_type: int | None) -> str | None:
    if file_type is None:
        return None
    return _FILE_TYPES.get(file_type, f"file type {file_type}")


def quantization_label(info: GGUFInfo) -> str:
    """'Q8_0 (49 Q8_0, 23 F32 tensors)': the declared file type, then what the tensors really are."""
    declared = file_type_label(info.file_type)
    counts = ", ".join(f"{count} {name}" for name, count in info.tensor_types)
    if declared is None and info.tensor_types:
        declared = info.tensor_types[0][0]
    if declared is None:
        return "unknown (no tensors)"
    return f"{declared} ({counts} tensors)" if counts else declared


def _cell(text: str) -> str:
    """Make text safe inside a markdown table cell."""
    return text.replace("\\", "\\\\").replace("|", "\\|").replace("\n", " ")


def _yaml_scalar(value: str) -> str:
    """A YAML scalar: plain when obviously safe, otherwise double-quoted (JSON strings are valid YAML)."""
    if re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._/+-]*", value) and value.lower() not in {
        "yes", "no", "true", "false", "on", "off", "null", "y", "n", "~",
    }:
        return value
    return json.dumps(value)


def _family_from_text(text: str | None) -> OfficialTarget | None:
    """Guess XS or S from a name such as 'Laguna-XS.2.1' or 'poolside/Laguna-S-2.1-DFlash'."""
    if not text:
        return None
    t = re.sub(r"[\s_.]+", "-", text.lower())
    if re.search(r"laguna-xs(?![a-z0-9])", t):
        return OFFICIAL_TARGETS[40]
    if re.search(r"laguna-s(?![a-z0-9])", t):
        return OFFICIAL_TARGETS[48]
    return None


def describe_file(info: GGUFInfo) -> str:
    """One sentence saying what a file is."""
    shape = []
    if info.block_count is not None:
        shape.append(f"{info.block_count} layers")
    if info.embedding_length is not None:
        shape.append(f"hidden size {info.embedding_length}")
    if info.is_drafter:
        kind = "Laguna DFlash drafter" if info.laguna else "DFlash drafter (not marked as Laguna)"
        if info.block_size is not None:
            shape.append(f"block size {info.block_size}")
        if info.target_layer_ids:
            shape.append("reads target layers " + ", ".join(str(i) for i in info.target_layer_ids))
    elif info.architecture == POOLSIDE_DRAFTER_ARCH:
        kind = "DFlash drafter in Poolside's own layout, not the dflash-draft layout the commands below load"
    elif info.architecture == TARGET_ARCH:
        kind = "Laguna target model"
    else:
        kind = "GGUF model"
    text = f"{kind} (`{info.architecture}`)"
    if shape:
        text += ": " + ", ".join(shape)
    return text


def _uploaded_target_for(drafter: GGUFInfo, files: Sequence[GGUFInfo]) -> GGUFInfo | None:
    """A non-drafter file of this upload whose shape fits the drafter, if any."""
    need = (max(drafter.target_layer_ids) + 1) if drafter.target_layer_ids else None
    for other in files:
        if other.is_any_drafter or other.block_count is None:
            continue
        if drafter.target_n_layer is not None and other.block_count != drafter.target_n_layer:
            continue
        if need is not None and other.block_count < need:
            continue
        if (
            drafter.embedding_length is not None
            and other.embedding_length is not None
            and other.embedding_length != drafter.embedding_length
        ):
            continue
        if drafter.target_n_layer is None and (drafter.embedding_length is None or other.embedding_length is None):
            continue  # nothing solid to match on
        return other
    return None


def pair_target(drafter: GGUFInfo, files: Sequence[GGUFInfo] = ()) -> Pairing:
    """Say which target GGUF a drafter pairs with, and how sure that is."""
    lines: list[str] = []
    official: OfficialTarget | None = None
    certain = False
    n_layer = drafter.target_n_layer

    if n_layer is not None:
        certain = True
        who = f"`{drafter.target_name}` (a {n_layer}-layer target)" if drafter.target_name else f"a {n_layer}-layer target"
        lines.append(f"When it was converted, `{drafter.filename}` was checked against {who}.")
        official = OFFICIAL_TARGETS.get(n_layer)
        if official is not None:
            lines.append(
                f"Pair it with a target GGUF from [{official.repo}]({HUB_URL}/{official.repo}) "
                f"({official.label}, {official.n_layer} layers); any quantization of that target works."
            )
        else:
            lines.append(
                f"No official Poolside target GGUF has {n_layer} layers: use the target it was checked against."
            )
    else:
        guess = _family_from_text(drafter.target_name)
        why = "the recorded target name"
        if guess is None:
            guess = _family_from_text(drafter.source_repo)
            why = "the name of its source repository"
        if drafter.target_name:
            lines.append(
                f"`{drafter.filename}` records its target as `{drafter.target_name}` but not the target's layer count."
            )
        else:
            lines.append(f"`{drafter.filename}` does not record which target it was checked against.")
        if guess is not None:
            official = guess
            lines.append(
                f"Going by {why}, it is most likely meant for {guess.label}: "
                f"[{guess.repo}]({HUB_URL}/{guess.repo}) ({guess.n_layer} layers)."
            )
        need = []
        if drafter.target_layer_ids:
            need.append(f"at least {max(drafter.target_layer_ids) + 1} layers")
        if drafter.embedding_length is not None:
            need.append(f"hidden size {drafter.embedding_length}")
        if need:
            lines.append("Whatever target you use needs " + " and ".join(need) + ", and the same vocabulary.")
        if guess is None and not need:
            lines.append("Use it with the Laguna target it was converted for.")

    uploaded = _uploaded_target_for(drafter, files)
    if uploaded is not None:
        lines.append(f"This repository also holds a target that fits it: `{uploaded.filename}`.")
    return Pairing(
        lines=tuple(lines),
        official=official,
        uploaded_target=uploaded.filename if uploaded else None,
        n_layer=n_layer,
        certain=certain,
    )


# --------------------------------------------------------------------------- the card


def _front_matter(files: Sequence[GGUFInfo]) -> tuple[list[str], list[str]]:
    """YAML lines (without the --- fences) and any remarks for the body."""
    remarks: list[str] = []
    drafters = [f for f in files if f.is_any_drafter]
    sources: list[str] = []
    for info in drafters or files:
        if info.source_repo and info.source_repo not in sources:
            sources.append(info.source_repo)
    licenses: list[str] = []
    for info in [*drafters, *(f for f in files if not f.is_any_drafter)]:
        if info.license and info.license not in licenses:
            licenses.append(info.license)

    yaml: list[str] = []
    if len(sources) == 1:
        yaml.append(f"base_model: {_yaml_scalar(sources[0])}")
    elif sources:
        yaml.append("base_model:")
        yaml.extend(f"- {_yaml_scalar(s)}" for s in sources)
    if sources:
        yaml.append("base_model_relation: quantized")
    if len(licenses) == 1:
        yaml.append(f"license: {_yaml_scalar(licenses[0])}")
    elif licenses:
        remarks.append(
            "The files declare different licenses (" + ", ".join(f"`{x}`" for x in licenses) + "); "
            "each file's terms are those of its source."
        )
    tags = ["gguf"]
    if drafters:
        tags += ["speculative-decoding", "dflash"]
    lagunaish = any(
        f.laguna
        or f.architecture == TARGET_ARCH
        or "laguna" in (f.source_repo or "").lower()
        or "laguna" in (f.target_name or "").lower()
        for f in files
    )
    if lagunaish:
        tags.append("laguna")
    yaml.append("tags:")
    yaml.extend(f"- {t}" for t in tags)
    return yaml, remarks


def _bench_section(bench: BenchResults) -> list[str]:
    out = ["## Benchmark", ""]
    where = f" on {bench.machine}" if bench.machine else ""
    out.append(f"Measured with `laguna-run bench`{where}:")
    out.append("")
    out.append("| content | n_max | tokens/s | speedup | mean accepted per round |")
    out.append("|---|---:|---:|---:|---:|")
    for row in bench.rows:
        accepted = "-" if row.mean_accepted is None else f"{row.mean_accepted:.2f}"
        out.append(
            f"| {_cell(row.content)} | {row.n_max} | {row.tokens_per_s:.1f} | {row.speedup:.2f}x | {accepted} |"
        )
    out.append("")
    out.append(
        "Speedup is against the same target decoding alone; below 1.00x speculation lost time on that content."
    )
    if bench.command:
        out += ["", "Command:", "", "```sh", bench.command, "```"]
    out.append("")
    return out


def build_model_card(
    repo_id: str,
    files: Sequence[GGUFInfo],
    bench: BenchResults | None = None,
    revision: str | None = None,
) -> str:
    """The full README.md text for `repo_id` holding `files`."""
    if not files:
        raise ValueError("a model card needs at least one file")
    yaml, remarks = _front_matter(files)
    drafters = [f for f in files if f.is_drafter]
    any_drafters = [f for f in files if f.is_any_drafter]
    title = repo_id.split("/")[-1]

    out: list[str] = ["---", *yaml, "---", "", f"# {title}", ""]
    if any_drafters:
        out.append(
            "GGUF files of a DFlash speculative drafter for Poolside's Laguna models. A DFlash drafter "
            "proposes several tokens per round from hidden states of its target, which then verifies them "
            "in one batched pass, so the output is the target's own. The drafter has no token embedding "
            "and no output head: it borrows both from the target, so it only runs next to its target GGUF."
        )
    else:
        out.append("GGUF files published with `laguna-gguf upload`.")
    out.append("")
    sources = sorted({f.source_repo for f in any_drafters or files if f.source_repo})
    if sources:
        links = ", ".join(f"[{s}]({HUB_URL}/{s})" for s in sources)
        out.append(f"Converted with `laguna-gguf` (laguna-dflash) from {links}.")
        out.append("")
    if remarks:
        out += [*remarks, ""]

    out += ["## Files", "", "| file | what it is | quantization | size | sha256 |", "|---|---|---|---:|---|"]
    for info in files:
        out.append(
            f"| `{_cell(info.filename)}` | {_cell(describe_file(info))} | {_cell(quantization_label(info))} "
            f"| {human_size(info.size)} | `{info.sha256}` |"
        )
    out += ["", "Check a download with `sha256sum FILE.gguf`.", ""]

    main_drafter = drafters[0] if drafters else None
    pairing = pair_target(main_drafter, files) if main_drafter else None
    if drafters:
        out += ["## Which target it pairs with", ""]
        for info in drafters:
            p = pairing if info is main_drafter else pair_target(info, files)
            out += [f"- {line}" for line in p.lines]
        out.append("")

    if main_drafter is not None and pairing is not None:
        out += _usage_section(repo_id, main_drafter, pairing, revision, several=len(drafters) > 1)
    if bench is not None:
        out += _bench_section(bench)
    while out and out[-1] == "":
        out.pop()
    return "\n".join(out) + "\n"


def _usage_section(
    repo_id: str, drafter: GGUFInfo, pairing: Pairing, revision: str | None, *, several: bool
) -> list[str]:
    rev = f" --revision {revision}" if revision and revision != "main" else ""
    target = pairing.uploaded_target or "TARGET.gguf"
    out = ["## Usage", ""]
    fetch = [f"hf download {repo_id} {drafter.filename}{rev} --local-dir ."]
    if pairing.uploaded_target:
        fetch.append(f"hf download {repo_id} {pairing.uploaded_target}{rev} --local-dir .")
        out.append("Download the drafter and the target from this repository:")
    elif pairing.official is not None:
        fetch.append(
            f'hf download {pairing.official.repo} --include "*Q4_K_M*" --local-dir .   '
            "# one quantization of the target; pick the one you want"
        )
        out.append(
            f"Download the drafter, and a target GGUF from {pairing.official.repo}; "
            "below, `TARGET.gguf` stands for the target file you chose:"
        )
    else:
        out.append(
            "Download the drafter; `TARGET.gguf` below stands for your Laguna target GGUF "
            "(see the section above for which one):"
        )
    out += ["", "```sh", *fetch, "```", ""]
    if several:
        out += [f"The commands use `{drafter.filename}`; any other drafter file above works the same way.", ""]

    out += [
        "### laguna-run (this project)",
        "",
        "```sh",
        f'laguna-run -m {target} -md {drafter.filename} -p "Write a Python function that merges two sorted lists." '
        "-n 256 --n-max 4",
        "```",
        "",
        "With a GPU, offload both models and draft fewer tokens per round:",
        "",
        "```sh",
        f'laguna-run -m {target} -md {drafter.filename} -ngl 99 -ngld 99 -p "..." --n-max 2',
        "```",
        "",
        "`--n-max` is how many tokens the drafter proposes per round (1 to block size - 1). A target on the CPU "
        "tends to do best around 4, a fast GPU target around 1-2. Keep the drafter on the same device as the "
        "target, and expect gains on code and structured text rather than free-form prose.",
        "",
        "### ik_llama.cpp",
        "",
        "ik_llama.cpp loads this `dflash-draft` layout through its DFlash speculative path; pass the drafter as the "
        "draft model and the draft depth inside the `--spec-type` stage:",
        "",
        "```sh",
        f"llama-server -m {target} -md {drafter.filename} --spec-type dflash:n_max=4",
        "```",
        "",
        "`llama-cli` and `llama-spec-bench` take the same options. ik_llama.cpp rejects the legacy `--draft-max`; "
        "`n_max` plays the role of `--n-max` above.",
        "",
    ]
    return out
