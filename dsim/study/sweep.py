"""Closed-loop concurrency sweeps: throughput per GPU vs per-user speed, per method.

``sweep(...) -> pandas.DataFrame`` (one row per method x concurrency); ``write_sweep(df, out)``
writes sweep.csv and the figures:

- frontier.png: output tok/s per GPU vs per-user tok/s (DSpark paper Fig. 7 style);
- throughput_vs_concurrency.png and verify_vs_concurrency.png (Fig. 8 style);
- tpot_vs_concurrency.png: P50 (solid) and P99 (dashed) TPOT.

Each point runs C users, each sending its next request when the previous one finishes, for
max(requests_per_user x C, min_requests) requests (the trace's lengths, repeated in order when
the trace is shorter). Points run in parallel (dsim.study.capacity.Runner: local processes or Ray tasks); results do not depend
on jobs or the executor.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from dsim.errors import InputError
from dsim.study.figures import method_style, pyplot, readable_log_axis, save_figure, set_title, sla_lines

if TYPE_CHECKING:
    from dsim.cost import Profile
    from dsim.workload import Workload

DEFAULT_CONCURRENCY = (1, 2, 4, 8, 16, 32, 64, 128, 256)


def closed_loop(base: Workload, concurrency: int, n: int) -> Workload:
    """base's requests (repeated in order up to n) sent by `concurrency` users in a closed loop."""
    if concurrency < 1:
        raise InputError(f"--concurrency: must be >= 1, got {concurrency}")
    idx = np.arange(n) % len(base)
    reps = "" if n <= len(base) else f", repeated to {n}"
    return dataclasses.replace(
        base,
        arrival_s=np.zeros(n),
        prompt_tokens=np.array(base.prompt_tokens[idx]),
        output_tokens=np.array(base.output_tokens[idx]),
        cls=np.array(base.cls[idx]),
        session_id=np.array(base.session_id[idx]),
        prefix_hashes=None if base.prefix_hashes is None else [base.prefix_hashes[i] for i in idx],
        rows=None if base.rows is None else np.array(base.rows[idx]),
        closed_loop_concurrency=int(concurrency),
        source=f"{base.source}; first {min(n, len(base))} requests{reps}; closed loop, {concurrency} users",
    )


def point_requests(c: int, requests_per_user: int, min_requests: int) -> int:
    return max(requests_per_user * c, min_requests)


def _row(name, spec, c, r) -> dict:
    from dsim.study.capacity import method_label

    s = r["summary"]
    row = {
        "method": name,
        "label": method_label(spec),
        "concurrency": c,
        "requests": s["requests_total"],
        "output_tok_s_per_gpu": s["output_tok_s_per_gpu"],
        "output_tok_s": s["output_tok_s"],
        "output_tok_s_per_user": s["output_tok_s_per_user"] or 0.0,
        "tpot_p50_ms": s["tpot_ms"]["p50"],
        "tpot_p99_ms": s["tpot_ms"]["p99"],
        "ttft_p50_ms": s["ttft_ms"]["p50"],
        "ttft_p99_ms": s["ttft_ms"]["p99"],
        "itl_p50_ms": s["itl_ms"]["p50"],
        "acceptance_length": s.get("acceptance_length", 1.0),
        "verify_tokens_per_request": s.get("mean_verify_tokens_per_request", 1.0),
        "mean_batch_requests": s.get("mean_batch_requests"),
        "sim_time_s": s["sim_time_s"],
        "wall_time_s": s["wall_time_s"],
        "gpus": s["setup"]["gpus"],
        # dsim.engine.diagnostics: what not to trust at this point (e.g. preemption at high concurrency)
        "warnings": " | ".join(w["message"] for w in s.get("warnings", ())),
    }
    # the paper's load axis is per GPU; a node holds nodes x replicas x GPUs per replica
    setup = s["setup"]
    row["concurrency_per_gpu"] = c / max(1, setup["gpus"])
    row["concurrency_per_node"] = c / max(1, setup["nodes"])
    row["concurrency_per_replica"] = c / max(1, setup["replicas"])
    for cls, v in (s.get("per_class") or {}).items():
        row[f"acceptance_length_{cls}"] = v["acceptance_length"]
        row[f"verify_tokens_{cls}"] = v["mean_verify_tokens_per_request"]
    return row


