"""`laguna-gguf upload`: publish ready-to-use GGUF files to the Hugging Face Hub.

One upload is one commit: the GGUF files plus a generated README.md model card
(convert/model_card.py) that says what each file is, which target it pairs with,
and how to run it. The repository is created when missing, a `--revision` branch
too. The token comes from HF_TOKEN or the saved `hf auth login`; it is only ever
handed to huggingface_hub and is scrubbed from every message we print.

`convert/cli.py` calls :func:`register` to add the command to the `laguna-gguf` app;
:func:`upload` is the same thing as a function.
"""

from __future__ import annotations

import json
import os
import re
from collections import Counter
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Optional

import typer
from gguf import Keys
from rich.console import Console
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TransferSpeedColumn

from .gguf import keys as K
from .command_line import argument, flag, switch
from .errors import USER_ERROR_EXIT, UserError
from .files import human_size, sha256_file
from .model_card import BenchResults, GGUFInfo, build_model_card, parse_bench

if TYPE_CHECKING:  # pragma: no cover
    from huggingface_hub import CommitOperationAdd, HfApi

#: What the README.md in the repository is called; no uploaded file may take that name.
CARD_NAME = "README.md"

_GGUF_MAGIC = b"GGUF"
_REPO_PART = r"[A-Za-z0-9](?:[A-Za-z0-9._-]{0,94}[A-Za-z0-9])?"
_REPO_ID_RE = re.compile(rf"{_REPO_PART}/{_REPO_PART}")
_MAX_MESSAGE = 300


# --------------------------------------------------------------------------- plan


@dataclass(frozen=True)
class LocalFile:
    path: Path
    info: GGUFInfo


@dataclass(frozen=True)
class UploadPlan:
    repo_id: str
    revision: str  # "main" unless --revision
    private: bool
    endpoint: str
    files: tuple[LocalFile, ...]
    card: str
    commit_message: str
    bench: BenchResults | None = None

    @property
    def creates_branch(self) -> bool:
        return self.revision != "main" and not self.revision.startswith("refs/")

    def describe(self) -> list[str]:
        """The planned operations, in order, as plain lines."""
        visibility = "private" if self.private else "default visibility, public unless the namespace says otherwise"
        steps = [f"create the model repository {self.repo_id} if it is missing ({visibility})"]
        if self.creates_branch:
            steps.append(f"create the branch {self.revision} if it is missing (starting from main)")
        for f in self.files:
            steps.append(f"upload {f.info.filename} ({human_size(f.info.size)}, sha256 {f.info.sha256})")
        steps.append(
            f"write {CARD_NAME} (generated model card, {human_size(len(self.card.encode()))}; "
            "replaces any existing card)"
        )
        lines = [f"plan: {self.repo_id} at revision {self.revision} on {self.endpoint}"]
        lines += [f"  {i}. {s}" for i, s in enumerate(steps, 1)]
        lines.append(f'  all files go in one commit: "{self.commit_message}"')
        return lines


@dataclass(frozen=True)
class UploadResult:
    plan: UploadPlan
    dry_run: bool
    commit_url: str | None = None
    repo_url: str | None = None


# --------------------------------------------------------------------------- local inputs


def check_repo_id(repo_id: str) -> str:
    repo_id = repo_id.strip()
    if not _REPO_ID_RE.fullmatch(repo_id) or "--" in repo_id or ".." in repo_id:
        raise UserError(
            f'REPO_ID: expected "owner/name" (letters, digits, ".", "_", "-"; '
            f'e.g. you/Laguna-XS-2.1-DFlash-GGUF), found "{repo_id}"'
        )
    return repo_id


def check_revision(revision: str | None) -> str:
    if revision is None:
        return "main"
    rev = revision.strip()
    if not rev or any(c.isspace() for c in rev) or ".." in rev or rev.startswith("/") or rev.endswith("/"):
        raise UserError(f'--revision: expected a branch name such as "main" or "q8_0", found "{revision}"')
    return rev


