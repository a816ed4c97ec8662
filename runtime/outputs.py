"""Files a command writes (``--trace``, ``--json``, ``--png``, stdout), checked before any model loads
and written so that a failure never destroys anything.

The rules, for every output:

- it is not an input of the same run (the models, the prompt files, a chat template): the same
  file under another name, a hard link or a symlink counts (``st_dev``/``st_ino``);
- it is not a FIFO, a device, a socket or a directory (a write to a FIFO blocks until someone
  reads it; ``/dev/full`` fails every write);
- it is not another output of the same run;
- its directory exists and a file can be created there; an existing file that is read-only is
  left alone;
- its format is one the writer supports (``--png``: matplotlib's formats, from the suffix).

A file output is written to ``NAME.partial-PID`` in the same directory and renamed over
``NAME`` when complete, so an error leaves the old file, or nothing. A live output (the trace,
line-buffered so it can be followed) that fails mid-run keeps its partial file and says where.
Stdout may be a terminal, a pipe, ``/dev/null`` or a regular file that is not an input; a
failed write to it (a closed pipe, a full disk) is one :class:`OutputFailed` line naming it.

    outputs = check_outputs({"--trace": trace, "--json": json_path}, inputs=[model, drafter, prompt_file])
    with AtomicFile(outputs["--json"]) as f:
        f.write(text)          # renamed over the path when the block ends without an error
"""

from __future__ import annotations

import errno
import os
import stat
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from ..convert.errors import UserError

STDOUT = "stdout"
#: outputs whose format comes from the path's suffix: flag -> the formats the writer supports
_SUFFIX_FORMATS = {"--png"}


class OutputFailed(UserError):
    """Writing an output failed mid-run (a full disk, a closed pipe): one line naming it, exit 2."""


@dataclass(frozen=True)
class Output:
    """An output path that passed :func:`check_outputs`; ``dest`` is where the bytes go (a
    symlink's target: writing replaces the file it points to, not the link)."""

    flag: str
    path: Path
    dest: Path
    format: str | None = None  # --png: the matplotlib format

    @property
    def label(self) -> str:
        return f"{self.path}: {self.flag}"


def file_kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket"), (stat.S_ISLNK, "a symbolic link")):
        if test(mode):
            return name
    return "not a regular file"


def _identity(path: Path) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except (OSError, ValueError):
        return None
    return st.st_dev, st.st_ino


#: the most files of an input directory (a checkpoint, the bundled pair) compared with the outputs
MAX_DIR_FILES = 10_000


def _inputs_by_identity(inputs: Iterable[Path | str | None]) -> dict[tuple[int, int], Path]:
    """Each input's (st_dev, st_ino); a directory stands for the files under it."""
    found = {}
    for p in inputs:
        if p is None:
            continue
        p = Path(p)
        files = [p]
        if p.is_dir():
            files = []
            for root, _, names in os.walk(p):
                files += [Path(root) / n for n in names]
                if len(files) > MAX_DIR_FILES:
                    break
        for f in files:
            ident = _identity(f)
            if ident is not None:
                found.setdefault(ident, f)
    return found


def _same_as(path: Path, shown: Path) -> str:
    return "" if Path(os.path.abspath(path)) == Path(os.path.abspath(shown)) else \
        f" ({shown}, through a link or another name)"


def supported_plot_formats() -> dict[str, str]:
    """matplotlib's savefig formats (suffix -> description), without importing pyplot."""
    from matplotlib.backend_bases import FigureCanvasBase

    return FigureCanvasBase.get_supported_filetypes()


def _plot_format(flag: str, path: Path) -> str:
    import importlib.util

    if importlib.util.find_spec("matplotlib") is None:
        raise UserError(f"{flag}: needs matplotlib, which is not installed (pip install matplotlib)")
    suffix = path.suffix.lower().lstrip(".")
    if not suffix:
        return "png"
    formats = supported_plot_formats()
    if suffix not in formats:
        raise UserError(f"{path}: {flag}: expected a name ending in one of "
                        f"{', '.join('.' + f for f in sorted(formats))} (matplotlib's formats), found .{suffix}")
    return suffix


