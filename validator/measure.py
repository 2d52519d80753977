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
Times are seconds; summary latencies are milliseconds (vLLM's conventions, docs/semantics.md §6).
A request whose stream arrived in a burst (most chunk gaps < BURST_GAP_MS) is left out of the
TTFT/TPOT/ITL statistics (it measures a hold-up between engine and client, not the engine) and
counted as ``burst_requests``; E2E and throughput use every completed request.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from dsim.errors import InputError

FORMAT = "dsim-measurements/1"
BURST_GAP_MS = 0.3          # chunk gaps below this are not engine steps
BURST_FRACTION = 0.3        # a request with at least this share of such gaps was burst-delivered
MIN_TIMED = 5               # per-token statistics need at least this many timing-valid requests


class Writer:
    """Appends JSON lines and flushes each one (fsync on header and summary)."""

    def __init__(self, path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._f = open(self.path, "w", encoding="utf-8")

    def write(self, obj: dict, sync: bool = False) -> None:
        if self._f.closed:
            return
        self._f.write(json.dumps(obj, separators=(",", ":"), allow_nan=False, default=_default) + "\n")
        self._f.flush()
        if sync:
            os.fsync(self._f.fileno())

    def close(self) -> None:
        if not self._f.closed:
            self._f.flush()
            self._f.close()


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
    summary: dict | None = None       # the stored summary line, or None (interrupted run)
    complete: bool = True

    @property
    def ok_requests(self) -> list:
        return [r for r in self.requests if r.get("ok")]

    def stats(self) -> dict:
        """The summary: the stored one (authoritative for metric deltas) over recomputed stats."""
        s = summarize_requests(self.requests)
        if self.summary:
            for k in ("metrics_delta", "spec", "server_histograms", "duration_s", "gauges",
                      "interrupted", "interrupt_reason"):
                if k in self.summary:
                    s[k] = self.summary[k]
            # an imported bench result carries its own aggregate numbers
            for k, v in self.summary.items():
                s.setdefault(k, v)
        s["complete"] = self.complete
        return s


def read(path) -> Measurement:
    path = Path(path)
    if not path.exists():
        raise InputError(f"{path}: measurement file not found")
    header, requests, gauges, before, summary = None, [], [], None, None
    bad = 0
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError:
                bad += 1          # a torn last line from a killed writer
                continue
            t = obj.get("type")
            if t == "header":
                header = obj
            elif t == "request":
                requests.append(obj)
            elif t == "gauge":
                gauges.append(obj)
            elif t == "metrics_before":
                before = obj.get("metrics")
            elif t == "summary":
                summary = obj
    if header is None:
        raise InputError(f"{path}:1: not a dsim measurement file (no header line)")
    if header.get("format") != FORMAT:
        raise InputError(f"{path}:1: format: expected {FORMAT}, got {header.get('format')!r}")
    m = Measurement(str(path), header, requests, gauges, before, summary, complete=summary is not None)
    m.header["torn_lines"] = bad
    return m


def _pct(a, prefix: str) -> dict:
    a = np.asarray(a, dtype=np.float64)
    if a.size == 0:
        return {}
    return {f"{prefix}_mean": float(a.mean()), f"{prefix}_p50": float(np.percentile(a, 50)),
            f"{prefix}_p90": float(np.percentile(a, 90)), f"{prefix}_p99": float(np.percentile(a, 99))}


def request_latencies(r: dict) -> dict | None:
    """ttft, tpot, e2e (ms) and the list of ITLs (ms) of one ok request."""
    if not r.get("ok") or r.get("first_token_s") is None or r.get("end_s") is None:
        return None
    send = r["send_s"]
    ttft = (r["first_token_s"] - send) * 1e3
    e2e = (r["end_s"] - send) * 1e3
    n = int(r.get("output_tokens") or 0)
    tpot = (e2e - ttft) / (n - 1) if n > 1 else None
    if r.get("itls_ms") is not None:        # imported bench result
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
    out = {"requests_sent": len(requests), "requests_completed": len(ok),
           "requests_failed": len(failed), "failure_reasons": reasons}
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
        # tokens per streamed chunk: one chunk per engine step per request (docs/semantics.md §6)
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
    loads = {json.dumps({k: (m.header.get("load") or {}).get(k) for k in ("mode", "concurrency", "rate")},
                        sort_keys=True) for m in ms}
    if len(loads) > 1:
        raise InputError(f"{where}: pooled measurements must share one load (got {sorted(loads)})")
    reqs, offset, total = [], 0.0, {}
    dur = 0.0
    for m in ms:
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
            reqs.append(r)
        offset += max(ends) - t0
        dur += (m.summary or {}).get("duration_s") or (max(ends) - t0)
        d = promtext.from_jsonable((m.summary or {}).get("metrics_delta") or {})
        for name, series in d.items():
            tgt = total.setdefault(name, {})
            for k, v in series.items():
                tgt[k] = tgt.get(k, 0.0) + v
    header = dict(ms[0].header, pooled_from=[m.path for m in ms], requests=len(reqs))
    summary = {"type": "summary", "duration_s": dur, "interrupted": any((m.summary or {}).get("interrupted")
                                                                        for m in ms)}
    if total:
        summary["metrics_delta"] = promtext.to_jsonable(total)
        summary["spec"] = promtext.spec_stats(total)
        summary["server_histograms"] = {n: promtext.histogram_stats(total, n) for n in promtext.HISTOGRAMS
                                        if promtext.histogram_stats(total, n)}
    return Measurement("+".join(m.path for m in ms), header, reqs, [], None, summary,
                       complete=all(m.complete for m in ms))
