"""Tests for dsim/spec: methods, presets, acceptance model, confidence head."""

import json

import numpy as np
import pytest

from dsim.errors import InputError
from dsim.spec.acceptance import (
    AcceptanceModel,
    accepted_prefix,
    chain_tau,
    load_acceptance,
    parse_acceptance,
    preset_names,
)
from dsim.spec.head_fit import head_quality
from dsim.spec.heads import HEAD_KINDS, HEADS
from dsim.spec.methods import make_method

CLASSES = ("math", "code", "chat")


class FakeCost:
    def __init__(self, tables=None):
        self.tables = tables or {}

    def draft_table_ms(self, kind, n):
        t = self.tables.get(kind)
        return None if t is None else t * n

    def forward_ms(self, n):
        return 10.0 + 0.01 * n


# ---- methods ---------------------------------------------------------------------------------


def test_methods_and_draft_cost_defaults():
    c = FakeCost()
    assert make_method("none").k == 0 and make_method("none").draft_ms(c, 8) == 0.0
    mtp = make_method("mtp")
    assert mtp.k == 1 and mtp.draft_ms(c, 8) == pytest.approx(0.05 * c.forward_ms(8))
    e = make_method("eagle3", 5)
    assert e.draft_ms(c, 8) == pytest.approx(5 * 0.06 * c.forward_ms(8))
    b = make_method("dflash")
    assert b.name == "block" and b.draft_ms(c, 8) == pytest.approx(0.12 * c.forward_ms(56))
    d = make_method("dspark", 7, adaptive=True)
    assert d.adaptive and d.draft_ms(c, 8) == pytest.approx(1.01 * b.draft_ms(c, 8))
    assert d.draft_ms(c, 0) == 0.0
    with pytest.raises(InputError):
        make_method("eagle3", 7, adaptive=True)
    with pytest.raises(InputError):
        make_method("medusa")


def test_draft_cost_tables():
    c = FakeCost({"mtp": 0.1, "eagle3": 0.2, "block": 0.3})
    assert make_method("mtp", 2).draft_ms(c, 4) == pytest.approx(2 * 0.4)
    assert make_method("eagle3", 3).draft_ms(c, 4) == pytest.approx(3 * 0.8)
    assert make_method("block", 7).draft_ms(c, 4) == pytest.approx(1.2)
    assert make_method("dspark", 7).draft_ms(c, 4) == pytest.approx(1.2 * 1.01)
    c.tables["dspark"] = 0.5
    assert make_method("dspark", 7).draft_ms(c, 4) == pytest.approx(2.0)


# ---- presets and parsing ---------------------------------------------------------------------


def test_presets_load_with_source():
    names = preset_names()
    for n in ("qwen3-4b-fig2", "mtp1-deepseek-v3", "deepseek-v4-flash-dspark", "deepseek-v4"):
        assert n in names
    for m in ("dspark", "block", "dflash", "eagle3"):
        c = load_acceptance("qwen3-4b-fig2", m)
        assert c.source and set(c.classes) == set(CLASSES) and c.k == 7
    assert load_acceptance("mtp1-deepseek-v3", "mtp").curve("chat", 1)[0] == 0.875
    with pytest.raises(InputError):
        load_acceptance("qwen3-4b-fig2", "mtp")


# Table 1, Qwen3-4B (DSpark paper): per dataset tau; per-domain means are what Fig. 2 averages.
TABLE1_QWEN3_4B = {
    "eagle3": {"math": (5.14, 4.62, 3.92), "code": (3.69, 4.16, 3.77), "chat": (2.39, 2.26, 2.55)},
    "block": {"math": (5.40, 4.85, 4.15), "code": (4.40, 4.74, 4.18), "chat": (3.07, 2.96, 2.83)},
    "dspark": {"math": (6.11, 5.70, 4.89), "code": (5.13, 5.38, 4.86), "chat": (3.64, 3.54, 3.29)},
}