def _check_one(flag: str, path: Path, inputs: dict[tuple[int, int], Path]) -> Output:
    path = Path(path)
    if str(path) == "":
        raise UserError(f"{flag}: expected a file path, found ''")
    dest = Path(os.path.realpath(path))  # a symlink: the file it names (existing or not)
    try:
        st = os.stat(dest)
    except (FileNotFoundError, NotADirectoryError):  # a new file; its directory is checked below
        st = None
    except OSError as e:
        raise UserError(f"{path}: {flag}: cannot look at it ({e.strerror or e})") from None
    if st is not None:
        if stat.S_ISDIR(st.st_mode):
            raise UserError(f"{path}: {flag}: expected a file path, found a directory")
        if not stat.S_ISREG(st.st_mode):
            raise UserError(f"{path}: {flag}: expected a regular file to write, found {file_kind(st.st_mode)}")
        shown = inputs.get((st.st_dev, st.st_ino))
        if shown is not None:
            raise UserError(f"{path}: {flag}: is an input of this run{_same_as(path, shown)}; writing it would "
                            "destroy it: choose another name")
        if not os.access(dest, os.W_OK):
            raise UserError(f"{path}: {flag}: expected a writable file, found a read-only one")
    parent = dest.parent
    if not parent.is_dir():
        raise UserError(f"{path}: {flag}: expected an existing directory to write into, found no directory {parent}")
    probe = _partial_path(dest, f"probe-{os.getpid()}")
    try:  # create one: permission bits do not tell root, read-only mounts or full quotas
        os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    except OSError as e:
        raise UserError(f"{path}: {flag}: cannot write into {parent} ({e.strerror or e})") from None
    os.unlink(probe)
    fmt = _plot_format(flag, path) if flag in _SUFFIX_FORMATS else None
    return Output(flag, path, dest, fmt)


def check_stdout(inputs: Iterable[Path | str | None] = (), stream: IO | None = None,
                 outputs: Mapping[str, Path] | None = None) -> None:
    """Refuse a stdout that is an input of the run (``> prompt.txt``: the shell has emptied it
    already; ``>> model.gguf`` would grow it) or another output of it, closed, or a device other
    than a terminal or ``/dev/null`` (``/dev/full`` fails every write)."""
    stream = sys.stdout if stream is None else stream
    if stream is None or getattr(stream, "closed", False):
        raise UserError(f"{STDOUT}: expected an open output, found it closed")
    try:
        fd = stream.fileno()
    except (OSError, ValueError, AttributeError):
        return  # not a file descriptor (an embedding caller's stream): its owner's business
    try:
        st = os.fstat(fd)
    except OSError:
        raise UserError(f"{STDOUT}: expected an open output, found it closed") from None
    name = _stream_name(stream)
    if stat.S_ISREG(st.st_mode):
        ident = (st.st_dev, st.st_ino)
        shown = _inputs_by_identity(inputs).get(ident)
        if shown is not None:
            raise UserError(f"{STDOUT} ({name}): is an input of this run ({shown}): the shell's redirection "
                            "opened it before the run started (> empties it); send the output elsewhere")
        for flag, path in (outputs or {}).items():
            if _identity(path) == ident:
                raise UserError(f"{STDOUT} ({name}): is also {flag}'s output; give each its own file")
        return
    if stat.S_ISCHR(st.st_mode):
        if stream.isatty() or _is_dev_null(st):
            return
        raise UserError(f"{STDOUT} ({name}): expected a terminal, a pipe, /dev/null or a regular file, found "
                        "another character device (every write would fail or vanish)")
    if stat.S_ISBLK(st.st_mode) or stat.S_ISDIR(st.st_mode):
        raise UserError(f"{STDOUT} ({name}): expected a terminal, a pipe, /dev/null or a regular file, found "
                        f"{file_kind(st.st_mode)}")


def _is_dev_null(st: os.stat_result) -> bool:
    try:
        null = os.stat(os.devnull)
    except OSError:
        return False
    return stat.S_ISCHR(null.st_mode) and st.st_rdev == null.st_rdev


def _stream_name(stream) -> str:
    try:
        return os.readlink(f"/proc/self/fd/{stream.fileno()}")
    except (OSError, ValueError, AttributeError):
        return getattr(stream, "name", "?") if not isinstance(getattr(stream, "name", None), int) else "?"


