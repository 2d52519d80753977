"""Trace files read into a :class:`~dsim.workload.table.Workload` (``load_workload``, by path or
public trace name) and written from one (``save_workload``). Readers:

* ``azure``      Azure LLM inference trace CSV, 2023 and 2024 (TIMESTAMP, ContextTokens,
                 GeneratedTokens); timestamps with up to 9 fractional digits, naive (read as
                 UTC) or with a timezone offset / ``Z``.
* ``mooncake``   Mooncake JSONL (timestamp in ms, input_length, output_length, hash_ids =
                 prefix blocks of 512 tokens).
* ``burstgpt``   BurstGPT CSV (Timestamp, [Session ID,] Elapsed time, Model, Request tokens,
                 Response tokens, Total tokens, Log Type). Rows with Response tokens == 0 are
                 failed requests: they are dropped and the count is reported in ``source``.
* ``native-csv``, ``native-jsonl``, ``native-parquet``: dsim's own format (traces/README.md).

Bad input raises :class:`dsim.errors.InputError` with ``path:line: field: problem``; lines are
1-based as an editor shows them (CSV header = line 1). Parsing is vectorized; only when
something is wrong is the file rescanned row by row to find the first bad line. (Over 800 lines:
the six formats share those checking and line-locating helpers, which would otherwise be passed
between modules.)
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from dsim.errors import InputError, plain, shown, where
from dsim.workload.table import (
    DEFAULT_CLASSES,
    DEFAULT_MIX,
    MOONCAKE_BLOCK_TOKENS,
    Workload,
    assign_classes,
    head,
    parse_mix,
    scale_rate,
    time_window,
)

FORMATS = ("azure", "mooncake", "burstgpt", "native-csv", "native-jsonl", "native-parquet")
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
#: Public trace names -> file name in the trace directory (DSIM_TRACE_DIR or ../shared/traces).
TRACE_FILES: dict[str, str] = {
    "azure-conv": "AzureLLMInferenceTrace_conv.csv",
    "azure-code": "AzureLLMInferenceTrace_code.csv",
    "azure-conv-2024": "AzureLLMInferenceTrace_conv_1week.csv",
    "azure-code-2024": "AzureLLMInferenceTrace_code_1week.csv",
    "mooncake-conversation": "conversation_trace.jsonl",
    "mooncake-synthetic": "synthetic_trace.jsonl",
    "mooncake-toolagent": "toolagent_trace.jsonl",
    "burstgpt": "BurstGPT_1.csv",
}

# --------------------------------------------------------------------------------------------
# Locating traces
# --------------------------------------------------------------------------------------------


def _repo_root() -> Path:
    return Path(__file__).resolve().parents[2]


def _trace_dir() -> Path:
    env = os.environ.get("DSIM_TRACE_DIR")
    if env:
        return Path(env).expanduser()
    return _repo_root().parent / "shared" / "traces"


def _default_path() -> Path:
    """traces/default.jsonl of the source tree (editable install / checkout); else a packaged
    copy under dsim/data/ if a build put one there."""
    p = _repo_root() / "traces" / "default.jsonl"
    if p.is_file():
        return p
    try:
        from importlib.resources import files

        r = files("dsim").joinpath("data", "default.jsonl")
        if r.is_file():
            return Path(str(r))
    except Exception:  # pragma: no cover - packaging variants
        pass
    raise InputError(f"{p}: default workload not found (is the dsim source tree complete?)")


def trace_names() -> list[str]:
    return ["default", *TRACE_FILES]


def resolve_trace(path_or_name: str | Path) -> tuple[Path, str | None]:
    """Map a path or a trace name to (path, name or None)."""
    s = str(path_or_name)
    p = Path(s).expanduser()
    if p.exists():
        return p, None
    if s == "default":
        return _default_path(), "default"
    if s in TRACE_FILES:
        d = _trace_dir()
        q = d / TRACE_FILES[s]
        if not q.is_file():
            raise InputError(
                f"{q}: trace {s!r} not found (set DSIM_TRACE_DIR to the folder holding "
                f"{TRACE_FILES[s]}; see traces/README.md for downloads)"
            )
        return q, s
    if any(ch in s for ch in "/\\.") or not s:
        raise InputError(f"{s}: no such file")
    raise InputError(f"{s}: no such file or trace name (names: {', '.join(trace_names())})")


# --------------------------------------------------------------------------------------------
# Helpers for error reporting
# --------------------------------------------------------------------------------------------


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
            self._lines = np.asarray(_csv_data_lines(Path(self.path)))
        return f"{self.path}:{int(self._lines[row])}"

    def __getstate__(self):
        return {"path": self.path, "kind": self.kind, "_lines": self._lines if self.kind == "lines" else None}


def _err(path, line, fieldname, problem) -> InputError:
    return InputError(f"{where(path, line, fieldname)}: {problem}")


def _csv_data_lines(path: Path) -> list[int]:
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


def _csv_scan_shape(path: Path) -> None:
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
                    raise _err(path, line, None, f"malformed row: {len(row)} fields, header has {len(header)}")
        except csv.Error as e:
            raise _err(path, start, None, f"malformed CSV ({e})") from None


def _int_column(
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
                raise _err(path, line, fieldname, "missing value")
            raise _err(path, line, fieldname, f"not a number: {plain(raw)}")
        if bad_int[i]:
            raise _err(path, line, fieldname, f"not an integer: {plain(raw)}")
        if bad_big[i]:
            raise _err(
                path,
                line,
                fieldname,
                f"{plain(raw)} is too large (at most {MAX_TOKENS} tokens)" if tokens else f"{plain(raw)} is too large",
            )
        raise _err(
            path,
            line,
            fieldname,
            f"must be > 0, got {plain(raw)}" if not allow_zero else f"must be >= 0, got {plain(raw)}",
        )
    return a.astype(np.int64)


def _check_monotone(t: np.ndarray, path, fieldname, lines, raw=None) -> None:
    if len(t) > 1:
        back = np.diff(t) < 0
        if back.any():
            i = int(np.argmax(back)) + 1
            ln = lines() if callable(lines) else lines
            val = (lambda j: plain(raw[j])) if raw is not None else (lambda j: f"{t[j]:g}")
            raise _err(
                path,
                ln[i],
                fieldname,
                f"timestamp goes back in time: {val(i)} is before {val(i - 1)} on line {ln[i - 1]}"
                " (timestamps must be non-decreasing: sort the trace by time)",
            )


# --------------------------------------------------------------------------------------------
# Readers -> dict of columns
# --------------------------------------------------------------------------------------------


class _Cols(dict):
    """arrival (float64 s, unshifted), prompt, output (int64), optional session (int64),
    cls_names (object array), hashes (list), notes (list[str]), lines (callable -> row lines)."""


def _read_csv_frame(
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
        raise _err(path, None, None, "empty trace (no header, no rows)") from None
    except pd.errors.ParserError:
        _csv_scan_shape(path)
        raise _err(path, None, None, "malformed CSV") from None
    except UnicodeDecodeError as e:
        raise _err(path, None, None, f"not a UTF-8 text file ({e.reason} at byte {e.start})") from None
    df.columns = [str(c).strip() for c in df.columns]
    missing = [c for c in required if c not in df.columns]
    if missing:
        raise _err(path, 1, None, f"missing column(s) {', '.join(missing)} (header has: {_first_line(path)[:120]})")
    for c in strs & set(df.columns):
        df[c] = df[c].astype(str)
    if len(df) == 0:
        raise _err(path, None, None, "empty trace (header but no requests)")
    if len(df) > MAX_TRACE_ROWS:
        raise _err(path, None, None, f"more than {MAX_TRACE_ROWS} requests (refused)")
    # pandas fills short rows with "" (keep_default_na=False) -> reported as missing values later;
    # it raises on long rows (handled above).
    return df


def _read_azure(path: Path) -> _Cols:
    req = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
    df = _read_csv_frame(path, req, str_cols=("TIMESTAMP",))
    lines = _lazy(lambda: _csv_data_lines(path))
    ts = pd.to_datetime(df["TIMESTAMP"].str.strip(), format="ISO8601", utc=True, errors="coerce")
    if ts.isna().any():
        i = int(np.argmax(ts.isna().to_numpy()))
        raw = df["TIMESTAMP"].iloc[i]
        raise _err(
            path, lines()[i], "TIMESTAMP", "missing value" if not raw.strip() else f"not a timestamp: {plain(raw)}"
        )
    ns = ts.dt.tz_convert(None).to_numpy().astype("datetime64[ns]").view(np.int64)
    t = ((ns - ns[0]) / 1e9).astype(np.float64)  # relative first: keeps sub-microsecond precision
    return _Cols(
        arrival=t,
        notes=[f"t0={ts.iloc[0].isoformat()}"],
        raw_t=df["TIMESTAMP"].to_numpy(),
        tfield="TIMESTAMP",
        prompt=_int_column(df["ContextTokens"], path, "ContextTokens", lines),
        output=_int_column(df["GeneratedTokens"], path, "GeneratedTokens", lines),
        lines=lines,
    )


def _read_burstgpt(path: Path) -> _Cols:
    req = ("Timestamp", "Request tokens", "Response tokens")
    df = _read_csv_frame(path, req, optional=("Session ID",))
    lines = _lazy(lambda: _csv_data_lines(path))
    tnum = pd.to_numeric(df["Timestamp"], errors="coerce").to_numpy(dtype=np.float64, na_value=np.nan)
    bad = ~np.isfinite(tnum) | (tnum < 0)
    if bad.any():
        i = int(np.argmax(bad))
        raise _err(path, lines()[i], "Timestamp", f"not a time in seconds >= 0: {plain(df['Timestamp'].iloc[i])}")
    output = _int_column(df["Response tokens"], path, "Response tokens", lines, allow_zero=True, tokens=True)
    keep = output > 0
    notes = []
    dropped = int((~keep).sum())
    if dropped:
        # failed requests (Response tokens = 0): dropped before any other check of their fields
        notes.append(f"dropped {dropped} failed requests (Response tokens = 0)")
        if not keep.any():
            raise _err(path, None, None, "empty trace: every request failed (Response tokens = 0)")
        all_lines = lines
        lines = _lazy(lambda: list(np.asarray(all_lines())[keep]))
        df = df[keep]
    prompt = _int_column(df["Request tokens"], path, "Request tokens", lines)
    session = None
    if "Session ID" in df.columns:
        session = _int_column(df["Session ID"], path, "Session ID", lines, allow_zero=True)
    return _Cols(
        arrival=tnum[keep],
        prompt=prompt,
        output=output[keep],
        session=session,
        lines=lines,
        notes=notes,
        tfield="Timestamp",
        raw_t=df["Timestamp"].to_numpy(),
        data_rows=np.flatnonzero(keep),
    )


def _read_native_csv(path: Path) -> _Cols:
    df = _read_csv_frame(
        path,
        ("arrival_s", "prompt_tokens", "output_tokens"),
        optional=("class", "session_id", "prefix_hashes"),
        str_cols=("class", "session_id", "prefix_hashes"),
    )
    lines = _lazy(lambda: _csv_data_lines(path))
    t = pd.to_numeric(df["arrival_s"], errors="coerce").to_numpy(dtype=np.float64, na_value=np.nan)
    bad = ~np.isfinite(t) | (t < 0)
    if bad.any():
        i = int(np.argmax(bad))
        raw = df["arrival_s"].iloc[i]
        raise _err(
            path,
            lines()[i],
            "arrival_s",
            "missing value" if not str(raw).strip() else f"not a time in seconds >= 0: {plain(raw)}",
        )
    out = _Cols(
        arrival=t,
        prompt=_int_column(df["prompt_tokens"], path, "prompt_tokens", lines),
        output=_int_column(df["output_tokens"], path, "output_tokens", lines),
        lines=lines,
        notes=[],
    )
    if "session_id" in df.columns:
        s = df["session_id"].str.strip()
        s = s.where(s != "", "-1")
        neg = (s == "-1").to_numpy()
        sess = _int_column(s.where(~neg, "0"), path, "session_id", lines, allow_zero=True)
        sess[neg] = -1
        out["session"] = sess
    if "class" in df.columns:
        c = df["class"].str.strip()
        if (c == "").any():
            i = int(np.argmax((c == "").to_numpy()))
            raise _err(path, lines()[i], "class", "missing value")
        out["cls_names"] = c.to_numpy(dtype=object)
    if "prefix_hashes" in df.columns:
        hashes = []
        col = df["prefix_hashes"].to_numpy()
        for i, s in enumerate(col):
            s = s.strip()
            try:
                hashes.append(np.array(s.split(), dtype=np.int64) if s else np.zeros(0, np.int64))
            except (ValueError, OverflowError):
                raise _err(
                    path, lines()[i], "prefix_hashes", f"expected space-separated integers, got {s[:40]!r}"
                ) from None
        out["hashes"] = hashes
    return out


def _lazy(fn):
    cache = []

    def get() -> Any:
        if not cache:
            cache.append(fn())
        return cache[0]

    return get


def _is_int(v) -> bool:
    return (type(v) is int) or (type(v) is float and v.is_integer())


def _jsonl_records(path: Path):
    """Yield (line_number, dict) for each non-blank line, raising InputError for bad JSON."""
    try:
        f = open(path, encoding="utf-8-sig")
    except OSError as e:
        raise _err(path, None, None, f"cannot read ({e.strerror})") from None
    with f:
        try:
            for ln, text in enumerate(iter(lambda: f.readline(MAX_LINE_CHARS + 1), ""), 1):
                if len(text) > MAX_LINE_CHARS:
                    raise _err(path, ln, None, f"line longer than {MAX_LINE_CHARS} characters (not a trace record)")
                if not text.strip():
                    continue
                try:
                    rec = json.loads(text)
                except json.JSONDecodeError as e:
                    raise _err(path, ln, None, f"malformed JSON ({e.msg} at column {e.colno})") from None
                if not isinstance(rec, dict):
                    raise _err(path, ln, None, "malformed row: expected a JSON object")
                if ln > MAX_TRACE_ROWS:
                    raise _err(path, ln, None, f"more than {MAX_TRACE_ROWS} requests (refused)")
                yield ln, rec
        except UnicodeDecodeError as e:
            raise _err(path, None, None, f"not a UTF-8 text file ({e.reason})") from None


def _read_jsonl(path: Path, tkey: str, pkey: str, okey: str, hkey: str, *, native: bool) -> _Cols:
    lines, ts, ps, os_, hs, cl, se = [], [], [], [], [], [], []
    has_h = has_c = has_s = False
    req = (tkey, pkey, okey)
    for ln, rec in _jsonl_records(path):
        try:
            t, p, o = rec[tkey], rec[pkey], rec[okey]
        except KeyError:
            miss = [k for k in req if k not in rec]
            raise _err(path, ln, miss[0], "missing field") from None
        lines.append(ln)
        ts.append(t)
        ps.append(p)
        os_.append(o)
        h = rec.get(hkey)
        if h is not None:
            if not isinstance(h, list):
                raise _err(path, ln, hkey, "expected a list of integers")
            a = np.asarray(h)
            if a.size and (a.dtype.kind not in "iu" or a.ndim != 1):
                raise _err(path, ln, hkey, "expected a list of integers")
            hs.append(a.astype(np.int64))
            has_h = True
        else:
            hs.append(None)
        if native:
            c = rec.get("class")
            if c is not None:
                if not isinstance(c, str) or not c.strip():
                    raise _err(path, ln, "class", f"expected a class name, got {plain(c)}")
                has_c = True
            cl.append(c)
            s = rec.get("session_id", -1)
            if s != -1:
                if not _is_int(s) or isinstance(s, bool):
                    raise _err(path, ln, "session_id", f"not an integer: {plain(s)}")
                has_s = True
            se.append(s)
    if not lines:
        raise _err(path, None, None, "empty trace (no requests)")
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
                    raise _err(path, lines_arr[i], key, f"not a number: {plain(v)}")
                try:
                    float(v)
                except OverflowError:
                    raise _err(path, lines_arr[i], key, f"{plain(v)} is too large") from None
            raise _err(path, None, key, "not a number")  # pragma: no cover
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
            raise _err(path, lines_arr[i], key, prob)
        return a

    t = num(ts, tkey, time=True)
    out = _Cols(
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
            raise _err(path, lines_arr[i], "class", "missing value (other rows have a class)")
        out["cls_names"] = np.array([c.strip() for c in cl], dtype=object)
    if has_s:
        out["session"] = np.array([int(s) for s in se], dtype=np.int64)
    return out


def _read_mooncake(path: Path) -> _Cols:
    c = _read_jsonl(path, "timestamp", "input_length", "output_length", "hash_ids", native=False)
    c["arrival"] = c["arrival"] / 1000.0  # ms -> s
    c["time_unit"] = "ms"
    return c


def _read_native_jsonl(path: Path) -> _Cols:
    return _read_jsonl(path, "arrival_s", "prompt_tokens", "output_tokens", "prefix_hashes", native=True)


# The columns a native Parquet trace may carry, by what their Arrow type must be; others are never read.
_PARQUET_COLUMNS = {
    "arrival_s": "number",
    "prompt_tokens": "number",
    "output_tokens": "number",
    "session_id": "number",
    "class": "label",
    "prefix_hashes": "integer list",
}


def _parquet_type_fits(t, kind: str) -> bool:
    """Whether an Arrow type can hold a column of this kind (strings and booleans in a number
    column pass here: the values are then named with their row)."""
    import pyarrow.types as pt

    if pt.is_null(t):
        return True
    if pt.is_dictionary(t):
        return kind == "label" and (pt.is_string(t.value_type) or pt.is_large_string(t.value_type))
    flat = pt.is_integer(t) or pt.is_floating(t) or pt.is_boolean(t) or pt.is_string(t) or pt.is_large_string(t)
    if kind in ("number", "label"):
        return flat
    return (pt.is_list(t) or pt.is_large_list(t)) and (pt.is_integer(t.value_type) or pt.is_null(t.value_type))


def _parquet_frame(path: Path) -> pd.DataFrame:
    """The trace's columns, read after the file's footer says they are sane: the row count
    (MAX_TRACE_ROWS), the columns' types (nothing nested where a number belongs) and their
    uncompressed size (MAX_TRACE_BYTES: a small file can decompress to far more) are checked
    before any data is read, and the size again as the row groups are read (a footer may lie).
    Columns dsim does not use are not read."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        pf = pq.ParquetFile(path)
        schema, meta = pf.schema_arrow, pf.metadata
    except Exception as e:  # pyarrow raises several types for a bad file
        raise _err(path, None, None, f"not a readable Parquet file ({type(e).__name__}: {str(e)[:120]})") from None
    names = list(schema.names)
    missing = [c for c in ("arrival_s", "prompt_tokens", "output_tokens") if c not in names]
    if missing:
        has = ", ".join(names[:20]) + (f", ... ({len(names)} columns)" if len(names) > 20 else "")
        raise _err(path, None, None, f"missing column(s) {', '.join(missing)} (has: {has})")
    if meta.num_rows > MAX_TRACE_ROWS:
        raise _err(path, None, None, f"{meta.num_rows} rows: more than {MAX_TRACE_ROWS} requests (refused)")
    cols = [c for c in _PARQUET_COLUMNS if c in names]
    for c in cols:
        t = schema.field(c).type
        if not _parquet_type_fits(t, _PARQUET_COLUMNS[c]):
            raise _err(path, None, c, f"column type {t} (expected {_PARQUET_COLUMNS[c]}s)")
    wanted = {c: [] for c in cols}
    for g in range(meta.num_row_groups):
        rg = meta.row_group(g)
        for j in range(rg.num_columns):
            cc = rg.column(j)
            top = cc.path_in_schema.split(".")[0]
            if top in wanted:
                # decoded, a value takes up to 8 bytes (run-length encoded pages report far less)
                wanted[top].append(max(cc.total_uncompressed_size, 8 * cc.num_values))
    size = sum(sum(v) for v in wanted.values())
    too_big = f"more than {MAX_TRACE_BYTES >> 20} MiB of data once decompressed (refused)"
    if size > MAX_TRACE_BYTES:
        raise _err(path, None, None, f"{size >> 20} MiB: {too_big}")
    batches, got = [], 0
    try:
        for b in pf.iter_batches(batch_size=1 << 16, columns=cols):
            got += b.nbytes
            if got > MAX_TRACE_BYTES:
                raise _err(path, None, None, too_big)
            batches.append(b)
        table = pa.Table.from_batches(batches, schema=pa.schema([schema.field(c) for c in cols]))
        return table.to_pandas()
    except InputError:
        raise
    except Exception as e:  # a corrupt page, a footer that does not match the data
        raise _err(path, None, None, f"not a readable Parquet file ({type(e).__name__}: {str(e)[:120]})") from None


