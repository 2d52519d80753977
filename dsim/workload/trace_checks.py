"""What every trace reader shares: the bounds on a trace (``MAX_TOKENS``, ``MAX_SPAN_S``, ...), the
one-line error naming ``path:line: field`` (``trace_error``), the row-to-line mapping
(``RowLocator``, ``csv_data_lines``), the CSV frame and JSONL record readers and the column checks
(``int_column``, ``check_monotone``). Parsing is vectorized; only when something is wrong is the
file rescanned row by row to find the first bad line; lines are 1-based as an editor shows them
(CSV header = line 1)."""

from __future__ import annotations

import csv
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from dsim.errors import InputError, plain, where

#: Largest token count accepted for one request's prompt or output: well above any model's
#: context (the largest public ones are ~10M tokens); beyond it a value is a corrupt row.
MAX_TOKENS = 16_777_216
#: Longest span of arrival times accepted (about 31 years): a later arrival is a corrupt row.
MAX_SPAN_S = 1e9
# A trace is read whole into memory: the largest public ones (BurstGPT, about 10 M rows and
# 0.6 GB of CSV) fit well under these; past them a file is refused before it is read.
MAX_TRACE_BYTES = 4 << 30
MAX_TRACE_ROWS = 50_000_000
MAX_LINE_CHARS = 16 << 20  # one JSONL record (a long prompt's block hashes are a few KB)


class RowLocator:
    """Maps a trace's data row (0-based) to ``path:line`` as an editor numbers lines (CSV: the
    header is line 1, blank lines counted; JSONL: the record's line; Parquet: ``row N``). CSV
    line numbers are found by a scan on first use only (error paths); picklable (the scan's
    result is not carried along)."""

    def __init__(self, path, kind: str, lines=None):
        self.path, self.kind = str(path), kind
        self._lines = None if lines is None else np.asarray(lines)

    def __call__(self, row: int) -> str:
        if self.kind == "parquet":
            return f"{self.path}: row {row + 1}"
        if self._lines is None:
            self._lines = np.asarray(csv_data_lines(Path(self.path)))
        return f"{self.path}:{int(self._lines[row])}"

    def __getstate__(self):
        return {"path": self.path, "kind": self.kind, "_lines": self._lines if self.kind == "lines" else None}


def trace_error(path, line, fieldname, problem) -> InputError:
    return InputError(f"{where(path, line, fieldname)}: {problem}")


def csv_data_lines(path: Path) -> list[int]:
    """Physical 1-based line number of each data row of a CSV (header skipped), as pandas
    counts rows (blank lines skipped). Only used on the error path."""
    lines = []
    with open(path, newline="", encoding="utf-8-sig", errors="replace") as f:
        r = csv.reader(f)
        first = True
        start = 1
        for row in r:
            if not row or all(not c.strip() for c in row) and len(row) <= 1:
                start = r.line_num + 1
                continue
            if first:
                first = False
            else:
                lines.append(start)
            start = r.line_num + 1
    return lines


def csv_scan_shape(path: Path) -> None:
    """Find the first row whose field count differs from the header and raise for it."""
    with open(path, newline="", encoding="utf-8-sig", errors="replace") as f:
        r = csv.reader(f)
        header = None
        start = 1
        try:
            for row in r:
                line = start
                start = r.line_num + 1
                if not row or (len(row) == 1 and not row[0].strip()):
                    continue
                if header is None:
                    header = row
                    continue
                if len(row) != len(header):
                    raise trace_error(path, line, None, f"malformed row: {len(row)} fields, header has {len(header)}")
        except csv.Error as e:
            raise trace_error(path, start, None, f"malformed CSV ({e})") from None


def int_column(
    values: pd.Series, path, fieldname: str, lines, *, allow_zero=False, tokens: bool | None = None
) -> np.ndarray:
    """Strings/numbers -> int64, with the first bad row reported by line. tokens: a token count
    (bounded by MAX_TOKENS); by default every column that must be > 0."""
    tokens = (not allow_zero) if tokens is None else tokens
    num = pd.to_numeric(values, errors="coerce")
    a = num.to_numpy(dtype=np.float64, na_value=np.nan)
    bad_num = ~np.isfinite(a)
    bad_int = ~bad_num & (a != np.round(a))
    bad_val = ~bad_num & ~bad_int & ((a < 0) if allow_zero else (a <= 0))
    bad_big = ~bad_num & ~bad_int & ~bad_val & (a > (MAX_TOKENS if tokens else np.iinfo(np.int64).max / 2))
    bad = bad_num | bad_int | bad_val | bad_big
    if bad.any():
        i = int(np.argmax(bad))
        raw = values.iloc[i]
        line = lines()[i] if callable(lines) else lines[i]
        if bad_num[i]:
            if raw is None or (isinstance(raw, float) and np.isnan(raw)) or (isinstance(raw, str) and not raw.strip()):
                raise trace_error(path, line, fieldname, "missing value")
            raise trace_error(path, line, fieldname, f"not a number: {plain(raw)}")
        if bad_int[i]:
            raise trace_error(path, line, fieldname, f"not an integer: {plain(raw)}")
        if bad_big[i]:
            raise trace_error(
                path,
                line,
                fieldname,
                f"{plain(raw)} is too large (at most {MAX_TOKENS} tokens)" if tokens else f"{plain(raw)} is too large",
            )
        raise trace_error(
            path,
            line,
            fieldname,
            f"must be > 0, got {plain(raw)}" if not allow_zero else f"must be >= 0, got {plain(raw)}",
        )
    return a.astype(np.int64)