def check_outputs(outputs: Mapping[str, Path | str | None], inputs: Iterable[Path | str | None] = (),
                  *, stdout: bool = True) -> dict[str, Output]:
    """Check every output of a run against the rules above, before any work; ``stdout``: check the
    process's stdout too. Returns the given (non-None) outputs by flag."""
    inputs = list(inputs)
    by_identity = _inputs_by_identity(inputs)
    checked: dict[str, Output] = {}
    for flag, path in outputs.items():
        if path is not None:
            checked[flag] = _check_one(flag, Path(path), by_identity)
    dests: dict[str, Output] = {}
    for out in checked.values():
        key = str(out.dest)
        if key in dests:
            raise UserError(f"{out.path}: {out.flag}: is also {dests[key].flag}'s output; give each its own file")
        dests[key] = out
    if stdout:
        check_stdout(inputs, outputs={o.flag: o.dest for o in checked.values()})
    return checked


def _partial_path(dest: Path, tag: str | int | None = None) -> Path:
    return dest.with_name(f"{dest.name}.partial-{os.getpid() if tag is None else tag}")


def _create_temp(path: Path, mode: int) -> int:
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), mode)


class AtomicFile:
    """An output written to ``NAME.partial-PID`` next to it and renamed over ``NAME`` by
    :meth:`commit` (or when its ``with`` block ends without an exception).

    ``live=True``: text mode, line-buffered (a trace followed as it grows). A failed write raises
    :class:`OutputFailed` naming the path and, for a live output, where the partial file stays;
    otherwise the partial file is removed and the old file is untouched."""

    def __init__(self, output: Output, *, binary: bool = False, live: bool = False) -> None:
        self.output = output
        self.binary, self.live = binary, live
        self.partial = _partial_path(output.dest)
        self.error: OutputFailed | None = None
        self._f = None

    def open(self) -> "AtomicFile":
        out = self.output
        try:
            mode = stat.S_IMODE(os.stat(out.dest).st_mode)
        except OSError:
            mode = 0o666  # less the umask, as open() would create it
        try:
            fd = _create_temp(self.partial, mode)
        except OSError as e:
            raise OutputFailed(f"{out.label}: cannot create {self.partial} ({e.strerror or e})") from None
        if self.binary:
            self._f = os.fdopen(fd, "wb")
        else:
            self._f = os.fdopen(fd, "w", encoding="utf-8", buffering=1 if self.live else -1)
        return self

    @property
    def name(self) -> str:
        """Where the bytes are now (matplotlib's savefig takes a file object or this)."""
        return str(self.partial)

    @property
    def file(self):
        return self._f

    def write(self, data) -> None:
        if self.error is not None:
            raise self.error
        try:
            self._f.write(data)
        except OSError as e:
            raise self._failed(e) from None

    def _failed(self, e: OSError) -> OutputFailed:
        why = e.strerror or str(e)
        if self.live:
            kept = self.keep_partial()
            where = f"the part written so far is in {kept}" if kept else "nothing was kept"
            self.error = OutputFailed(f"{self.output.label}: write failed ({why}); {where}")
        else:
            self.abandon()
            self.error = OutputFailed(f"{self.output.label}: write failed ({why}); the file was left as it was")
        return self.error

    def commit(self) -> Path:
        """Flush, sync and rename over the output's path; OutputFailed if any of it fails."""
        if self.error is not None:
            raise self.error
        try:
            self._f.flush()
            os.fsync(self._f.fileno())
            self._f.close()
            os.replace(self.partial, self.output.dest)
        except OSError as e:
            raise self._failed(e) from None
        return self.output.dest

    def _close_quietly(self) -> None:
        if self._f is not None and not self._f.closed:
            try:
                self._f.close()
            except OSError:  # the buffered tail could not be written either
                pass

    def abandon(self) -> None:
        """Remove the partial file; the output's path keeps what it had."""
        self._close_quietly()
        try:
            os.unlink(self.partial)
        except FileNotFoundError:
            pass

    def keep_partial(self) -> Path | None:
        """Close and leave the partial file where it is (a live output cut short) and return its
        path; an empty one (nothing was written) is removed and None returned."""
        self._close_quietly()
        try:
            if os.path.getsize(self.partial) == 0:
                os.unlink(self.partial)
                return None
        except OSError:
            return None
        return self.partial

    def __enter__(self) -> "AtomicFile":
        return self.open()

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.commit()
        elif self.live:  # the run failed: what was written so far stays in the partial file
            self.keep_partial()
        else:
            self.abandon()