def _read_native_parquet(path: Path) -> _Cols:
    df = _parquet_frame(path)
    if len(df) == 0:
        raise _err(path, None, None, "empty trace (no requests)")
    rows = np.arange(1, len(df) + 1)
    lines = [f"row {i}" for i in rows]
    for col in ("arrival_s", "prompt_tokens", "output_tokens", "session_id"):
        # Parquet columns are typed: numbers stored as strings (or booleans) are a broken writer,
        # as in JSONL, not something to coerce
        if col in df.columns and df[col].dtype.kind not in "iuf":
            vals = df[col].tolist()
            i = next(
                (
                    j
                    for j, v in enumerate(vals)
                    if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)))
                ),
                None,
            )
            if i is None:  # numbers with nulls: checked below as missing values
                continue
            raise _err(path, lines[i], col, f"not a number: {plain(vals[i])} (column type {df[col].dtype})")
    t = pd.to_numeric(df["arrival_s"], errors="coerce").to_numpy(dtype=np.float64, na_value=np.nan)
    bad = ~np.isfinite(t) | (t < 0)
    if bad.any():
        i = int(np.argmax(bad))
        raise _err(path, lines[i], "arrival_s", f"not a time in seconds >= 0: {plain(df['arrival_s'].iloc[i])}")
    out = _Cols(
        arrival=t,
        prompt=_int_column(df["prompt_tokens"], path, "prompt_tokens", lines),
        output=_int_column(df["output_tokens"], path, "output_tokens", lines),
        lines=lines,
        notes=[],
    )
    if "session_id" in df.columns:
        s = pd.to_numeric(df["session_id"], errors="coerce").fillna(-1).to_numpy()
        out["session"] = s.astype(np.int64)
    if "class" in df.columns:
        c = df["class"]
        if c.isna().any() or (c.astype(str).str.strip() == "").any():
            i = int(np.argmax((c.isna() | (c.astype(str).str.strip() == "")).to_numpy()))
            raise _err(path, lines[i], "class", "missing value")
        out["cls_names"] = c.astype(str).str.strip().to_numpy(dtype=object)
    if "prefix_hashes" in df.columns:
        out["hashes"] = [
            np.zeros(0, np.int64) if h is None else np.asarray(h, dtype=np.int64) for h in df["prefix_hashes"].tolist()
        ]
    return out