def resolve_endpoint() -> str:
    """HF_ENDPOINT as set now (huggingface_hub reads it only at import), else the public Hub."""
    endpoint = os.environ.get("HF_ENDPOINT", "").strip().rstrip("/")
    if not endpoint:
        endpoint = "https://huggingface.co"
    if not re.match(r"https?://[^/\s]+", endpoint):
        raise UserError(f'HF_ENDPOINT: expected a URL such as "https://huggingface.co", found "{endpoint}"')
    return endpoint


def _field(reader: Any, key: str) -> Any:
    f = reader.fields.get(key)
    if f is None:
        return None
    try:
        return f.contents()
    except Exception:  # a field our reader version cannot decode: treat as absent
        return None


def _as_int(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    return value


def _as_str(value: Any) -> str | None:
    return value.strip() or None if isinstance(value, str) else None


def _repo_from_url(url: str | None) -> str | None:
    """'https://huggingface.co/poolside/Laguna-XS-2.1-DFlash' -> 'poolside/Laguna-XS-2.1-DFlash'."""
    if not url:
        return None
    m = re.fullmatch(r"https?://(?:www\.)?huggingface\.co/([^/\s]+/[^/\s]+?)/?", url.strip())
    return m.group(1) if m and _REPO_ID_RE.fullmatch(m.group(1)) else None


def _check_magic(path: Path) -> None:
    try:
        with path.open("rb") as fh:
            magic = fh.read(4)
    except OSError as exc:
        raise UserError(f"{path}: cannot read ({exc.strerror or exc})") from None
    if magic != _GGUF_MAGIC:
        raise UserError(f"{path}: not a GGUF file (expected the magic bytes GGUF, found {magic!r})")


def inspect_gguf(path: Path) -> GGUFInfo:
    """Read what the card needs from a GGUF header (sha256 left empty: see :func:`sha256_file`)."""
    _check_magic(path)

    from gguf import GGMLQuantizationType, GGUFReader

    try:
        reader = GGUFReader(str(path), "r")
    except Exception as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise UserError(f"{path}: not a readable GGUF file ({first[:_MAX_MESSAGE]})") from None

    arch = _as_str(_field(reader, K.GENERAL_ARCHITECTURE))
    if arch is None:
        raise UserError(f"{path}: {K.GENERAL_ARCHITECTURE}: expected a string, found nothing")
    counts: Counter[str] = Counter()
    weights: Counter[str] = Counter()
    for t in reader.tensors:
        try:
            kind = GGMLQuantizationType(int(t.tensor_type)).name
        except ValueError:
            kind = f"type {int(t.tensor_type)}"
        counts[kind] += 1
        weights[kind] += int(t.n_elements)
    ids = _field(reader, K.for_arch(arch, K.TARGET_LAYER_IDS))
    layer_ids = tuple(int(i) for i in ids) if isinstance(ids, list) and ids else None
    laguna = _field(reader, K.for_arch(arch, K.DFLASH_LAGUNA))
    source = _as_str(_field(reader, K.GENERAL_SOURCE_REPO))
    if source is not None and not _REPO_ID_RE.fullmatch(source):
        source = _repo_from_url(source)
    if source is None:
        source = _repo_from_url(_as_str(_field(reader, Keys.General.SOURCE_REPO_URL)))
    return GGUFInfo(
        filename=path.name,
        size=path.stat().st_size,
        sha256="",
        architecture=arch,
        name=_as_str(_field(reader, K.GENERAL_NAME)),
        file_type=_as_int(_field(reader, K.GENERAL_FILE_TYPE)),
        # The type holding most of the weights first: that is what the file "is".
        tensor_types=tuple(sorted(counts.items(), key=lambda kv: (-weights[kv[0]], kv[0]))),
        block_count=_as_int(_field(reader, K.for_arch(arch, K.BLOCK_COUNT))),
        embedding_length=_as_int(_field(reader, K.for_arch(arch, K.EMBEDDING_LENGTH))),
        laguna=bool(laguna) if isinstance(laguna, bool) else None,
        block_size=_as_int(_field(reader, K.for_arch(arch, K.BLOCK_SIZE))),
        mask_token_id=_as_int(_field(reader, K.for_arch(arch, K.MASK_TOKEN_ID))),
        target_layer_ids=layer_ids,
        target_name=_as_str(_field(reader, K.for_arch(arch, K.TARGET_NAME))),
        target_n_layer=_as_int(_field(reader, K.for_arch(arch, K.TARGET_N_LAYER))),
        source_repo=source,
        license=_as_str(_field(reader, Keys.General.LICENSE)),
    )


def _sha256_shown(path: Path, progress: Progress | None) -> str:
    """The file's sha256, with a progress bar when there is a ``progress``."""
    if progress is None:
        return sha256_file(path)
    task = progress.add_task(f"sha256 {path.name}", total=path.stat().st_size)
    return sha256_file(path, lambda n: progress.advance(task, n))


def load_bench(path: Path) -> BenchResults:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise UserError(f"{path}: cannot read the benchmark file ({exc.strerror or exc})") from None
    except UnicodeDecodeError:
        raise UserError(f"{path}: not a UTF-8 JSON file") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UserError(f"{path}: not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})") from None
    return parse_bench(data, str(path))


def _check_files(files: list[Path]) -> list[Path]:
    if not files:
        raise UserError("FILE: expected at least one GGUF file to upload, found none")
    seen: dict[str, Path] = {}
    for p in files:
        if not p.exists():
            raise UserError(f"{p}: no such file")
        if not p.is_file():
            raise UserError(f"{p}: expected a GGUF file, found a directory or special file")
        if p.name == CARD_NAME:
            raise UserError(f"{p}: {CARD_NAME} is the generated model card; it cannot be uploaded as a file")
        if p.name in seen:
            raise UserError(f"{p}: same file name as {seen[p.name]}; files land at the repository root by name")
        seen[p.name] = p
        _check_magic(p)
    return files


def _commit_message(infos: list[GGUFInfo]) -> str:
    names = ", ".join(i.filename for i in infos)
    if len(names) <= 120:
        return f"Upload {names} and model card (laguna-gguf)"
    return f"Upload {len(infos)} GGUF files and model card (laguna-gguf)"


def prepare_upload(
    repo_id: str,
    files: list[Path],
    *,
    private: bool = False,
    revision: str | None = None,
    bench_json: Path | None = None,
    console: Console | None = None,
) -> UploadPlan:
    """Check every input, hash the files and build the card. Sends nothing."""
    repo_id = check_repo_id(repo_id)
    rev = check_revision(revision)
    endpoint = resolve_endpoint()
    paths = _check_files([Path(f) for f in files])
    bench = load_bench(Path(bench_json)) if bench_json is not None else None
    infos = [inspect_gguf(p) for p in paths]

    console = console or Console(stderr=True)
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        console=console,
        transient=True,
        disable=not console.is_terminal,  # a bar only where it can redraw; no stray lines in logs
    ) as progress:
        infos = [replace(info, sha256=_sha256_shown(p, progress)) for p, info in zip(paths, infos)]

    card = build_model_card(repo_id, infos, bench, revision=rev)
    return UploadPlan(
        repo_id=repo_id,
        revision=rev,
        private=private,
        endpoint=endpoint,
        files=tuple(LocalFile(p, i) for p, i in zip(paths, infos)),
        card=card,
        commit_message=_commit_message(infos),
        bench=bench,
    )


