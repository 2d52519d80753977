"""Tests for dsim/spec/budget.py: verify-budget policies (hypothesis properties + worked examples), and
the compiled policies (dsim.engine.compiled_budget) against the numpy reference (tests/reference_policy.py)."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

import reference_policy as RP
from dsim.errors import InputError
from dsim.spec.budget import (
    POLICY_SPELLINGS,
    AdditiveCost,
    PolicyContext,
    make_policy,
    survival,
    verify_tokens_and_commit,
)


def stair(t):
    """Staircase verify cost: 5 ms + 0.5 ms per started block of 8 tokens + a little slope."""
    t = np.asarray(t, dtype=np.float64)
    return 5.0 + 0.5 * np.ceil(t / 8.0) + 0.002 * t


def ctx_for(k, R, limit=10_000, vm=stair, draft=1.0, K=7, extra=0):
    return PolicyContext(vm, draft, np.full(k, R + extra, dtype=np.int64), limit, K)


def all_policies():
    cost = AdditiveCost(0.5, (1, 64), (0.1, 2.0), (1, 8, 64, 1024), (5.0, 5.5, 7.0, 30.0))
    return [
        make_policy("fixed"),
        make_policy("threshold"),
        make_policy("threshold", tau=0.6),
        make_policy("vllm"),
        make_policy("paper"),
        make_policy("paper", production=True),
        make_policy("sglang"),
        make_policy("sglang", cost=cost),
    ]


conf_arrays = st.tuples(st.integers(1, 3), st.integers(1, 12), st.integers(1, 7)).flatmap(
    lambda s: arrays(np.float32, s, elements=st.floats(0, 1, width=32))
)


@pytest.mark.slow
@settings(max_examples=40, deadline=None)
@given(conf=conf_arrays, limit=st.integers(0, 60), extra=st.integers(0, 20), seed=st.integers(0, 2**16))
def test_policy_postconditions(conf, limit, extra, seed):
    k, R, K = conf.shape
    rng = np.random.default_rng(seed)
    prev = rng.random(conf.shape).astype(np.float32)
    prev2 = rng.random(conf.shape).astype(np.float32)
    ctx = ctx_for(k, R, limit=R + extra + limit, K=K, extra=extra)
    for pol in all_policies():
        l = pol.windows(conf, prev, prev2, ctx)
        assert l.shape == (k, R) and l.dtype == np.int64
        assert (l >= 0).all() and (l <= K).all()
        assert (l.sum(1) + ctx.n_nondraft <= ctx.token_limit).all(), pol.name
        # windows are prefixes: the chosen drafts of a request are 1..l (counts by construction);
        # cost-aware policies never pick zero-survival drafts
        if pol.name in ("vllm", "paper", "sglang"):
            S = survival(conf)
            for t in range(k):
                for r in range(R):
                    if l[t, r]:
                        assert S[t, r, l[t, r] - 1] > 0


@settings(max_examples=40, deadline=None)
@given(prev=conf_arrays, limit=st.integers(0, 60))
def test_vllm_budget_is_brute_force_argmax(prev, limit):
    """With the current confidences equal to the previous ones, vLLM's windows add up to the
    brute-force budget argmax (capped by the drafts with a positive score)."""
    k, R, K = prev.shape
    ctx = ctx_for(k, R, limit=R + limit, K=K)
    l = make_policy("vllm").windows(prev, prev, None, ctx)
    S = survival(prev)
    for t in range(k):
        scores = sorted(S[t].ravel().tolist(), reverse=True)
        M = min(R * K, ctx.token_limit - R)
        best, best_b = -1.0, 0
        for b in range(M + 1):
            v = (R + sum(scores[:b])) / (ctx.draft_ms + stair(R + b))
            if v > best * (1 + 1e-12):
                best, best_b = v, b
        assert l[t].sum() == min(best_b, sum(x > 0 for x in scores))


@settings(max_examples=30, deadline=None)
@given(conf=conf_arrays)
def test_vllm_allocates_budget_to_top_current_scores(conf):
    k, R, K = conf.shape
    ctx = ctx_for(k, R, K=K)
    prev = np.clip(conf[::-1] * 0.9, 0, 1)
    B = RP.make_policy("vllm").budget(prev, RP.PolicyContext(stair, 1.0, ctx.n_nondraft, ctx.token_limit, K))
    l = make_policy("vllm").windows(conf, prev, None, ctx)
    npos = (survival(conf) > 0).reshape(k, -1).sum(1)
    assert (l.sum(1) == np.minimum(B, npos)).all()


def test_paper_toy_example():
    """DSpark paper Appendix A: one request, gamma = 2, a_1 = 0.8, SPS(1)=1.0, SPS(2)=0.5, SPS(3)=0.45.
    Theta_0 = 1.0, Theta_1 = 1.8 x 0.5 = 0.9 <= Theta_best: Algorithm 1 breaks and verifies no
    draft, whatever c_2 is. Without the break (global search) it answers l = 2 when c_2 = 0.9
    (Theta_2 = 2.52 x 0.45 = 1.134) and l = 0 when c_2 = 0."""
    sps = {1: 1.0, 2: 0.5, 3: 0.45}
    ctx = PolicyContext(lambda t: np.vectorize(lambda n: 1.0 / sps[int(n)])(t), 0.0, np.array([1]), 100, 2)
    for c2, global_answer in ((0.9, 2), (0.0, 0)):
        conf = np.array([[[0.8, c2]]])
        assert make_policy("paper").windows(conf, None, None, ctx).tolist() == [[0]]
        assert make_policy("paper", production=True).windows(conf, conf, conf, ctx).tolist() == [[global_answer]]
        assert make_policy("vllm").windows(conf, conf, None, ctx).tolist() == [[global_answer]]


def test_paper_production_uses_two_step_old_budget():
    ctx = ctx_for(1, 4, K=3)
    now = np.full((1, 4, 3), 0.95)
    old = np.full((1, 4, 3), 0.01)
    p = make_policy("paper", production=True)
    assert p.windows(now, now, old, ctx).sum() < p.windows(now, now, now, ctx).sum()


@settings(max_examples=25, deadline=None)
@given(conf=arrays(np.float64, (2, 6, 5), elements=st.floats(0.01, 1)))
def test_flat_cost_verifies_everything(conf):
    ctx = ctx_for(2, 6, vm=lambda t: np.full(np.shape(t), 7.0), K=5)
    for pol in all_policies():
        if pol.name in ("vllm", "paper") or (pol.name == "sglang" and pol.cost is None):
            assert (pol.windows(conf, conf, conf, ctx) == 5).all(), pol.name


@settings(max_examples=30, deadline=None)
@given(conf=arrays(np.float64, (2, 8, 6), elements=st.floats(0.05, 0.95)), seed=st.integers(0, 1000))
def test_higher_confidence_gets_longer_windows(conf, seed):
    """A request whose confidences are all strictly higher than another's never gets a shorter window."""
    rng = np.random.default_rng(seed)
    hi = np.minimum(conf + rng.uniform(0.01, 0.05, conf.shape), 1.0)
    both = np.concatenate([conf, hi], axis=1)  # requests 0..7 low, 8..15 their higher twins
    ctx = ctx_for(2, 16, K=6)
    for pol in all_policies():
        l = pol.windows(both, both, both, ctx)
        assert (l[:, 8:] >= l[:, :8]).all(), pol.name


