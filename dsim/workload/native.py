"""dsim's own trace format (traces/README.md), read from CSV, JSONL or Parquet: ``arrival_s``,
``prompt_tokens``, ``output_tokens``, optional ``class``, ``session_id`` and ``prefix_hashes``. A
Parquet trace's row count, column types and decompressed size are checked from its footer before
any data is read. Each reader returns the trace's columns (``dsim.workload.trace_checks.Cols``);
each writer writes a Workload (``save_workload`` picks one by extension or format). The formats
are registered in dsim.workload.readers."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from dsim.errors import InputError, plain
from dsim.workload.table import Workload
from dsim.workload.trace_checks import (
    MAX_TRACE_BYTES,
    MAX_TRACE_ROWS,
    Cols,
    csv_data_lines,
    int_column,
    lazy,
    read_csv_frame,
    read_jsonl,
    trace_error,
)


def _token_cols(df: pd.DataFrame, t: np.ndarray, path: Path, lines) -> Cols:
    """The columns every native trace has: its checked arrival times ``t`` and the prompt and
    output token counts (checked here, errors naming ``lines``)."""
    return Cols(
        arrival=t,
        prompt=int_column(df["prompt_tokens"], path, "prompt_tokens", lines),
        output=int_column(df["output_tokens"], path, "output_tokens", lines),
        lines=lines,
        notes=[],
    )


def read_native_csv(path: Path) -> Cols:
    df = read_csv_frame(
        path,
        ("arrival_s", "prompt_tokens", "output_tokens"),
        optional=("class", "session_id", "prefix_hashes"),
        str_cols=("class", "session_id", "prefix_hashes"),
    )
    lines = lazy(lambda: csv_data_lines(path))
    t = pd.to_numeric(df["arrival_s"], errors="coerce").to_numpy(dtype=np.float64, na_value=np.nan)
    bad = ~np.isfinite(t) | (t < 0)
    if bad.any():
        i = int(np.argmax(bad))
        raw = df["arrival_s"].iloc[i]
        raise trace_error(
            path,
            lines()[i],
            "arrival_s",
            "missing value" if not str(raw).strip() else f"not a time in seconds >= 0: {plain(raw)}",
        )
    out = _token_cols(df, t, path, lines)
    if "session_id" in df.columns:
        s = df["session_id"].str.strip()
        s = s.where(s != "", "-1")
        neg = (s == "-1").to_numpy()
        sess = int_column(s.where(~neg, "0"), path, "session_id", lines, allow_zero=True)
        sess[neg] = -1
        out["session"] = sess
    if "class" in df.columns:
        c = df["class"].str.strip()
        if (c == "").any():
            i = int(np.argmax((c == "").to_numpy()))
            raise trace_error(path, lines()[i], "class", "missing value")
        out["cls_names"] = c.to_numpy(dtype=object)
    if "prefix_hashes" in df.columns:
        hashes = []
        col = df["prefix_hashes"].to_numpy()
        for i, s in enumerate(col):
            s = s.strip()
            try:
                hashes.append(np.array(s.split(), dtype=np.int64) if s else np.zeros(0, np.int64))
            except (ValueError, OverflowError):
                raise trace_error(
                    path, lines()[i], "prefix_hashes", f"expected space-separated integers, got {s[:40]!r}"
                ) from None
        out["hashes"] = hashes
    return out


def read_native_jsonl(path: Path) -> Cols:
    return read_jsonl(path, "arrival_s", "prompt_tokens", "output_tokens", "prefix_hashes", native=True)


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
        raise trace_error(
            path, None, None, f"not a readable Parquet file ({type(e).__name__}: {str(e)[:120]})"
        ) from None
    names = list(schema.names)
    missing = [c for c in ("arrival_s", "prompt_tokens", "output_tokens") if c not in names]
    if missing:
        has = ", ".join(names[:20]) + (f", ... ({len(names)} columns)" if len(names) > 20 else "")
        raise trace_error(path, None, None, f"missing column(s) {', '.join(missing)} (has: {has})")
    if meta.num_rows > MAX_TRACE_ROWS:
        raise trace_error(path, None, None, f"{meta.num_rows} rows: more than {MAX_TRACE_ROWS} requests (refused)")
    cols = [c for c in _PARQUET_COLUMNS if c in names]
    for c in cols:
        t = schema.field(c).type
        if not _parquet_type_fits(t, _PARQUET_COLUMNS[c]):
            raise trace_error(path, None, c, f"column type {t} (expected {_PARQUET_COLUMNS[c]}s)")
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
        raise trace_error(path, None, None, f"{size >> 20} MiB: {too_big}")
    batches, got = [], 0
    try:
        for b in pf.iter_batches(batch_size=1 << 16, columns=cols):
            got += b.nbytes
            if got > MAX_TRACE_BYTES:
                raise trace_error(path, None, None, too_big)
            batches.append(b)
        table = pa.Table.from_batches(batches, schema=pa.schema([schema.field(c) for c in cols]))
        return table.to_pandas()
    except InputError:
        raise
    except Exception as e:  # a corrupt page, a footer that does not match the data
        raise trace_error(
            path, None, None, f"not a readable Parquet file ({type(e).__name__}: {str(e)[:120]})"
        ) from None


def read_native_parquet(path: Path) -> Cols:
    df = _parquet_frame(path)
    if len(df) == 0:
        raise trace_error(path, None, None, "empty trace (no requests)")
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
            raise trace_error(path, lines[i], col, f"not a number: {plain(vals[i])} (column type {df[col].dtype})")
    t = pd.to_numeric(df["arrival_s"], errors="coerce").to_numpy(dtype=np.float64, na_value=np.nan)
    bad = ~np.isfinite(t) | (t < 0)
    if bad.any():
        i = int(np.argmax(bad))
        raise trace_error(path, lines[i], "arrival_s", f"not a time in seconds >= 0: {plain(df['arrival_s'].iloc[i])}")
    out = _token_cols(df, t, path, lines)
    if "session_id" in df.columns:
        s = pd.to_numeric(df["session_id"], errors="coerce").fillna(-1).to_numpy()
        out["session"] = s.astype(np.int64)
    if "class" in df.columns:
        c = df["class"]
        if c.isna().any() or (c.astype(str).str.strip() == "").any():
            i = int(np.argmax((c.isna() | (c.astype(str).str.strip() == "")).to_numpy()))
            raise trace_error(path, lines[i], "class", "missing value")
        out["cls_names"] = c.astype(str).str.strip().to_numpy(dtype=object)
    if "prefix_hashes" in df.columns:
        out["hashes"] = [
            np.zeros(0, np.int64) if h is None else np.asarray(h, dtype=np.int64) for h in df["prefix_hashes"].tolist()
        ]
    return out


# --------------------------------------------------------------------------------------------
# Writers (dsim.workload.readers.save_workload picks one by extension or format)
# --------------------------------------------------------------------------------------------


def write_native_jsonl(w: Workload, path: Path, time_decimals: int) -> None:
    """One JSON object a line: arrival_s (rounded to ``time_decimals``), prompt_tokens,
    output_tokens, class, then session_id where known and prefix_hashes where present."""
    arr = np.round(w.arrival_s, time_decimals)
    labels = w.class_labels
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


def _frame_columns(w: Workload, time_decimals: int) -> dict[str, Any]:
    """The columns of a CSV or Parquet trace; session_id only when some session is known."""
    cols = {
        "arrival_s": np.round(w.arrival_s, time_decimals),
        "prompt_tokens": w.prompt_tokens,
        "output_tokens": w.output_tokens,
        "class": w.class_labels.astype(str),
    }
    if bool(np.any(w.session_id >= 0)):
        cols["session_id"] = w.session_id
    return cols


def write_native_csv(w: Workload, path: Path, time_decimals: int) -> None:
    """A CSV with a header; prefix_hashes as space-separated integers where present."""
    cols = _frame_columns(w, time_decimals)
    if w.prefix_hashes is not None:
        cols["prefix_hashes"] = [" ".join(map(str, h.tolist())) for h in w.prefix_hashes]
    pd.DataFrame(cols).to_csv(path, index=False, lineterminator="\n", float_format=f"%.{time_decimals}f")


def write_native_parquet(w: Workload, path: Path, time_decimals: int) -> None:
    """A Parquet table; prefix_hashes as a list<int64> column where present."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    tbl = {k: pa.array(np.asarray(v)) for k, v in _frame_columns(w, time_decimals).items()}
    if w.prefix_hashes is not None:
        tbl["prefix_hashes"] = pa.array([h.tolist() for h in w.prefix_hashes], type=pa.list_(pa.int64()))
    pq.write_table(pa.table(tbl), path)