# --------------------------------------------------------------------------- token


def token_hint() -> str:
    """Where a real upload would take its token from, found without reading it or going online."""
    if os.environ.get("HF_TOKEN") or os.environ.get("HUGGING_FACE_HUB_TOKEN"):
        return "token: HF_TOKEN is set"
    if os.environ.get("HF_OIDC_RESOURCE"):
        return "token: would be exchanged through OIDC (HF_OIDC_RESOURCE is set)"
    try:
        from huggingface_hub import constants

        if Path(constants.HF_TOKEN_PATH).is_file():
            return "token: a saved `hf auth login` token was found"
    except Exception:
        pass
    return "token: none found; a real upload would stop here (set HF_TOKEN or run `hf auth login`)"


def resolve_token() -> str:
    """The token huggingface_hub would use; a one-line UserError when there is none."""
    hub = _import_hub()
    try:
        token = hub.get_token()
    except Exception as exc:  # e.g. a failed OIDC exchange
        raise UserError(
            "could not obtain a Hugging Face token: " + _one_line(f"{type(exc).__name__}: {exc}", None)
        ) from None
    if not token:
        raise UserError(
            "no Hugging Face token: set HF_TOKEN to a token with write access, or run `hf auth login`"
        )
    return token


def _import_hub() -> Any:
    try:
        import huggingface_hub
    except ImportError:
        raise UserError(
            "the upload command needs huggingface_hub: pip install 'laguna-dflash[upload]'"
        ) from None
    return huggingface_hub