@pytest.mark.parametrize("method", ["eagle3", "block", "dspark"])
def test_fig2_preset_reproduces_table1(method):
    c = load_acceptance("qwen3-4b-fig2", method)
    for cls, vals in TABLE1_QWEN3_4B[method].items():
        assert abs(c.tau(cls, 7) - np.mean(vals)) < 0.1, (method, cls)


def test_v4_presets_match_public_rates():
    a = np.array([0.739, 0.478, 0.261, 0.174, 0.130, 0.087, 0.043])
    flash = load_acceptance("deepseek-v4-flash-dspark", "dspark")
    assert np.allclose(np.cumprod(flash.curve("anything", 7)), a, atol=1e-3)
    # the deepseek-v4 preset's derivation is checked in tests/test_presets.py


def test_parse_and_user_files(tmp_path):
    c = parse_acceptance("math=0.9,0.8,0.7;chat=0.7,0.5")
    assert c.curve("math", 3).tolist() == [0.9, 0.8, 0.7]
    assert c.curve("chat", 4).tolist() == [0.7, 0.5, 0.5, 0.5]  # padded with the last value
    assert np.allclose(c.curve("code", 2), [0.8, 0.65])  # no default: mean of classes
    assert load_acceptance("const:0.8", "dspark").curve("x", 3).tolist() == [0.8] * 3
    p = tmp_path / "c.json"
    p.write_text(json.dumps({"source": "me", "classes": {"default": [0.6, 0.5]}}))
    assert load_acceptance(str(p), "eagle3").curve("x", 2).tolist() == [0.6, 0.5]
    for bad in ("math=0.9,x", "const:abc", "nosuchpreset", "math=1.5"):
        with pytest.raises(InputError):
            load_acceptance(bad, "dspark")


def test_acceptance_file_reread_when_changed(tmp_path, monkeypatch):
    """A file loaded again unchanged gives the same curves (not re-parsed); a changed file is read
    again; a path given otherwise is read again (the curves carry the path as given)."""
    import os

    p = tmp_path / "c.json"
    p.write_text(json.dumps({"source": "me", "classes": {"default": [0.6, 0.5]}}))
    a = load_acceptance(str(p), "eagle3")
    assert load_acceptance(str(p), "eagle3") is a
    assert load_acceptance(str(p), "mtp") is not a  # (per method)
    st = p.stat()
    p.write_text(json.dumps({"source": "me", "classes": {"default": [0.7, 0.4]}}))
    os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    assert load_acceptance(str(p), "eagle3").curve("x", 2).tolist() == [0.7, 0.4]
    b = load_acceptance(str(p), "eagle3")
    monkeypatch.chdir(tmp_path)
    c = load_acceptance("c.json", "eagle3")  # the same file named otherwise: its own record
    assert c is not b and c.curves == b.curves


# ---- acceptance model ------------------------------------------------------------------------


def _mean_emitted(model, K, n_req=4000, steps=25, seed=0, cls_idx=0):
    rng = np.random.default_rng(seed)
    cls = np.full(n_req, cls_idx)
    lat = model.request_latent(rng, cls)
    d = model.sample(rng, cls, lat, steps)
    return (accepted_prefix(d.accept, K) + 1).mean(), d


@pytest.mark.slow
@pytest.mark.parametrize("p,K", [(0.8, 7), (0.6, 4), (0.9, 1)])
def test_closed_form_constant_p(p, K):
    m = AcceptanceModel(
        parse_acceptance(f"const:{p}"), ("default",), K, sigma_request=0, sigma_step=0, sigma_token=0, head="perfect"
    )
    mean, _ = _mean_emitted(m, K)
    assert mean == pytest.approx((1 - p ** (K + 1)) / (1 - p), rel=0.01)