_READERS = {
    "azure": _read_azure,
    "mooncake": _read_mooncake,
    "burstgpt": _read_burstgpt,
    "native-csv": _read_native_csv,
    "native-jsonl": _read_native_jsonl,
    "native-parquet": _read_native_parquet,
}


# --------------------------------------------------------------------------------------------
# Format detection
# --------------------------------------------------------------------------------------------


def _first_line(path: Path) -> str:
    try:
        with open(path, encoding="utf-8-sig", errors="replace") as f:
            for text in f:
                if text.strip():
                    return text.strip()
    except OSError as e:
        raise _err(path, None, None, f"cannot read ({e.strerror})") from None
    raise _err(path, None, None, "empty trace (empty file)")


def _check_text(path: Path, head_bytes: bytes) -> None:
    """A trace read as text must be text: NUL bytes or invalid UTF-8 at the start mean binary
    data (say so instead of echoing it)."""
    nul = head_bytes.find(b"\0")
    if nul >= 0:
        raise _err(path, None, None, f"not a text trace (binary data: NUL byte at byte {nul})")
    try:
        head_bytes.decode("utf-8")
    except UnicodeDecodeError as e:
        if e.start < len(head_bytes) - 4:  # not just a character cut at the 4 KiB edge
            raise _err(path, None, None, f"not a UTF-8 text trace ({e.reason} at byte {e.start})") from None


