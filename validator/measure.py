"""The measurement file: what a replay (or an imported `vllm bench serve` result) observed.

JSONL, one object per line, each with a ``type``:

- ``header``   run metadata (format, source, server, model, server_version, load, lengths, date);
- ``metrics_before`` the /metrics scrape before the run (vllm: series only);
- ``gauge``    a sample of running/waiting/kv gauges during the run (t seconds from start);
- ``request``  one finished request (ok or not): i, prompt_tokens, max_tokens, arrival_s,
               send_s, first_token_s, end_s (seconds from run start), chunks [[t_s, n_tokens]...],
               output_tokens, ok, error (reason or null), status (HTTP status or null);
- ``summary``  final line: counts, latency statistics, throughput, metric deltas, spec stats.

Lines are flushed as they are written, so an interrupted run leaves a valid partial file: the
reader recomputes the summary from the request lines when the summary line is missing.
Times are seconds; summary latencies are milliseconds (vLLM's conventions, docs/user/semantics.md §6).
A request whose stream arrived in a burst (most chunk gaps < BURST_GAP_MS) is left out of the
TTFT/TPOT/ITL statistics (it measures a hold-up between engine and client, not the engine) and
counted as ``burst_requests``; E2E and throughput use every completed request.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from dsim.errors import InputError, plain

FORMAT = "dsim-measurements/1"
BURST_GAP_MS = 0.3  # chunk gaps below this are not engine steps
BURST_FRACTION = 0.3  # a request with at least this share of such gaps was burst-delivered
MIN_TIMED = 5  # per-token statistics need at least this many timing-valid requests


class Writer:
    """Appends JSON lines to a temporary sibling of ``path`` and flushes each one (fsync on header
    and summary); ``close()`` renames it onto ``path`` (so a measurement file is never seen
    half-written, nor header-only), ``discard()`` removes it. ``write_path`` is where the lines
    are while the run goes on. Values that JSON cannot carry (NaN, infinities) are written as
    null."""

    def __init__(self, path):
        self.path = Path(path)
        if self.path.is_dir():
            raise InputError(f"{self.path}: is a directory, not a measurement file")
        from dsim.outputs import check_file_target

        check_file_target(self.path, "--out", parents=True)  # never over a device, FIFO or symlink
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.write_path = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp-dsim")
        self._f = open(self.write_path, "w", encoding="utf-8")
        self.lines = 0

    def write(self, obj: dict, sync: bool = False) -> None:
        if self._f.closed:
            return
        try:
            text = json.dumps(obj, separators=(",", ":"), allow_nan=False, default=_default)
        except ValueError:  # a NaN or infinity somewhere (e.g. a server's metric)
            text = json.dumps(_finite(obj), separators=(",", ":"), allow_nan=False, default=_default)
        self._f.write(text + "\n")
        self._f.flush()
        self.lines += 1
        if sync:
            os.fsync(self._f.fileno())

    def close(self) -> None:
        """Commit: the file appears at ``path`` whole."""
        if not self._f.closed:
            self._f.flush()
            os.fsync(self._f.fileno())
            self._f.close()
            from dsim.outputs import check_file_target

            try:
                check_file_target(self.path, "--out")  # as at the start: still nothing to destroy
            except InputError:
                self.discard()
                raise
            os.replace(self.write_path, self.path)

    def discard(self) -> None:
        """Nothing written: the temporary file is removed."""
        if not self._f.closed:
            self._f.close()
        try:
            self.write_path.unlink()
        except FileNotFoundError:
            pass


def _finite(o):
    if isinstance(o, float) and not math.isfinite(o):
        return None
    if isinstance(o, (np.floating,)) and not np.isfinite(o):
        return None
    if isinstance(o, dict):
        return {k: _finite(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [_finite(v) for v in o]
    return o


def _default(o):
    if isinstance(o, (np.integer,)):
        return int(o)
    if isinstance(o, (np.floating,)):
        return float(o)
    return str(o)


@dataclass
class Measurement:
    path: str
    header: dict
    requests: list
    gauges: list = field(default_factory=list)
    metrics_before: dict | None = None
    summary: dict | None = None  # the stored summary line, or None (interrupted run)
    complete: bool = True

    @property
    def ok_requests(self) -> list:
        return [r for r in self.requests if r.get("ok")]

    def stats(self) -> dict:
        """The summary: the stored one (authoritative for metric deltas) over recomputed stats."""
        s = summarize_requests(self.requests)
        if self.summary:
            for k in (
                "metrics_delta",
                "spec",
                "server_histograms",
                "duration_s",
                "gauges",
                "interrupted",
                "interrupt_reason",
            ):
                if k in self.summary:
                    s[k] = self.summary[k]
            # an imported bench result carries its own aggregate numbers
            for k, v in self.summary.items():
                s.setdefault(k, v)
        s["complete"] = self.complete
        return s


def _time(v, where: str, key: str, required: bool):
    if v is None:
        if required:
            raise InputError(f"{where}: {key}: missing (a completed request has send, first-token and end times)")
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise InputError(f"{where}: {key}: not a time in seconds: {plain(v)}")
    if v < 0:
        raise InputError(f"{where}: {key}: negative time {plain(v)} s")
    return float(v)


def _count(v, where: str, key: str):
    if v is None:
        return
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v != int(v) or v < 0:
        raise InputError(f"{where}: {key}: not a token count >= 0: {plain(v)}")


def check_request(r: dict, where: str) -> None:
    """A request line is well-formed: times finite, >= 0 and in order for a completed request,
    token counts non-negative integers, chunks [time, tokens] pairs."""
    ok = r.get("ok")
    if not isinstance(ok, bool):
        raise InputError(f"{where}: ok: expected true or false, got {plain(ok)}")
    for key in ("prompt_tokens", "max_tokens", "output_tokens"):
        _count(r.get(key), where, key)
    _time(r.get("arrival_s"), where, "arrival_s", False)
    send = _time(r.get("send_s"), where, "send_s", ok)
    first = _time(r.get("first_token_s"), where, "first_token_s", ok)
    end = _time(r.get("end_s"), where, "end_s", ok)
    if ok:
        if first < send - 1e-9:
            raise InputError(f"{where}: first_token_s: {plain(first)} is before send_s {plain(send)}")
        if end < first - 1e-9:
            raise InputError(f"{where}: end_s: {plain(end)} is before first_token_s {plain(first)}")
    chunks = r.get("chunks")
    if chunks is not None:
        if not isinstance(chunks, list):
            raise InputError(f"{where}: chunks: expected a list of [time, tokens], got {plain(chunks)}")
        for j, c in enumerate(chunks):
            if not isinstance(c, list) or len(c) != 2:
                raise InputError(f"{where}: chunks[{j}]: expected [time, tokens], got {plain(c)}")
            _time(c[0], where, f"chunks[{j}]", True)
            _count(c[1], where, f"chunks[{j}]")
    itls = r.get("itls_ms")
    if itls is not None:
        if not isinstance(itls, list):
            raise InputError(f"{where}: itls_ms: expected a list of milliseconds, got {plain(itls)}")
        for j, g in enumerate(itls):
            _time(g, where, f"itls_ms[{j}]", True)


MAX_MEASUREMENT_BYTES = 2 << 30  # a day of a busy server's per-request lines is well under this
MAX_MEASUREMENT_LINES = 20_000_000  # (a day at 100 requests/s is under 9 M request lines)


def read(path) -> Measurement:
    """Read and check a measurement file. A malformed line is an error naming it, except a torn
    last line of a run that was killed before its summary (tolerated, counted as torn_lines)."""
    path = Path(path)
    if path.is_dir():
        raise InputError(f"{path}: is a directory, not a measurement file")
    if not path.exists():
        raise InputError(f"{path}: measurement file not found")
    from dsim.schema import read_bytes

    try:
        text = read_bytes(path, max_bytes=MAX_MEASUREMENT_BYTES).decode("utf-8")  # regular files only
    except UnicodeDecodeError as e:
        raise InputError(f"{path}: not a UTF-8 text file ({e.reason} at byte {e.start})") from None
    except OSError as e:
        raise InputError(f"{path}: cannot read ({e.strerror or e})") from None
    header, requests, gauges, before, summary = None, [], [], None, None
    bad = 0
    rows = [(i, ln) for i, ln in enumerate(text.splitlines(), 1) if ln.strip()]
    if len(rows) > MAX_MEASUREMENT_LINES:
        raise InputError(f"{path}:{rows[MAX_MEASUREMENT_LINES][0]}: more than {MAX_MEASUREMENT_LINES} lines (refused)")
    for idx, (lineno, line) in enumerate(rows):
        where = f"{path}:{lineno}"
        try:
            obj = json.loads(line)
        except (json.JSONDecodeError, RecursionError) as e:
            if idx == len(rows) - 1 and summary is None and header is not None:
                bad += 1  # a torn last line from a killed writer
                continue
            raise InputError(f"{where}: malformed line ({getattr(e, 'msg', 'nested too deeply')})") from None
        if not isinstance(obj, dict):
            raise InputError(f"{where}: malformed line (expected a JSON object)")
        t = obj.get("type")
        if header is None and t != "header":
            raise InputError(f"{where}: not a dsim measurement file (the first line is not a header)")
        if t == "header":
            if header is not None:
                raise InputError(f"{where}: a second header line")
            header = obj
            if header.get("format") != FORMAT:
                raise InputError(f"{where}: format: expected {FORMAT}, got {plain(header.get('format'))}")
        elif t == "request":
            check_request(obj, where)
            requests.append(obj)
        elif t == "gauge":
            gauges.append(obj)
        elif t == "metrics_before":
            before = obj.get("metrics")
        elif t == "summary":
            summary = obj
        else:
            raise InputError(f"{where}: type: unknown line type {plain(t)}")
    if header is None:
        raise InputError(f"{path}:1: not a dsim measurement file (no header line)")
    m = Measurement(str(path), header, requests, gauges, before, summary, complete=summary is not None)
    m.header["torn_lines"] = bad
    return m


def _pct(a, prefix: str) -> dict:
    a = np.asarray(a, dtype=np.float64)
    if a.size == 0:
        return {}
    return {
        f"{prefix}_mean": float(a.mean()),
        f"{prefix}_p50": float(np.percentile(a, 50)),
        f"{prefix}_p90": float(np.percentile(a, 90)),
        f"{prefix}_p99": float(np.percentile(a, 99)),
    }


def request_latencies(r: dict) -> dict | None:
    """ttft, tpot, e2e (ms) and the list of ITLs (ms) of one ok request."""
    if not r.get("ok") or r.get("first_token_s") is None or r.get("end_s") is None:
        return None
    send = r["send_s"]
    ttft = (r["first_token_s"] - send) * 1e3
    e2e = (r["end_s"] - send) * 1e3
    n = int(r.get("output_tokens") or 0)
    tpot = (e2e - ttft) / (n - 1) if n > 1 else None
    if r.get("itls_ms") is not None:  # imported bench result
        itls = list(r["itls_ms"])
    else:
        times = [c[0] for c in r.get("chunks") or [] if c[1] > 0]
        itls = [(b - a) * 1e3 for a, b in zip(times, times[1:])]
    # A stream delivered in a burst (most gaps far below any engine step) has no per-token timing:
    # something between the engine and the client held it back (seen on a busy 2-core machine with
    # raw-socket clients too). Its TTFT/TPOT/ITL measure the hold-up, not the engine.
    burst = len(itls) >= 3 and sum(g < BURST_GAP_MS for g in itls) >= BURST_FRACTION * len(itls)
    return {"ttft": ttft, "e2e": e2e, "tpot": tpot, "itls": itls, "n": n, "burst": burst}


def summarize_requests(requests: list) -> dict:
    ok = [r for r in requests if r.get("ok")]
    failed = [r for r in requests if not r.get("ok")]
    reasons: dict = {}
    for r in failed:
        key = (r.get("error") or "unknown").split(":")[0]
        reasons[key] = reasons.get(key, 0) + 1
    lat = [x for x in (request_latencies(r) for r in ok) if x]
    out = {
        "requests_sent": len(requests),
        "requests_completed": len(ok),
        "requests_failed": len(failed),
        "failure_reasons": reasons,
    }
    if lat:
        timed = [x for x in lat if not x["burst"]]
        out["burst_requests"] = len(lat) - len(timed)
        if len(timed) < MIN_TIMED:
            timed = lat
        out["timing_requests"] = len(timed)
        # TTFT, TPOT, ITL over the timing-valid requests; E2E and throughput over all
        out.update(_pct([x["ttft"] for x in timed], "ttft_ms"))
        out.update(_pct([x["tpot"] for x in timed if x["tpot"] is not None], "tpot_ms"))
        out.update(_pct([i for x in timed for i in x["itls"]], "itl_ms"))
        out.update(_pct([x["e2e"] for x in lat], "e2e_ms"))
        if out["burst_requests"]:
            out.update(_pct([x["tpot"] for x in lat if x["tpot"] is not None], "tpot_ms_all"))
            out.update(_pct([x["ttft"] for x in lat], "ttft_ms_all"))
        toks = sum(x["n"] for x in lat)
        start = min(r["send_s"] for r in ok)
        end = max(r["end_s"] for r in ok)
        out["output_tokens"] = toks
        out["input_tokens"] = int(sum(int(r.get("prompt_tokens") or 0) for r in ok))
        out["measured_span_s"] = end - start
        out["output_tok_s"] = toks / (end - start) if end > start else None
        out["request_s"] = len(ok) / (end - start) if end > start else None
        # tokens per streamed chunk: one chunk per engine step per request (docs/user/semantics.md §6)
        chunks = sum(max(len([c for c in r.get("chunks") or [] if c[1] > 0]) - 1, 0) for r in ok)
        if chunks:
            out["decode_steps"] = chunks
            out["tokens_per_decode_step"] = sum(x["n"] - 1 for x in lat) / chunks
    return out


def pool(ms: list, where: str = "measurements") -> Measurement:
    """Several measurements of the same load as one: requests laid end to end in time (each
    segment starts where the previous one ended), metric deltas summed. For interleaved runs
    (A B A B ...) that expose both loads to the same background noise."""
    from validator import promtext

    if len(ms) == 1:
        return ms[0]
    loads = {
        json.dumps({k: (m.header.get("load") or {}).get(k) for k in ("mode", "concurrency", "rate")}, sort_keys=True)
        for m in ms
    }
    if len(loads) > 1:
        raise InputError(f"{where}: pooled measurements must share one load (got {sorted(loads)})")
    reqs, offset, total = [], 0.0, {}
    dur = 0.0
    for run, m in enumerate(ms):
        times = [r["send_s"] for r in m.requests if r.get("send_s") is not None]
        ends = [r["end_s"] for r in m.requests if r.get("end_s") is not None]
        if not times:
            continue
        t0 = min(times)
        for r in m.requests:
            r = dict(r)
            for k in ("arrival_s", "send_s", "first_token_s", "end_s"):
                if r.get(k) is not None:
                    r[k] = r[k] - t0 + offset
            r["chunks"] = [[c[0] - t0 + offset, c[1]] for c in r.get("chunks") or []]
            r["i"] = len(reqs)
            r["run"] = run  # (which of the pooled runs: a closed loop restarts with each)
            reqs.append(r)
        offset += max(ends) - t0
        dur += (m.summary or {}).get("duration_s") or (max(ends) - t0)
        d = promtext.from_jsonable((m.summary or {}).get("metrics_delta") or {})
        for name, series in d.items():
            tgt = total.setdefault(name, {})
            for k, v in series.items():
                tgt[k] = tgt.get(k, 0.0) + v
    header = dict(ms[0].header, pooled_from=[m.path for m in ms], requests=len(reqs))
    summary = {
        "type": "summary",
        "duration_s": dur,
        "interrupted": any((m.summary or {}).get("interrupted") for m in ms),
    }
    if total:
        summary["metrics_delta"] = promtext.to_jsonable(total)
        summary["spec"] = promtext.spec_stats(total)
        summary["server_histograms"] = {
            n: promtext.histogram_stats(total, n) for n in promtext.HISTOGRAMS if promtext.histogram_stats(total, n)
        }
    return Measurement(
        "+".join(m.path for m in ms), header, reqs, [], None, summary, complete=all(m.complete for m in ms)
    )