def sweep(
    base: Workload,
    profile: Profile,
    specs: dict,
    concurrency: Sequence[int] = DEFAULT_CONCURRENCY,
    *,
    requests_per_user: int = 8,
    min_requests: int = 200,
    nodes: int = 1,
    gpus_per_node: int = 8,
    seed: int = 0,
    jobs: int | None = None,
    runner: Any = None,
    executor: str = "local",
    ray_address: str | None = None,
    progress_bar: Any = None,
    engine: Any = None,
    router: str = "least_outstanding",
) -> pd.DataFrame:
    """One closed-loop simulation per (method, concurrency); rows sorted by method order then C.
    runner: a dsim.study.capacity.Runner to use (else one is made from jobs, executor and ray_address);
    engine: a dsim.engine.config.EngineConfig for every point (default: vLLM's defaults); router: the
    router over a fleet's replicas (dsim.engine.router)."""
    from dsim.study.capacity import Point, Runner, run_point

    if requests_per_user < 1:
        raise InputError(f"--requests-per-user: must be >= 1, got {requests_per_user}")
    conc = [int(c) for c in concurrency]
    if not conc or any(c < 1 for c in conc):
        raise InputError(f"--concurrency: expected integers >= 1, got {concurrency}")
    wl = {c: closed_loop(base, c, point_requests(c, requests_per_user, min_requests)) for c in conc}
    pts = []
    # biggest points first so that the pool's tail is short
    for c in sorted(conc, reverse=True):
        for name, spec in specs.items():
            pts.append(Point(wl[c], profile, spec, nodes, seed, gpus_per_node, router, engine=engine, tag=(name, c)))
    if runner is None:
        with Runner(jobs, executor, ray_address, progress_bar) as rn:
            res = rn.map(run_point, pts)
    else:
        res = runner.map(run_point, pts)
    by = {r["tag"]: r for r in res}
    rows = [_row(name, spec, c, by[(name, c)]) for name, spec in specs.items() for c in conc]
    return pd.DataFrame(rows)


# ---- figures --------------------------------------------------------------------------------


def _label_axes(ax, xlabel, ylabel, what, legend_size, context=""):
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    set_title(ax, what, context)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=legend_size)


def plot_frontier(
    df: pd.DataFrame, path: str | Path, what: str = "Throughput vs per-user speed", context: str = ""
) -> None:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 4.8))
    for name, g in df.groupby("method", sort=False):
        col, mk = method_style(name)
        g = g.sort_values("concurrency")
        ax.plot(g["output_tok_s_per_user"], g["output_tok_s_per_gpu"], marker=mk, color=col, label=g["label"].iloc[0])
        for _, r in g.iterrows():
            ax.annotate(
                str(int(r["concurrency"])),
                (r["output_tok_s_per_user"], r["output_tok_s_per_gpu"]),
                fontsize=6,
                xytext=(3, 3),
                textcoords="offset points",
                color=col,
            )
    _label_axes(ax, "per-user speed (output tok/s per user)", "output tok/s per GPU", what, 8, context)
    save_figure(fig, path)


def plot_vs_concurrency(
    df: pd.DataFrame,
    path: str | Path,
    cols: Sequence[str],
    ylabel: str,
    what: str,
    styles: Sequence[str] = ("-",),
    labels: Sequence[str] | None = None,
    logy: bool = False,
    context: str = "",
    slos: Iterable = (),
    sla_metric: str | None = None,
) -> None:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 4.6))
    for name, g in df.groupby("method", sort=False):
        col, mk = method_style(name)
        g = g.sort_values("concurrency")
        for j, c in enumerate(cols):
            lab = g["label"].iloc[0] + (f" {labels[j]}" if labels else "")
            ax.plot(g["concurrency"], g[c], marker=mk, color=col, ls=styles[j % len(styles)], label=lab)
    if sla_metric:
        sla_lines(ax, slos, sla_metric, axis="y")
    ax.set_xscale("log", base=2)
    readable_log_axis(ax, "x", df["concurrency"])
    if logy:
        ax.set_yscale("log")
        readable_log_axis(ax, "y")
    _label_axes(ax, "concurrency (users)", ylabel, what, 7, context)
    save_figure(fig, path)