def detect_format(path: str | Path) -> str:
    """Detect the trace format from the extension and the header / first record."""
    path = Path(path)
    ext = "".join(path.suffixes[-1:]).lower()
    if ext in (".parquet", ".pq"):
        return "native-parquet"
    try:
        with open(path, "rb") as f:
            head_bytes = f.read(4096)
    except OSError as e:
        raise _err(path, None, None, f"cannot read ({e.strerror})") from None
    if head_bytes[:4] == b"PAR1":
        return "native-parquet"
    _check_text(path, head_bytes)
    first = _first_line(path)
    if ext in (".jsonl", ".json", ".ndjson") or first.startswith("{"):
        try:
            rec = json.loads(first)
        except json.JSONDecodeError:
            raise _err(path, 1, None, "unknown format: first line is not a JSON object") from None
        if isinstance(rec, dict):
            if "arrival_s" in rec:
                return "native-jsonl"
            if "input_length" in rec or ("timestamp" in rec and "output_length" in rec):
                return "mooncake"
        raise _err(
            path,
            1,
            None,
            "unknown format: JSON record with neither arrival_s (native) nor input_length/output_length (Mooncake)",
        )
    cols = [c.strip().strip('"') for c in next(csv.reader([first]))]
    if "ContextTokens" in cols or "GeneratedTokens" in cols or "TIMESTAMP" in cols:
        return "azure"
    if "Request tokens" in cols or "Response tokens" in cols:
        return "burstgpt"
    if "arrival_s" in cols or "prompt_tokens" in cols:
        return "native-csv"
    raise _err(
        path,
        1,
        None,
        f"unknown format: header {shown(first, 80)} matches no known trace (formats: {', '.join(FORMATS)})",
    )