def test_threshold_and_fixed():
    conf = np.array([[[0.9, 0.5, 0.5], [0.2, 0.9, 0.9]]])
    ctx = ctx_for(1, 2, K=3)
    assert make_policy("threshold", tau=0.3).windows(conf, None, None, ctx).tolist() == [[2, 0]]
    assert make_policy("fixed").windows(conf, None, None, ctx).tolist() == [[3, 3]]
    tight = ctx_for(1, 2, K=3, limit=2 + 4)
    assert make_policy("fixed").windows(conf, None, None, tight).tolist() == [[3, 1]]  # FCFS trim


def test_additive_cost_from_cost_and_errors():
    class FakeCost:
        cpu_overhead_ms = 1.5

        def forward_ms(self, n):
            return 5.0 + 0.01 * n

        def draft_table_ms(self, kind, n):
            return None

    from dsim.spec.methods import make_method

    tab = AdditiveCost.from_cost(FakeCost(), make_method("dspark"), max_requests=256, max_tokens=4096)
    assert tab.bias == 1.5
    assert tab(1, 100) == pytest.approx(1.5 + make_method("dspark").draft_ms(FakeCost(), 1) + 6.0)
    with pytest.raises(InputError):
        make_policy("nope")
    with pytest.raises(InputError):
        make_policy("vllm", tau=0.3)