def check_monotone(t: np.ndarray, path, fieldname, lines, raw=None) -> None:
    if len(t) > 1:
        back = np.diff(t) < 0
        if back.any():
            i = int(np.argmax(back)) + 1
            ln = lines() if callable(lines) else lines
            val = (lambda j: plain(raw[j])) if raw is not None else (lambda j: f"{t[j]:g}")
            raise trace_error(
                path,
                ln[i],
                fieldname,
                f"timestamp goes back in time: {val(i)} is before {val(i - 1)} on line {ln[i - 1]}"
                " (timestamps must be non-decreasing: sort the trace by time)",
            )


class Cols(dict):
    """arrival (float64 s, unshifted), prompt, output (int64), optional session (int64),
    cls_names (object array), hashes (list), notes (list[str]), lines (callable -> row lines)."""


def read_csv_frame(
    path: Path, required: Sequence[str], optional: Sequence[str] = (), str_cols: Sequence[str] = ()
) -> pd.DataFrame:
    """Read the wanted columns; numbers are parsed by pandas' C parser (a column with a bad value
    comes back as strings and is checked row by row by the column helpers)."""
    strs = set(str_cols)
    try:
        df = pd.read_csv(
            path,
            keep_default_na=False,
            skipinitialspace=True,
            encoding="utf-8-sig",
            dtype={c: str for c in strs} or None,
            nrows=MAX_TRACE_ROWS + 1,
        )
    except pd.errors.EmptyDataError:
        raise trace_error(path, None, None, "empty trace (no header, no rows)") from None
    except pd.errors.ParserError:
        csv_scan_shape(path)
        raise trace_error(path, None, None, "malformed CSV") from None
    except UnicodeDecodeError as e:
        raise trace_error(path, None, None, f"not a UTF-8 text file ({e.reason} at byte {e.start})") from None
    df.columns = [str(c).strip() for c in df.columns]
    missing = [c for c in required if c not in df.columns]
    if missing:
        raise trace_error(
            path, 1, None, f"missing column(s) {', '.join(missing)} (header has: {first_line(path)[:120]})"
        )
    for c in strs & set(df.columns):
        df[c] = df[c].astype(str)
    if len(df) == 0:
        raise trace_error(path, None, None, "empty trace (header but no requests)")
    if len(df) > MAX_TRACE_ROWS:
        raise trace_error(path, None, None, f"more than {MAX_TRACE_ROWS} requests (refused)")
    # pandas fills short rows with "" (keep_default_na=False) -> reported as missing values later;
    # it raises on long rows (handled above).
    return df


def lazy(fn):
    cache = []

    def get() -> Any:
        if not cache:
            cache.append(fn())
        return cache[0]

    return get


def is_int(v) -> bool:
    return (type(v) is int) or (type(v) is float and v.is_integer())


def jsonl_records(path: Path):
    """Yield (line_number, dict) for each non-blank line, raising InputError for bad JSON."""
    try:
        f = open(path, encoding="utf-8-sig")
    except OSError as e:
        raise trace_error(path, None, None, f"cannot read ({e.strerror})") from None
    with f:
        try:
            for ln, text in enumerate(iter(lambda: f.readline(MAX_LINE_CHARS + 1), ""), 1):
                if len(text) > MAX_LINE_CHARS:
                    raise trace_error(
                        path, ln, None, f"line longer than {MAX_LINE_CHARS} characters (not a trace record)"
                    )
                if not text.strip():
                    continue
                try:
                    rec = json.loads(text)
                except json.JSONDecodeError as e:
                    raise trace_error(path, ln, None, f"malformed JSON ({e.msg} at column {e.colno})") from None
                if not isinstance(rec, dict):
                    raise trace_error(path, ln, None, "malformed row: expected a JSON object")
                if ln > MAX_TRACE_ROWS:
                    raise trace_error(path, ln, None, f"more than {MAX_TRACE_ROWS} requests (refused)")
                yield ln, rec
        except UnicodeDecodeError as e:
            raise trace_error(path, None, None, f"not a UTF-8 text file ({e.reason})") from None