FIGURES = ("frontier.png", "throughput_vs_concurrency.png", "verify_vs_concurrency.png", "tpot_vs_concurrency.png")


def write_sweep(
    df: pd.DataFrame, out: str | Path, prefix: str = "", context: str = "", slos: Iterable = ()
) -> list[Path]:
    """sweep.csv and the figures; `context` (dsim.study.figures.context_line) is each title's second
    line, `slos` (dsim.study.sla.SLO) draw the TPOT targets on the TPOT figure."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    csv = out / f"{prefix}sweep.csv"
    df.to_csv(csv, index=False)
    if context and "gpus" in df.columns and len(df):
        context += f"; closed loop on {int(df['gpus'].iloc[0])} GPUs"
    plot_frontier(
        df, out / f"{prefix}frontier.png", "Output throughput per GPU vs per-user speed (closed loop)", context
    )
    plot_vs_concurrency(
        df,
        out / f"{prefix}throughput_vs_concurrency.png",
        ["output_tok_s_per_gpu"],
        "output tok/s per GPU",
        "Throughput per GPU vs concurrency",
        context=context,
    )
    plot_vs_concurrency(
        df,
        out / f"{prefix}verify_vs_concurrency.png",
        ["verify_tokens_per_request"],
        "verified tokens per request per step",
        "Verify tokens per request vs concurrency",
        context=context,
    )
    plot_vs_concurrency(
        df,
        out / f"{prefix}tpot_vs_concurrency.png",
        ["tpot_p50_ms", "tpot_p99_ms"],
        "TPOT (ms)",
        "TPOT vs concurrency (P50 solid, P99 dashed)",
        styles=("-", "--"),
        labels=("P50", "P99"),
        context=context,
        slos=slos,
        sla_metric="tpot",
    )
    return [csv] + [out / f"{prefix}{f}" for f in FIGURES]


def format_sweep(df: pd.DataFrame) -> str:
    cols = [
        "label",
        "concurrency",
        "output_tok_s_per_gpu",
        "output_tok_s_per_user",
        "tpot_p50_ms",
        "tpot_p99_ms",
        "ttft_p50_ms",
        "acceptance_length",
        "verify_tokens_per_request",
    ]
    short = {
        "output_tok_s_per_gpu": "tok/s/GPU",
        "output_tok_s_per_user": "tok/s/user",
        "tpot_p50_ms": "TPOT p50",
        "tpot_p99_ms": "TPOT p99",
        "ttft_p50_ms": "TTFT p50",
        "acceptance_length": "accept len",
        "verify_tokens_per_request": "verify/req",
        "label": "method",
        "concurrency": "C",
    }
    if "concurrency_per_gpu" in df.columns:
        cols.insert(2, "concurrency_per_gpu")
        short["concurrency_per_gpu"] = "C/GPU"
    d = df[cols].rename(columns=short)
    text = d.to_string(index=False, float_format=lambda x: f"{x:.2f}")
    return "\n".join([text, *sweep_warnings(df)])


def sweep_warnings(df: pd.DataFrame) -> list[str]:
    """Printed lines: each point's warnings (dsim.engine.diagnostics), under a heading; none when clean."""
    from dsim.outputs import field_lines

    if "warnings" not in df.columns:
        return []
    rows = df[df["warnings"].fillna("").astype(str) != ""]
    if rows.empty:
        return []
    out = ["warnings (points a reader should not trust as they stand):"]
    for _, r in rows.iterrows():
        for msg in str(r["warnings"]).split(" | "):
            out += field_lines(f"  {r['label']} at C={int(r['concurrency'])}: ", msg)
    return out
