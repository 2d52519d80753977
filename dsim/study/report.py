"""A/B reports: method A (baseline, e.g. MTP-1) vs method B (candidate, e.g. DSpark adaptive).

``ab_report(...)`` runs: the capacity plan for the SLA (dsim.study.capacity), one open-loop simulation per
method at A's planned fleet (latency CDFs, per-class acceptance and verify windows), a closed-loop
concurrency sweep (frontier, Fig. 8 curves), and a sensitivity study of B's gain over A as the
class mix goes from all math to all chat. It writes report.md (images as relative PNG files),
report.html (one self-contained file: inline CSS, images embedded as base64 data URIs), the PNG
figures, plan.json and sweep.csv into one directory. Figure styling (one colour per method, titles
naming model, hardware, topology, trace and methods, SLA lines): dsim.study.figures.
"""

from __future__ import annotations

import html
import json
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from dsim.study.figures import (
    context_line,
    pair_colours,
    pyplot,
    readable_log_axis,
    save_figure,
    set_suptitle,
    set_title,
    sla_lines,
)
from dsim.study.prices import price_for

if TYPE_CHECKING:
    from dsim.cost import Profile
    from dsim.sim import SpecConfig

SENSITIVITY_MIXES = ("math=1", "math=0.75,chat=0.25", "math=0.5,chat=0.5", "math=0.25,chat=0.75", "chat=1")

CSS = """body{font-family:-apple-system,Segoe UI,Helvetica,Arial,sans-serif;max-width:980px;margin:2em auto;
padding:0 1em;color:#222;line-height:1.45}h1{font-size:1.6em;border-bottom:2px solid #d62728}
h2{font-size:1.25em;margin-top:1.6em;border-bottom:1px solid #ddd}table{border-collapse:collapse;margin:.8em 0;
font-size:.88em}th,td{border:1px solid #ccc;padding:3px 8px;text-align:right}th{background:#f3f3f3}
td:first-child,th:first-child{text-align:left}pre,code{background:#f6f6f6;font-size:.88em}pre{padding:.6em;
overflow-x:auto;white-space:pre-wrap}img{max-width:100%;border:1px solid #eee;margin:.4em 0}
.cap{font-size:.85em;color:#555}.win{color:#1a7f37}.lose{color:#b42318}"""


class Doc:
    """Blocks rendered to both Markdown and HTML."""

    def __init__(self) -> None:
        self.blocks: list[tuple] = []

    def h(self, level: int, text: str) -> None:
        self.blocks.append(("h", level, text))

    def p(self, text: str) -> None:
        self.blocks.append(("p", text))

    def code(self, text: str) -> None:
        self.blocks.append(("pre", text))

    def table(self, header: list[str], rows: list[list]) -> None:
        self.blocks.append(("table", [str(h) for h in header], [[str(c) for c in r] for r in rows]))

    def img(self, path: str, caption: str) -> None:
        self.blocks.append(("img", path, caption))

    def ul(self, items: list[str]) -> None:
        self.blocks.append(("ul", list(items)))

    def markdown(self) -> str:
        out = []
        for b in self.blocks:
            if b[0] == "h":
                out.append("#" * b[1] + " " + b[2])
            elif b[0] == "p":
                out.append(b[1])
            elif b[0] == "pre":
                out.append("```\n" + b[1] + "\n```")
            elif b[0] == "table":
                out.append(
                    "| "
                    + " | ".join(b[1])
                    + " |\n|"
                    + "---|" * len(b[1])
                    + "\n"
                    + "\n".join("| " + " | ".join(c.replace("|", "\\|") for c in r) + " |" for r in b[2])
                )
            elif b[0] == "img":
                out.append(f"![{b[2]}]({b[1]})\n\n*{b[2]}*")
            elif b[0] == "ul":
                out.append("\n".join(f"- {x}" for x in b[1]))
        return "\n\n".join(out) + "\n"

    def html(self, title: str, base: Path | None = None) -> str:
        """One self-contained HTML file: images under `base` embedded as base64 data URIs (the
        Markdown keeps them as files beside it)."""
        e = html.escape
        out = [
            f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{e(title)}</title>"
            f"<style>{CSS}</style></head><body>"
        ]
        for b in self.blocks:
            if b[0] == "h":
                out.append(f"<h{b[1]}>{e(b[2])}</h{b[1]}>")
            elif b[0] == "p":
                out.append(f"<p>{_inline(b[1])}</p>")
            elif b[0] == "pre":
                out.append(f"<pre>{e(b[1])}</pre>")
            elif b[0] == "table":
                out.append(
                    "<table><tr>"
                    + "".join(f"<th>{e(h)}</th>" for h in b[1])
                    + "</tr>"
                    + "".join("<tr>" + "".join(f"<td>{_inline(c)}</td>" for c in r) + "</tr>" for r in b[2])
                    + "</table>"
                )
            elif b[0] == "img":
                out.append(
                    f"<figure><img src='{_data_uri(base, b[1])}' alt='{e(b[2])}'><figcaption class='cap'>{e(b[2])}"
                    f"</figcaption></figure>"
                )
            elif b[0] == "ul":
                out.append("<ul>" + "".join(f"<li>{_inline(x)}</li>" for x in b[1]) + "</ul>")
        out.append("</body></html>")
        return "\n".join(out) + "\n"