_TOKEN_SHAPE = re.compile(r"\bhf_[A-Za-z0-9]{8,}\b")
_BEARER = re.compile(r"(?i)\b(bearer\s+|authorization\s*[:=]\s*(?:bearer\s+)?)[^\s'\",;]+")


def scrub(text: str, token: str | None) -> str:
    """Remove the token (and anything shaped like a token or an auth header value) from text."""
    if token:
        text = text.replace(token, "***")
    text = _TOKEN_SHAPE.sub("hf_***", text)
    return _BEARER.sub(r"\1***", text)


def _one_line(text: str, token: str | None) -> str:
    text = " ".join(scrub(text, token).split())
    return text if len(text) <= _MAX_MESSAGE else text[: _MAX_MESSAGE - 3] + "..."


# --------------------------------------------------------------------------- the Hub


def _hub_error(exc: BaseException, step: str, plan: UploadPlan, token: str) -> UserError:
    """One scrubbed line for any failure of the Hub client."""
    from huggingface_hub.errors import HfHubHTTPError

    if isinstance(exc, HfHubHTTPError):
        response = getattr(exc, "response", None)
        status = getattr(response, "status_code", None)
        reason = getattr(response, "reason_phrase", "") or ""
        said = exc.server_message or ""
        detail = f"HTTP {status}{' ' + reason if reason else ''}{': ' + said if said else ''}"
        owner = plan.repo_id.split("/")[0]
        if status == 401:
            hint = "the token was not accepted; set HF_TOKEN to a valid token or run `hf auth login` again"
        elif status == 403:
            hint = f"check that the token has write access to {owner}"
        elif status == 404:
            hint = f"check the repository name and that the token can see {plan.repo_id}"
        elif status == 409:
            hint = "the repository changed meanwhile; run the upload again"
        else:
            hint = ""
        message = f"the Hub refused {step} ({detail})" + (f"; {hint}" if hint else "")
        return UserError(_one_line(message, token))
    if isinstance(exc, (OSError, ConnectionError)) or type(exc).__module__.startswith(("httpx", "httpcore")):
        return UserError(
            _one_line(f"could not reach the Hub at {plan.endpoint} while {step}: {type(exc).__name__}: {exc}", token)
        )
    return UserError(_one_line(f"upload failed while {step}: {type(exc).__name__}: {exc}", token))


def _say(console: Console, text: str) -> None:
    console.print(text, markup=False, highlight=False, soft_wrap=True)