def test_mtp1_closed_form():
    m = AcceptanceModel(
        parse_acceptance("const:0.9"), ("default",), 1, sigma_request=0, sigma_step=0, sigma_token=0, head="perfect"
    )
    mean, _ = _mean_emitted(m, 1, n_req=20000, steps=5)
    assert mean == pytest.approx(1.9, rel=0.01)
    assert chain_tau([0.8] * 7) == pytest.approx(4.16, abs=0.01)


def test_chain_preserving_latent_keeps_tau_and_conditional_rates():
    curves = load_acceptance("qwen3-4b-fig2", "dspark")
    m = AcceptanceModel(curves, CLASSES, 7, head="useless")
    for ci, cls in enumerate(CLASSES):
        mean, d = _mean_emitted(m, 7, cls_idx=ci, seed=ci)
        assert mean == pytest.approx(m.tau[ci], rel=0.01)
        # conditional acceptance per position, given the prefix was accepted
        surv = np.cumprod(d.accept, axis=-1)
        prev = np.concatenate([np.ones_like(surv[..., :1]), surv[..., :-1]], axis=-1)
        cond = surv.sum((0, 1)) / prev.sum((0, 1))
        assert np.allclose(cond, curves.curve(cls, 7), rtol=0.01)


def test_marginal_preserving_latent():
    curves = load_acceptance("qwen3-4b-fig2", "block")
    m = AcceptanceModel(curves, CLASSES, 7, preserve="marginal", head="useless")
    rng = np.random.default_rng(3)
    cls = np.arange(6000) % 3
    d = m.sample(rng, cls, m.request_latent(rng, cls), 20)
    for ci, c in enumerate(CLASSES):
        mean = d.p_true[:, cls == ci].mean((0, 1))
        assert np.allclose(mean, curves.curve(c, 7), rtol=0.01)


def test_sample_shapes_dtypes_and_zero_k():
    m = AcceptanceModel(load_acceptance("deepseek-v4", "dspark"), CLASSES + ("other",), 7)
    rng = np.random.default_rng(0)
    cls = np.array([0, 1, 2, 3, 3])
    d = m.sample(rng, cls, m.request_latent(rng, cls), 3)
    assert d.p_true.shape == d.accept.shape == d.conf.shape == (3, 5, 7)
    assert d.p_true.dtype == np.float32 and d.accept.dtype == bool and d.conf.dtype == np.float32
    assert ((d.conf >= 0) & (d.conf <= 1)).all()
    # sample of a None method
    m0 = AcceptanceModel(parse_acceptance("const:0.5"), ("default",), 0)
    assert m0.sample(rng, np.zeros(4, int), np.zeros(4), 2).accept.shape == (2, 4, 0)


def _engine_draws(m, cls, lat, steps, key=7, ids=None, rounds=0):
    """The engine's compiled draws (dsim.engine.compiled_draws.draw_slots, outcomes only while the prefix
    holds): conf [steps, K, R], lead [steps, R]."""
    from dsim.engine import compiled_bundles, compiled_draws

    R, K = len(cls), m.k
    slots = np.zeros((R, compiled_bundles.NCOL), dtype=np.int64)
    slots[:, compiled_bundles.ID] = np.arange(R) if ids is None else ids
    slots[:, compiled_bundles.ROUNDS] = rounds
    off = np.ascontiguousarray(m.slot_offsets(cls, lat))
    conf = np.empty((steps, K, R), np.float32)
    lead = np.empty((steps, R), np.int64)
    compiled_draws.draw_slots(
        tuple(compiled_bundles.DrawParams(key, *m.kernel_params())),
        slots,
        off,
        R,
        K,
        steps,
        False,
        (conf, lead, np.zeros((0, 0, 0), bool), np.zeros((0, 0, 0), np.float32)),
    )
    return conf, lead