def _data_uri(base: Path | None, name: str) -> str:
    """A PNG under `base` as a data URI; the escaped name itself when there is no such file."""
    import base64

    p = base / name if base is not None else None
    if p is None or not p.is_file():
        return html.escape(name)
    return "data:image/png;base64," + base64.b64encode(p.read_bytes()).decode("ascii")


def _inline(text: str) -> str:
    """Escape, then render `code` and **bold** spans."""
    import re

    t = html.escape(text)
    t = re.sub(r"`([^`]+)`", r"<code>\1</code>", t)
    t = re.sub(r"\*\*([^*]+)\*\*", r"<b>\1</b>", t)
    return t


def _cdf_plot(cols_a, cols_b, la, lb, path, colours=("#1f77b4", "#d62728"), slos=(), context=""):
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(10, 4.4))
    for ax, key, name in ((axes[0], "ttft_ms", "TTFT (ms)"), (axes[1], "tpot_ms", "TPOT (ms)")):
        for cols, lab, col in ((cols_a, la, colours[0]), (cols_b, lb, colours[1])):
            v = np.sort(cols[key][np.isfinite(cols[key])])
            if len(v):
                ax.plot(v, np.arange(1, len(v) + 1) / len(v), color=col, label=lab)
        sla_lines(ax, slos, key[:-3], axis="x")
        ax.set_xlabel(name + " (log)")
        ax.set_ylabel("fraction of requests")
        ax.set_xscale("log")
        readable_log_axis(ax, "x")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
        set_title(ax, f"CDF of {name.split(' ')[0]} per request")
    set_suptitle(fig, context)
    save_figure(fig, path)


def _class_plot(sa, sb, la, lb, path, colours=("#1f77b4", "#d62728"), context=""):
    plt = pyplot()
    classes = sorted(set(sa.get("per_class", {})) | set(sb.get("per_class", {})))
    fig, axes = plt.subplots(1, 2, figsize=(10, 4.2))
    x = np.arange(len(classes))
    for ax, key, name in (
        (axes[0], "acceptance_length", "acceptance length (tokens/step)"),
        (axes[1], "mean_verify_tokens_per_request", "verified tokens per request per step"),
    ):
        for off, s, lab, col in ((-0.2, sa, la, colours[0]), (0.2, sb, lb, colours[1])):
            vals = [s.get("per_class", {}).get(c, {}).get(key, np.nan) for c in classes]
            ax.bar(x + off, vals, 0.4, label=lab, color=col)
        ax.set_xticks(x, classes)
        ax.set_ylabel(name)
        ax.grid(alpha=0.3, axis="y")
        ax.legend(fontsize=8)
        set_title(ax, name.split(" (")[0].capitalize() + " by workload class")
    set_suptitle(fig, context)
    save_figure(fig, path)