def push(plan: UploadPlan, token: str, console: Console | None = None) -> tuple[str, str]:
    """Send the plan to the Hub: (commit URL, repository URL). Failures raise one-line UserErrors."""
    _import_hub()
    from huggingface_hub import CommitOperationAdd, HfApi
    from huggingface_hub.errors import RepositoryNotFoundError

    console = console or Console(stderr=True)
    api: HfApi = HfApi(endpoint=plan.endpoint, token=token)
    step = "building the commit"
    try:
        ops: list[CommitOperationAdd] = []
        for f in plan.files:
            op = CommitOperationAdd(path_in_repo=f.info.filename, path_or_fileobj=str(f.path))
            op.upload_info.sha256 = bytes.fromhex(f.info.sha256)  # hashed already; spare a second read
            ops.append(op)
        card_op = CommitOperationAdd(path_in_repo=CARD_NAME, path_or_fileobj=plan.card.encode("utf-8"))

        step = f"looking up {plan.repo_id}"
        try:
            existing = api.repo_info(plan.repo_id, repo_type="model")
        except RepositoryNotFoundError:
            existing = None
        if existing is None:
            step = f"creating the repository {plan.repo_id}"
            _say(console, f"creating {plan.repo_id} ({'private' if plan.private else 'default visibility'})")
            api.create_repo(plan.repo_id, repo_type="model", private=True if plan.private else None, exist_ok=True)
        else:
            _say(console, f"{plan.repo_id} exists; adding to it")
            if plan.private and not getattr(existing, "private", False):
                _say(console, f"note: {plan.repo_id} is public already; --private does not change an existing repository")

        if plan.creates_branch:
            step = f"creating the branch {plan.revision}"
            api.create_branch(plan.repo_id, branch=plan.revision, repo_type="model", exist_ok=True)

        n = len(ops)
        for i, (f, op) in enumerate(zip(plan.files, ops), 1):
            step = f"uploading {f.info.filename}"
            _say(console, f"[{i}/{n}] uploading {f.info.filename} ({human_size(f.info.size)})")
            api.preupload_lfs_files(
                plan.repo_id, additions=[op], repo_type="model", revision=plan.revision, free_memory=False
            )
            if getattr(op, "_upload_mode", None) == "lfs":
                _say(console, f"[{i}/{n}] {f.info.filename}: stored")
            else:
                _say(console, f"[{i}/{n}] {f.info.filename}: small enough to travel inside the commit")

        step = f"committing to {plan.repo_id}@{plan.revision}"
        _say(console, f"committing {n} file(s) and {CARD_NAME} to {plan.repo_id}@{plan.revision}")
        info = api.create_commit(
            plan.repo_id,
            operations=[*ops, card_op],
            commit_message=plan.commit_message,
            commit_description="\n".join(f"{f.info.filename}: sha256 {f.info.sha256}" for f in plan.files),
            repo_type="model",
            revision=plan.revision,
        )
    except UserError:
        raise
    except Exception as exc:  # everything from the client: scrub it, one line, no chained traceback
        raise _hub_error(exc, step, plan, token) from None
    repo_url = f"{plan.endpoint}/{plan.repo_id}"
    if plan.revision != "main":
        repo_url += f"/tree/{plan.revision}"
    return str(getattr(info, "commit_url", "") or repo_url), repo_url


# --------------------------------------------------------------------------- entry points


def upload(
    repo_id: str,
    files: list[Path],
    *,
    private: bool = False,
    revision: str | None = None,
    dry_run: bool = False,
    bench_json: Path | None = None,
    console: Console | None = None,
) -> UploadResult:
    """Plan, then (unless dry_run) check the token and push. Raises UserError on any user-side problem."""
    console = console or Console(stderr=True)
    # Cheap checks first, then the token (a real upload only), then the slow part: reading and hashing.
    check_repo_id(repo_id)
    check_revision(revision)
    resolve_endpoint()
    _check_files([Path(f) for f in files])
    token = None if dry_run else resolve_token()
    plan = prepare_upload(
        repo_id, files, private=private, revision=revision, bench_json=bench_json, console=console
    )
    if token is None:
        return UploadResult(plan=plan, dry_run=True)
    commit_url, repo_url = push(plan, token, console)
    return UploadResult(plan=plan, dry_run=False, commit_url=commit_url, repo_url=repo_url)