@pytest.mark.parametrize("head", HEADS)
def test_compiled_draws_match_the_numpy_reference_distribution(head):
    """The compiled sampler (full outcomes, and the engine's prefix-only form) against the numpy
    reference sampler on the same model and latents, fixed seeds: per position, a two-sample KS
    test on the confidences; a chi-square test on the accepted-prefix length (0..K)."""
    from scipy import stats

    from reference_draws import RefSampler

    m = AcceptanceModel(load_acceptance("deepseek-v4", "dspark"), CLASSES, 7, head=head)
    rng = np.random.default_rng(21)
    cls = np.arange(3000) % 3
    lat = m.request_latent(rng, cls)
    ref = RefSampler(m).sample(np.random.default_rng(22), cls, lat, 6)
    new = m.sample(np.random.default_rng(23), cls, lat, 6)
    conf_e, lead_e = _engine_draws(m, cls, lat, 6)
    lead_r = accepted_prefix(ref.accept, 7).ravel()
    for lead in (accepted_prefix(new.accept, 7).ravel(), lead_e.ravel()):
        table = np.array([np.bincount(lead_r, minlength=8), np.bincount(lead, minlength=8)])
        table = table[:, table.sum(0) > 0]
        assert stats.chi2_contingency(table).pvalue > 1e-3
    if HEAD_KINDS[head].class_curve:  # the class curve, exactly
        assert np.array_equal(new.conf, ref.conf) and np.array_equal(conf_e.transpose(0, 2, 1), ref.conf)
        return
    for j in range(7):
        a = ref.conf[..., j].ravel()
        assert stats.ks_2samp(a, new.conf[..., j].ravel()).pvalue > 1e-3
        assert stats.ks_2samp(a, conf_e[:, j].ravel()).pvalue > 1e-3
        assert stats.ks_2samp(ref.p_true[..., j].ravel(), new.p_true[..., j].ravel()).pvalue > 1e-3
    # outcomes are Bernoulli(p_true) position by position
    assert np.abs(new.accept.mean((0, 1)) - new.p_true.mean((0, 1))).max() < 0.01


def test_compiled_draws_are_per_request_round_streams():
    """A request's draws depend on (run key, request, draft round) only: not on the other slots,
    their order or how many steps are drawn at once; another key or round draws anew."""
    m = AcceptanceModel(load_acceptance("deepseek-v4", "dspark"), CLASSES, 7)
    rng = np.random.default_rng(2)
    cls = np.arange(10) % 3
    lat = m.request_latent(rng, cls)
    conf, lead = _engine_draws(m, cls, lat, 4)
    sub = [7, 2, 5]
    conf2, lead2 = _engine_draws(m, cls[sub], lat[sub], 2, ids=np.array(sub), rounds=2)
    assert np.array_equal(conf2, conf[2:, :, sub]) and np.array_equal(lead2, lead[2:, sub])
    again, _ = _engine_draws(m, cls, lat, 4)
    assert np.array_equal(again, conf)
    other, _ = _engine_draws(m, cls, lat, 4, key=8)
    assert not np.array_equal(other, conf)