def _sens_plot(rows, la, lb, path, colour="#d62728", context=""):
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    x = np.arange(len(rows))
    ax.plot(
        x,
        [r["speed_gain_pct"] for r in rows],
        marker="D",
        color=colour,
        label=f"{lb} per-user speed gain over {la} (%)",
    )
    ax.set_xticks(x, [r["mix"] for r in rows], rotation=15, fontsize=7)
    ax.set_ylabel("gain (%)")
    ax.axhline(0, color="#888", lw=0.8)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    set_title(ax, "Per-user speed gain by traffic mix", context)
    save_figure(fig, path)


def _f(x, nd=2):
    return "n/a" if x is None or (isinstance(x, float) and not np.isfinite(x)) else f"{x:.{nd}f}"


def ab_report(
    workloads: dict,
    profile: Profile,
    spec_a: SpecConfig,
    spec_b: SpecConfig,
    slos: dict,
    out: str | Path,
    *,
    command: str,
    margin: float = 0.10,
    max_nodes: int = 64,
    seeds: Sequence[int] = (0, 1, 2),
    gpus_per_node: int = 8,
    price: float | None = None,
    jobs: int | None = None,
    concurrency: Sequence[int] = (1, 4, 16, 64, 128, 256),
    requests_per_user: int = 4,
    min_requests: int = 100,
    mixes: Any = SENSITIVITY_MIXES,
    notes: Sequence[str] = (),
    name_a: str = "a",
    name_b: str = "b",
    executor: str = "local",
    ray_address: str | None = None,
    progress_bar: Any = None,
    user_sla: Sequence[float] | None = None,
    engine: Any = None,
    router: str = "least_outstanding",
) -> list[Path]:
    """Run everything and write the report into `out`; returns the list of files written.
    executor / ray_address: where the simulations run (dsim.study.executor); progress_bar: dsim.study.progress;
    engine: a dsim.engine.config.EngineConfig for every run (default: vLLM's defaults)."""
    from dsim.study import capacity as P
    from dsim.study import sweep as S
    from dsim.workload import assign_classes

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    seeds = list(seeds)
    if name_a == name_b:
        name_b = name_b + "-b"
    specs = {name_a: spec_a, name_b: spec_b}
    la, lb = P.method_label(spec_a), P.method_label(spec_b)
    if la == lb:
        la, lb = f"A: {la}", f"B: {lb}"
    w0 = workloads[seeds[0]]
    searches = {n: P._Search(n, seeds, slos, margin, max_nodes) for n in specs}
    if progress_bar is not None:  # the bar's total: the plan's bound, then the runs after the plan
        progress_bar.ahead(
            search=sum(srch.remaining() for srch in searches.values()),
            report=len(specs) * (1 + len(mixes) + len(list(concurrency))),
        )
    with P.Runner(jobs, executor, ray_address, progress_bar) as runner:
        # 1. the plan
        def point(name: str, n: int, s: int) -> P.Point:
            return P.Point(
                workloads[s], profile, specs[name], n, s, gpus_per_node, router=router, engine=engine, tag=name
            )

        outs = P.search_nodes(point, searches, runner, slos)
        pres = {}
        cost = price_for(profile.provenance.get("hardware"), price)
        for n, sp in specs.items():
            pres[n] = P.summarize_method(
                n, sp, outs[n], slos, margin, gpus_per_node, cost.per_gpu_hour, cost.spot_per_gpu_hour
            )
            pres[n].update(P.method_fit_fields(sp, profile))
        fleet = pres[name_a]["nodes"]
        # 2. open-loop runs at A's fleet (CDFs, per class); 3. sweep; 4. sensitivity: submitted together
        runner.claim = "report"  # the runs declared ahead above, submitted from here on
        keep = ("ttft_ms", "tpot_ms", "class")
        f_ol = {
            n: runner.submit(
                P.run_point,
                P.Point(w0, profile, specs[n], fleet, seeds[0], gpus_per_node, router=router, engine=engine, tag=n),
                slos,
                keep,
            )
            for n in specs
        }
        f_mix = {}
        for m in mixes:
            wm = assign_classes(w0, m, seeds[0])
            for n in specs:
                f_mix[(m, n)] = runner.submit(
                    P.run_point,
                    P.Point(
                        wm, profile, specs[n], fleet, seeds[0], gpus_per_node, router=router, engine=engine, tag=(m, n)
                    ),
                    slos,
                )
        df = S.sweep(
            w0,
            profile,
            specs,
            concurrency,
            requests_per_user=requests_per_user,
            min_requests=min_requests,
            gpus_per_node=gpus_per_node,
            seed=seeds[0],
            runner=runner,
            engine=engine,
            router=router,
        )
        ol = {n: f.result() for n, f in f_ol.items()}
        mixr = {k: f.result() for k, f in f_mix.items()}
        runner.claim = None

    # ---- files ----
    ctx = context_line(profile, w0, [la, lb])
    colours = pair_colours(name_a, name_b)
    files = S.write_sweep(df, out, context=ctx, slos=slos)
    from dsim.study import frontier as F

    sla_anchors, sla_src = (
        (tuple(user_sla), "given with --user-sla") if user_sla else F.default_user_sla(profile.provenance.get("model"))
    )
    comp = F.paper_comparison(df, name_a, name_b, sla_anchors, sla_src)
    files += F.plot_comparison(df, comp, out, context=ctx)
    fleet_ctx = f"{ctx}; {fleet} node(s), open loop"
    _cdf_plot(ol[name_a]["columns"], ol[name_b]["columns"], la, lb, out / "latency_cdf.png", colours, slos, fleet_ctx)
    sa, sb = ol[name_a]["summary"], ol[name_b]["summary"]
    _class_plot(sa, sb, la, lb, out / "per_class.png", colours, fleet_ctx)
    sens = []
    for m in mixes:
        a, b = mixr[(m, name_a)]["summary"], mixr[(m, name_b)]["summary"]
        ta, tb = a["tpot_ms"]["p50"], b["tpot_ms"]["p50"]
        ua, ub = a["output_tok_s_per_user"] or 0, b["output_tok_s_per_user"] or 0
        sens.append(
            {
                "mix": m,
                "tpot_p50_a": ta,
                "tpot_p50_b": tb,
                "user_tok_s_a": ua,
                "user_tok_s_b": ub,
                "speed_gain_pct": 100.0 * (ub / ua - 1) if ua else float("nan"),
                "acc_a": a.get("acceptance_length"),
                "acc_b": b.get("acceptance_length"),
                "verify_b": b.get("mean_verify_tokens_per_request"),
            }
        )
    _sens_plot(sens, la, lb, out / "sensitivity.png", colours[1], fleet_ctx)
    plan_json = {n: pres[n] for n in specs}
    (out / "plan.json").write_text(json.dumps(plan_json, indent=2, sort_keys=True, default=float) + "\n")

    # ---- document ----
    d = Doc()
    title = f"A/B report: {la} (A) vs {lb} (B)"
    d.h(1, title)
    d.p("Regenerate this report with:")
    d.code(command)
    a, b = pres[name_a], pres[name_b]
    sla_txt = "; ".join(s.describe() for s in slos)
    d.h(2, "Summary")
    bullets = []
    if a["sla_met"] and b["sla_met"]:
        pct = 100 * (a["gpus"] - b["gpus"]) / a["gpus"]
        saved = (
            f"${a['cost_per_hour'] - b['cost_per_hour']:.2f}/hour ({pct:.1f}%)"
            if cost.per_gpu_hour is not None
            else f"{pct:.1f}% of the GPUs (no dollar figure: no price for this hardware)"
        )
        bullets.append(
            f"For the SLA ({sla_txt}, {margin:.0%} margin) A needs **{a['nodes']}** node(s), B needs "
            f"**{b['nodes']}**: B saves {a['nodes'] - b['nodes']} node(s), {saved}."
        )
    else:
        for r, lab in ((a, la), (b, lb)):
            if not r["sla_met"]:
                bullets.append(f"{lab}: SLA **not met** at {r['nodes']} nodes (--max-nodes); best reached shown below.")
    ua, ub = sa["output_tok_s_per_user"] or 0, sb["output_tok_s_per_user"] or 0
    bullets.append(
        f"At A's fleet ({fleet} node(s)) on this traffic, B's per-user speed is {ub:.1f} tok/s vs "
        f"{ua:.1f} ({100 * (ub / ua - 1) if ua else float('nan'):+.1f}%); P50 TPOT {sb['tpot_ms']['p50']:.2f} "
        f"vs {sa['tpot_ms']['p50']:.2f} ms."
    )
    piv = df.pivot(index="concurrency", columns="method", values="output_tok_s_per_gpu")
    ratio = piv[name_b] / piv[name_a]
    bullets.append("Closed-loop throughput per GPU, B / A: " + ", ".join(f"C={c}: {r:.2f}x" for c, r in ratio.items()))
    loses = []
    for m in ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms"):
        for q in ("p50", "p99"):
            va, vb = sa[m][q], sb[m][q]
            if va is not None and vb is not None and vb > va * 1.02:
                loses.append(f"{m[:-3].upper()} {q} at A's fleet ({vb:.1f} vs {va:.1f} ms)")
    for c, r in ratio.items():
        if r < 1:
            loses.append(f"closed-loop throughput at C={c} ({r:.2f}x)")
    bullets.append("Where B loses: " + ("; ".join(loses) if loses else "nowhere measured here") + ".")
    d.ul(bullets)
    warned = [f"{lab}, plan at {r['nodes']} node(s): {w['message']}" for r, lab in ((a, la), (b, lb))
              for w in r.get("warnings", ())]  # fmt: skip
    warned += [
        f"{lab}, at A's fleet: {w['message']}" for sm, lab in ((sa, la), (sb, lb)) for w in sm.get("warnings", ())
    ]
    for _, r in df[df["warnings"].fillna("").astype(str) != ""].iterrows():  # the closed-loop sweep's points
        warned += [f"{r['label']}, sweep at C={int(r['concurrency'])}: {m}" for m in str(r["warnings"]).split(" | ")]
    if warned:
        d.h(2, "Warnings")
        d.p(
            "Results a reader should not trust as they stand (thresholds: docs/user/semantics.md, warnings on results):"
        )
        d.ul(warned)

    d.h(2, "Node count for the SLA")
    head = ["method", "nodes", "GPUs"] + [s.key for s in slos] + ["tok/s/GPU", "$/hour", "$/M output tokens"]
    head.append("acceptance")
    rows = []
    for r, lab in ((a, la), (b, lb)):
        lab = lab + (" (hypothetical)" if r.get("hypothetical") else "")
        row = [lab, str(r["nodes"]) if r["sla_met"] else f"not met at {r['nodes']}", r["gpus"]]
        for s in slos:
            m = r["metrics"][s.key]
            row.append(f"{_f(m['value'])} vs {m['limit']:.4g} ({'ok' if m['ok'] else 'MISS'})")
        row += [_f(r["output_tok_s_per_gpu"], 1), _f(r["cost_per_hour"]), _f(r["cost_per_million_output_tokens"], 3)]
        row.append(r.get("acceptance_origin") or "none (no drafts)")
        rows.append(row)
    d.table(head, rows)
    for line in P.hypothetical_lines(pres, (name_a, name_b)):
        d.p(line)

    def trail(r: dict) -> str:
        return ", ".join(f"{x['nodes']}:" + ("pass" if x["passed"] else "fail") for x in r["search"])

    d.p(
        f"Search trail (nodes: pass/fail) A: {trail(a)}; B: {trail(b)}. "
        "SLO cells show the worst seed's value against target x (1 - margin)."
    )

    d.h(2, "Latency distributions")
    d.p(
        f"One open-loop run per method at A's planned fleet ({fleet} node(s)), seed {seeds[0]}: both methods see "
        "the same traffic on the same hardware."
    )
    d.img("latency_cdf.png", "CDF of TTFT and TPOT per request (log x)")
    d.table(
        ["metric", "A p50", "A p99", "B p50", "B p99"],
        [
            [m, _f(sa[m]["p50"]), _f(sa[m]["p99"]), _f(sb[m]["p50"]), _f(sb[m]["p99"])]
            for m in ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms")
        ],
    )

    d.h(2, "Acceptance and verify windows per class")
    d.img("per_class.png", "Acceptance length and verified tokens per request per step, by workload class")
    rows = []
    ca, cb = ol[name_a]["columns"], ol[name_b]["columns"]
    classes = sorted(set(np.unique(ca["class"])) | set(np.unique(cb["class"])))
    for c in classes:
        pa = sa.get("per_class", {}).get(c, {})
        pb = sb.get("per_class", {}).get(c, {})
        ta = float(np.nanmedian(ca["tpot_ms"][ca["class"] == c])) if np.any(ca["class"] == c) else float("nan")
        tb = float(np.nanmedian(cb["tpot_ms"][cb["class"] == c])) if np.any(cb["class"] == c) else float("nan")
        verdict = "B wins" if tb < ta else ("B loses" if tb > ta else "tie")
        rows.append(
            [
                c,
                _f(pa.get("acceptance_length")),
                _f(pb.get("acceptance_length")),
                _f(pa.get("mean_verify_tokens_per_request")),
                _f(pb.get("mean_verify_tokens_per_request")),
                _f(ta),
                _f(tb),
                f"{100 * (ta / tb - 1):+.1f}%" if tb == tb and tb > 0 else "n/a",
                verdict,
            ]
        )
    d.table(
        [
            "class",
            "A accept len",
            "B accept len",
            "A verify/req",
            "B verify/req",
            "A TPOT p50",
            "B TPOT p50",
            "B speed gain",
            "verdict",
        ],
        rows,
    )

    d.h(2, "Across load: the frontier (closed-loop sweep)")
    d.p(
        f"C users in a closed loop, max({requests_per_user} x C, {min_requests}) requests per point, one node, "
        f"seed {seeds[0]}."
    )
    d.img("frontier.png", "Output throughput per GPU vs per-user speed; labels are concurrency")
    d.img("throughput_vs_concurrency.png", "Throughput per GPU vs concurrency")
    d.img("verify_vs_concurrency.png", "Verified tokens per request per step vs concurrency")
    d.img("tpot_vs_concurrency.png", "TPOT P50 and P99 vs concurrency")
    rows = []
    for c in sorted(df["concurrency"].unique()):
        ra = df[(df.method == name_a) & (df.concurrency == c)].iloc[0]
        rb = df[(df.method == name_b) & (df.concurrency == c)].iloc[0]
        thr = rb.output_tok_s_per_gpu / ra.output_tok_s_per_gpu if ra.output_tok_s_per_gpu else float("nan")
        spd = rb.output_tok_s_per_user / ra.output_tok_s_per_user if ra.output_tok_s_per_user else float("nan")
        verdict = "B wins" if thr >= 1 and spd >= 1 else ("B loses" if thr < 1 and spd < 1 else "mixed")
        rows.append(
            [
                int(c),
                _f(ra.output_tok_s_per_gpu, 1),
                _f(rb.output_tok_s_per_gpu, 1),
                f"{thr:.2f}x",
                _f(ra.output_tok_s_per_user, 1),
                _f(rb.output_tok_s_per_user, 1),
                f"{spd:.2f}x",
                _f(ra.verify_tokens_per_request),
                _f(rb.verify_tokens_per_request),
                verdict,
            ]
        )
    d.table(
        [
            "C",
            "A tok/s/GPU",
            "B tok/s/GPU",
            "B/A",
            "A tok/s/user",
            "B tok/s/user",
            "B/A",
            "A verify/req",
            "B verify/req",
            "verdict",
        ],
        rows,
    )

    d.h(2, "The DSpark paper's comparison: throughput per GPU vs per-user speed")
    d.p(
        f"From the sweep above (dsim.study.frontier): each method's Pareto frontier, interpolated piecewise-linearly in "
        f"log-log space, no extrapolation. SLA anchors {', '.join(f'{x:g}' for x in comp.slas)} tok/s/user "
        f"({comp.sla_source}). The DSpark paper (Sec. 5.4) reports, DSpark-5 over MTP-1 on DeepSeek-V4-Flash: "
        "+51% throughput at 80 tok/s/user, 60-85% faster per user at matched throughput; V4-Pro: +52% at 35, "
        "57-78%; a verify budget of about 4-6 tokens per request at moderate load, falling with load."
    )
    d.img("paper_frontier.png", "Frontiers with the SLA anchors and gains (paper Fig. 7 style)")
    d.img(
        "paper_load.png", "Throughput per GPU and verify tokens per request vs concurrency per GPU (paper Fig. 8 style)"
    )
    d.table(["comparison", "A", "B", "B over A", "note"], F.comparison_rows(comp))
    d.table(
        ["concurrency per GPU", "A verify/req", "B verify/req"],
        [[f"{cg:g}", _f(va), _f(vb)] for cg, va, vb in comp.verify],
    )

    d.h(2, "Seed spread")
    rows = []
    for r, lab in ((a, la), (b, lb)):
        for s in slos:
            vals = r["metrics"][s.key]["seeds"]
            v = [x for x in vals.values() if x is not None]
            rows.append(
                [
                    lab,
                    f"{s.key} at {r['nodes']} node(s)",
                    ", ".join(f"seed {k}: {_f(x)}" for k, x in vals.items()),
                    _f(max(v) - min(v)) if v else "n/a",
                ]
            )
    d.table(["method", "metric", "per seed", "spread (max - min)"], rows)

    d.h(2, "Sensitivity: traffic mix")
    d.p(
        f"B's gain over A as the class mix goes from all math to all chat (classes re-assigned with "
        f"`workload.assign_classes`, seed {seeds[0]}), open loop at A's fleet ({fleet} node(s))."
    )
    d.img("sensitivity.png", "Per-user speed gain of B over A by traffic mix")
    d.table(
        [
            "mix",
            "A TPOT p50",
            "B TPOT p50",
            "A tok/s/user",
            "B tok/s/user",
            "B speed gain",
            "A accept len",
            "B accept len",
            "B verify/req",
        ],
        [
            [
                r["mix"],
                _f(r["tpot_p50_a"]),
                _f(r["tpot_p50_b"]),
                _f(r["user_tok_s_a"], 1),
                _f(r["user_tok_s_b"], 1),
                f"{r['speed_gain_pct']:+.1f}%",
                _f(r["acc_a"]),
                _f(r["acc_b"]),
                _f(r["verify_b"]),
            ]
            for r in sens
        ],
    )

    d.h(2, "Assumptions and sources")
    items = [
        f"SLA: {sla_txt}; margin {margin:.0%}: a node count passes only if every latency SLO <= target x (1 - margin) "
        f"for every seed (seeds {', '.join(map(str, seeds))}; worst seed counted).",
        f"Workload: {w0.source} ({len(w0)} requests).",
        "Class mix: "
        + ("assumed (assigned by a mix, not carried by the trace)" if w0.class_mix_assumed else "carried by the trace")
        + ".",
        "Load model: open loop for the plan, CDFs and sensitivity (the trace's arrivals are fixed; nodes share "
        f"them via the {router.replace('_', '-')} router); closed loop for the sweep.",
        f"Profile: {profile.label} (kind: {profile.provenance.get('kind')}).",
        f"Acceptance A: {a['acceptance_source'] or 'none'}",
        f"Acceptance B: {b['acceptance_source'] or 'none'}",
        f"Price: {cost.describe()}; {gpus_per_node} GPUs per node.",
    ] + [f"Note: {n}" for n in notes]
    d.ul(items)
    d.p("Data: `plan.json` (plan results), `sweep.csv` (sweep points).")
    root = str(Path(__file__).resolve().parents[2]) + "/"
    md = out / "report.md"
    md.write_text(d.markdown().replace(root, ""))
    hp = out / "report.html"
    hp.write_text(d.html(title, base=out).replace(root, ""))
    return [md, hp, out / "plan.json", out / "latency_cdf.png", out / "per_class.png", out / "sensitivity.png"] + files
