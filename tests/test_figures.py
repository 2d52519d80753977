"""Figures a planner can paste into a review: one colour per method in every figure, titles that
name model, hardware, topology, trace and methods, SLA lines on latency plots, log axes whose tick
labels do not collide, and (tests/test_sweep_ab.py) a self-contained report.html."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from dsim.study import figures as FG
from dsim.study import report as R
from dsim.study import sweep as S
from dsim.study.sla import parse_sla


@pytest.fixture
def captured(monkeypatch):
    """The figures the plotting functions would write, kept open for inspection."""
    figs = []
    for mod in (FG, S, R):
        monkeypatch.setattr(mod, "save_figure", lambda fig, path: figs.append(fig))
    yield figs
    FG.pyplot().close("all")


def _sweep_df():
    rows = []
    for m, lab, base in (("mtp", "MTP-1", 1.0), ("dspark", "DSpark adaptive", 1.3)):
        for c in (1, 4, 16, 64, 256):
            rows.append(
                dict(
                    method=m,
                    label=lab,
                    concurrency=c,
                    output_tok_s_per_gpu=base * 100 * c**0.5,
                    output_tok_s_per_user=base * 200 / c**0.3,
                    verify_tokens_per_request=2.0 * base,
                    tpot_p50_ms=15 + c / 20,
                    tpot_p99_ms=18 + c / 10,
                    gpus=8,
                )
            )
    return pd.DataFrame(rows)


def _lines(figs):
    for fig in figs:
        for ax in fig.axes:
            yield from ax.get_lines()


def test_method_style_one_colour_per_method():
    assert FG.method_style("mtp") == FG.method_style("mtp3") == FG.METHOD_STYLE["mtp"]
    assert FG.method_style("dspark5") == FG.METHOD_STYLE["dspark"]
    assert FG.method_style("dspark5-fixed") == FG.METHOD_STYLE["dspark-fixed"] != FG.METHOD_STYLE["dspark"]
    assert FG.method_style("medusa") == FG.method_style("medusa")  # a method outside the map: stable
    # digits that are part of the name stay ('eagle3' is not a length of 'eagle')
    assert FG.method_style("eagle3") == FG.METHOD_STYLE["eagle3"]
    assert FG.method_style("block8") == FG.METHOD_STYLE["block"]
    # DSpark keeps its colour however it is spelt
    for spelling in ("dspark", "dspark5", "dspark-adaptive", "dspark5-adaptive", "DSpark"):
        assert FG.method_style(spelling) == FG.METHOD_STYLE["dspark"], spelling
    assert FG.pair_colours("mtp", "dspark") == (FG.METHOD_STYLE["mtp"][0], FG.METHOD_STYLE["dspark"][0])
    pair = FG.pair_colours("dspark", "dspark5")  # two lengths of one method told apart...
    assert len(set(pair)) == 2
    # ... by a colour no method in the map or the spare palette has
    others = {c for c, _ in FG.METHOD_STYLE.values()} | set(FG._SPARE)
    assert pair[1] not in others


def test_same_method_same_colour_across_figures(captured, tmp_path):
    df = _sweep_df()
    S.write_sweep(df, tmp_path, context="ctx")
    cols = {n: np.sort(np.random.default_rng(0).lognormal(3, 0.3, 200)) for n in ("ttft_ms", "tpot_ms")}
    # B listed first: its colour must still be the method's own
    R._cdf_plot(cols, cols, "DSpark adaptive", "MTP-1", tmp_path / "c.png", FG.pair_colours("dspark", "mtp"))
    seen: dict = {}
    for ln in _lines(captured):
        lab = ln.get_label()
        for m, key in (("MTP-1", "mtp"), ("DSpark adaptive", "dspark")):
            if lab.startswith(m):
                seen.setdefault(key, set()).add(ln.get_color())
    assert seen == {"mtp": {FG.METHOD_STYLE["mtp"][0]}, "dspark": {FG.METHOD_STYLE["dspark"][0]}}


def test_titles_name_model_hardware_topology_trace_methods():
    from dsim.cost import load_profile
    from dsim.scenario import build_workload

    prof = load_profile(None)  # the default: DeepSeek-V4-Flash on 8 x H200, dp8-ep8
    w = build_workload("default", requests=150, rate_scale=20)
    ctx = FG.context_line(prof, w, ["MTP-1", "DSpark adaptive"])
    for part in (
        "deepseek-v4-flash",
        "H200",
        "dp8-ep8",
        "trace default",
        "first 150 requests",
        "rate x20",
        "MTP-1 vs DSpark adaptive",
    ):
        assert part in ctx, (part, ctx)
    assert "fmt=" not in ctx


def test_trace_label_of_a_path_trace_re_timed(tmp_path):
    # a trace without classes (the per-trace default mix is assumed) with its arrivals re-drawn:
    # the title names the file and every change, in order
    p = tmp_path / "conv.csv"
    p.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        + "".join(f"2023-11-16 18:15:{i:02d}.000000,{100 + i},{20 + i}\n" for i in range(40))
    )
    from dsim.scenario import build_workload

    w = build_workload(str(p), requests=30, rate=2.5, concurrency=None)
    assert FG.trace_label(w) == (
        "conv.csv; classes assumed: mix chat=0.6,code=0.2,math=0.2; first 30 requests; "
        "arrivals re-drawn Poisson at 2.5 req/s"
    )
    assert FG.trace_label(build_workload(str(p), concurrency=4)).endswith("; closed loop, 4 users")


def test_sweep_titles_and_tpot_sla_line(captured, tmp_path):
    S.write_sweep(_sweep_df(), tmp_path, context="llama on 1 x NVIDIA H200; trace default", slos=parse_sla("p50=20ms"))
    for fig in captured:
        assert "llama on 1 x NVIDIA H200" in fig.axes[0].get_title()
        assert "closed loop on 8 GPUs" in fig.axes[0].get_title()
    tpot = captured[-1].axes[0]
    sla = [ln for ln in tpot.get_lines() if ln.get_label().startswith("SLA")]
    assert len(sla) == 1 and sla[0].get_ydata()[0] == 20.0


def test_cdf_sla_lines(captured, tmp_path):
    cols = {"ttft_ms": np.linspace(100, 3000, 50), "tpot_ms": np.linspace(15, 40, 50)}
    R._cdf_plot(cols, cols, "MTP-1", "DSpark adaptive", tmp_path / "c.png", slos=parse_sla("ttft_p99=2s,p50=20ms"))
    ttft, tpot = captured[0].axes
    (a,) = [ln for ln in ttft.get_lines() if ln.get_label().startswith("SLA")]
    (b,) = [ln for ln in tpot.get_lines() if ln.get_label().startswith("SLA")]
    assert a.get_xdata()[0] == 2000.0 and "TTFT" in a.get_label()
    assert b.get_xdata()[0] == 20.0 and "TPOT" in b.get_label()


def _collisions(ax):
    ax.figure.canvas.draw()
    lo, hi = ax.get_xlim()
    labels = [
        t
        for t in ax.get_xticklabels() + ax.xaxis.get_minorticklabels()
        if t.get_visible() and t.get_text() and lo <= t.get_position()[0] <= hi
    ]
    boxes = [t.get_window_extent() for t in labels]
    hits = sum(boxes[i].overlaps(boxes[j]) for i in range(len(boxes)) for j in range(i + 1, len(boxes)))
    return len(labels), hits


@pytest.mark.parametrize(
    ("lo", "hi"), [(15.0, 40.0), (5.0, 80.0), (30.0, 200.0), (8.0, 300.0), (100.0, 90000.0), (20.0, 25.0), (21.0, 23.0)]
)
def test_log_axes_labels_do_not_collide(captured, tmp_path, lo, hi):
    cols = {"ttft_ms": np.geomspace(lo, hi, 100), "tpot_ms": np.geomspace(lo, hi, 100)}
    R._cdf_plot(cols, cols, "MTP-1", "DSpark adaptive", tmp_path / "c.png")
    for ax in captured[0].axes:
        n, hits = _collisions(ax)
        assert hits == 0, (lo, hi, n)


@pytest.mark.parametrize(("lo", "hi"), [(5.0, 80.0), (20.0, 25.0)])
def test_readable_log_axis_on_a_narrow_range(captured, lo, hi):
    # ranges within a decade, where a log axis's labels are the minor ticks': readable_log_axis
    # labels at least two of them, none overlapping
    plt = FG.pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))  # the CDF figure's layout
    ax = axes[1]
    ax.plot(np.geomspace(lo, hi, 50), np.linspace(0, 1, 50))
    ax.set_xscale("log")
    FG.readable_log_axis(ax, "x")
    n, hits = _collisions(ax)
    assert hits == 0 and n >= 2