@pytest.mark.slow
@pytest.mark.parametrize("n_req", [20, 3000])
@pytest.mark.parametrize("head", HEADS)
def test_lane_parallel_draws_are_the_request_by_request_definition(head, n_req):
    """The engine's draws, drawn position by position for all requests at once (vectorized
    ziggurat candidates and outcome brackets, the definition for the lanes they cannot settle),
    equal the definition drawn request by request (``_position`` in each stream's order, libm's
    exp for the confidences), bit for bit: 3,000 requests x 3 rounds x 7 positions, enough for
    ziggurat rejections and undecided brackets on every head; and 20 requests (below LANES_MIN:
    drawn request by request, the confidences by the vectorized pass)."""
    import math

    from numba import njit

    from dsim.engine import compiled_bundles, compiled_draws

    @njit
    def by_request(key, slots, X, R, K, steps, params, conf, lead):
        head, step = params.head, params.step_scale
        for t in range(steps):
            for r in range(R):
                s = compiled_draws.stream_seed(
                    key, slots[r, compiled_bundles.ID], slots[r, compiled_bundles.ROUNDS] + t
                )
                su = 0.0
                if step != 0.0:
                    s, z = compiled_draws._normal_v(s)
                    su = step * z
                alive = True
                nacc = 0
                for j in range(K):
                    s, a, y, _ = compiled_draws._position(s, alive, X[j, r], su, params, False)
                    if head == compiled_bundles.HEAD_USELESS:
                        conf[t, j, r] = X[K + j, r]
                    else:
                        conf[t, j, r] = 1.0 / (1.0 + math.exp(-2.0 * y))
                    if alive and a:
                        nacc += 1
                    else:
                        alive = False
                lead[t, r] = nacc

    m = AcceptanceModel(load_acceptance("deepseek-v4", "dspark"), CLASSES, 7, head=head)
    rng = np.random.default_rng(11)
    cls = rng.integers(0, 3, n_req)
    lat = m.request_latent(rng, cls)
    conf, lead = _engine_draws(m, cls, lat, 3, rounds=4)
    slots = np.zeros((len(cls), compiled_bundles.NCOL), dtype=np.int64)
    slots[:, compiled_bundles.ID] = np.arange(len(cls))
    slots[:, compiled_bundles.ROUNDS] = 4
    conf2, lead2 = np.empty_like(conf), np.empty_like(lead)
    params = m.kernel_params()
    assert params[2] != 0.0  # (the step normal is drawn too)
    by_request(
        7,
        slots,
        np.ascontiguousarray(m.slot_offsets(cls, lat)),
        len(cls),
        7,
        3,
        compiled_bundles.DrawParams(7, *params),
        conf2,
        lead2,
    )
    assert np.array_equal(conf.view(np.int32), conf2.view(np.int32)) and np.array_equal(lead, lead2)


def test_compiled_normals_and_uniforms():
    """The ziggurat normals and the uniforms of the compiled streams (KS tests, fixed keys)."""
    from scipy import stats

    from dsim.engine import compiled_draws

    z = np.empty(200_000)
    compiled_draws.fill_normal(compiled_draws.run_key(0), z)
    assert stats.kstest(z, "norm").pvalue > 1e-3
    assert abs((np.abs(z) > 3.0).mean() - 2 * stats.norm.sf(3.0)) < 5e-4  # the tails too
    u = np.empty(200_000)
    compiled_draws.fill_uniform(compiled_draws.run_key(1), u)
    assert stats.kstest(u, "uniform").pvalue > 1e-3 and u.min() >= 0.0 and u.max() < 1.0


