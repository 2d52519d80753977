"""All-or-nothing outputs: every command that writes files writes them through here.

``staged_dir(target)`` yields a temporary directory next to where ``target`` will live; the
command writes its files there, and only when the ``with`` block ends normally are they moved
into ``target`` (a rename: a new target appears whole; into an existing directory each file is
renamed in, with SIGINT/SIGTERM held off until the last one is in). On any exception, including
KeyboardInterrupt, the temporary directory is removed and ``target`` is left as it was.
``staged_file(path)`` does the same for a single file.

Both check the target up front (before a long run starts): an empty path, an existing target
of the wrong kind (a file where a directory is wanted or the reverse), or a place that cannot be
written raise InputError naming the option and the path.

A stop signal's exception is also recorded (``note_stop``) and raised again before any commit
(``raise_if_stopped``): an exception raised by a signal handler while native code calls back
into Python (numba loading or compiling kernels through llvmlite's ctypes callbacks) is printed
and swallowed there, and the run would otherwise go on to write its outputs and exit 0.

``field_lines(name, text)`` lays out one printed summary field (a name, then its text wrapped
under a hanging indent), so a long provenance stays readable in a terminal.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import tempfile
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path

from dsim.errors import InputError

TMP_SUFFIX = ".tmp-dsim"
FIELD_WIDTH = 110  # printed summary lines wrap here


def field_lines(name: str, text: str, width: int = FIELD_WIDTH) -> list[str]:
    """One printed field: ``name`` then ``text``, wrapped at ``width`` with the continuation lines
    indented under the text's start. Words are never split (a path or URL stays whole)."""
    return textwrap.wrap(
        text,
        width=width,
        initial_indent=name,
        subsequent_indent=" " * len(name),
        break_long_words=False,
        break_on_hyphens=False,
    ) or [name.rstrip()]


def _existing_ancestor(p: Path) -> Path:
    """The nearest directory at or above p's parent that exists (where staging can happen)."""
    q = p.absolute().parent
    while not q.exists():
        if q.parent == q:
            break
        q = q.parent
    return q


def _check_path(target, what: str) -> Path:
    if target is None or str(target).strip() == "":
        raise InputError(f"{what}: empty path")
    s = str(target)
    if "\0" in s:
        raise InputError(f"{what}: path contains a NUL byte")
    return Path(s).expanduser()


def _make_stage(p: Path, what: str, kind: str) -> tuple[Path, Path]:
    """(ancestor, staging path) for target p; raises InputError if nothing can be written there."""
    anc = _existing_ancestor(p)
    if not anc.is_dir():
        raise InputError(f"{what}: {p}: {anc} is not a directory")
    try:
        if kind == "dir":
            stage = Path(tempfile.mkdtemp(prefix=f".{p.name}.", suffix=TMP_SUFFIX, dir=anc))
        else:
            fd, name = tempfile.mkstemp(prefix=f".{p.name}.", suffix=TMP_SUFFIX, dir=anc)
            os.close(fd)
            stage = Path(name)
    except OSError as e:
        raise InputError(f"{what}: {p}: cannot write in {anc} ({e.strerror or e})") from None
    # mkdtemp/mkstemp make private (0700/0600) entries: give the result the usual permissions
    umask = os.umask(0)
    os.umask(umask)
    try:
        os.chmod(stage, (0o777 if kind == "dir" else 0o666) & ~umask)
    except OSError:  # pragma: no cover
        pass
    return anc, stage


def _remove(path: Path) -> None:
    try:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
    except OSError:
        pass


_stop: list[BaseException] = []  # the exception of a stop signal received by this process


def note_stop(exc: BaseException) -> BaseException:
    """Record a stop signal's exception (KeyboardInterrupt, the CLI's SIGTERM exception) before its
    handler raises it; returns it."""
    _stop[:] = [exc]
    return exc


def raise_if_stopped() -> None:
    """Raise a recorded stop signal's exception again (it may have been swallowed on the way)."""
    if _stop:
        raise _stop[0]


def clear_stop() -> None:
    """Forget a recorded stop (an in-process caller that runs several commands)."""
    _stop.clear()