def test_verify_modes():
    w = np.array([[0, 3, 7]])
    v, c = verify_tokens_and_commit("static", w, 7)
    assert v.tolist() == [[7, 7, 7]] and c.tolist() == [[7, 7, 7]]
    v, c = verify_tokens_and_commit("compact", w, 7)
    assert v.tolist() == [[0, 3, 7]] and c.tolist() == [[0, 3, 7]]
    v, c = verify_tokens_and_commit("cap-accept", w, 7)
    assert v.tolist() == [[7, 7, 7]] and c.tolist() == [[0, 3, 7]]
    with pytest.raises(InputError):
        verify_tokens_and_commit("bogus", w, 7)


tie_arrays = st.tuples(st.integers(1, 3), st.integers(1, 24), st.integers(1, 7)).flatmap(
    lambda s: arrays(np.float32, s, elements=st.sampled_from([0.0, 0.25, 0.5, 0.9, 1.0]))
)


def _both(name, **opts):
    ref_opts = dict(opts)
    if isinstance(opts.get("cost"), AdditiveCost):
        c = opts["cost"]
        ref_opts["cost"] = RP.AdditiveCost(c.bias, c.alpha_r, c.alpha_ms, c.theta_m, c.theta_ms)
    return make_policy(name, **opts), RP.make_policy(name, **ref_opts)


@settings(max_examples=150, deadline=None)
@given(
    now=st.one_of(tie_arrays, conf_arrays),
    seed=st.integers(0, 2**16),
    limit=st.integers(0, 80),
    extra=st.integers(0, 20),
    k_max=st.integers(1, 7),
    step_extra=st.booleans(),
    big=st.booleans(),
)
def test_compiled_policies_equal_the_numpy_reference(now, seed, limit, extra, k_max, step_extra, big):
    """Every policy's compiled windows are exactly the numpy reference's on the same float32
    inputs: ties, zero scores, trimmed k_max, token limits, per-step extra costs, cost tables.
    ``big`` tiles the batch past the radix sort's small-array cut-off (64 scores)."""
    if big:
        now = np.tile(now, (1, 12, 1))
    k, R, K = now.shape
    rng = np.random.default_rng(seed)
    prev = rng.permutation(now.reshape(-1)).reshape(now.shape) if seed % 2 else rng.random(now.shape).astype(np.float32)
    old = rng.random(now.shape).astype(np.float32)
    se = rng.random(k) * 3 if step_extra else None
    args = dict(
        verify_ms=stair,
        draft_ms=1.0,
        n_nondraft=np.full(k, R + extra),
        token_limit=R + extra + limit,
        k_max=k_max,
        step_extra_ms=se,
    )
    cost = AdditiveCost(0.5, (1, 64), (0.1, 2.0), (1, 8, 64, 1024), (5.0, 5.5, 7.0, 30.0))
    # every registered spelling (a new policy is held to its reference here without a new line),
    # and the options that take another path
    cases = [(name, {}) for name in POLICY_SPELLINGS] + [("threshold", {"tau": 0.5}), ("sglang", {"cost": cost})]
    for name, opts in cases:
        pol, ref = _both(name, **opts)
        got = pol.windows(now, prev, old, PolicyContext(**args))
        want = ref.windows(now, prev, old, RP.PolicyContext(**args))
        assert got.tolist() == want.tolist(), name


