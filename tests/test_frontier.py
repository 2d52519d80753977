"""dsim.study.frontier: Pareto frontier, log-log interpolation and the paper's gains, on closed forms."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dsim.errors import InputError
from dsim.study.frontier import (
    Frontier,
    default_user_sla,
    matched_throughput_gains,
    paper_comparison,
    parse_user_sla,
    speed_gain_at_throughput,
    throughput_gain_at_sla,
)


def power_law(c, s, xs):
    xs = np.asarray(xs, dtype=float)
    return xs, c * xs**-s


def test_pareto_drops_dominated_points_and_sorts():
    x = [50, 40, 60, 45, 70, 70]
    y = [100, 120, 80, 90, 50, 40]  # (45, 90) is beaten by (50, 100); (70, 40) by (70, 50)
    f = Frontier.from_points(x, y)
    assert f.user_tok_s.tolist() == [40, 50, 60, 70]
    assert f.gpu_tok_s.tolist() == [120, 100, 80, 50]
    with pytest.raises(InputError):
        Frontier.from_points([0, -1], [1, 2])


def test_interpolation_is_exact_at_points_and_for_power_laws():
    xs, ys = power_law(1e6, 1.7, [20, 35, 60, 100, 180])
    f = Frontier.from_points(xs, ys)
    for x, y in zip(xs, ys):
        assert f.throughput_at(x).value == pytest.approx(y)
    for x in (22.0, 47.5, 150.0):
        assert f.throughput_at(x).value == pytest.approx(1e6 * x**-1.7, rel=1e-12)
        t = 1e6 * x**-1.7
        assert f.speed_at(t).value == pytest.approx(x, rel=1e-12)


def test_throughput_scaled_power_laws_known_gains():
    """B = 1.5 x A in throughput at every speed (y = c x^-s): +50% throughput at any SLA, and at
    matched throughput B is 1.5^(1/s) faster per user."""
    s = 1.25
    xa, ya = power_law(2e5, s, np.geomspace(30, 200, 9))
    fa = Frontier.from_points(xa, ya, "A")
    fb = Frontier.from_points(xa, 1.5 * ya, "B")
    for sla in (40, 80, 120):
        g = throughput_gain_at_sla(fa, fb, sla)
        assert g.gain == pytest.approx(0.5, rel=1e-9) and not g.note
    m = matched_throughput_gains(fa, fb)
    assert m.gain_min == pytest.approx(1.5 ** (1 / s) - 1, rel=1e-9)
    assert m.gain_max == pytest.approx(1.5 ** (1 / s) - 1, rel=1e-9)
    assert m.throughput_lo == pytest.approx(1.5 * ya.min()) and m.throughput_hi == pytest.approx(ya.max())


def test_speed_scaled_linear_frontiers_known_gains():
    """Linear frontiers y = m - k x, B(x) = A(x / 1.6): at matched throughput B is exactly 60%
    faster everywhere; the throughput gain at an SLA is (m - k s / 1.6) / (m - k s) - 1."""
    m_, k = 20000.0, 100.0
    xa = np.linspace(50, 190, 400)
    fa = Frontier.from_points(xa, m_ - k * xa, "A")
    fb = Frontier.from_points(1.6 * xa, m_ - k * xa, "B")
    mr = matched_throughput_gains(fa, fb)
    assert mr.gain_min == pytest.approx(0.6, rel=1e-9) and mr.gain_max == pytest.approx(0.6, rel=1e-9)
    assert speed_gain_at_throughput(fa, fb, 10000).gain == pytest.approx(0.6, rel=1e-9)
    for sla in (85.0, 120.0, 150.0):
        want = (m_ - k * sla / 1.6) / (m_ - k * sla) - 1
        assert throughput_gain_at_sla(fa, fb, sla).gain == pytest.approx(want, rel=2e-4)


def test_bounds_out_of_reach_and_lower():
    xa, ya = power_law(1e5, 1.0, [40, 60, 90, 136])
    xb, yb = power_law(2e5, 1.0, [60, 100, 160, 230])
    fa, fb = Frontier.from_points(xa, ya, "MTP"), Frontier.from_points(xb, yb, "DSpark")
    g = throughput_gain_at_sla(fa, fb, 150)  # A tops out at 136 tok/s/user
    assert g.gain == math.inf and "MTP does not reach" in g.note
    g = throughput_gain_at_sla(fa, fb, 50)  # below B's slowest sampled point: B's is a bound
    assert g.b.bound == "lower" and "lower bound" in g.note and g.gain == pytest.approx(yb[0] / (1e5 / 50) - 1)
    g = throughput_gain_at_sla(fa, fb, 300)
    assert math.isnan(g.gain) and "neither" in g.note


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.floats(1, 500), st.floats(1, 1e5)), min_size=1, max_size=30), st.floats(1, 500))
def test_frontier_is_monotone_and_dominates_points(pts, q):
    x, y = zip(*pts)
    f = Frontier.from_points(x, y)
    assert np.all(np.diff(f.user_tok_s) > 0) and np.all(np.diff(f.gpu_tok_s) < 0)
    # no input point lies strictly above the frontier
    for xi, yi in pts:
        v = f.throughput_at(xi)
        if v.bound == "":
            assert yi <= v.value * (1 + 1e-9)
    v = f.throughput_at(q)
    if v.ok:
        assert f.gpu_tok_s[-1] * (1 - 1e-9) <= v.value <= f.gpu_tok_s[0] * (1 + 1e-9)


def _sweep_table(fa_pts, fb_pts, gpus=8):
    rows = []
    for name, label, pts, vb in (("mtp", "MTP-1", fa_pts, 2.0), ("dspark", "DSpark", fb_pts, 5.0)):
        for i, (c, x, y) in enumerate(pts):
            rows.append(
                {
                    "method": name,
                    "label": label,
                    "concurrency": c,
                    "output_tok_s_per_user": x,
                    "output_tok_s_per_gpu": y,
                    "verify_tokens_per_request": vb - 0.1 * i * (name == "dspark"),
                    "concurrency_per_gpu": c / gpus,
                }
            )
    return pd.DataFrame(rows)


def test_paper_comparison_on_a_sweep_table():
    """Power-law frontiers, B = 1.5 x A in throughput: +50% at both SLAs; at A's throughput at
    each SLA, B is 1.5^(1/s) faster; verify tokens per request read per GPU."""
    s = 0.8
    xs = np.array([50.0, 75.0, 100.0, 160.0, 260.0])
    ya = 4e5 * xs**-s
    conc = (1024, 256, 64, 16, 8)
    df = _sweep_table(list(zip(conc, xs, ya)), list(zip(conc, xs, 1.5 * ya)))
    c = paper_comparison(df, "mtp", "dspark", (80, 120), "test")
    assert [g.gain for g in c.throughput_at_sla] == pytest.approx([0.5, 0.5], rel=1e-9)
    assert [g.gain for g in c.at_sla] == pytest.approx([1.5 ** (1 / s) - 1] * 2, rel=1e-9)
    assert c.at_sla[0].anchor == pytest.approx(4e5 * 80**-s)
    assert c.matched.gain_min == pytest.approx(1.5 ** (1 / s) - 1, rel=1e-9)
    assert c.verify[0] == (1.0, 2.0, pytest.approx(4.6)) and len(c.verify) == 5
    with pytest.raises(InputError):
        paper_comparison(df, "mtp", "eagle3")


def test_user_sla_parsing_and_defaults():
    assert parse_user_sla("80,120") == (80.0, 120.0)
    for bad in ("", "x", "80,-1", "0"):
        with pytest.raises(InputError):
            parse_user_sla(bad)
    assert default_user_sla("DeepSeek-V4-Pro")[0] == (35.0, 50.0)
    assert default_user_sla("deepseek-v4-flash")[0] == (80.0, 120.0)
    assert default_user_sla("deepseek-v3")[0] == (80.0, 120.0)


# ---- the CLI hooks: dsim sweep / dsim ab ----------------------------------------------------


@pytest.mark.slow
def test_sweep_per_gpu_prints_and_plots_the_comparison(tmp_path):
    from typer.testing import CliRunner

    from dsim.cli.entry import app

    out = tmp_path / "sw"
    res = CliRunner().invoke(
        app,
        [
            "sweep",
            "--concurrency",
            "1,4",
            "--per-gpu",
            "--methods",
            "mtp,dspark",
            "--min-requests",
            "16",
            "--requests-per-user",
            "1",
            "--jobs",
            "1",
            "--user-sla",
            "20,40",
            "--out",
            str(out),
        ],
    )
    assert res.exit_code == 0, res.output
    df = pd.read_csv(out / "sweep.csv")
    # the default profile is one 8-GPU replica per node: per-GPU 1 and 4 are 8 and 32 users
    assert sorted(set(df["concurrency"])) == [8, 32]
    assert sorted(set(df["concurrency_per_gpu"])) == [1.0, 4.0]
    assert (df["concurrency_per_node"] == df["concurrency"]).all()
    assert "throughput per GPU at 20 tok/s/user" in res.output and "given with --user-sla" in res.output
    assert "matched throughput" in res.output
    for f in ("paper_frontier.png", "paper_load.png"):
        assert (out / f).is_file() and (out / f).stat().st_size > 2000
    bad = CliRunner().invoke(app, ["sweep", "--user-sla", "80,x", "--out", str(tmp_path / "b")])
    assert bad.exit_code == 2 and "--user-sla" in bad.output and not (tmp_path / "b").exists()


@pytest.mark.slow
def test_ab_report_has_the_paper_comparison(tmp_path):
    from typer.testing import CliRunner

    from dsim.cli.entry import app

    out = tmp_path / "ab"
    res = CliRunner().invoke(
        app,
        [
            "ab",
            "--a",
            "mtp",
            "--b",
            "dspark",
            "--sla",
            "p50=20ms",
            "--requests",
            "40",
            "--seeds",
            "0",
            "--concurrency",
            "1,4",
            "--min-requests",
            "12",
            "--requests-per-user",
            "1",
            "--max-nodes",
            "2",
            "--jobs",
            "1",
            "--out",
            str(out),
        ],
    )
    assert res.exit_code == 0, res.output
    md = (out / "report.md").read_text()
    assert "The DSpark paper's comparison" in md and "paper_frontier.png" in md and "paper_load.png" in md
    assert "throughput per GPU at 80 tok/s/user" in md  # the V4-Flash anchors by default
    assert "concurrency per GPU" in md


def test_pick_pair_and_dspark_block_tokens():
    from dsim.scenario import method_spec
    from dsim.study.frontier import pick_pair

    assert pick_pair(["none", "mtp", "dspark5-fixed", "dspark5"]) == ("mtp", "dspark5")
    assert pick_pair(["mtp", "dspark-fixed"]) == ("mtp", "dspark-fixed")
    assert pick_pair(["mtp", "block"]) == ("mtp", "block")
    assert pick_pair(["mtp"]) is None
    s = method_spec("dspark5")
    assert (s.method, s.k, s.adaptive) == ("dspark", 5, True)
    s = method_spec("DSpark7-fixed")
    assert (s.method, s.k, s.adaptive) == ("dspark", 7, False)
    for bad in ("dspark0", "dspark5-x", "dsparkx"):
        with pytest.raises(InputError):
            method_spec(bad)


@pytest.mark.slow
def test_sweep_on_the_paper_scenario_end_to_end(tmp_path):
    """The paper's deployment (V4-Flash with one routed expert per GPU over EP256, two-batch overlap,
    decode instances, load per GPU, DSpark-5): the sweep prints the comparison with the paper's
    V4-Flash anchors and draws it."""
    from typer.testing import CliRunner

    from dsim.cli.entry import app

    out = tmp_path / "sw"
    res = CliRunner().invoke(
        app,
        [
            "sweep",
            "--profile",
            "deepseek-v4-flash-h200-dp256-ep256-dbo",
            "--per-gpu",
            "--concurrency",
            "2,20",
            "--methods",
            "mtp,dspark5",
            "--disaggregated",
            "--min-requests",
            "16",
            "--requests-per-user",
            "1",
            "--jobs",
            "1",
            "--out",
            str(out),
        ],
    )
    assert res.exit_code == 0, res.output
    df = pd.read_csv(out / "sweep.csv")
    assert sorted(set(df["concurrency_per_gpu"])) == [2.0, 20.0] and sorted(set(df["concurrency"])) == [16, 160]
    ds = df[df.method == "dspark5"]
    assert (ds["verify_tokens_per_request"] > 2.0).all() and (ds["verify_tokens_per_request"] <= 6.0).all()
    assert np.allclose(df[df.method == "mtp"]["verify_tokens_per_request"], 2.0)
    assert "throughput per GPU at 80 tok/s/user" in res.output and "matched throughput" in res.output
    assert "verify tokens per request" in res.output and "kv_consumer" in res.output
    for f in ("paper_frontier.png", "paper_load.png"):
        assert (out / f).is_file()


def test_network_floor_closed_form():
    """V4-Flash: 43 MoE layers x (6 x (4096 FP8 + 32 fp32 scales) + 6 x 4096 bf16) bytes one way
    per token; the paper's MTP-1 at 200 per GPU (13810 tok/s/GPU, tau 1.88, 2 tokens verified per
    request) moves 400 such tokens per 27.2 ms step: 47 GB/s."""
    from dsim.study.frontier import a2a_bytes_per_token, network_floor

    bpt = a2a_bytes_per_token(4096, 6, 43)
    assert bpt == 43 * (6 * (4096 + 128) + 6 * 8192)
    f = network_floor("mtp", 200, 13810, 2.0, 1.88, bpt)
    assert f.step_ms == pytest.approx(1e3 * 1.88 / (13810 / 200))
    assert f.required_gb_s == pytest.approx(400 * bpt / (f.step_ms / 1e3) / 1e9)
    assert 46.5 < f.required_gb_s < 47.5
    # twice the tokens per step at the same per-user speed and tau: twice the bandwidth
    g = network_floor("dspark", 200, 13810, 4.0, 1.88, bpt)
    assert g.required_gb_s == pytest.approx(2 * f.required_gb_s)
    with pytest.raises(ValueError):
        network_floor("mtp", 0, 13810, 2.0, 1.88, bpt)


def _linear_step_sweep(fixed_ms, ms_per_token, methods, loads):
    """Sweep rows from a closed-form step: t(C) = fixed + (ms_per_token x b + draft_ms_per_request) x C,
    speed = 1000 tau / t, throughput = C x speed; methods: name -> (tau, b, draft ms per request)."""
    rows = []
    for m, (tau, b, d) in methods.items():
        for c in loads[m]:
            t = fixed_ms + (ms_per_token * b + d) * c
            s = 1e3 * tau / t
            rows.append(
                {
                    "method": m,
                    "label": m,
                    "concurrency": c,
                    "concurrency_per_gpu": c,
                    "output_tok_s_per_user": s,
                    "output_tok_s_per_gpu": c * s,
                    "verify_tokens_per_request": b,
                    "acceptance_length": tau,
                }
            )
    return pd.DataFrame(rows)


def test_step_at_speed_and_gain_split_closed_form():
    """Linear step 10 ms + 0.05 ms per verified token (+ a drafter per request): at 80 tok/s/user
    MTP-like A (tau 2, 2 tokens) runs 25 ms steps with 150 requests, B (tau 4.5, 5 tokens, 62.5 us
    of drafter per request) 56.25 ms with 148; the fixed step is the one-token forward (10.05 ms),
    the split reproduces each term and the gain is headroom (46.2 / 14.95) over per-request cost
    (312.16 / 99.67 us), = 148 / 150 - 1, as read on the frontiers."""
    from dsim.study.frontier import gain_split, step_at_speed

    fixed, k = 10.0, 0.05
    methods = {"mtp": (2.0, 2.0, 0.0), "dspark": (4.5, 5.0, 0.0625)}
    df = _linear_step_sweep(fixed, k, methods, {"mtp": (20, 60, 150, 300), "dspark": (20, 60, 148, 300)})
    draft = {"mtp": 0.0, "dspark": 0.0625}
    steps = {}
    for m in methods:
        st_ = step_at_speed(df, m, 80.0, lambda n: fixed + k * n, lambda r, m=m: draft[m] * r)
        assert st_ is not None
        steps[m] = st_
    a, b = steps["mtp"], steps["dspark"]
    assert (a.requests_per_gpu, b.requests_per_gpu) == (pytest.approx(150), pytest.approx(148))
    assert (a.step_ms, b.step_ms) == (pytest.approx(25.0), pytest.approx(56.25))
    assert a.fixed_ms == pytest.approx(10.05)
    assert (a.verify_ms, b.verify_ms) == (pytest.approx(14.95), pytest.approx(36.95))
    assert b.draft_ms == pytest.approx(9.25) and a.rest_ms == pytest.approx(0, abs=1e-9)
    assert b.rest_ms == pytest.approx(0, abs=1e-9)
    assert (a.per_request_us, b.per_request_us) == (pytest.approx(14950 / 150), pytest.approx(46200 / 148))
    g = gain_split(a, b)
    assert g.headroom == pytest.approx(46.2 / 14.95)
    assert g.cost_ratio == pytest.approx((46200 / 148) / (14950 / 150))
    assert g.gain == pytest.approx(148 / 150 - 1)
    assert g.fixed_share_a == pytest.approx(10.05 / 25)
    assert g.gain == pytest.approx(paper_comparison(df, "mtp", "dspark", (80,)).throughput_at_sla[0].gain)
    # out of the sampled span: no step
    assert step_at_speed(df, "mtp", 1e4, lambda n: fixed + k * n, lambda r: 0.0) is None
    with pytest.raises(ValueError):
        gain_split(a, dataclasses.replace(b, fixed_ms=11.0))


@settings(max_examples=60, deadline=None)
@given(
    fixed=st.floats(1.0, 50.0),
    extra=st.tuples(st.floats(0.1, 200.0), st.floats(0.1, 400.0)),
    loads=st.tuples(st.floats(1.0, 500.0), st.floats(1.0, 500.0)),
)
def test_gain_split_is_the_load_ratio(fixed, extra, loads):
    """For any two steps over one fixed part, headroom / per-request cost ratio = C_B / C_A."""
    from dsim.study.frontier import StepAtSpeed, gain_split

    a, b = (StepAtSpeed(m, 50.0, c, 2.0, 1.9, fixed + e, fixed, e, 0.0, 0.0) for m, e, c in zip("ab", extra, loads))
    g = gain_split(a, b)
    assert g.headroom / g.cost_ratio == pytest.approx(loads[1] / loads[0], rel=1e-9)