# Paragraphs are single lines on purpose: typer rewraps them to the terminal width.
_HELP = "\n\n".join(
    [
        "Publish GGUF files to the Hugging Face Hub, with a generated model card.",
        "Creates the model repository REPO_ID (owner/name) when it is missing, and adds the files and a README.md "
        "in one commit. The card comes from the files' GGUF metadata: the drafter's source repository and license, "
        "what each file is (architecture, quantization, size, sha256), which target GGUF it pairs with, and the "
        "commands to run it with laguna-run and with ik_llama.cpp.",
        "The token comes from HF_TOKEN or from a saved `hf auth login` and needs write access to the owner's "
        "namespace; it is never printed. HF_ENDPOINT selects another Hub endpoint.",
        "Start with --dry-run: it prints the plan and the card and sends nothing (no token needed). "
        "A missing token or a refused upload exits with status 2.",
    ]
)

_EPILOG = "\n\n".join(
    [
        "Examples:",
        "laguna-gguf upload you/Laguna-XS-2.1-DFlash-GGUF drafter-Q8_0.gguf --dry-run",
        "laguna-gguf upload you/Laguna-XS-2.1-DFlash-GGUF drafter-Q8_0.gguf --bench-json bench.json --private",
        "The --bench-json file is what `laguna-run bench --json` writes: an object with \"rows\" (each with content, "
        "n_max, tokens_per_s, speedup and optionally mean_accepted) and optional \"machine\" and \"command\" strings.",
    ]
)


def _print_dry_run(result: UploadResult) -> None:
    for line in result.plan.describe():
        typer.echo(line)
    typer.echo(token_hint())
    typer.echo(f"--- {CARD_NAME} ---")
    typer.echo(result.plan.card, nl=False)
    typer.echo(f"--- end of {CARD_NAME} ---")
    typer.echo("dry run: nothing was sent")


def upload_command(
    repo_id: Annotated[str, argument("REPO_ID", help="Target repository, owner/name.")],
    files: Annotated[
        list[Path],
        argument("FILE.gguf...", help="GGUF files to publish (drafters, and optionally targets)."),
    ],
    private: Annotated[
        bool, switch("--private", help="Create the repository as private (an existing one keeps its visibility).")
    ] = False,
    revision: Annotated[
        Optional[str],
        flag("--revision", metavar="R", help="Branch to commit to; created from main when missing. Default: main."),
    ] = None,
    dry_run: Annotated[
        bool, switch("--dry-run", help="Print the planned operations and the model card; send nothing.")
    ] = False,
    bench_json: Annotated[
        Optional[Path],
        flag("--bench-json", metavar="B.json", help="Add a benchmark table from `laguna-run bench --json` output."),
    ] = None,
) -> None:
    console = Console(stderr=True)
    try:
        result = upload(
            repo_id, files, private=private, revision=revision, dry_run=dry_run, bench_json=bench_json, console=console
        )
    except UserError as exc:
        typer.echo(f"error: {_one_line(str(exc), None)}", err=True)
        raise typer.Exit(USER_ERROR_EXIT) from None
    if result.dry_run:
        _print_dry_run(result)
    else:
        typer.echo(f"uploaded to {result.repo_url}")
        typer.echo(f"commit: {result.commit_url}")


def register(app: typer.Typer) -> None:
    """Add the `upload` command to the laguna-gguf typer app."""
    app.command("upload", help=_HELP, epilog=_EPILOG, no_args_is_help=True)(upload_command)
