"""Read `vllm bench serve --save-result [--save-detailed]` output into the measurement format.

With --save-detailed the file has per-request ``ttfts``, ``itls``, ``latencies``, ``input_lens``,
``output_lens``, ``start_times`` and ``errors``: each becomes a request line. vLLM's bench splits a
multi-token chunk into per-token gaps a few microseconds apart; gaps below ``merge_gap_s`` are
folded back into one chunk so that ITL keeps its meaning (one sample per engine step, docs/user/semantics.md §6).
Without --save-detailed only the aggregate keys exist; they go to the summary line (mean, median ->
p50, p90/p99 when present), with no request lines.
"""

from __future__ import annotations

import math
from pathlib import Path

from dsim.errors import InputError, plain
from validator import measure

MERGE_GAP_S = 2e-4
_METRICS = {"ttft": "ttft_ms", "tpot": "tpot_ms", "itl": "itl_ms", "e2el": "e2e_ms"}


def _aggregate(d: dict) -> dict:
    out = {}
    for src, dst in _METRICS.items():
        if f"mean_{src}_ms" in d:
            out[f"{dst}_mean"] = d[f"mean_{src}_ms"]
        if f"median_{src}_ms" in d:
            out[f"{dst}_p50"] = d[f"median_{src}_ms"]
        for q in ("50", "90", "99"):
            if f"p{q}_{src}_ms" in d:
                out[f"{dst}_p{q}"] = d[f"p{q}_{src}_ms"]
    for src, dst in (
        ("completed", "requests_completed"),
        ("failed", "requests_failed"),
        ("output_throughput", "output_tok_s"),
        ("request_throughput", "request_s"),
        ("duration", "duration_s"),
        ("total_output_tokens", "output_tokens"),
        ("total_input_tokens", "input_tokens"),
        ("request_goodput", "request_goodput"),
    ):
        if d.get(src) is not None:
            out[dst] = d[src]
    spec = {}
    if d.get("spec_decode_acceptance_length") is not None:
        spec["acceptance_length"] = d["spec_decode_acceptance_length"]
    if d.get("spec_decode_acceptance_rate") is not None:
        spec["acceptance_rate"] = d["spec_decode_acceptance_rate"]
    rates = d.get("spec_decode_per_position_acceptance_rates")
    if rates:
        spec["per_pos_rate"] = list(rates)
        spec["k"] = len(rates)
    for k in ("spec_decode_num_drafts", "spec_decode_draft_tokens", "spec_decode_accepted_tokens"):
        if d.get(k) is not None:
            spec[k.replace("spec_decode_", "")] = d[k]
    if spec:
        out["spec"] = spec
    return out


def _requests(d: dict, merge_gap_s: float) -> list:
    ttfts = d.get("ttfts")
    if not isinstance(ttfts, list):
        return []
    n = len(ttfts)
    get = lambda k, default=None: d.get(k) if isinstance(d.get(k), list) and len(d[k]) == n else [default] * n  # noqa: E731
    itls, lats, ins, outs = get("itls", []), get("latencies"), get("input_lens", 0), get("output_lens", 0)
    starts, errors = get("start_times"), get("errors", "")
    have_start = all(s is not None for s in starts)
    if not have_start:
        # no start times: assume closed-loop order and lay requests end to end per slot
        starts = [0.0] * n
    t_min = min(starts) if n else 0.0
    reqs = []
    for i in range(n):
        send = float(starts[i]) - t_min
        err = errors[i] or ""
        ok = (not err) and ttfts[i] is not None and lats[i] is not None and (outs[i] or 0) > 0
        rec = {
            "type": "request",
            "i": i,
            "prompt_tokens": int(ins[i] or 0),
            "max_tokens": int(outs[i] or 0),
            "arrival_s": send,
            "send_s": send,
            "first_token_s": None,
            "end_s": None,
            "chunks": [],
            "output_tokens": int(outs[i] or 0),
            "ok": bool(ok),
            "error": (err[:200] or None) if not ok else None,
            "status": None,
            "token_counts": "bench",
        }
        if ok:
            ft = send + float(ttfts[i])
            rec["first_token_s"] = ft
            rec["end_s"] = send + float(lats[i])
            # rebuild chunks: first chunk at TTFT, then per gap; tiny gaps = same chunk
            chunks = [[ft, 1]]
            t = ft
            for g in itls[i] or []:
                t += float(g)
                if g < merge_gap_s:
                    chunks[-1][1] += 1
                else:
                    chunks.append([t, 1])
            # the first chunk may already have carried several tokens: the remainder goes there
            missing = rec["output_tokens"] - sum(c[1] for c in chunks)
            if missing > 0:
                chunks[0][1] += missing
            rec["chunks"] = [[round(c[0], 6), c[1]] for c in chunks]
            rec["itls_ms"] = [(b[0] - a[0]) * 1e3 for a, b in zip(chunks, chunks[1:])]
        elif rec["error"] is None:
            rec["error"] = "failed: no timing recorded"
        reqs.append(rec)
    if not have_start:
        for r in reqs:
            r["start_unknown"] = True
    return reqs


