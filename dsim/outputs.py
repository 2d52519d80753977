"""All-or-nothing outputs: every command that writes files writes them through here.

``staged_dir(target)`` yields a temporary directory next to where ``target`` will live; the
command writes its files there, and only when the ``with`` block ends normally does it become
``target`` (a rename, with SIGINT/SIGTERM held off until it is done). On any exception, including
KeyboardInterrupt, the temporary directory is removed and ``target`` is left as it was.
``staged_file(path)`` does the same for a single file; ``write_file`` writes one text or bytes
whole (the single-file writers of the kernel tools and the GPU tools).

Nothing of the user's is ever destroyed:
- a file target must be absent or a regular file: a directory, symlink (``/dev/stdout`` is one),
  device node, FIFO or socket is refused, never replaced;
- a directory target must be absent, empty, or a directory dsim wrote whole before, unchanged
  since (its manifest, ``MANIFEST``, lists exactly the files it holds). Such a directory is
  replaced as a whole, never merged: the new one is renamed in beside the old one, which is
  removed only once the swap has succeeded. Any other directory (one holding a file dsim did
  not write) is refused.
Every check runs up front, before a long run starts (``check_dir_target``, ``check_file_target``,
``check_apart`` for two outputs of one run), and again just before the commit; a refusal is an
InputError naming the option and the path.

A stop signal's exception is also recorded (``note_stop``) and raised again before any commit
(``raise_if_stopped``): an exception raised by a signal handler while native code calls back
into Python (numba loading or compiling kernels through llvmlite's ctypes callbacks) is printed
and swallowed there, and the run would otherwise go on to write its outputs and exit 0.

``field_lines(name, text)`` lays out one printed summary field (a name, then its text wrapped
under a hanging indent), so a long provenance stays readable in a terminal.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import stat
import tempfile
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path

from dsim.errors import InputError

TMP_SUFFIX = ".tmp-dsim"
MANIFEST = ".dsim-output.json"  # in every output directory: the files dsim wrote there
MAX_MANIFEST_BYTES = 4 << 20
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


def stopped_by() -> BaseException | None:
    """The recorded stop signal's exception, if any."""
    return _stop[0] if _stop else None


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


def kind(p: Path) -> str | None:
    """What is at p, not following a final symlink: None (nothing), 'file', 'directory',
    'symlink', 'FIFO', 'socket', 'character device', 'block device'."""
    try:
        st = os.lstat(p)
    except FileNotFoundError:
        return None
    except OSError as e:
        raise InputError(f"{p}: cannot inspect ({e.strerror or e})") from None
    m = st.st_mode
    for test, name in (
        (stat.S_ISREG, "file"),
        (stat.S_ISDIR, "directory"),
        (stat.S_ISLNK, "symlink"),
        (stat.S_ISFIFO, "FIFO"),
        (stat.S_ISSOCK, "socket"),
        (stat.S_ISCHR, "character device"),
        (stat.S_ISBLK, "block device"),
    ):
        if test(m):
            return name
    return "special file"  # pragma: no cover


def _entries(d: Path) -> tuple[list[str], list[str]]:
    """(files, directories) under d, relative, not following symlinks; a symlink or special file
    counts as a file (something that is not dsim's)."""
    files: list[str] = []
    dirs: list[str] = []
    for root, dnames, fnames in os.walk(d, followlinks=False, onerror=_raise):
        rel = Path(root).relative_to(d)
        for n in dnames:
            if os.path.islink(os.path.join(root, n)):
                files.append(str(rel / n))
            else:
                dirs.append(str(rel / n))
        files.extend(str(rel / n) for n in fnames)
    return sorted(files), sorted(dirs)


def _raise(e: OSError) -> None:
    raise e