def test_draw_sigmoids_are_the_definition_bit_for_bit():
    """The draws' outcome and confidence sigmoids (a bracketing grid and a table exp with a
    certified rounding, the definition where they cannot decide) give exactly what
    u < 1 / (1 + exp(-2 g T)) and float32(1 / (1 + exp(-2 y))) give: on wide random inputs, at
    float32 rounding boundaries, at the grid's bin edges, beyond its range and beyond |2y| = 120."""
    import math

    from numba import njit

    from dsim.engine import compiled_draws

    @njit
    def confidence_definition(y, out):  # (libm's exp, as the kernel's definition; numpy's differs)
        for i in range(y.shape[0]):
            out[i] = 1.0 / (1.0 + math.exp(-2.0 * y[i]))

    @njit
    def accept_both(u, g, temp, fast, ref):
        for i in range(u.shape[0]):
            fast[i] = compiled_draws._accept(u[i], g[i], temp[i])
            ref[i] = u[i] < 1.0 / (1.0 + math.exp(-2.0 * g[i] * temp[i]))

    rng = np.random.default_rng(5)
    n = 400_000
    y = np.concatenate(
        [
            rng.normal(0.0, 3.0, n),
            rng.uniform(-80.0, 80.0, n // 4),
            [0.0, -0.0, 59.9, -59.9, 60.0, -60.0, 61.0, -61.0, 400.0, -400.0, 1e-300, -1e-300, np.inf, -np.inf, np.nan],
        ]
    )
    # y whose sigmoid lies within a few float64 ulps of a float32 rounding midpoint
    c32 = rng.uniform(0.01, 0.99, 20_000).astype(np.float32).astype(np.float64)
    mid = c32 + np.spacing(np.float32(c32)).astype(np.float64) / 2
    y = np.concatenate([y, -0.5 * np.log(1.0 / mid - 1.0)])
    conf = np.empty((1, y.size), np.float32)
    compiled_draws._confidences(y.reshape(1, -1), conf, 1, y.size)
    ref = np.empty(y.size, np.float32)
    confidence_definition(y, ref)
    assert np.array_equal(conf[0].view(np.int32), ref.view(np.int32))

    g = np.concatenate(
        [
            rng.normal(0.0, 4.0, n),
            compiled_draws._SIG_HALF * np.array([-1.0, 1.0, -1.5, 1.5]),
            (np.arange(-1024, 1024) / compiled_draws._SIG_BINS) / 2,
        ]
    )  # bin edges at temperature 1
    temp = np.concatenate([rng.uniform(0.3, 2.0, n), np.ones(4 + 2048)])
    p = 1.0 / (1.0 + np.exp(-2.0 * g * temp))
    u = np.concatenate(
        [
            rng.uniform(0.0, 1.0, g.size),
            np.nextafter(p, 0.0),
            p,
            np.nextafter(p, 1.0),
            p - 1e-13,
            p + 1e-13,  # at the outcome's edge
        ]
    )
    g, temp = np.tile(g, 6), np.tile(temp, 6)
    fast, slow = np.empty(u.size, np.bool_), np.empty(u.size, np.bool_)
    accept_both(u, g, temp, fast, slow)
    assert np.array_equal(fast, slow) and 0.2 < slow.mean() < 0.8


def test_accepted_prefix():
    a = np.array([[True, True, False, True], [True, True, True, True], [False, True, True, True]])
    assert accepted_prefix(a, np.array([4, 4, 4])).tolist() == [2, 4, 0]
    assert accepted_prefix(a, np.array([1, 3, 0])).tolist() == [1, 3, 0]
    assert accepted_prefix(a, 2).tolist() == [2, 2, 0]


# ---- confidence head -------------------------------------------------------------------------


@pytest.mark.parametrize("target", [0.81, 0.90])
def test_head_auc_hits_target(target):
    m = AcceptanceModel(load_acceptance("qwen3-4b-fig2", "dspark"), CLASSES, 7, head_auc=target)
    assert m.head_auc_ceiling > target
    rng = np.random.default_rng(11)
    cls = np.arange(3000) % 3
    d = m.sample(rng, cls, m.request_latent(rng, cls), 8)
    auc, ece = head_quality(d.conf, d.accept)
    assert abs(auc - target) < 0.02
    assert ece < 0.025  # calibrated by default (target 1%)


def test_head_modes_ordered_and_ece_target():
    curves = load_acceptance("qwen3-4b-fig2", "dspark")
    rng = np.random.default_rng(5)
    cls = np.arange(3000) % 3
    out = {}
    for head in ("perfect", "model", "useless"):
        m = AcceptanceModel(curves, CLASSES, 7, head=head)
        d = m.sample(rng, cls, m.request_latent(rng, cls), 6)
        out[head] = head_quality(d.conf, d.accept)[0]
    assert out["perfect"] > out["model"] > out["useless"] > 0.5
    m = AcceptanceModel(curves, CLASSES, 7, head_ece=0.05)
    d = m.sample(rng, cls, m.request_latent(rng, cls), 6)
    assert abs(head_quality(d.conf, d.accept)[1] - 0.05) < 0.015
    # a target above the ceiling: s = 0 and a note
    m = AcceptanceModel(curves, CLASSES, 7, head_auc=0.999)
    assert m.head_noise == 0.0 and m.head_notes


def test_head_quality_basics():
    y = np.array([0, 0, 1, 1], dtype=bool)
    auc, ece = head_quality(np.array([0.1, 0.2, 0.8, 0.9]), y)
    assert auc == 1.0 and ece == pytest.approx(0.15)
    assert head_quality(np.full(4, 0.5), y)[0] == 0.5
    assert np.isnan(head_quality(np.ones(3), np.ones(3, bool))[0])


from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402


@settings(max_examples=150, deadline=None)
@given(
    n=st.integers(2, 400),
    dtype=st.sampled_from([np.float32, np.float64]),
    grid=st.sampled_from([0, 4, 64]),
    nan=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_auc_is_the_mann_whitney_statistic(n, dtype, grid, nan, seed):
    """The head's AUC (one merge pass over both classes sorted) is the pairwise definition: the
    share of (positive, negative) pairs the positive scores above, ties counting half, exactly;
    ties (a coarse grid of scores), float32 and float64 scores included. With NaN scores it is
    what binary searches of the sorted float64 classes give (NaNs sort last)."""
    from dsim.spec.head_fit import _auc

    rng = np.random.default_rng(seed)
    c = rng.random(n)
    if grid:
        c = np.floor(c * grid) / grid
    c = c.astype(dtype)
    if nan:
        c[rng.integers(0, n, size=max(1, n // 10))] = np.nan
    y = rng.random(n) < 0.5
    pos, neg = c[y].astype(np.float64), c[~y].astype(np.float64)
    if len(pos) == 0 or len(neg) == 0:
        assert np.isnan(_auc(c, y))
        return
    if nan:
        ps, ns = np.sort(pos), np.sort(neg)
        pairs = np.searchsorted(ns, ps, "left").sum() + np.searchsorted(ns, ps, "right").sum()
        want = 0.5 * pairs / (len(pos) * len(neg))
    else:
        gt = (pos[:, None] > neg[None, :]).sum()
        eq = (pos[:, None] == neg[None, :]).sum()
        want = (gt + 0.5 * eq) / (len(pos) * len(neg))
    assert _auc(c, y) == want


@pytest.mark.parametrize("profile", ["deepseek-v4-class-h200x8", "analytical-qwen3-8b-h200x1"])
@pytest.mark.parametrize("name,k", [("mtp", 1), ("mtp", 2), ("eagle3", 7), ("block", 7), ("dspark", 7), ("dspark", 4)])
def test_draft_cost_table_upto_equals_size_by_size(profile, name, k):
    """The vectorized drafter table the compiled steps read is draft_ms at every size, bit for
    bit: inside the profile's sizes (the next profiled size up), past them (the slope), at 0."""
    from dsim.cost import CostModel, load_profile

    cost = CostModel(load_profile(profile))
    m = make_method(name, k)
    n_max = 1500  # (past the tables' last size, 1024)
    tab = m.draft_ms_upto(cost, n_max)
    assert tab.dtype == np.float64 and tab.shape == (n_max + 1,)
    assert tab.tolist() == [m.draft_ms(cost, n) for n in range(n_max + 1)]
    assert tab[0] == 0.0 and (tab[1:] > 0).all()


def test_draft_cost_table_upto_without_tables_is_size_by_size():
    c = FakeCost()  # (no draft_table_ms_upto: the fractions of a forward, size by size)
    for name in ("mtp", "eagle3", "block", "dspark"):
        m = make_method(name)
        assert m.draft_ms_upto(c, 40).tolist() == [m.draft_ms(c, n) for n in range(41)]
    assert make_method("none").draft_ms_upto(c, 5).tolist() == [0.0] * 6