_AGGREGATE_KEYS = tuple(f"{a}_{m}_ms" for m in _METRICS for a in ("mean", "median", "std", "p50", "p90", "p99")) + (
    "completed",
    "failed",
    "output_throughput",
    "request_throughput",
    "duration",
    "total_output_tokens",
    "total_input_tokens",
    "request_goodput",
    "total_token_throughput",
    "num_prompts",
    "spec_decode_acceptance_length",
    "spec_decode_acceptance_rate",
    "spec_decode_num_drafts",
    "spec_decode_draft_tokens",
    "spec_decode_accepted_tokens",
)
_COUNT_KEYS = (
    "completed",
    "failed",
    "total_output_tokens",
    "total_input_tokens",
    "num_prompts",
    "spec_decode_num_drafts",
    "spec_decode_draft_tokens",
    "spec_decode_accepted_tokens",
)


def _num(v, where: str, *, integer: bool = False, allow_none: bool = True) -> float | int | None:
    """A finite number >= 0 from the bench file (not a string, NaN or a negative value)."""
    if v is None and allow_none:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise InputError(f"{where}: not a number: {plain(v)}")
    if not math.isfinite(v):
        raise InputError(f"{where}: not a finite number: {plain(v)}")
    if v < 0:
        raise InputError(f"{where}: must be >= 0, got {plain(v)}")
    if integer and v != int(v):
        raise InputError(f"{where}: not an integer: {plain(v)}")
    return int(v) if integer else v


