"""The per-request attention terms of format-2 profiles (dsim.cost.AttentionTerms): closed forms,
properties against the GPU executor's own split plan, format compatibility (format-1 profiles load
and price exactly as before) and the engine's use of them (its recorded step costs equal the cost
interface's on the same shapes)."""

import dataclasses
import math
from pathlib import Path

import numpy as np
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from builders import ATTENTION_TERMS
from dsim import cost as C
from dsim.cost import attention as CA
from dsim.cost.profile_upgrade import FORMAT_VERSION
from dsim.errors import InputError
from validator.gpu import plan
from validator.gpu.fit import predicted_step_ms

ROOT = Path(__file__).resolve().parent.parent
SHIPPED = sorted(p for p in (ROOT / "profiles").rglob("*.yaml") if "models" not in p.parts)

A = ATTENTION_TERMS


def v2(profile_path: Path, a: C.AttentionTerms = A) -> dict:
    d = yaml.safe_load(profile_path.read_text())
    d["format_version"] = 2
    d["attention"] = {f.name: getattr(a, f.name) for f in dataclasses.fields(a)}
    return d


def test_decode_features_closed_form():
    # 33 requests of 1024 tokens, one query token: L = 1024 (33 chunk sets fill 2 x 132 SMs with
    # 8 KV heads), one chunk each, 264 CTAs = one wave of 2 x 132: capacity = the KV read exactly
    wave, ctas, merge = C.decode_features([1] * 33, [1024] * 33, A)
    assert wave == pytest.approx(33 * 1024 / 1000)
    assert ctas == pytest.approx(264 / 1000)
    assert merge == pytest.approx(1 * 4 * 33 * 8 / 1e6)
    # one request 32x longer than the rest (same total): the same KV read, more chunks for one
    # request, so a deeper merge grid; and 392 CTAs on 264 slots, dispatched KV head by KV head
    # (17 chunks of 1024, then 32 of 512): heads 0-4 and 19 CTAs of head 5 start at 0, the other
    # 128 take the slots the 512-token CTAs free at 512, and head 6-7's 1024-token chunks end at
    # 1536: the makespan is 1.5 chunks, not the 1 chunk the same KV spread evenly takes
    ctx = [1024 * 17] + [1024 // 2] * 32
    wave2, ctas2, merge2 = C.decode_features([1] * 33, ctx, A)
    assert sum(ctx) == 33 * 1024 and merge2 == pytest.approx(17 * merge)
    assert wave2 == pytest.approx(1536 * 264 / 8 / 1000)
    # 66 equal requests: two exact waves, capacity = the KV read again
    assert C.decode_features([1] * 66, [1024] * 66, A)[0] == pytest.approx(66 * 1024 / 1000)
    # too little work to fill the SMs: the longest chunk (here the 100-token contexts, below
    # min_chunk) is the critical path of every slot
    big = dataclasses.replace(A, min_chunk=4096)
    assert C.decode_features([1, 1], [100, 100], big)[0] == pytest.approx(100 * 264 / 8 / 1000)
    assert C.decode_features([], [], A) == (0.0, 0.0, 0.0)


def test_prefill_pairs_closed_form():
    # 8192 tokens at context 0: 64 query blocks x 32 heads = 2048 CTAs, 8 waves of 264 (2112 slots)
    assert C.prefill_pairs(8192, 0, A) == pytest.approx(8 * 264 / 32 * 128 * 4096 / 1e6)
    # 512 tokens over a 122880-token prefix: 128 CTAs, one partly filled wave priced whole
    p = C.prefill_pairs(512, 122880, A)
    assert p == pytest.approx(264 / 32 * 128 * (122880 + 256) / 1e6)
    assert p > 512 * (122880 + 256) / 1e6 * 2


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.tuples(st.integers(1, 8), st.integers(0, 130_000)), min_size=1, max_size=300),
    st.sampled_from([1, 2, 4]),
)
def test_decode_features_match_the_executors_split(reqs, occ):
    """The chunk count and longest split the cost model sees are the executor's (model.split_plan),
    and the wave capacity (the chunk CTAs' list-schedule makespan over the slots) covers the KV
    read and at most exceeds it by one longest chunk over every slot (Graham's bound)."""
    M = pytest.importorskip("validator.gpu.model")
    q = [r[0] for r in reqs]
    ctx = [r[1] for r in reqs]
    a = dataclasses.replace(A, decode_ctas_per_sm=occ)
    parts = M.split_plan([max(c, 1) for c in ctx], [a.group * x for x in q], a.kv_heads, dict(M.SPLIT, sms=a.sms))
    wave, ctas, merge = C.decode_features(q, ctx, a)
    assert ctas * 1000 == pytest.approx(a.kv_heads * sum(len(p) for p in parts))
    assert merge * 1e6 == pytest.approx(max(len(p) for p in parts) * a.group * sum(q) * a.kv_heads)
    tot = sum(max(c, 1) for c in ctx)
    slots = a.sms * a.decode_ctas_per_sm
    per = a.kv_heads * max(1, -(-(a.group * max(q)) // a.block_rows))
    longest = max(max(p) for p in parts)
    assert tot - 1e-6 <= wave * 1000 <= tot + longest * slots / per + 1e-6


@settings(max_examples=80, deadline=None)
@given(
    st.lists(st.tuples(st.integers(1, 8), st.integers(0, 130_000)), min_size=1, max_size=300),
    st.sampled_from([1, 2, 4]),
)
def test_wave_capacity_is_a_list_schedule(reqs, occ):
    """The wave capacity is the makespan of a list schedule of the chunk CTAs over the slots: at
    least the KV read (all slots busy), at most the KV read plus one longest chunk on every slot
    (Graham's bound), and exactly the KV read when every chunk has one length and the CTAs fill
    whole waves."""
    q = [r[0] for r in reqs]
    ctx = [max(r[1], 1) for r in reqs]
    a = dataclasses.replace(A, decode_ctas_per_sm=occ)
    wave = C.decode_features(q, ctx, a)[0] * 1000
    L = CA.split_chunk_tokens(np.asarray(ctx), a.group * max(q), a)
    per = a.kv_heads * max(1, -(-(a.group * max(q)) // a.block_rows))
    slots = a.sms * a.decode_ctas_per_sm
    tot = sum(ctx)
    assert tot - 1e-6 <= wave <= tot + min(L, max(ctx)) * slots / per + 1e-6
    # R equal requests of one chunk each, R x per CTAs = whole waves: no idle slot
    R = slots // math.gcd(slots, per) * (1 + len(reqs) % 3)
    c1 = min(L, 4096)
    eq = C.decode_features([1] * R, [c1] * R, dataclasses.replace(a, balance=1.0, min_chunk=c1))[0] * 1000
    assert eq == pytest.approx(R * c1)


@settings(max_examples=80, deadline=None)
@given(
    st.lists(st.integers(0, 40_000), min_size=1, max_size=120),
    st.integers(16, 5000),
    st.sampled_from([1, 2, 8]),
    st.sampled_from([1, 2]),
    st.sampled_from([3, 5, 8, 132, 133, 264]),
)
def test_makespan_is_the_list_schedule(ctx, L, kv_heads, qblocks, slots):
    """dsim.cost.attention._makespan against a list schedule written out with heapq: the CTAs in dispatch order
    (KV head, request, chunk, query block), each on the earliest-free slot."""
    import heapq

    lens = []
    for c in ctx:
        c = max(c, 1)
        k = -(-c // L)
        lens += [L] * (k - 1) + [c - (k - 1) * L]
    longest = min(L, max(max(ctx), 1))
    free = [0] * slots
    for _h in range(kv_heads):
        for d in lens:
            for _b in range(qblocks):
                heapq.heapreplace(free, free[0] + d)
    want = float(longest) if len(lens) * kv_heads * qblocks <= slots else float(max(free))
    got = CA._makespan(np.asarray(ctx, dtype=np.int64), L, kv_heads, qblocks, slots, longest)
    assert got == want


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 16384), st.integers(0, 200_000))
def test_prefill_pairs_cover_the_causal_pairs(q, c):
    qb = math.ceil(q / 128) * 128
    assert C.prefill_pairs(q, c, A) >= qb * (c + 0.5 * q) / 1e6 - 1e-9


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.stem)
def test_format_1_profiles_price_as_before(path):
    """A profile without attention terms: context_ms is 0, prefill_ms the pairs formula, and the
    written dict carries no format-2 keys (round trip unchanged)."""
    p = C.load_profile(str(path))
    cm = C.CostModel(p)
    if p.attention is not None or p.request_attention is not None:
        pytest.skip("a format-2 or format-3 profile")
    assert not cm.has_context_terms
    assert cm.context_ms([1, 4, 8], [100, 50_000, 120_000]) == 0.0
    chunks = [(512, 0), (2048, 65536)]
    d, a = p.prefill_discount_ms_per_ktok / 1000, p.prefill_attn_ms_per_mpair / 1e6
    assert cm.prefill_ms(chunks) == pytest.approx(sum(q * (a * (c + q / 2) - d) for q, c in chunks))
    out = C.profile_to_dict(p)
    assert out["format_version"] == FORMAT_VERSION and "attention" not in out


def test_format_2_round_trip_and_errors(tmp_path):
    base = ROOT / "profiles" / "h200" / "h200-llama-3.1-8b.yaml"
    d = v2(base)
    p = C.profile_from_dict(d, "x.yaml")
    assert p.format_version == 2 and p.attention == A
    again = C.profile_from_dict(C.profile_to_dict(p), "y.yaml")
    assert again.attention == A and again.format_version == FORMAT_VERSION  # written in the current format
    bad = v2(base)
    bad.pop("format_version")
    with pytest.raises(InputError, match="format_version: 2"):
        C.profile_from_dict(bad, "x.yaml")
    bad = v2(base)
    bad["attention"]["warp_speed"] = 1
    with pytest.raises(InputError, match="warp_speed"):
        C.profile_from_dict(bad, "x.yaml")
    bad = v2(base)
    bad["attention"]["kv_heads"] = 5
    with pytest.raises(InputError, match="does not divide"):
        C.profile_from_dict(bad, "x.yaml")
    bad = v2(base)
    bad["format_version"] = FORMAT_VERSION + 1  # a format this build does not know
    with pytest.raises(InputError, match="format_version"):
        C.profile_from_dict(bad, "x.yaml")


def test_format_2_prices_unequal_contexts_and_long_prefixes_higher():
    cm = C.CostModel(C.profile_from_dict(v2(ROOT / "profiles" / "h200" / "h200-llama-3.1-8b.yaml"), "x.yaml"))
    uni = cm.context_ms([4] * 16, [12288] * 16)
    heavy = cm.context_ms([4] * 16, [98304] + [6553] * 15)
    assert heavy > uni > 0
    # prefill: the same pairs cost more as one short chunk over a long prefix than as a long chunk
    assert cm.prefill_ms([(512, 122880)]) > 0
    assert cm.context_ms([], []) == 0.0


def test_context_ms_closed_form():
    """context_ms of a format-2 profile is the features times their coefficients: 33 requests of
    1024 tokens, one chunk each, one exact wave (capacity 33,792 tokens, 264 CTAs, 1 x 4 x 33 x 8
    merge cells, 33 requests, a 1024-token longest chunk over 264 / 8 slots)."""
    a = dataclasses.replace(A, ms_per_request=0.002, tail_ms_per_ktok=0.003, decode_step_ms=0.7)
    cm = C.CostModel(C.profile_from_dict(v2(ROOT / "profiles" / "h200" / "h200-llama-3.1-8b.yaml", a), "x.yaml"))
    want = 0.01 * 33.792 + 0.3 * 0.264 + 0.5 * (4 * 33 * 8 / 1e6) + 0.002 * 33 + 0.003 * 33.792 + 0.7
    assert cm.context_ms([1] * 33, [1024] * 33) == pytest.approx(want, rel=1e-12)
    assert cm.context_ms(np.ones(33, np.int32), np.full(33, 1024, np.int32)) == pytest.approx(want, rel=1e-12)
    # the split-KV path's per-step term: once per step with decode requests, never for a prompt-only one
    args = cm.context_args()
    assert C.context_ms_compiled(np.ones(33, np.int64), np.full(33, 1024, np.int64), *args[1:]) == pytest.approx(want)
    assert cm.context_ms([], []) == 0.0
    a0 = dataclasses.replace(a, decode_step_ms=0.0)
    cm0 = C.CostModel(C.profile_from_dict(v2(ROOT / "profiles" / "h200" / "h200-llama-3.1-8b.yaml", a0), "x.yaml"))
    for q, c in (([1], [1024]), ([8, 3], [70_000, 5])):
        assert cm.context_ms(q, c) - cm0.context_ms(q, c) == pytest.approx(0.7, rel=1e-12)
    # the field round-trips through the profile file and is 0 where a profile does not give it
    assert C.profile_to_dict(cm.profile)["attention"]["decode_step_ms"] == 0.7
    assert (
        C.CostModel(
            C.profile_from_dict(v2(ROOT / "profiles" / "h200" / "h200-llama-3.1-8b.yaml"), "x.yaml")
        ).attention.decode_step_ms
        == 0.0
    )


def test_context_ms_replaces_the_forward_share_past_the_dense_table():
    """Format 3, a step past the dense table (8 x 2100 = 16,800 tokens > DENSE_TOKENS): context_ms
    replaces the forward table's attention share at that size (the last segment extrapolated, as
    forward_ms is) and the KV slope's by the requests' own attention."""
    p = C.load_profile("deepseek-v3-h200-tp8-ep8")
    cm = C.CostModel(p)
    assert p.request_attention is not None and p.forward.x[-1] <= C.DENSE_TOKENS
    ax = np.asarray(p.forward.x, dtype=float)
    share = np.asarray(p.request_attention.forward_share_ms, dtype=float)
    for R, q, ctx in ((2100, 8, 4096), (4096, 5, 1000), (3, 4, 70_000)):
        n = R * q
        own = C.request_attention_ms(np.full(R, q), np.full(R, ctx), p.request_attention)
        slope = (share[-1] - share[-2]) / (ax[-1] - ax[-2])
        at_n = share[-1] + slope * (n - ax[-1]) if n > ax[-1] else cm._forward_share(n)
        want = own - at_n - cm.kv_ms_per_tok * R * (ctx + q)
        assert cm.context_ms(np.full(R, q), np.full(R, ctx)) == pytest.approx(want, rel=1e-9, abs=1e-9)


def _simulate(profile, method="dspark", prefix=False, requests=60, concurrency=16):
    from dsim.engine.config import EngineConfig
    from dsim.sim import SimConfig, SpecConfig, simulate
    from dsim.workload import load_workload

    w = load_workload("azure-conv", n=requests)
    w = dataclasses.replace(w, closed_loop_concurrency=concurrency, arrival_s=np.zeros(len(w.arrival_s)))
    eng = dataclasses.replace(EngineConfig(), record_shapes=True, enable_prefix_caching=prefix)
    spec = SpecConfig(method) if method != "none" else SpecConfig()
    return simulate(SimConfig(workload=w, profile=profile, spec=spec, engine=eng, gpus_per_node=1))


@pytest.mark.needs_traces("azure-conv")
def test_engine_zero_terms_change_nothing():
    base = dataclasses.replace(
        C.load_profile("h200-llama-3.1-8b"), format_version=1, attention=None, prefill_attn_ms_per_mpair=1.4
    )
    zero = dataclasses.replace(
        A, wave_ms_per_ktok=0.0, chunk_ms_per_kcta=0.0, merge_ms_per_mcell=0.0, prefill_ms_per_mpair=0.0
    )
    p2 = dataclasses.replace(base, format_version=2, attention=zero)
    a, b = _simulate(base), _simulate(p2)
    assert {k: v for k, v in a.summary.items() if k != "wall_time_s"} == {
        k: v for k, v in b.summary.items() if k != "wall_time_s"
    }
    assert a.shapes == b.shapes


@pytest.mark.needs_traces("azure-conv")
@pytest.mark.parametrize("method", ["dspark", "none"])
def test_engine_step_costs_are_the_cost_interfaces(method):
    """Every recorded step's forward cost is the cost model's on the recorded shape (single steps
    exactly; decode windows price their contexts at the window's first step, within 1%)."""
    base = C.load_profile("h200-llama-3.1-8b")
    p2 = dataclasses.replace(base, format_version=2, attention=A)
    res = _simulate(p2, method=method)
    cm = C.CostModel(p2)
    cm1 = C.CostModel(dataclasses.replace(base, format_version=1, attention=None))
    errs, extra = [], []
    for _rep, _t, q, ctx, ms in res.shapes:
        shape = plan.StepShape(tuple(q), tuple(ctx))
        pred = predicted_step_ms(cm, shape)
        errs.append(abs(pred - ms) / pred)
        extra.append(pred - predicted_step_ms(cm1, shape))
    errs = np.asarray(errs)
    assert len(errs) > 50
    assert np.count_nonzero(errs < 1e-9) >= 5 and errs.max() < 0.01
    # the terms (all positive here) make every step dearer than the profile without them
    assert min(extra) >= -1e-9 and np.mean(extra) > 0