score_arrays = st.integers(0, 3000).flatmap(
    lambda n: arrays(
        np.float32, n, elements=st.one_of(st.sampled_from([0.0, 0.125, 0.5, 1.0]), st.floats(0, 1, width=32))
    )
)


@settings(max_examples=80, deadline=None)
@given(v=score_arrays, seed=st.integers(0, 2**16))
def test_compiled_sort_and_selection_equal_numpy(v, seed):
    """The policies' descending radix sort (both digit widths: below and from 512 scores) is
    numpy's sort reversed, and the selection of the b-th largest score is the sorted array's
    element b, ties and zeros included."""
    from dsim.engine import compiled_budget

    out = np.empty_like(v)
    compiled_budget._sort_desc(v, out)
    assert out.tobytes() == np.sort(v)[::-1].tobytes()
    if len(v):
        b = int(np.random.default_rng(seed).integers(0, len(v)))
        assert compiled_budget._kth_largest(v, b) == out[b]
        assert compiled_budget._kth_largest(v, 0) == out[0] and compiled_budget._kth_largest(v, len(v) - 1) == out[-1]


@settings(max_examples=120, deadline=None)
@given(
    R=st.integers(1, 600),
    K=st.integers(1, 7),
    kind=st.sampled_from(["uniform", "ones", "steep", "zeros", "flat", "tiny"]),
    base=st.floats(1.0, 60.0),
    slope=st.floats(0.0, 0.08),
    stair=st.integers(1, 16),
    dip=st.booleans(),
    extra=st.sampled_from([0.0, 0.25, 3.0]),
    cut=st.floats(0.0, 1.0),
    seed=st.integers(0, 2**16),
)
def test_ratio_argmax_in_any_order_equals_the_sorted_loop(R, K, kind, base, slope, stair, dip, extra, cut, seed):
    """The vllm / paper-production budget from scores in any order (exact grouped sums, only the
    groups near the maximum sorted) is the sorted loop's argmax, first maximum included: survival
    scores of several shapes (ties, zeros, values below the exact-sum range), staircase cost rows,
    some not non-decreasing (then the full sort)."""
    from dsim.engine import compiled_budget

    rng = np.random.default_rng(seed)
    c = rng.random((K, R)).astype(np.float32)
    if kind == "ones":
        c = np.where(rng.random((K, R)) < 0.4, np.float32(1.0), c)
    elif kind == "steep":
        c = (c**6).astype(np.float32)
    elif kind == "zeros":
        c = np.where(rng.random((K, R)) < 0.3, np.float32(0.0), c)
    elif kind == "flat":
        c = (0.95 + 0.05 * c).astype(np.float32)
    v = np.empty(K * R, np.float32)  # the request-major survival scores, as the policies compute them
    compiled_budget._scores(c, K, R, v, np.empty(0, np.float32))
    if kind == "tiny":
        v[rng.integers(0, len(v), size=4)] = np.float32(3e-30)
    limit = int(round(cut * len(v)))
    row = np.floor((base + slope * np.arange(limit + 1)) * stair) / stair
    if dip and limit > 1:
        row[limit // 2] *= 0.5  # (not non-decreasing)
    srt = np.empty_like(v)
    compiled_budget._sort_desc(v, srt)
    want = compiled_budget._ratio_argmax(srt, len(v), float(R), row, extra, limit)
    assert compiled_budget._ratio_argmax_any(v, float(R), row, extra, limit) == want
    assert compiled_budget._ratio_argmax_any(srt, float(R), row, extra, limit) == want