def write_text(output: Output, text: str, *, fallback: IO | None = None) -> Path:
    """Write ``text`` to the output atomically. On failure the old file stays; with ``fallback``
    (e.g. stderr) the text is written there so the results are not lost, and the error says so."""
    try:
        with AtomicFile(output) as f:
            f.write(text)
    except OutputFailed as e:
        if fallback is None:
            raise
        try:
            fallback.write(text if text.endswith("\n") else text + "\n")
            fallback.flush()
        except (OSError, ValueError):
            raise e from None
        where = _stream_name(fallback)
        raise OutputFailed(f"{e}; the results were written to {'stderr' if fallback is sys.stderr else where} "
                           "instead") from None
    return output.dest


class GuardedStream:
    """A text stream (stdout) whose failed writes become one :class:`OutputFailed` line naming
    it: ``EPIPE`` (the reader went away) and ``ENOSPC`` (a full disk) included. After a failure
    every write raises the same error; ``failed`` tells a generation loop to stop."""

    def __init__(self, stream: IO | None = None, label: str = STDOUT) -> None:
        self.stream = sys.stdout if stream is None else stream
        self.label = label
        self.error: OutputFailed | None = None

    @property
    def failed(self) -> bool:
        return self.error is not None

    def __getattr__(self, name: str):  # isatty, fileno, encoding...: what rich asks a terminal
        return getattr(self.stream, name)

    def write(self, text: str) -> None:
        if self.error is not None:
            raise self.error
        try:
            self.stream.write(text)
        except (OSError, ValueError) as e:
            raise self._failed(e) from None

    def flush(self) -> None:
        if self.error is not None:
            raise self.error
        try:
            self.stream.flush()
        except (OSError, ValueError) as e:
            raise self._failed(e) from None

    def _failed(self, e: Exception) -> OutputFailed:
        if isinstance(e, BrokenPipeError) or getattr(e, "errno", None) == errno.EPIPE:
            why = "the reading end was closed"
        else:
            why = getattr(e, "strerror", None) or str(e)
        self.error = OutputFailed(f"{self.label} ({_stream_name(self.stream)}): write failed ({why})")
        _detach(self.stream)
        return self.error


def _detach(stream) -> None:
    """Point a failed stdout at /dev/null, so that the interpreter's flush at exit does not fail
    a second time with a traceback (Python's documented recipe for SIGPIPE)."""
    try:
        fd = stream.fileno()
    except (OSError, ValueError, AttributeError):
        return
    try:
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, fd)
        os.close(null)
    except OSError:
        pass


class LiveTrace:
    """``--trace``: one JSON line per round, written live to an :class:`AtomicFile`. A failed
    write does not raise inside the engine: it is kept in ``error`` and :meth:`should_stop`
    ends the generation at its next round, so the caller still reports what was done."""

    def __init__(self, output: Output | None) -> None:
        self.output = output
        self.file: AtomicFile | None = None
        self.error: OutputFailed | None = None

    def __enter__(self) -> "LiveTrace":
        if self.output is not None:
            self.file = AtomicFile(self.output, live=True).open()
            print(f"{self.output.label}: rounds go to {self.file.partial} as they run, renamed to "
                  f"{self.output.path} at the end", file=sys.stderr)
        return self

    def write(self, record: dict) -> None:
        if self.file is None or self.error is not None:
            return
        import json

        try:
            self.file.write(json.dumps(record) + "\n")
        except OutputFailed as e:
            self.error = e

    @property
    def callback(self):
        return self.write if self.file is not None else None

    def should_stop(self) -> bool:
        return self.error is not None

    def __exit__(self, exc_type, exc, tb) -> None:
        if self.file is None or self.error is not None:
            return
        if exc_type is None:
            self.file.commit()
        else:
            kept = self.file.keep_partial()
            if kept is not None:
                print(f"{self.output.label}: the run failed; the trace of the rounds before is in {kept}",
                      file=sys.stderr)


def save_plot(output: Output, draw) -> Path:
    """``--png``: ``draw(file, format)`` writes the figure into the partial file, renamed when done."""
    with AtomicFile(output, binary=True) as f:
        try:
            draw(f.file, output.format)
        except OSError as e:
            raise f._failed(e) from None
    return output.dest