_FMT_ALIASES = {
    "native": None,
    "csv": "native-csv",
    "jsonl": "native-jsonl",
    "parquet": "native-parquet",
    "azure2023": "azure",
    "azure2024": "azure",
    "bursty": "burstgpt",
}


def _norm_fmt(fmt: str, path: Path) -> str:
    f = str(fmt).lower().strip()
    if f == "auto":
        return detect_format(path)
    if f == "native":
        ext = path.suffix.lower()
        f = {
            ".csv": "native-csv",
            ".jsonl": "native-jsonl",
            ".json": "native-jsonl",
            ".parquet": "native-parquet",
            ".pq": "native-parquet",
        }.get(ext, "")
        if not f:
            raise _err(path, None, None, f"unknown format: native file needs .csv/.jsonl/.parquet, got {ext!r}")
        return f
    f = _FMT_ALIASES.get(f, f)
    if f not in _READERS:
        raise _err(path, None, None, f"unknown format {fmt!r} (use auto, {', '.join(FORMATS)})")
    return f


# --------------------------------------------------------------------------------------------
# load / save
# --------------------------------------------------------------------------------------------


def _default_mix_for(fmt: str, path: Path, name: str | None) -> dict[str, float]:
    if fmt == "azure" and (name == "azure-code" or name == "azure-code-2024" or "code" in path.name.lower()):
        return {"code": 1.0}
    return dict(DEFAULT_MIX)


