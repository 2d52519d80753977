"""The public traces: where they are found (``TRACE_FILES``: a ``--trace`` name -> its file in
``$DSIM_TRACE_DIR`` or ``../shared/traces``; ``resolve_trace``) and their readers:

* Azure LLM inference trace CSV, 2023 and 2024 (TIMESTAMP, ContextTokens, GeneratedTokens);
  timestamps with up to 9 fractional digits, naive (read as UTC) or with a timezone offset / ``Z``.
* Mooncake JSONL (timestamp in ms, input_length, output_length, hash_ids = prefix blocks of 512
  tokens).
* BurstGPT CSV (Timestamp, [Session ID,] Elapsed time, Model, Request tokens, Response tokens,
  Total tokens, Log Type). Rows with Response tokens == 0 are failed requests: they are dropped
  and the count is reported in ``source``.

Each reader returns the trace's columns (``dsim.workload.trace_checks.Cols``); the formats are
registered in dsim.workload.readers."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pandas as pd

from dsim.errors import InputError, plain
from dsim.workload.table import DEFAULT_MIX
from dsim.workload.trace_checks import (
    Cols,
    csv_data_lines,
    int_column,
    lazy,
    read_csv_frame,
    read_jsonl,
    trace_error,
)

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


def repo_root() -> Path:
    return Path(__file__).resolve().parents[2]


def trace_dir() -> Path:
    env = os.environ.get("DSIM_TRACE_DIR")
    if env:
        return Path(env).expanduser()
    return repo_root().parent / "shared" / "traces"


def default_path() -> Path:
    """traces/default.jsonl of the source tree (editable install / checkout); else a packaged
    copy under dsim/data/ if a build put one there."""
    p = repo_root() / "traces" / "default.jsonl"
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
        return default_path(), "default"
    if s in TRACE_FILES:
        d = trace_dir()
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


def read_azure(path: Path) -> Cols:
    req = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
    df = read_csv_frame(path, req, str_cols=("TIMESTAMP",))
    lines = lazy(lambda: csv_data_lines(path))
    ts = pd.to_datetime(df["TIMESTAMP"].str.strip(), format="ISO8601", utc=True, errors="coerce")
    if ts.isna().any():
        i = int(np.argmax(ts.isna().to_numpy()))
        raw = df["TIMESTAMP"].iloc[i]
        raise trace_error(
            path, lines()[i], "TIMESTAMP", "missing value" if not raw.strip() else f"not a timestamp: {plain(raw)}"
        )
    ns = ts.dt.tz_convert(None).to_numpy().astype("datetime64[ns]").view(np.int64)
    t = ((ns - ns[0]) / 1e9).astype(np.float64)  # relative first: keeps sub-microsecond precision
    return Cols(
        arrival=t,
        notes=[f"t0={ts.iloc[0].isoformat()}"],
        raw_t=df["TIMESTAMP"].to_numpy(),
        tfield="TIMESTAMP",
        prompt=int_column(df["ContextTokens"], path, "ContextTokens", lines),
        output=int_column(df["GeneratedTokens"], path, "GeneratedTokens", lines),
        lines=lines,
    )


def read_burstgpt(path: Path) -> Cols:
    req = ("Timestamp", "Request tokens", "Response tokens")
    df = read_csv_frame(path, req, optional=("Session ID",))
    lines = lazy(lambda: csv_data_lines(path))
    tnum = pd.to_numeric(df["Timestamp"], errors="coerce").to_numpy(dtype=np.float64, na_value=np.nan)
    bad = ~np.isfinite(tnum) | (tnum < 0)
    if bad.any():
        i = int(np.argmax(bad))
        raise trace_error(
            path, lines()[i], "Timestamp", f"not a time in seconds >= 0: {plain(df['Timestamp'].iloc[i])}"
        )
    output = int_column(df["Response tokens"], path, "Response tokens", lines, allow_zero=True, tokens=True)
    keep = output > 0
    notes = []
    dropped = int((~keep).sum())
    if dropped:
        # failed requests (Response tokens = 0): dropped before any other check of their fields
        notes.append(f"dropped {dropped} failed requests (Response tokens = 0)")
        if not keep.any():
            raise trace_error(path, None, None, "empty trace: every request failed (Response tokens = 0)")
        all_lines = lines
        lines = lazy(lambda: list(np.asarray(all_lines())[keep]))
        df = df[keep]
    prompt = int_column(df["Request tokens"], path, "Request tokens", lines)
    session = None
    if "Session ID" in df.columns:
        session = int_column(df["Session ID"], path, "Session ID", lines, allow_zero=True)
    return Cols(
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


def read_mooncake(path: Path) -> Cols:
    c = read_jsonl(path, "timestamp", "input_length", "output_length", "hash_ids", native=False)
    c["arrival"] = c["arrival"] / 1000.0  # ms -> s
    c["time_unit"] = "ms"
    return c


def azure_default_mix(path: Path, name: str | None) -> dict[str, float]:
    """An Azure trace's class mix when it carries none: all code for the code trace (by name or a
    file name with "code"), else the default mix."""
    if name == "azure-code" or name == "azure-code-2024" or "code" in path.name.lower():
        return {"code": 1.0}
    return dict(DEFAULT_MIX)