def _check(d: dict, src) -> None:
    """Every key import_bench reads has the type the bench writes; the first bad one is named."""
    for k in _AGGREGATE_KEYS:
        if k in d:
            _num(d[k], f"{src}: {k}", integer=k in _COUNT_KEYS)
    rates = d.get("spec_decode_per_position_acceptance_rates")
    if rates is not None:
        if not isinstance(rates, list):
            raise InputError(f"{src}: spec_decode_per_position_acceptance_rates: expected a list, got {plain(rates)}")
        for i, x in enumerate(rates):
            if _num(x, f"{src}: spec_decode_per_position_acceptance_rates[{i}]", allow_none=False) > 1:
                raise InputError(f"{src}: spec_decode_per_position_acceptance_rates[{i}]: must be <= 1, got {plain(x)}")
    mc = d.get("max_concurrency")
    if mc is not None:
        mc = _num(mc, f"{src}: max_concurrency", integer=True)
        if mc < 1:
            raise InputError(f"{src}: max_concurrency: must be >= 1, got {mc}")
    rate = d.get("request_rate")
    if rate is not None and rate not in ("inf", "Infinity") and rate != float("inf"):
        if _num(rate, f"{src}: request_rate") == 0:
            raise InputError(f"{src}: request_rate: must be > 0 (or inf), got 0")
    ttfts = d.get("ttfts")
    if ttfts is None:
        return
    if not isinstance(ttfts, list):
        raise InputError(f"{src}: ttfts: expected a list of seconds, got {plain(ttfts)}")
    n = len(ttfts)
    for key, kind in (
        ("ttfts", "time"),
        ("latencies", "time"),
        ("start_times", "time"),
        ("input_lens", "count"),
        ("output_lens", "count"),
        ("itls", "gaps"),
        ("errors", "text"),
    ):
        v = d.get(key)
        if v is None:
            continue
        if not isinstance(v, list):
            raise InputError(f"{src}: {key}: expected a list, got {plain(v)}")
        if len(v) != n:
            raise InputError(f"{src}: {key}: {len(v)} values, ttfts has {n} (one per request)")
        for i, x in enumerate(v):
            where = f"{src}: {key}[{i}]"
            if kind == "time":
                _num(x, where)
            elif kind == "count":
                _num(x, where, integer=True)
            elif kind == "gaps":
                if x is None:
                    continue
                if not isinstance(x, list):
                    raise InputError(f"{where}: expected a list of seconds, got {plain(x)}")
                for j, g in enumerate(x):
                    _num(g, f"{where}[{j}]", allow_none=False)
            elif x is not None and not isinstance(x, str):
                raise InputError(f"{where}: expected an error message (a string), got {plain(x)}")
    lat = d.get("latencies")
    if isinstance(lat, list):
        for i, (t, e) in enumerate(zip(ttfts, lat)):
            if t is not None and e is not None and e < t:
                raise InputError(f"{src}: latencies[{i}]: {plain(e)} s is shorter than ttfts[{i}] {plain(t)} s")


def import_bench(src, dest, concurrency: int | None = None, merge_gap_s: float = MERGE_GAP_S) -> dict:
    src = Path(src)
    if src.is_dir():
        raise InputError(f"{src}: is a directory, not a `vllm bench serve` result file")
    if not src.exists():
        raise InputError(f"{src}: file not found")
    from dsim.schema import read_json

    d = read_json(src, max_bytes=2 << 30)  # regular files only, bounded, nesting checked
    if not isinstance(d, dict) or not any(k in d for k in ("completed", "mean_ttft_ms", "ttfts")):
        raise InputError(
            f"{src}: not a `vllm bench serve --save-result` file (no completed / mean_ttft_ms / ttfts keys)"
        )
    _check(d, src)
    conc = concurrency or d.get("max_concurrency")
    rate = d.get("request_rate")
    rate = None if rate in (None, "inf", "Infinity", float("inf")) else float(rate)
    mode = "concurrency" if conc else ("rate" if rate else "unknown")
    header = {
        "type": "header",
        "format": measure.FORMAT,
        "source": "vllm-bench",
        "label": d.get("label") or "",
        "server": d.get("base_url") or d.get("endpoint_type"),
        "model": d.get("model_id"),
        "server_version": d.get("vllm_version"),
        "date": d.get("date"),
        "trace": f"vllm bench serve ({src.name})",
        "requests": d.get("num_prompts"),
        "load": {"mode": mode, "concurrency": conc, "rate": rate, "burstiness": d.get("burstiness")},
        "detailed": isinstance(d.get("ttfts"), list),
        "imported_from": str(src),
        "engine": {"max_num_seqs": None},
    }
    reqs = _requests(d, merge_gap_s)
    agg = _aggregate(d)
    w = measure.Writer(dest)  # the file appears whole, at close (never header-only)
    try:
        w.write(header, sync=True)
        for r in reqs:
            measure.check_request(r, f"{src}: request {r['i']}")
            w.write(r)
        summary = {"type": "summary", "interrupted": False}
        if reqs:
            summary.update(measure.summarize_requests(reqs))
            summary["bench_reported"] = agg  # the bench's own numbers, kept for comparison
            if "duration_s" in agg:
                summary["duration_s"] = agg["duration_s"]
            if "spec" in agg:
                summary["spec"] = agg["spec"]
        else:
            summary.update(agg)
        w.write(summary, sync=True)
        w.close()
    except BaseException:
        w.discard()
        raise
    return summary
