"""One schema check for the files users hand dsim: profiles and acceptance presets.

``read_document(path)`` parses a YAML or JSON file and keeps, for every mapping key and list
item, the line it was written on (YAML node marks), so that a bad field is reported as
``path:line: field.path: problem, got VALUE``. The check helpers (``number``, ``integer``,
``number_list``, ...) take a ``Doc`` location and raise InputError for the first bad field,
one field at a time, with the value in plain form.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dsim.errors import InputError, plain

if TYPE_CHECKING:
    from collections.abc import Iterable

MAX_DEPTH = 64  # deeper nesting is not a profile or preset (and would exhaust the parser)
# The largest structured input read whole: the largest shipped kernel table is about 40 MB of
# JSON, a composed profile under 1 MB; past this a file is refused, not read until memory runs out.
MAX_DOCUMENT_BYTES = 256 << 20


@dataclass(frozen=True)
class Doc:
    """Where values of a parsed file came from: path and line per key path."""

    path: str
    lines: dict = field(default_factory=dict)  # tuple key path -> 1-based line

    def at(self, *keys: str | int) -> str:
        """``path:line: a.b[2]`` for the key path (the nearest line known)."""
        line = None
        for n in range(len(keys), -1, -1):
            line = self.lines.get(tuple(keys[:n]))
            if line is not None:
                break
        name = ""
        for k in keys:
            name += f"[{k}]" if isinstance(k, int) else (f".{k}" if name else str(k))
        out = self.path + (f":{line}" if line is not None else "")
        return f"{out}: {name}" if name else out


def _depth_ok(text: str) -> None:
    depth = best = 0
    for ch in text:
        if ch in "[{":
            depth += 1
            best = max(best, depth)
        elif ch in "]}":
            depth -= 1
    if best > MAX_DEPTH:
        raise InputError(f"nested {best} levels deep (at most {MAX_DEPTH})")


def _node_lines(node, prefix=(), out=None, depth=0, seen=None) -> dict:
    import yaml

    out = {} if out is None else out
    seen = set() if seen is None else seen
    if depth > MAX_DEPTH:
        raise InputError(f"nested more than {MAX_DEPTH} levels deep")
    out.setdefault(prefix, node.start_mark.line + 1)
    if id(node) in seen:  # an alias (*name) of a node walked already: walking it again per
        return out  # reference would take exponential time on nested aliases ("billion laughs")
    seen.add(id(node))
    if isinstance(node, yaml.MappingNode):
        for k, v in node.value:
            key = k.value if isinstance(k, yaml.ScalarNode) else None
            if key is None:
                continue
            out[prefix + (key,)] = k.start_mark.line + 1
            _node_lines(v, prefix + (key,), out, depth + 1, seen)
            out[prefix + (key,)] = k.start_mark.line + 1
    elif isinstance(node, yaml.SequenceNode):
        for i, v in enumerate(node.value):
            _node_lines(v, prefix + (i,), out, depth + 1, seen)
    return out


def _parse_yaml(text: str) -> tuple:
    """(node tree, document) of a YAML text: libyaml's parser where PyYAML has it (the same
    nodes, marks and values as the pure-Python one, about 6x faster on the composed profiles),
    else the pure-Python one. A text libyaml rejects is parsed again by the pure-Python parser,
    so a parse error reads the same with or without libyaml."""
    import yaml

    fast = getattr(yaml, "CSafeLoader", None)
    if fast is not None:
        try:
            return yaml.compose(text, Loader=fast), yaml.load(text, Loader=fast)
        except yaml.YAMLError:
            pass
    return yaml.compose(text, Loader=yaml.SafeLoader), yaml.safe_load(text)


def open_regular(path: str | Path, what: str = "", mode: str = "rb"):
    """``path`` opened for reading, refused (InputError) unless it is a regular file: a
    directory, FIFO, socket or device (``/dev/zero``, ``/dev/stdin``) is no input file. A FIFO
    is opened without blocking, so the refusal does not wait for a writer."""
    import stat

    p = Path(path)
    pre = f"{what} {p}" if what else str(p)
    try:
        fd = os.open(p, os.O_RDONLY | os.O_NONBLOCK)
    except FileNotFoundError:
        raise InputError(f"{pre}: file not found") from None
    except IsADirectoryError:
        raise InputError(f"{pre}: is a directory, not a file") from None
    except OSError as e:
        raise InputError(f"{pre}: cannot read ({e.strerror or e})") from None
    try:
        m = os.fstat(fd).st_mode
        if stat.S_ISDIR(m):
            raise InputError(f"{pre}: is a directory, not a file")
        if not stat.S_ISREG(m):
            k = (
                "a FIFO" if stat.S_ISFIFO(m) else
                "a socket" if stat.S_ISSOCK(m) else "a device" if stat.S_ISCHR(m) or stat.S_ISBLK(m) else
                "not a regular file"
            )  # fmt: skip
            raise InputError(f"{pre}: is {k}, not a regular file")
        os.set_blocking(fd, True)
        f = open(fd, mode, closefd=True)
    except BaseException:
        os.close(fd)
        raise
    return f


def check_input_file(path: str | Path, what: str = "", max_bytes: int = MAX_DOCUMENT_BYTES) -> int:
    """A file about to be read by a parser of its own (pandas, pyarrow, a line reader): it must be
    a regular file of at most ``max_bytes`` (a device such as /dev/zero, a FIFO or a huge file
    would be read until memory runs out). Returns its size."""
    p = Path(path)
    pre = f"{what} {p}" if what else str(p)
    with open_regular(p, what) as f:
        size = os.fstat(f.fileno()).st_size
    if size > max_bytes:
        raise InputError(f"{pre}: {size / 2**30:.1f} GiB, larger than {max_bytes / 2**30:g} GiB (refused)")
    return size


def read_bytes(path: str | Path, what: str = "", max_bytes: int = MAX_DOCUMENT_BYTES) -> bytes:
    """A regular file's bytes, at most ``max_bytes`` (InputError past it); ``.gz`` files are
    decompressed, bounded the same way (a truncated or corrupt archive is an InputError)."""
    import gzip
    import zlib

    p = Path(path)
    pre = f"{what} {p}" if what else str(p)
    with open_regular(p, what) as f:
        try:
            if p.name.endswith(".gz"):
                with gzip.GzipFile(fileobj=f) as g:
                    raw = g.read(max_bytes + 1)
            else:
                raw = f.read(max_bytes + 1)
        except (EOFError, zlib.error, gzip.BadGzipFile) as e:
            raise InputError(f"{pre}: corrupt or truncated gzip file ({e})") from None
        except OSError as e:
            raise InputError(f"{pre}: cannot read ({e.strerror or e})") from None
    if len(raw) > max_bytes:
        raise InputError(f"{pre}: larger than {max_bytes >> 20} MiB; not an input dsim reads whole")
    return raw


def read_json(path: str | Path, what: str = "", max_bytes: int = MAX_DOCUMENT_BYTES) -> Any:
    """A JSON (or ``.json.gz``) file parsed, bounded in size and nesting; InputError naming the
    file for anything else (not UTF-8, not JSON, NaN/Infinity literals are accepted as JSON's
    Python reading has them: the field checks refuse them)."""
    p = Path(path)
    pre = f"{what} {p}" if what else str(p)
    raw = read_bytes(p, what, max_bytes)
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise InputError(f"{pre}: not a UTF-8 text file ({e.reason} at byte {e.start})") from None
    try:
        _depth_ok(text)
    except InputError as e:
        raise InputError(f"{pre}: {e}") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise InputError(f"{pre}:{e.lineno}: not JSON ({e.msg})") from None
    except RecursionError:
        raise InputError(f"{pre}: nested too deeply") from None


MAX_JSON_LINES = 50_000_000  # as many records as the largest trace dsim reads (workload.MAX_TRACE_ROWS)


def read_json_lines(
    path: str | Path, what: str = "", max_bytes: int = MAX_DOCUMENT_BYTES, max_lines: int = MAX_JSON_LINES
) -> list[tuple[int, dict]]:
    """A JSON-lines file (one object a line; blank lines skipped) as (line number, object) pairs,
    bounded in size, line count and nesting; InputError naming the file and line for anything else."""
    p = Path(path)
    pre = f"{what} {p}" if what else str(p)
    raw = read_bytes(p, what, max_bytes)
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise InputError(f"{pre}: not a UTF-8 text file ({e.reason} at byte {e.start})") from None
    del raw
    out: list[tuple[int, dict]] = []
    for ln, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        if len(out) >= max_lines:
            raise InputError(f"{pre}:{ln}: more than {max_lines} records (refused)")
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise InputError(f"{pre}:{ln}: not JSON ({e.msg})") from None
        except RecursionError:
            raise InputError(f"{pre}:{ln}: nested too deeply") from None
        if not isinstance(obj, dict):
            raise InputError(f"{pre}:{ln}: expected a JSON object, got {type(obj).__name__}")
        out.append((ln, obj))
    return out


def read_document(path: str | Path, *, kind: str = "yaml") -> tuple[object, Doc]:
    """(parsed document, Doc with line marks). kind: 'yaml' or 'json'. Raises InputError for an
    unreadable or special file, one over MAX_DOCUMENT_BYTES, a parse error (with its line), or
    nesting beyond MAX_DEPTH."""
    import yaml

    p = Path(path)
    raw = read_bytes(p)
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise InputError(f"{p}: not a UTF-8 text file ({e.reason} at byte {e.start})") from None
    if "\0" in text:
        raise InputError(f"{p}: not a text file (NUL byte at character {text.index(chr(0))})")
    try:
        _depth_ok(text)
    except InputError as e:
        raise InputError(f"{p}: {e}") from None
    try:
        if kind == "json":
            try:
                doc = json.loads(text)
            except json.JSONDecodeError as e:
                raise InputError(f"{p}:{e.lineno}: not valid JSON ({e.msg})") from None
            return doc, Doc(str(p))
        try:
            node, doc = _parse_yaml(text)
        except yaml.YAMLError as e:
            mark = getattr(e, "problem_mark", None)
            line = f":{mark.line + 1}" if mark is not None else ""
            prob = getattr(e, "problem", None) or "syntax error"
            raise InputError(f"{p}{line}: not valid YAML ({prob})") from None
        lines = _node_lines(node) if node is not None else {}
        return doc, Doc(str(p), lines)
    except RecursionError:
        raise InputError(f"{p}: nested too deeply") from None


# ---- checks ----------------------------------------------------------------------------------


def _bad(doc: Doc, keys, problem: str, value=None, show=True) -> InputError:
    tail = f", got {plain(value)}" if show else ""
    return InputError(f"{doc.at(*keys)}: {problem}{tail}")


def mapping(v: Any, doc: Doc, *keys: str | int, required: Iterable[str] = ()) -> dict:
    if not isinstance(v, dict):
        raise _bad(doc, keys, "must be a mapping", v if not isinstance(v, (list, tuple)) else "a list")
    for k in required:
        if k not in v:
            raise InputError(f"{doc.at(*keys)}: missing field '{k}'" if keys else f"{doc.at()}: missing field '{k}'")
    return v


def number(
    v: Any, doc: Doc, *keys: str | int, lo: float | None = None, lo_open: bool = False, hi: float | None = None
) -> float:
    """A finite real number (not a string or boolean) within [lo, hi] (lo excluded if lo_open)."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise _bad(doc, keys, "must be a number", v)
    try:
        f = float(v)
    except OverflowError:
        raise _bad(doc, keys, "is too large", v) from None
    if not math.isfinite(f):
        raise _bad(doc, keys, "must be finite", v)
    if lo is not None and (f <= lo if lo_open else f < lo):
        raise _bad(doc, keys, f"must be {'>' if lo_open else '>='} {lo:g}", v)
    if hi is not None and f > hi:
        raise _bad(doc, keys, f"must be <= {hi:g}", v)
    return f