def _manifest_files(d: Path) -> list[str] | None:
    """The files listed in d's manifest, or None where it has none that dsim wrote."""
    m = d / MANIFEST
    if kind(m) != "file":
        return None
    try:
        if m.stat().st_size > MAX_MANIFEST_BYTES:
            return None
        doc = json.loads(m.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    files = doc.get("files") if isinstance(doc, dict) and doc.get("written_by") == "dsim" else None
    if not isinstance(files, list) or not all(isinstance(f, str) for f in files):
        return None
    return files


def _check_replaceable(p: Path, what: str) -> None:
    """p, an existing directory, may be replaced whole: empty, or dsim's own output, unchanged."""
    try:
        files, dirs = _entries(p)
    except OSError as e:
        raise InputError(f"{what}: {p}: cannot read the directory ({e.strerror or e})") from None
    if not files and not dirs:
        return
    listed = _manifest_files(p)
    foreign = sorted(set(files) - {MANIFEST} - set(listed or ()))
    if listed is not None and not foreign:
        parents = {str(q) for f in listed for q in Path(f).parents if str(q) != "."}
        odd = [f for f in files if f != MANIFEST and kind(p / f) != "file"] + sorted(set(dirs) - parents)
        if not odd:
            return
        foreign = odd
    first = foreign[0] if foreign else files[0] if files else dirs[0]
    raise InputError(
        f"{what}: {p}: an existing directory holding files dsim did not write ({first}"
        f"{f' and {len(foreign) - 1} more' if len(foreign) > 1 else ''}); refused, never merged: "
        "name a new directory, or an empty one, or remove it"
    )


def _write_manifest(stage: Path) -> None:
    files, _ = _entries(stage)
    doc = {"written_by": "dsim", "files": [f for f in files if f != MANIFEST]}
    (stage / MANIFEST).write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")


def check_dir_target(target: str | Path, what: str = "--out") -> Path:
    """Path of a directory to be written: InputError if empty, an existing non-directory (a file,
    symlink, device, FIFO, socket), or a directory that is not empty and not dsim's own output."""
    p = _check_path(target, what)
    k = kind(p)
    if k not in (None, "directory"):
        raise InputError(f"{what}: {p}: exists and is not a directory (a {k}); refused, never replaced")
    if k == "directory":
        if not os.access(p, os.W_OK | os.X_OK):
            raise InputError(f"{what}: {p}: directory not writable")
        if not os.access(p.absolute().parent, os.W_OK | os.X_OK):
            raise InputError(f"{what}: {p}: cannot replace it ({p.absolute().parent} not writable)")
        _check_replaceable(p, what)
        return p
    anc = _existing_ancestor(p)
    if not anc.is_dir() or not os.access(anc, os.W_OK | os.X_OK):
        raise InputError(f"{what}: {p}: cannot create it ({anc} is not a writable directory)")
    return p


def check_file_target(target: str | Path, what: str, parents: bool = False) -> Path:
    """Path of a file to be written: InputError if empty, its directory is missing (unless
    ``parents``: it can be made), or something other than a regular file is there (directory,
    symlink, device, FIFO, socket)."""
    p = _check_path(target, what)
    if parents and kind(p.absolute().parent) is None:
        check_dir_target(p.absolute().parent, what)
        return p
    k = kind(p)
    if k == "directory":
        raise InputError(f"{what}: {p}: is a directory, not a file")
    if k not in (None, "file"):
        raise InputError(f"{what}: {p}: is a {k}, not a regular file; refused, never replaced")
    if not p.absolute().parent.is_dir():
        raise InputError(f"{what}: {p}: directory {p.absolute().parent} does not exist")
    if k == "file" and not os.access(p, os.W_OK):
        raise InputError(f"{what}: {p}: not writable")
    if not os.access(p.absolute().parent, os.W_OK | os.X_OK):
        raise InputError(f"{what}: {p}: directory {p.absolute().parent} not writable")
    return p


def check_apart(*targets: tuple[str | Path | None, str]) -> None:
    """Outputs of one run must not overlap: the same path twice, or one inside another
    (``--out X --step-log X``, ``--step-log X/summary.json``), is refused before the run."""
    seen: list[tuple[Path, str]] = []
    for t, what in targets:
        if t is None or str(t).strip() == "":
            continue
        p = Path(os.path.realpath(Path(str(t)).expanduser().absolute().parent)) / Path(str(t)).name
        for q, qwhat in seen:
            if p == q or q in p.parents or p in q.parents:
                raise InputError(f"{what} {t}: overlaps {qwhat} {q}; give them separate paths")
        seen.append((p, what))


def _swap_in(stage: Path, p: Path, what: str) -> None:
    """Make the staged directory p: a rename where p is absent, else old p renamed aside, stage
    renamed in, old p removed (put back if the second rename fails)."""
    k = kind(p)
    if k is None:
        p.parent.mkdir(parents=True, exist_ok=True)
        os.rename(stage, p)  # onto nothing (or an empty directory made meanwhile)
        return
    if k != "directory":
        raise InputError(f"{what}: {p}: became a {k} during the run; refused, never replaced")
    _check_replaceable(p, what)  # a file added during the run is the user's
    old = Path(tempfile.mkdtemp(prefix=f".{p.name}.old.", suffix=TMP_SUFFIX, dir=p.absolute().parent))
    os.rename(p, old)  # onto the empty directory just made
    try:
        os.rename(stage, p)
    except BaseException:
        os.rename(old, p)
        raise
    _remove(old)


@contextlib.contextmanager
def staged_dir(target: str | Path, what: str = "--out") -> Iterator[Path]:
    """Yield a temporary directory; on success it becomes ``target`` (created with its parents if
    missing, or replacing dsim's earlier output there as a whole), on any exception nothing is
    left behind."""
    p = check_dir_target(target, what)
    _, stage = _make_stage(p, what, "dir")
    try:
        yield stage
        raise_if_stopped()
        _write_manifest(stage)
        with _signals_held():
            try:
                _swap_in(stage, p, what)
            except OSError as e:
                raise InputError(f"{what}: {p}: cannot write ({e.strerror or e})") from None
    finally:
        if kind(stage) is not None:
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
            k = kind(p)
            if k not in (None, "file"):
                raise InputError(f"{what}: {p}: became a {k} during the run; refused, never replaced")
            try:
                os.replace(stage, p)
            except OSError as e:
                raise InputError(f"{what}: {p}: cannot write ({e.strerror or e})") from None
    finally:
        if kind(stage) is not None:
            _remove(stage)


def write_file(target: str | Path, data: str | bytes, what: str = "--out", parents: bool = False) -> Path:
    """Write one file whole through ``staged_file`` (text as UTF-8); ``parents`` creates missing
    directories above it first. Returns the path."""
    p = check_file_target(target, what, parents=parents)
    if parents:
        p.absolute().parent.mkdir(parents=True, exist_ok=True)
    with staged_file(p, what) as tmp:
        if isinstance(data, str):
            tmp.write_text(data, encoding="utf-8")
        else:
            tmp.write_bytes(data)
    return p


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