def load_workload(
    path_or_name: str | Path,
    fmt: str = "auto",
    *,
    mix: Any = None,
    seed: int = 0,
    sort: bool = False,
    prefix_block_tokens: int | None = None,
    n: int | None = None,
    window: tuple[float, float] | None = None,
    rate_scale: float | None = None,
) -> Workload:
    """Load a trace by path or name ("default", "azure-conv", "azure-code",
    "mooncake-conversation", "mooncake-synthetic", ...).

    fmt: "auto" (extension + header/first record) or one of FORMATS ("native" picks by extension).
    mix: class mix (dict or "math=0.3,..." string) to assign instead of the trace's classes / the
         per-trace default; seed: its seed. sort: sort by arrival instead of rejecting a trace
         whose timestamps go back. Then, in this order: window=(t0, t1) s, n = first N requests,
         rate_scale = arrival rate multiplier.
    """
    path, name = resolve_trace(path_or_name)
    if path.is_dir():
        raise _err(path, None, None, "is a directory, not a trace file")
    if not os.access(path, os.R_OK):
        raise _err(path, None, None, "cannot read (permission denied)")
    from dsim.schema import check_input_file

    check_input_file(path, max_bytes=MAX_TRACE_BYTES)  # no device, FIFO or file past the bound
    f = _norm_fmt(fmt, path)
    c = _READERS[f](path)
    t = c["arrival"]
    order = None
    if sort:
        if len(t) > 1 and np.any(np.diff(t) < 0):
            order = np.argsort(t, kind="stable")
    else:
        _check_monotone(t, path, c.get("tfield", "arrival_s"), c["lines"], c.get("raw_t"))
    nreq = len(t)
    sel = order if order is not None else slice(None)
    t = t[sel]
    t0 = float(t[0])
    arrival = (t - t0).astype(np.float64)
    if arrival[-1] > MAX_SPAN_S:
        i = int(np.argmax(arrival > MAX_SPAN_S))
        j = int(order[i]) if order is not None else i
        ln = c["lines"]() if callable(c["lines"]) else c["lines"]
        raise _err(
            path,
            ln[j],
            c.get("tfield", "arrival_s"),
            f"arrives {arrival[i]:.3g} s after the first request (more than {MAX_SPAN_S:g} s: not a trace's time)",
        )
    session = c.get("session")
    session = np.full(nreq, -1, np.int64) if session is None else np.asarray(session, np.int64)[sel]
    hashes = c.get("hashes")
    if hashes is not None and order is not None:
        hashes = [hashes[i] for i in order]
    pbt = prefix_block_tokens or MOONCAKE_BLOCK_TOKENS

    label = f"{name}: {path}" if name else str(path)
    notes = [f"fmt={f}", f"{nreq} requests"] + list(c.get("notes", []))
    if order is not None:
        notes.append("sorted by arrival")
    cls_raw = c.get("cls_names")
    if cls_raw is not None and mix is None:
        cls_raw = cls_raw[sel]
        uniq = set(cls_raw.tolist())
        names = tuple([k for k in DEFAULT_CLASSES if k in uniq] + sorted(uniq - set(DEFAULT_CLASSES)))
        lut = {k: i for i, k in enumerate(names)}
        cls = np.array([lut[x] for x in cls_raw], dtype=np.int16)
        assumed = name == "default"  # the default's classes were drawn from a mix by dsim
        if assumed:
            notes.append("classes carried per request, drawn by dsim from a mix (an assumption)")
        else:
            notes.append("classes from the trace")
    else:
        names = ("chat",)
        cls = np.zeros(nreq, np.int16)
        assumed = True
    data_rows = c.get("data_rows")
    rows = (np.arange(nreq, dtype=np.int64) if data_rows is None else np.asarray(data_rows, np.int64))[sel]
    if f == "native-parquet":
        locator = RowLocator(path, "parquet")
    elif f in ("native-jsonl", "mooncake"):
        locator = RowLocator(path, "lines", c["lines"])
    else:
        locator = RowLocator(path, "csv")
    w = Workload(
        arrival_s=arrival,
        prompt_tokens=c["prompt"][sel],
        output_tokens=c["output"][sel],
        cls=cls,
        class_names=names,
        session_id=session,
        prefix_hashes=hashes,
        prefix_block_tokens=pbt,
        closed_loop_concurrency=None,
        source=f"{label} ({', '.join(notes)})",
        class_mix_assumed=assumed,
        rows=rows,
        locator=locator,
        trace_name=name or path.name,
    )
    if cls_raw is None or mix is not None:
        m = parse_mix(mix) if mix is not None else _default_mix_for(f, path, name)
        w = assign_classes(w, m, seed)
        if mix is None:
            w = dataclasses.replace(
                w, source=w.source.replace("classes assumed: mix", "classes assumed (per-trace default): mix")
            )
    if window is not None:
        w = time_window(w, *window)
    if n is not None:
        w = head(w, n)
    if rate_scale is not None:
        w = scale_rate(w, rate_scale)
    return w