def integer(v: Any, doc: Doc, *keys: str | int, lo: float | None = None, hi: float | None = None) -> int:
    """An integer (an integral float like 8.0 is accepted; 8.5, '8', true are not)."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise _bad(doc, keys, "must be an integer", v)
    if isinstance(v, float) and not (math.isfinite(v) and v.is_integer()):
        raise _bad(doc, keys, "must be an integer", v)
    i = int(v)
    if lo is not None and i < lo:
        raise _bad(doc, keys, f"must be >= {lo}", v)
    if hi is not None and i > hi:
        raise _bad(doc, keys, f"must be <= {hi}", v)
    return i


def number_list(
    v: Any,
    doc: Doc,
    *keys: str | int,
    lo: float | None = None,
    hi: float | None = None,
    ints: bool = False,
    increasing: bool = False,
) -> list:
    """A non-empty list of numbers (integers if ints), each checked, strictly increasing if asked."""
    if not isinstance(v, list):
        raise _bad(doc, keys, "must be a list", v)
    if not v:
        raise _bad(doc, keys, "must not be empty", show=False)
    out = []
    for i, x in enumerate(v):
        out.append(integer(x, doc, *keys, i, lo=lo, hi=hi) if ints else number(x, doc, *keys, i, lo=lo, hi=hi))
        if increasing and i and out[i] <= out[i - 1]:
            raise _bad(doc, (*keys, i), f"must be strictly increasing (after {plain(out[i - 1])})", x)
    return out


def text(v: Any, doc: Doc, *keys: str | int) -> str:
    if isinstance(v, bool) or not isinstance(v, (str, int, float)) or (isinstance(v, str) and not v.strip()):
        raise _bad(doc, keys, "must be a non-empty string", v)
    return str(v)


# ---- kernel tables ---------------------------------------------------------------------------

MAX_KERNEL_RECORDS = 5_000_000
MAX_KERNEL_MS = 1e7  # one kernel call of almost three hours is not a measurement
MAX_SHAPE = 10**15  # sizes, bytes and counts


def kernel_table(d: Any, path: str, size_axis: dict, meta: Iterable[str], text_fields: Iterable[str]) -> list:
    """A kernel table's records, checked: ``{name?, provenance: {...}, records: [...]}`` with at
    least one record; each record an ``op`` of ``size_axis`` with its size field, ``ms`` a finite
    number >= 0 (not a boolean), every shape field a short string if it is one of
    ``text_fields`` (dtype, kind, ...), else an integer >= 0 (its size axis >= 1). ``meta``: the
    fields that are not shape (op, ms, note, ...)."""
    doc = Doc(str(path))
    if not isinstance(d, dict) or not isinstance(d.get("records"), list) or not isinstance(d.get("provenance"), dict):
        raise InputError(f"{path}: a kernel table needs 'provenance' (a mapping) and 'records' (a list)")
    recs = d["records"]
    if not recs:
        raise InputError(f"{path}: records: empty (a kernel table prices at least one op)")
    if len(recs) > MAX_KERNEL_RECORDS:
        raise InputError(f"{path}: records: {len(recs)} records, more than {MAX_KERNEL_RECORDS}")
    meta, text_fields = set(meta), set(text_fields)
    for i, r in enumerate(recs):
        if not isinstance(r, dict):
            raise _bad(doc, ("records", i), "must be a mapping", r if not isinstance(r, list) else "a list")
        op = r.get("op")
        if not isinstance(op, str) or op not in size_axis:
            raise _bad(doc, ("records", i, "op"), f"must be one of {', '.join(size_axis)}", op)
        if "ms" not in r:
            raise InputError(f"{doc.at('records', i)}: missing field 'ms'")
        number(r["ms"], doc, "records", i, "ms", lo=0, hi=MAX_KERNEL_MS)
        axis = size_axis[op]
        if axis not in r:
            raise InputError(f"{doc.at('records', i)}: {op} record without '{axis}'")
        for k, v in r.items():
            if k in meta:
                continue
            if k in text_fields:
                if not isinstance(v, str) or not v.strip():
                    raise _bad(doc, ("records", i, k), "must be a non-empty string", v)
                if len(v) > 200:
                    raise _bad(doc, ("records", i, k), "is too long a string (at most 200 characters)", v)
                continue
            integer(v, doc, "records", i, k, lo=1 if k == axis else 0, hi=MAX_SHAPE)
    return recs