def read_jsonl(path: Path, tkey: str, pkey: str, okey: str, hkey: str, *, native: bool) -> Cols:
    lines, ts, ps, os_, hs, cl, se = [], [], [], [], [], [], []
    has_h = has_c = has_s = False
    req = (tkey, pkey, okey)
    for ln, rec in jsonl_records(path):
        try:
            t, p, o = rec[tkey], rec[pkey], rec[okey]
        except KeyError:
            miss = [k for k in req if k not in rec]
            raise trace_error(path, ln, miss[0], "missing field") from None
        lines.append(ln)
        ts.append(t)
        ps.append(p)
        os_.append(o)
        h = rec.get(hkey)
        if h is not None:
            if not isinstance(h, list):
                raise trace_error(path, ln, hkey, "expected a list of integers")
            a = np.asarray(h)
            if a.size and (a.dtype.kind not in "iu" or a.ndim != 1):
                raise trace_error(path, ln, hkey, "expected a list of integers")
            hs.append(a.astype(np.int64))
            has_h = True
        else:
            hs.append(None)
        if native:
            c = rec.get("class")
            if c is not None:
                if not isinstance(c, str) or not c.strip():
                    raise trace_error(path, ln, "class", f"expected a class name, got {plain(c)}")
                has_c = True
            cl.append(c)
            s = rec.get("session_id", -1)
            if s != -1:
                if not is_int(s) or isinstance(s, bool):
                    raise trace_error(path, ln, "session_id", f"not an integer: {plain(s)}")
                has_s = True
            se.append(s)
    if not lines:
        raise trace_error(path, None, None, "empty trace (no requests)")
    lines_arr = np.asarray(lines)

    def num(vals: Any, key: str, *, time: bool = False) -> np.ndarray:
        a = None
        if set(map(type, vals)) <= {int, float}:  # no str, bool, None, list
            try:
                a = np.array(vals, dtype=np.float64)
            except (TypeError, ValueError, OverflowError):
                a = None
        if a is None or a.shape != (len(vals),):
            for i, v in enumerate(vals):
                if isinstance(v, bool) or not isinstance(v, (int, float)):
                    raise trace_error(path, lines_arr[i], key, f"not a number: {plain(v)}")
                try:
                    float(v)
                except OverflowError:
                    raise trace_error(path, lines_arr[i], key, f"{plain(v)} is too large") from None
            raise trace_error(path, None, key, "not a number")  # pragma: no cover
        big = MAX_TOKENS if not time else np.inf
        bad = ~np.isfinite(a) | ((a < 0) if time else (a <= 0) | (a != np.round(a)) | (a > big))
        if bad.any():
            i = int(np.argmax(bad))
            v = vals[i]
            if not np.isfinite(a[i]):
                prob = f"not a number: {plain(v)}"
            elif time:
                prob = f"must be >= 0, got {plain(v)}"
            elif a[i] <= 0:
                prob = f"must be > 0, got {plain(v)}"
            elif a[i] != np.round(a[i]):
                prob = f"not an integer: {plain(v)}"
            else:
                prob = f"{plain(v)} is too large (at most {MAX_TOKENS} tokens)"
            raise trace_error(path, lines_arr[i], key, prob)
        return a

    t = num(ts, tkey, time=True)
    out = Cols(
        arrival=t,
        prompt=num(ps, pkey).astype(np.int64),
        output=num(os_, okey).astype(np.int64),
        lines=lines_arr,
        notes=[],
        tfield=tkey,
    )
    if has_h:
        out["hashes"] = [h if h is not None else np.zeros(0, np.int64) for h in hs]
    if has_c:
        if any(c is None for c in cl):
            i = next(i for i, c in enumerate(cl) if c is None)
            raise trace_error(path, lines_arr[i], "class", "missing value (other rows have a class)")
        out["cls_names"] = np.array([c.strip() for c in cl], dtype=object)
    if has_s:
        out["session"] = np.array([int(s) for s in se], dtype=np.int64)
    return out


def first_line(path: Path) -> str:
    try:
        with open(path, encoding="utf-8-sig", errors="replace") as f:
            for text in f:
                if text.strip():
                    return text.strip()
    except OSError as e:
        raise trace_error(path, None, None, f"cannot read ({e.strerror})") from None
    raise trace_error(path, None, None, "empty trace (empty file)")


def check_text(path: Path, head_bytes: bytes) -> None:
    """A trace read as text must be text: NUL bytes or invalid UTF-8 at the start mean binary
    data (say so instead of echoing it)."""
    nul = head_bytes.find(b"\0")
    if nul >= 0:
        raise trace_error(path, None, None, f"not a text trace (binary data: NUL byte at byte {nul})")
    try:
        head_bytes.decode("utf-8")
    except UnicodeDecodeError as e:
        if e.start < len(head_bytes) - 4:  # not just a character cut at the 4 KiB edge
            raise trace_error(path, None, None, f"not a UTF-8 text trace ({e.reason} at byte {e.start})") from None