def save_workload(w: Workload, path: str | Path, fmt: str = "auto", *, time_decimals: int = 6) -> Path:
    """Write a workload in dsim's native format (CSV, JSONL or Parquet, by extension or fmt).

    Arrival times are rounded to ``time_decimals`` (microseconds by default); classes are
    written by name; session_id only when known (>= 0); prefix_hashes only when present
    (CSV: space-separated integers). Closed-loop concurrency and class_mix_assumed are not
    stored (they are run options).
    """
    path = Path(path)
    f = str(fmt).lower()
    if f in ("auto", "native"):
        f = {
            ".csv": "native-csv",
            ".jsonl": "native-jsonl",
            ".json": "native-jsonl",
            ".parquet": "native-parquet",
            ".pq": "native-parquet",
        }.get(path.suffix.lower(), "")
    f = _FMT_ALIASES.get(f, f)
    if f not in ("native-csv", "native-jsonl", "native-parquet"):
        raise InputError(f"{path}: cannot write format {fmt!r} (use .csv, .jsonl or .parquet)")
    arr = np.round(w.arrival_s, time_decimals)
    labels = w.class_labels
    has_s = bool(np.any(w.session_id >= 0))
    if f == "native-jsonl":
        buf = io.StringIO()
        for i in range(len(w)):
            rec = {
                "arrival_s": float(arr[i]),
                "prompt_tokens": int(w.prompt_tokens[i]),
                "output_tokens": int(w.output_tokens[i]),
                "class": str(labels[i]),
            }
            if w.session_id[i] >= 0:
                rec["session_id"] = int(w.session_id[i])
            if w.prefix_hashes is not None:
                rec["prefix_hashes"] = w.prefix_hashes[i].tolist()
            buf.write(json.dumps(rec, separators=(", ", ": ")) + "\n")
        path.write_text(buf.getvalue(), encoding="utf-8", newline="\n")
        return path
    cols = {
        "arrival_s": arr,
        "prompt_tokens": w.prompt_tokens,
        "output_tokens": w.output_tokens,
        "class": labels.astype(str),
    }
    if has_s:
        cols["session_id"] = w.session_id
    if f == "native-csv":
        if w.prefix_hashes is not None:
            cols["prefix_hashes"] = [" ".join(map(str, h.tolist())) for h in w.prefix_hashes]
        pd.DataFrame(cols).to_csv(path, index=False, lineterminator="\n", float_format=f"%.{time_decimals}f")
        return path
    import pyarrow as pa
    import pyarrow.parquet as pq

    tbl = {k: pa.array(np.asarray(v)) for k, v in cols.items()}
    if w.prefix_hashes is not None:
        tbl["prefix_hashes"] = pa.array([h.tolist() for h in w.prefix_hashes], type=pa.list_(pa.int64()))
    pq.write_table(pa.table(tbl), path)
    return path