@contextlib.contextmanager
def _signals_held() -> Iterator[None]:
    """Defer SIGINT/SIGTERM while the final renames run (then deliver them)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    pending: list[int] = []
    old: dict = {}
    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            old[sig] = signal.signal(sig, lambda s, f: pending.append(s))
        except (ValueError, OSError):  # pragma: no cover - not settable here
            pass
    try:
        yield
    finally:
        for sig, h in old.items():
            signal.signal(sig, h)
        for got in pending:
            h = old.get(signal.Signals(got))
            if callable(h):
                h(got, None)
            elif got == signal.SIGINT:
                raise KeyboardInterrupt
            else:
                os.kill(os.getpid(), got)


def _merge_into(src: Path, dst: Path) -> None:
    for f in sorted(src.iterdir()):
        d = dst / f.name
        if f.is_dir() and d.is_dir():
            _merge_into(f, d)
        else:
            if d.is_dir() and not f.is_dir():
                shutil.rmtree(d)
            os.replace(f, d)


def check_dir_target(target: str | Path, what: str = "--out") -> Path:
    """Path of a directory to be written: InputError if empty or an existing non-directory."""
    p = _check_path(target, what)
    if p.exists() and not p.is_dir():
        raise InputError(f"{what}: {p}: exists and is not a directory")
    if p.is_dir() and not os.access(p, os.W_OK | os.X_OK):
        raise InputError(f"{what}: {p}: directory not writable")
    anc = _existing_ancestor(p)
    if not p.is_dir() and (not anc.is_dir() or not os.access(anc, os.W_OK | os.X_OK)):
        raise InputError(f"{what}: {p}: cannot create it ({anc} is not a writable directory)")
    return p


def check_file_target(target: str | Path, what: str) -> Path:
    """Path of a file to be written: InputError if empty, a directory, or its directory is missing."""
    p = _check_path(target, what)
    if p.is_dir():
        raise InputError(f"{what}: {p}: is a directory, not a file")
    if not p.absolute().parent.is_dir():
        raise InputError(f"{what}: {p}: directory {p.absolute().parent} does not exist")
    if p.exists() and not os.access(p, os.W_OK):
        raise InputError(f"{what}: {p}: not writable")
    if not os.access(p.absolute().parent, os.W_OK | os.X_OK):
        raise InputError(f"{what}: {p}: directory {p.absolute().parent} not writable")
    return p


@contextlib.contextmanager
def staged_dir(target: str | Path, what: str = "--out") -> Iterator[Path]:
    """Yield a temporary directory; on success its files end up in ``target`` (created with its
    parents if missing), on any exception nothing is left behind."""
    p = check_dir_target(target, what)
    _, stage = _make_stage(p, what, "dir")
    try:
        yield stage
        raise_if_stopped()
        with _signals_held():
            try:
                if p.is_dir():
                    _merge_into(stage, p)
                else:
                    p.parent.mkdir(parents=True, exist_ok=True)
                    os.replace(stage, p)
            except OSError as e:
                raise InputError(f"{what}: {p}: cannot write ({e.strerror or e})") from None
    finally:
        if stage.exists():
            _remove(stage)


@contextlib.contextmanager
def staged_file(target: str | Path, what: str) -> Iterator[Path]:
    """Yield a temporary file path next to ``target``; renamed onto it on success, removed on
    any exception."""
    p = check_file_target(target, what)
    _, stage = _make_stage(p, what, "file")
    try:
        yield stage
        raise_if_stopped()
        with _signals_held():
            try:
                os.replace(stage, p)
            except OSError as e:
                raise InputError(f"{what}: {p}: cannot write ({e.strerror or e})") from None
    finally:
        if stage.exists():
            _remove(stage)


def final_path(stage: Path, target: str | Path, path: str | Path) -> Path:
    """Where a file written under ``stage`` will be once committed to ``target``."""
    return Path(target) / Path(path).relative_to(stage)


def debris(parent: str | Path) -> list[Path]:
    """Staging leftovers in a directory (for tests and diagnostics)."""
    return sorted(Path(parent).glob(f".*{TMP_SUFFIX}"))


def rewrite_paths(
    stage: Path, target: str | Path, suffixes: tuple[str, ...] = (".md", ".json", ".yaml", ".html")
) -> None:
    """Text files under ``stage`` that name the staging directory name ``target`` instead (a
    report that lists the files it wrote, before they are moved into place)."""
    old, new = str(Path(stage)), str(Path(target))
    for f in Path(stage).rglob("*"):
        if f.is_file() and f.suffix in suffixes:
            text = f.read_text(encoding="utf-8", errors="surrogateescape")
            if old in text:
                f.write_text(text.replace(old, new), encoding="utf-8", errors="surrogateescape")
