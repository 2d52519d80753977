"""The MoE step-cost composer: model decomposition, kernel tables, topologies, composed profiles."""

import json

import numpy as np
import pytest

from dsim.cost import CostModel
from dsim.cost.profile_upgrade import FORMAT_VERSION
from dsim.errors import InputError
from dsim.profiling.compose import compose_profile, kv_capacity, required_ops
from dsim.profiling.drafters import DRAFT_REQUESTS, draft_ops
from dsim.profiling.kernel_ops import layer_ops, step_ops
from dsim.profiling.kernel_tables import HARDWARE, KernelTable, Roofline, load_kernel_table
from dsim.profiling.models import load_model
from dsim.profiling.pricer import Pricer, moe_lockstep_factor
from dsim.profiling.topology import parse_topology


@pytest.mark.parametrize(
    "name,total_b,active_b",
    [
        # public parameter counts (without the MTP module): DeepSeek-V3 671B / 37B (technical report);
        # DeepSeek-V4-Flash 284B / 13B, V4-Pro 1.6T / 49B (model cards)
        ("deepseek-v3", 671, 37),
        ("deepseek-v4-flash", 284, 13),
        ("deepseek-v4-pro", 1600, 49),
    ],
)
def test_parameter_counts_match_public_figures(name, total_b, active_b):
    c = load_model(name).param_count()
    assert (c["total"] - c["mtp"]) / 1e9 == pytest.approx(total_b, rel=0.03)
    assert c["active"] / 1e9 == pytest.approx(active_b, rel=0.06)


def test_v4_layer_kinds_and_kv_per_token():
    m = load_model("deepseek-v4-flash")
    assert m.layers == 43 and len(m.attn_kinds) == 43
    assert m.attn_kinds.count("v4_csa") == 21 and m.attn_kinds.count("v4_hca") == 20
    # closed form: per CSA layer (448 + 128) / 4 + 128 / 4 bytes, per HCA layer 576 / 128
    assert m.kv_bytes_per_token() == pytest.approx(21 * (576 / 4 + 32) + 20 * 576 / 128)
    assert m.kv_bytes_per_request() == 43 * 128 * 576
    v3 = load_model("deepseek-v3")
    assert v3.kv_bytes_per_token() == 61 * 576 * 2


def test_topology_grammar():
    t = parse_topology("dp8-ep8")
    assert (t.attn_dp, t.attn_tp, t.gpus, t.gpus_per_replica) == (8, 1, 8, 1)
    t = parse_topology("TP8-EP8")
    assert (t.attn_dp, t.attn_tp, t.gpus_per_replica) == (1, 8, 8)
    t = parse_topology("tp2-dp8-ep16")
    assert (t.attn_tp, t.attn_dp, t.gpus, t.gpus_per_replica, t.nodes) == (2, 8, 16, 2, 2)
    for bad in ("tp8", "dp8-ep4", "xx8-ep8", "dp0-ep0", "", "tp2-dp2-ep8"):
        with pytest.raises(InputError):
            parse_topology(bad)


def test_roofline_gemm_closed_form():
    r = Roofline(hardware="h200", kernel_floor_us=0.0)
    m, n, k = 16384, 8192, 8192  # compute bound
    want = 2 * m * n * k / (HARDWARE["h200"]["fp8"] * r.eff_flops) * 1e3
    assert r.ms(dict(op="gemm", dtype="fp8", m=m, n=n, k=k)) == pytest.approx(want)
    m = 1  # weight-read bound
    want = (m * k + k * n + m * n * 2) / (HARDWARE["h200"]["bw"] * r.eff_bw) * 1e3
    assert r.ms(dict(op="gemm", dtype="fp8", m=m, n=n, k=k)) == pytest.approx(want)


def test_kernel_table_exact_and_loglog_interpolation(tmp_path):
    recs = [dict(op="gemm", dtype="fp8", m=m, n=64, k=64, ms=0.01 * m**0.5) for m in (1, 4, 16, 64)]
    t = KernelTable("t", {"kind": "measured"}, recs)
    assert t.ms(dict(op="gemm", dtype="fp8", m=16, n=64, k=64)) == pytest.approx(0.04)
    assert t.ms(dict(op="gemm", dtype="fp8", m=8, n=64, k=64)) == pytest.approx(0.01 * 8**0.5)  # power law exact
    assert t.ms(dict(op="gemm", dtype="fp8", m=128, n=64, k=64)) is None  # no extrapolation
    assert t.ms(dict(op="gemm", dtype="bf16", m=8, n=64, k=64)) is None
    p = tmp_path / "k.json"
    p.write_text(json.dumps({"name": "k", "provenance": {}, "records": [dict(op="gemm", m=1, ms=float("nan"))]}))
    with pytest.raises(InputError, match=r"records\[0\]\.ms"):
        load_kernel_table(str(p))


def test_required_ops_cover_every_lookup():
    """A table priced on exactly required_ops answers every lookup (no roofline fallback) and,
    priced with the roofline's own numbers, composes the same profile as the roofline alone."""
    model, topo = load_model("deepseek-v4-flash"), parse_topology("dp8-ep8")
    roof = Roofline(hardware="h200")
    # required_ops lists the drafter at the collections' grid; the profile's drafter sizes between
    # those points (vLLM's capture sizes) are added here, as a real table answers them by interpolation
    draft = {
        op.record
        for kind in ("mtp", "eagle3", "dspark")
        for R in DRAFT_REQUESTS
        for op in draft_ops(model, topo, "h200", kind, R, 7)
    }
    recs = [dict(r, ms=roof.ms(r)) for r in required_ops(model, topo, "h200")]
    have = {json.dumps(r, sort_keys=True) for r in required_ops(model, topo, "h200")}
    recs += [dict(r, ms=roof.ms(dict(r))) for r in map(dict, draft) if json.dumps(r, sort_keys=True) not in have]
    table = KernelTable("roof-as-table", {"kind": "measured", "method": "test"}, recs)
    a = compose_profile(model, topo, "h200", None)
    b = compose_profile(model, topo, "h200", table)
    assert "0 of" in b.provenance["method"]
    np.testing.assert_allclose(a.forward.ms, b.forward.ms, rtol=1e-9)
    assert a.kv_ms_per_ktok == pytest.approx(b.kv_ms_per_ktok)
    for k in a.draft:
        np.testing.assert_allclose(a.draft[k].ms, b.draft[k].ms, rtol=1e-9)


@pytest.mark.parametrize(
    "model,topo,hw",
    [
        ("deepseek-v4-flash", "dp8-ep8", "h200"),
        ("deepseek-v4-flash", "tp8-ep8", "h200"),
        ("deepseek-v4-pro", "dp8-ep8", "b300"),
        ("deepseek-v3", "tp8-ep8", "h200"),
    ],
)
def test_composed_profiles_are_valid_and_monotone(model, topo, hw):
    p = compose_profile(load_model(model), parse_topology(topo), hw)
    c = CostModel(p)
    n = np.arange(1, 16384)
    f = c.forward_ms(n)
    assert np.all(np.diff(f) >= 0) and f[0] > 0
    assert p.gpus_per_replica == parse_topology(topo).gpus_per_replica
    assert p.kv_cache_gib > 0 and p.provenance["memory_per_gpu_gb"]["kv_cache"] > 0
    # more tokens per step cost more per step but less per token (batching amortizes weight reads)
    assert c.forward_ms(256) / 256 < c.forward_ms(1)


def test_pro_fp8_does_not_fit_one_h200_node():
    # V4-Pro with FP8 experts (Hopper) is ~1.6 TB of weights: 8 x 141 GB cannot hold it
    with pytest.raises(InputError, match="no KV cache"):
        kv_capacity(load_model("deepseek-v4-pro"), parse_topology("dp8-ep8"), "h200", 1024)
    with pytest.raises(InputError, match="no KV cache"):  # attention replicated on 16 ranks: still too much
        kv_capacity(load_model("deepseek-v4-pro"), parse_topology("dp16-ep16"), "h200", 1024)
    gib, mem = kv_capacity(load_model("deepseek-v4-pro"), parse_topology("tp2-dp8-ep16"), "h200", 1024)
    assert gib > 0 and mem["routed_experts"] == pytest.approx(1547.4 / 16, rel=0.01)


def test_lockstep_factor_properties():
    args = (48e6, 1e-7, 4e12)
    small = moe_lockstep_factor(1, 6, 256, 8, *args)
    big = moe_lockstep_factor(4096, 6, 256, 8, *args)
    assert small > 1.5  # 6 experts over 8 ranks: some rank holds 2+, others none
    assert 1.0 <= big < 1.15  # large batches balance out
    assert moe_lockstep_factor(64, 6, 256, 1, *args) == 1.0
    assert moe_lockstep_factor(64, 6, 256, 8, *args) == moe_lockstep_factor(64, 6, 256, 8, *args)


def test_dp_moe_sees_every_rank_tokens_tp_does_not():
    m = load_model("deepseek-v4-flash")
    dp = [o for o in layer_ops(m, parse_topology("dp8-ep8"), "h200", 32) if o.part == "moe_experts"][0]
    tp = [o for o in layer_ops(m, parse_topology("tp8-ep8"), "h200", 32) if o.part == "moe_experts"][0]
    assert dp.rec["tokens"] == 256 and tp.rec["tokens"] == 32
    parts = {o.part for o in step_ops(m, parse_topology("dp8-ep8"), "h200", 32)}
    assert {"attn_core", "moe_experts", "comm", "lm_head", "mhc", "indexer_proj"} <= parts


def test_table_includes_skip_double_counting():
    m, t = load_model("deepseek-v4-flash"), parse_topology("dp8-ep8")
    recs = [
        dict(
            op="attn",
            kind="v4_csa",
            phase="decode",
            batch=1,
            q=1,
            kv=1024,
            heads=64,
            ms=1.0,
            includes=["q_proj", "kv_proj"],
        )
    ]
    pr = Pricer(KernelTable("x", {}, recs), Roofline())
    q_ops = [o for o in step_ops(m, t, "h200", 1) if o.part in ("q_proj", "kv_proj")]
    assert q_ops and all(pr.ms(o) == 0.0 for o in q_ops)


def test_tables_in_order_of_preference_and_zero_ops():
    m, t = load_model("deepseek-v4-flash"), parse_topology("dp8-ep8")
    rec = dict(op="mhc", tokens=8, hidden=4096, hc_mult=4)
    a = KernelTable("a", {"kind": "measured"}, [dict(rec, ms=1.0)])
    b = KernelTable("b", {"kind": "measured"}, [dict(rec, ms=2.0)])
    op = [o for o in step_ops(m, t, "h200", 8) if o.part == "mhc"][0]
    assert Pricer([a, b], Roofline()).ms(op) == 1.0
    assert Pricer([a, b], Roofline(), prefer={"mhc": "b"}).ms(op) == 2.0
    comm = [o for o in step_ops(m, t, "h200", 8) if o.part == "comm"][0]
    assert Pricer([a], Roofline(), frozenset({"comm"})).ms(comm) == 0.0
    with pytest.raises(InputError, match="not one of the kernel tables"):
        Pricer([a], Roofline(), prefer={"mhc": "zz"})


def test_layer_glue_recovers_a_known_offset():
    """Layer records made as the composer's own sum + 0.1 ms + 0.2 ms per 1000 tokens: the fit
    recovers both, and the held-out half is then exact."""
    from dsim.profiling.forward import composed_layer_ms, fit_layer_glue

    m, t = load_model("deepseek-v4-flash"), parse_topology("dp8-ep8")
    pr = Pricer(None, Roofline())
    recs = []
    for kind in ("v4_csa", "v4_hca"):
        for B, q, kv in ((1, 1, 2048), (8, 4, 8192), (32, 2, 8192), (64, 4, 4096), (256, 1, 2048), (1, 2048, 0)):
            r = dict(op="layer", model=m.name, topology=t.name, attn_kind=kind, batch=B, q=q, kv=kv)
            r["ms"] = composed_layer_ms(m, t, "h200", r, pr) + 0.1 + 0.0002 * B * q
            recs.append(r)
    g = fit_layer_glue(m, t, "h200", pr, recs)
    assert g.a_ms == pytest.approx(0.1, abs=1e-6) and g.b_ms_per_tok == pytest.approx(0.0002, rel=1e-4)
    assert g.fit["applied"] and g.fit["check_median_abs_pct"] < 1e-3
    p = compose_profile(m, t, "h200", None, layer_records=recs)
    q = compose_profile(m, t, "h200", None)
    # every layer of a 1-token step pays the glue
    assert CostModel(p).forward_ms(1) - CostModel(q).forward_ms(1) == pytest.approx(m.layers * (0.1 + 0.0002), rel=1e-3)


ATTN_PARTS = ("q_proj", "kv_proj", "o_proj", "compressor", "indexer_proj", "mla_absorb")


@pytest.mark.parametrize(
    "model,kind",
    [
        ("deepseek-v4-flash", "v4_csa"),
        ("deepseek-v4-flash", "v4_hca"),
        ("deepseek-v4-flash", "v4_swa"),
        ("deepseek-v4-pro", "v4_csa"),
        ("deepseek-v3", "mla"),
    ],
)
def test_layer_projections_read_every_attention_weight_once(model, kind):
    """The projection GEMMs of one layer (groups x n x k per record) are exactly the attention block's
    parameters of the public config (one GPU holding all heads: data-parallel attention)."""
    m = load_model(model)
    i = m.attn_kinds.index(kind)
    ops = [o for o in layer_ops(m, parse_topology("dp8-ep8"), "h200", 16, layers=[i]) if o.part in ATTN_PARTS]
    weights = sum(o.count * o.rec.get("groups", 1) * o.rec["n"] * o.rec["k"] for o in ops)
    assert weights == m.attn_params(kind)
    assert all(o.rec["m"] == 16 for o in ops)  # every product runs on the step's 16 tokens


def test_v4_flash_projection_shapes_closed_form():
    """V4-Flash (hidden 4096, 64 heads x 512, q_lora 1024, o_lora 1024, 8 output groups, indexer 64 x 128):
    the grouped output projection is 8 products [n, 4096] x [4096, 1024] in one launch, then [n, 8192] x
    [8192, 4096]; the compressor is 2 x 2 x 512 wide on ratio-4 layers and 2 x 512 on ratio-128 layers
    (bf16); the indexer's projections are 1024 -> 8192 (fp8), 4096 -> 64 and 4096 -> 512 (bf16)."""
    m, n = load_model("deepseek-v4-flash"), 32
    ops = layer_ops(m, parse_topology("dp8-ep8"), "h200", n)
    got = sorted(
        (o.part, o.count, o.rec["dtype"], o.rec["n"], o.rec["k"], o.rec.get("groups", 1))
        for o in ops
        if o.part in ("o_proj", "compressor", "indexer_proj")
    )
    assert got == sorted(
        [
            ("o_proj", 43, "fp8", 1024, 4096, 8),
            ("o_proj", 43, "fp8", 4096, 8192, 1),
            ("compressor", 21, "bf16", 2048, 4096, 1),
            ("compressor", 20, "bf16", 1024, 4096, 1),
            ("indexer_proj", 21, "fp8", 8192, 1024, 1),
            ("indexer_proj", 21, "bf16", 64, 4096, 1),
            ("indexer_proj", 21, "bf16", 512, 4096, 1),
        ]
    )
    # under TP8 each rank holds one output group: a plain GEMM
    tp = [o for o in layer_ops(m, parse_topology("tp8-ep8"), "h200", n) if o.part == "o_proj"]
    assert sorted((o.rec["n"], o.rec["k"], o.rec.get("groups", 1)) for o in tp) == [(1024, 4096, 1), (4096, 1024, 1)]


def test_v3_absorb_is_batched_over_local_heads():
    """V3 under TP8: 16 local heads; W_UK and W_UV as one batched GEMM each of 16 products on m = n tokens
    (not one GEMM of m = 16 n reading one head's weights): FLOPs 2 x n x 16 x 128 x 512 each."""
    m, n = load_model("deepseek-v3"), 8
    ab = [o for o in layer_ops(m, parse_topology("tp8-ep8"), "h200", n) if o.part == "mla_absorb"]
    assert sorted((o.rec["m"], o.rec["n"], o.rec["k"], o.rec["groups"]) for o in ab) == [
        (8, 128, 512, 16),
        (8, 512, 128, 16),
    ]
    r = Roofline(hardware="h200", kernel_floor_us=0.0)
    hw = HARDWARE["h200"]
    for m_ in (1, 65536):
        rec = dict(ab[0].rec, m=m_)
        flops = 2 * m_ * 16 * rec["n"] * rec["k"]
        nbytes = 16 * (m_ * rec["k"] * 2 + rec["k"] * rec["n"] * 2 + m_ * rec["n"] * 2)  # all 16 heads' weights
        want = max(flops / (hw["bf16"] * r.eff_flops), nbytes / (hw["bw"] * r.eff_bw)) * 1e3
        assert r.ms(rec) == pytest.approx(want)


def test_batched_gemm_without_a_table_record_is_priced_as_its_single_gemm():
    g = dict(op="gemm", dtype="fp8", m=8, n=1024, k=4096, groups=8)
    single = [dict(op="gemm", dtype="fp8", m=m, n=1024, k=32768, ms=0.01 * m) for m in (1, 16)]
    pr = Pricer(KernelTable("s", {"kind": "measured"}, single), Roofline())
    from dsim.profiling.kernel_ops import kernel_op

    assert pr.ms(kernel_op("o_proj", 1, **g)) == pytest.approx(0.08)
    assert pr.grouped_as_single == {"gemm": 1} and not pr.fallback
    both = KernelTable("b", {"kind": "measured"}, single + [dict(g, ms=0.5)])
    assert Pricer(both, Roofline()).ms(kernel_op("o_proj", 1, **g)) == 0.5  # a measured batched record wins


def test_attention_interpolates_along_context_and_query_length():
    """Attention records at kv 2048 / 8192 and q 2 / 4: a core at kv 4096 is linear in the context between
    them, at q 3 linear in the query tokens; exact where the table has the record."""
    recs = [
        dict(
            op="attn", kind="v4_csa", phase="decode", batch=b, q=q, kv=kv, heads=64, ms=0.1 + 0.001 * b + 1e-5 * kv * q
        )
        for b in (1, 64)
        for q in (2, 4)
        for kv in (2048, 8192)
    ]
    t = KernelTable("a", {"kind": "measured"}, recs)
    base = dict(op="attn", kind="v4_csa", phase="decode", heads=64)
    assert t.ms(dict(base, batch=64, q=2, kv=4096)) == pytest.approx(0.1 + 0.064 + 1e-5 * 4096 * 2)
    assert t.ms(dict(base, batch=64, q=3, kv=2048)) == pytest.approx(0.1 + 0.064 + 1e-5 * 2048 * 3)
    assert t.ms(dict(base, batch=64, q=3, kv=5120)) == pytest.approx(0.1 + 0.064 + 1e-5 * 5120 * 3)
    assert t.ms(dict(base, batch=64, q=2, kv=16384)) is None  # no extrapolation
    assert t.ms(dict(base, batch=64, q=4, kv=8192)) == recs[-1]["ms"]


# ------------------------------------------------------------- per-request attention (profile format 3)
def _format3_profile():
    """A composed V4-Flash dp8-ep8 profile from the roofline: every number below follows from it."""
    return compose_profile(load_model("deepseek-v4-flash"), parse_topology("dp8-ep8"), "h200", None)


def test_format3_profile_round_trips_and_is_validated(tmp_path):
    from dsim.cost import load_profile, save_profile

    p = _format3_profile()
    assert p.format_version == 3 and p.request_attention is not None
    path = tmp_path / "p.yaml"
    save_profile(p, path)
    q = load_profile(str(path))
    np.testing.assert_allclose(q.request_attention.step_ms, p.request_attention.step_ms, rtol=1e-4, atol=1e-5)
    assert list(q.request_attention.ctx) == list(p.request_attention.ctx)
    import yaml

    d = yaml.safe_load(path.read_text())
    bad = dict(d, format_version=2)
    path.write_text(yaml.safe_dump(bad))
    with pytest.raises(InputError, match="request_attention: needs format_version: 3"):
        load_profile(str(path))
    bad = dict(d)
    bad["request_attention"] = dict(
        d["request_attention"], forward_share_ms=d["request_attention"]["forward_share_ms"][:-1]
    )
    path.write_text(yaml.safe_dump(bad))
    with pytest.raises(InputError, match="forward_share_ms: has"):
        load_profile(str(path))
    bad["request_attention"] = dict(d["request_attention"], step_ms=d["request_attention"]["step_ms"][1:])
    path.write_text(yaml.safe_dump(bad))
    with pytest.raises(InputError, match="step_ms"):
        load_profile(str(path))


def test_context_ms_prices_each_requests_own_attention():
    """Equal requests: step_ms + context_ms = the table's non-attention part + the tabulated
    attention of that batch shape, exactly, at table points; so one request verifying 8 tokens
    costs what the table says for (1, 8, ctx), not what 8 one-token requests cost."""
    p = _format3_profile()
    c = CostModel(p)
    ra = p.request_attention
    b = {int(x): i for i, x in enumerate(ra.batch)}
    j = {int(x): i for i, x in enumerate(ra.q)}
    k = {int(x): i for i, x in enumerate(ra.ctx)}
    fx = [int(x) for x in p.forward.x]
    for R, q, ctx in ((1, 8, 2048), (8, 1, 2048), (32, 4, 8192), (256, 2, 32768), (64, 8, 131072)):
        n = R * q
        base = c.step_ms(n, R * (ctx + q)) + c.context_ms(np.full(R, q), np.full(R, ctx))
        i = fx.index(min(x for x in fx if x >= n))  # the forward size the step is looked up at
        nonattn = np.maximum.accumulate(p.forward.ms)[i] - ra.forward_share_ms[i]
        assert base == pytest.approx(nonattn + ra.step_ms[b[R], j[q], k[ctx]], rel=1e-9, abs=1e-9)
    # one request verifying 8 tokens vs 8 one-token requests: the table's shapes, not one total
    one8 = c.step_ms(8, 8 + 2048) + c.context_ms([8], [2048])
    eight1 = c.step_ms(8, 8 * 2049) + c.context_ms([1] * 8, [2048] * 8)
    assert one8 - eight1 == pytest.approx(ra.step_ms[b[1], j[8], k[2048]] - ra.step_ms[b[8], j[1], k[2048]], abs=1e-9)


def test_context_ms_mixed_batch_is_the_mean_of_equal_batches():
    c = CostModel(_format3_profile())
    q = np.array([1, 8, 3, 8, 5, 2, 7, 1])
    ctx = np.array([600, 5000, 100, 90000, 2048, 300000, 7000, 0])
    n, kv = int(q.sum()), int((q + ctx).sum())
    own = c.context_ms(q, ctx) + c._forward_share(n) + c.kv_ms_per_tok * kv
    each = [
        c.context_ms(np.full(8, a), np.full(8, b)) + c._forward_share(8 * a) + c.kv_ms_per_tok * 8 * (a + b)
        for a, b in zip(q, ctx)
    ]
    assert own == pytest.approx(np.mean(each), rel=1e-9)
    # the step never costs less than the forward table's non-attention part
    for R in (1, 7, 100, 700):
        qq, cc = np.ones(R, np.int64), np.zeros(R, np.int64)
        assert c.step_ms(R, R) + c.context_ms(qq, cc) > 0


def test_request_attention_grows_with_context_and_query_tokens():
    ra = _format3_profile().request_attention
    assert (np.diff(ra.step_ms, axis=2) >= -1e-12).all()  # roofline attention: non-decreasing in ctx
    assert (np.diff(ra.step_ms, axis=1) >= -1e-12).all()  # and in query tokens per request


def test_moe_dp_chunking_prices_vllm_chunks():
    """vLLM's chunking MoE runner (DeepEP low-latency kernels): n tokens per rank run the MoE block
    in ceil(n / 256) chunks; each op of the block is priced per chunk."""
    m, t = load_model("deepseek-v4-flash"), parse_topology("dp8-ep8")
    one = {o.record: o.count for o in layer_ops(m, t, "h200", 600) if o.part in ("moe_experts", "comm")}
    ch = [o for o in layer_ops(m, t, "h200", 600, moe_chunk=256) if o.part in ("moe_experts", "comm")]
    toks = sorted({(o.rec["tokens"], o.count) for o in ch if o.part == "moe_experts"})
    moe_layers = sum(m.moe_layer)
    assert toks == [(88 * 8, moe_layers), (256 * 8, 2 * moe_layers)]
    assert sum(o.count for o in ch if o.rec.get("kind") == "a2a_dispatch") == 3 * moe_layers
    assert sum(c for r, c in one.items() if dict(r).get("kind") == "a2a_dispatch") == moe_layers
    # at or below the chunk, and on tensor-parallel attention, one pass
    assert layer_ops(m, t, "h200", 256, moe_chunk=256) == layer_ops(m, t, "h200", 256)
    tp = parse_topology("tp8-ep8")
    assert layer_ops(m, tp, "h200", 600, moe_chunk=256) == layer_ops(m, tp, "h200", 600)
    # the composed profile says which it used
    p = compose_profile(m, t, "h200", None)
    assert "chunks of 256 tokens" in p.provenance["assumptions"]["moe_dp_chunk"]
    q = compose_profile(m, t, "h200", None, moe_dp_chunk=0, request_attention=False)
    assert q.format_version == 1 and q.request_attention is None
    assert q.provenance["assumptions"]["moe_dp_chunk"] == "one MoE pass per step"
    fq, fp = CostModel(q).forward_ms(512), CostModel(p).forward_ms(512)
    assert CostModel(q).forward_ms(256) == pytest.approx(CostModel(p).forward_ms(256))
    assert fp > fq  # two chunks read the experts' weights twice


def test_profile_kind_follows_the_first_kernel_table(tmp_path):
    """A profile composed from published silicon tables says so (kind silicon-table), one from our
    own measurements says measured; both load, and an unknown kind is refused."""
    from dsim.cost import load_profile, save_profile

    m, t = load_model("deepseek-v4-flash"), parse_topology("dp8-ep8")
    recs = [dict(op="gemm", dtype="fp8", m=1, n=512, k=4096, ms=0.01)]
    for kind in ("silicon-table", "measured"):
        p = compose_profile(
            m, t, "h200", KernelTable("k", {"kind": kind, "method": "x"}, recs), request_attention=False
        )
        assert p.provenance["kind"] == kind
        save_profile(p, tmp_path / "p.yaml")
        assert load_profile(str(tmp_path / "p.yaml")).provenance["kind"] == kind
    import yaml

    d = yaml.safe_load((tmp_path / "p.yaml").read_text())
    d["provenance"]["kind"] = "guessed"
    (tmp_path / "p.yaml").write_text(yaml.safe_dump(d))
    with pytest.raises(InputError, match="provenance.kind.*silicon-table"):
        load_profile(str(tmp_path / "p.yaml"))


def _format4_profile(ms_per_mcell=1.5):
    import dataclasses

    p = _format3_profile()
    ra = dataclasses.replace(p.request_attention, indexer_ratio=4, indexer_ms_per_mcell=ms_per_mcell)
    return dataclasses.replace(p, format_version=4, request_attention=ra)


def _indexer_excess_mcells_reference(q, c, ratio):
    """N x l_max - sum q_r l_r over l_r = max(1, (c_r + q_r) // ratio), in million cells (module doc)."""
    lr = np.maximum(1, (c + q) // ratio)
    return (q.sum() * lr.max() - (q * lr).sum()) / 1e6


def _step_keys_reference(sk, q, c):
    """The step_keys term as the module doc states it, in numpy (split_work has its own test)."""
    from dsim.cost import split_work

    n, out = int(q.sum()), 0.0
    for kind in sk.kinds:
        w = (c + q) // kind.ratio if kind.ratio else np.zeros_like(c)
        if kind.cap:
            w = np.minimum(kind.cap, w)
        out += kind.ms_per_mcell * (n * w.max() - (q * w).sum()) / 1e6
        work = split_work(n, kind.window + int(w.max()), sk.programs, sk.block, sk.min_chunk)
        out += kind.layers * sk.combine_ms_per_work * work
    return out


def test_step_indexer_prices_the_longest_context_cells_closed_form():
    """Format 4: an executor scoring every token over the step's longest context pays
    ms_per_mcell x (N x l_max - sum q_r l_r) / 1e6 beyond the format-3 price, l_r = (ctx + q) // 4;
    nothing for equal requests; prefill chunks join through `chunks`."""
    c3, c4 = CostModel(_format3_profile()), CostModel(_format4_profile(1.5))
    eq = (np.full(16, 4), np.full(16, 8188))
    assert c4.context_ms(*eq) == pytest.approx(c3.context_ms(*eq), abs=1e-12)
    q, ctx = np.array([1, 8]), np.array([399, 3992])  # l = 100, 1000; N = 9: 9000 - (100 + 8000)
    assert c4.context_ms(q, ctx) - c3.context_ms(q, ctx) == pytest.approx(1.5 * 900 / 1e6, rel=1e-12)
    # a 2048-token prompt chunk over 1024 cached (l = 768) beside a request at 120K (l = 30000)
    q, ctx, ch = np.array([4]), np.array([119_996]), [(2048, 1024)]
    extra = 1.5 * ((4 + 2048) * 30000 - (4 * 30000 + 2048 * 768)) / 1e6
    extra += _one_call_share_reference(c4, 4, 2048)  # the one attention call's share (its own test)
    assert c4.context_ms(q, ctx, ch) - c3.context_ms(q, ctx, ch) == pytest.approx(extra, rel=1e-12)
    assert c3.context_ms(q, ctx, ch) == pytest.approx(c3.context_ms(q, ctx), abs=1e-12)  # format 3 ignores chunks


def _one_call_share_reference(cm, n, p):
    """S(n) - (S(1) + (S(n + p) - S(1)) n / (n + p)): what a format-4 profile's context_ms adds for n
    decode tokens beside p prompt tokens (dsim.cost module doc, "one attention call")."""
    s = cm._forward_share
    return s(n) - (s(1) + (s(n + p) - s(1)) * n / (n + p)) if n and p else 0.0


def test_one_attention_call_gives_the_decode_requests_their_part_of_the_steps_share():
    """Format 4 with prompt chunks: the decode requests' forward share is S(1) + (S(N) - S(1)) n / N of
    the step's N = n + p tokens, not S(n). Closed form on the shard-check profile, where S(n) of a
    split-K step (224 tokens) is three times that part of S(480); nothing changes without chunks or
    on a format-3 profile."""
    from dsim.cost import load_profile

    cm = CostModel(load_profile("archive/kernels/h200-torch-checks/deepseek-v4-flash-h200-shard-check.yaml"))
    assert cm.context_reads_chunks
    s = cm._forward_share
    part = s(1) + (s(480) - s(1)) * 224 / 480
    assert s(224) > 2.5 * part  # the split-K combine and small-step regime of 224 tokens alone
    q, ctx = np.full(32, 7), np.linspace(300, 3400, 32).astype(np.int64)
    ch = [(256, 0)]
    # the step terms see the chunk either way; the share is the only other difference
    no_call = CostModel(cm.profile)
    no_call._step_call_share_ms = lambda n, p: 0.0  # type: ignore[method-assign]
    assert cm.context_ms(q, ctx, ch) - no_call.context_ms(q, ctx, ch) == pytest.approx(s(224) - part, rel=1e-12)
    assert cm._step_call_share_ms(224, 0) == 0.0 and cm._step_call_share_ms(0, 256) == 0.0
    # the decode requests' part lies between the per-call part and the whole share, at any split
    for n, p in ((1, 16), (224, 1024), (256, 8192), (1392, 1536), (8, 20000)):
        added = cm._step_call_share_ms(n, p)
        assert added == pytest.approx(_one_call_share_reference(cm, n, p), rel=1e-12)
        assert s(1) - 1e-12 <= s(n) - added <= s(n + p) + 1e-12
    # a format-3 profile ignores chunks: unchanged
    c3 = CostModel(_format3_profile())
    assert c3.context_ms(q, ctx, ch) == pytest.approx(c3.context_ms(q, ctx), abs=1e-12)


def test_format4_step_indexer_round_trips_and_prices_the_doc_formula(tmp_path):
    import yaml

    from dsim.cost import load_profile, save_profile

    path = tmp_path / "p.yaml"
    save_profile(_format4_profile(2.25), path)
    p = load_profile(str(path))
    assert p.format_version == FORMAT_VERSION  # written in the current format
    assert (p.request_attention.indexer_ratio, p.request_attention.indexer_ms_per_mcell) == (4, 2.25)
    # the loaded profile's step term on random steps, against the module doc's formula in numpy
    # over the format-3 price (context_ms itself runs the compiled pricing)
    import dataclasses

    no_indexer = dataclasses.replace(p.request_attention, indexer_ratio=0, indexer_ms_per_mcell=0.0)
    cm, c3 = CostModel(p), CostModel(dataclasses.replace(p, request_attention=no_indexer))
    rng = np.random.default_rng(1)
    for _ in range(100):
        R = int(rng.integers(1, 300))
        q = rng.integers(1, 9, R).astype(np.int64)
        c = rng.integers(0, 130_000, R).astype(np.int64)
        extra = 2.25 * _indexer_excess_mcells_reference(q, c, 4)
        assert cm.context_ms(q, c) - c3.context_ms(q, c) == pytest.approx(extra, abs=1e-9)
    d = yaml.safe_load(path.read_text())
    path.write_text(yaml.safe_dump(dict(d, format_version=3)))
    with pytest.raises(InputError, match="step_indexer: needs format_version: 4"):
        load_profile(str(path))
    d["request_attention"]["step_indexer"] = {"ratio": 4}
    path.write_text(yaml.safe_dump(d))
    with pytest.raises(InputError, match="step_indexer"):
        load_profile(str(path))


def test_composed_step_indexer_is_priced_from_the_csa_records():
    from dsim.profiling.executor_terms import step_indexer_ms_per_mcell
    from dsim.profiling.pricer import Pricer
    from dsim.profiling.topology import parse_topology

    m, topo = load_model("deepseek-v4-flash"), parse_topology("dp8-ep8")
    pr = Pricer([load_kernel_table("h200-torch")], Roofline(hardware="h200"), frozenset({"comm"}), None)
    per_layer = step_indexer_ms_per_mcell(m, topo, "h200", pr) / 21  # 21 csa layers
    # the csa core of an 8192-token prompt chunk grows with context by about that much per cell
    t = [pr.ms(_op_csa(m, topo, 8192, kv)) for kv in (32768, 131072)]
    assert (t[1] - t[0]) / (8192 * (131072 - 32768) / 4 / 1e6) == pytest.approx(per_layer, rel=0.15)
    assert 0.02 < per_layer < 0.5


def _op_csa(m, topo, qn, kv):
    from dsim.profiling.kernel_ops import attn_record, kernel_op

    return kernel_op("attn_core", 1, **attn_record(m, topo, "v4_csa", "prefill", 1, qn, kv))


def _step_keys_profile(per_work=0.0005, csa=20.0, hca=17.0):
    import dataclasses

    from dsim.cost import StepKeyKind, StepKeys

    sk = StepKeys(
        programs=264,
        block=32,
        min_chunk=64,
        combine_ms_per_work=per_work,
        kinds=(
            StepKeyKind(layers=21, ratio=4, cap=512, window=128, ms_per_mcell=csa),
            StepKeyKind(layers=20, ratio=128, cap=0, window=128, ms_per_mcell=hca),
            StepKeyKind(layers=2, ratio=0, cap=0, window=128, ms_per_mcell=0.0),
        ),
    )
    p = _format4_profile(1.5)
    return dataclasses.replace(p, request_attention=dataclasses.replace(p.request_attention, step_keys=sk))


def test_split_work_follows_the_executors_split_rule():
    """Our executor's plan_work: no split at >= 264 tokens; else chunks of
    max(64, ceil(N k / 264 / 32) x 32) keys, split only where a chunk is shorter than k."""
    from dsim.cost import split_work

    assert split_work(264, 10_000, 264, 32, 64) == 0
    assert split_work(256, 132, 264, 32, 64) == 512  # chunk 128 < 132: two items per token
    assert split_work(256, 136, 264, 32, 64) == 0  # chunk 160 holds 136
    assert split_work(224, 640, 264, 32, 64) == 448  # chunk 544 < 640
    assert split_work(256, 640, 264, 32, 64) == 0  # chunk 640
    assert split_work(8, 640, 264, 32, 64) == 80  # chunk 64 (the minimum): ten items per token
    assert split_work(256, 1152, 264, 32, 64) == 512  # chunk 1120


def test_step_keys_prices_padded_cells_and_the_steps_own_split_closed_form():
    """Format 4 step_keys: per kind ms_per_mcell x (N x w(l_max) - sum q_r w(l_r)) / 1e6, plus
    layers x per_work x the step's split work items (decided by N and the longest key list)."""
    c4, ck = CostModel(_format4_profile(1.5)), CostModel(_step_keys_profile())
    # 32 requests x 8 tokens: one at 6392 cached (csa w 512, hca w 50), the rest at 504 (w 128, 4)
    q, ctx = np.full(32, 8), np.array([6392] + [504] * 31)
    cells_csa = (256 * 512 - (8 * 512 + 31 * 8 * 128)) / 1e6
    cells_hca = (256 * 50 - (8 * 50 + 31 * 8 * 4)) / 1e6
    # N = 256 < 264: csa k = 640 (chunk 640, not split), hca k = 178 (chunk 192), swa k = 128 (chunk 128)
    extra = 20.0 * cells_csa + 17.0 * cells_hca
    assert ck.context_ms(q, ctx) - c4.context_ms(q, ctx) == pytest.approx(extra, rel=1e-12)
    # 32 x 7 = 224 tokens, all at 6392: no padding; csa k 640 (chunk 544: 2 items), hca k 178
    # (chunk 160: 2 items), swa 128 (chunk 128): 21 x 448 + 20 x 448 work items
    q, ctx = np.full(32, 7), np.full(32, 6393)
    assert ck.context_ms(q, ctx) - c4.context_ms(q, ctx) == pytest.approx(0.0005 * 41 * 448, rel=1e-12)
    # a prompt chunk joins the step: 4 decode tokens at 8188 cached (csa 512, hca 64) and a
    # 1024-token chunk over nothing (csa 256, hca 8); N = 1028: no split
    q, ctx, ch = np.array([4]), np.array([8188]), [(1024, 0)]
    extra = (20.0 * (1028 * 512 - (4 * 512 + 1024 * 256)) + 17.0 * (1028 * 64 - (4 * 64 + 1024 * 8))) / 1e6
    assert ck.context_ms(q, ctx, ch) - c4.context_ms(q, ctx, ch) == pytest.approx(extra, rel=1e-12)


def test_format4_step_keys_round_trip_doc_formula_and_errors(tmp_path):
    import yaml

    from dsim.cost import load_profile, save_profile

    path = tmp_path / "p.yaml"
    save_profile(_step_keys_profile(0.00054), path)
    p = load_profile(str(path))
    assert p.request_attention.step_keys == _step_keys_profile(0.00054).request_attention.step_keys
    import dataclasses

    no_keys = dataclasses.replace(p.request_attention, step_keys=None)
    cm, c4 = CostModel(p), CostModel(dataclasses.replace(p, request_attention=no_keys))
    assert cm.context_reads_chunks
    sk = p.request_attention.step_keys
    rng = np.random.default_rng(2)
    for _ in range(100):
        R = int(rng.integers(1, 300))
        q = rng.integers(1, 9, R).astype(np.int64)
        c = rng.integers(0, 130_000, R).astype(np.int64)
        assert cm.context_ms(q, c) - c4.context_ms(q, c) == pytest.approx(_step_keys_reference(sk, q, c), abs=1e-9)
    d = yaml.safe_load(path.read_text())
    path.write_text(yaml.safe_dump(dict(d, format_version=3)))
    with pytest.raises(InputError, match="step_indexer: needs format_version: 4"):
        load_profile(str(path))
    del d["request_attention"]["step_indexer"]
    path.write_text(yaml.safe_dump(dict(d, format_version=3)))
    with pytest.raises(InputError, match="step_keys: needs format_version: 4"):
        load_profile(str(path))
    d["request_attention"]["step_keys"]["kinds"][0]["width"] = 3
    path.write_text(yaml.safe_dump(d))
    with pytest.raises(InputError, match=r"step_keys.*kinds.*width.*unknown field"):
        load_profile(str(path))


def _block_pool_profile(h=(2.0, 0.04), c=(1.5, 0.01)):
    import dataclasses

    from dsim.cost import BlockPool, BlockPoolKind

    p = _step_keys_profile(0.00054)
    bp = BlockPool((BlockPoolKind(128, 20, h[0], h[1], 0), BlockPoolKind(4, 21, c[0], c[1], 4)), source="test")
    return dataclasses.replace(
        p, format_version=5, request_attention=dataclasses.replace(p.request_attention, block_pool=bp)
    )


def _block_pool_reference(bp, q, c, chunks):
    """The block_pool term as the module doc states it, in numpy."""
    out = 0.0
    for k in bp.kinds:
        blocks = int(((c + q) // k.ratio - c // k.ratio).sum())
        if not blocks or (k.priced_from_q and q.max() >= k.priced_from_q):
            continue
        out += k.ms_per_block * blocks + (0.0 if chunks else k.ms_per_step)
    return out


def test_block_pool_prices_completed_blocks_closed_form(tmp_path):
    """Format 5 block_pool: a step pays ms_per_block per completed block and ms_per_step once per kind
    whose blocks its decode requests complete (not with prompt chunks: theirs price it), a kind with
    priced_from_q only where every request has fewer query tokens; on the engine's compiled path and
    the Python path alike, and round-tripped through the file."""
    import dataclasses

    import yaml

    from dsim.cost import load_profile, save_profile

    path = tmp_path / "p.yaml"
    save_profile(_block_pool_profile(), path)
    p = load_profile(str(path))
    bp = p.request_attention.block_pool
    assert bp == _block_pool_profile().request_attention.block_pool
    cm = CostModel(p)
    c4 = CostModel(
        dataclasses.replace(
            p, format_version=4, request_attention=dataclasses.replace(p.request_attention, block_pool=None)
        )
    )
    assert cm.context_reads_chunks

    def extra(q, c, ch=()):
        return cm.context_ms(q, c, ch) - c4.context_ms(q, c, ch)

    one = np.array([8])
    assert extra(one, np.array([1000])) == pytest.approx(0.0, abs=1e-12)  # 1000 + 8 completes no block of 128
    assert extra(one, np.array([1020])) == pytest.approx(2.0 + 0.04, abs=1e-9)  # one of 128; ratio 4 priced from q 4
    assert extra(np.array([1]), np.array([1003])) == pytest.approx(1.5 + 0.01, abs=1e-9)  # one of 4
    assert extra(np.array([1]), np.array([1023])) == pytest.approx(2.04 + 1.51, abs=1e-9)  # one of each
    assert extra(np.array([1, 8]), np.array([1003, 1000])) == pytest.approx(0.0, abs=1e-12)  # a request of 8: priced
    assert extra(one, np.array([1020]), [(256, 0)]) == pytest.approx(0.04, abs=1e-9)  # chunks: per block only
    rng = np.random.default_rng(4)
    for _ in range(100):
        R = int(rng.integers(1, 300))
        q = rng.integers(1, 9, R).astype(np.int64)
        if rng.random() < 0.3:
            q[:] = rng.integers(1, 4)
        c = rng.integers(0, 20_000, R).astype(np.int64)
        ch = [(int(rng.integers(64, 2048)), int(rng.integers(0, 8000)))] if rng.random() < 0.3 else []
        assert extra(q, c, ch) == pytest.approx(_block_pool_reference(bp, q, c, ch), abs=1e-9)
    d = yaml.safe_load(path.read_text())
    path.write_text(yaml.safe_dump(dict(d, format_version=4)))
    with pytest.raises(InputError, match="block_pool: needs format_version: 5"):
        load_profile(str(path))
    d["request_attention"]["block_pool"]["kinds"][1]["ratio"] = 128
    path.write_text(yaml.safe_dump(d))
    with pytest.raises(InputError, match="block_pool.*kinds.*repeats a compression ratio"):
        load_profile(str(path))
    d["request_attention"]["block_pool"]["kinds"][1]["width"] = 1
    path.write_text(yaml.safe_dump(d))
    with pytest.raises(InputError, match=r"block_pool.*kinds.*width.*unknown field"):
        load_profile(str(path))


def test_block_pool_fit_recovers_known_terms_and_compose_checks_them():
    """fit-pool on the pool design set, timed as set level + the term's own formula, gives back the
    term's coefficients (least absolute deviations: exact on exact data); compose refuses a fit whose
    ratios or priced_from_q do not match the model and table."""
    import dataclasses

    from dsim.cost import load_profile, priced_from_q
    from dsim.profiling.executor_terms import with_block_pool
    from dsim.profiling.models import load_model
    from validator.gpu.moe_steplogs import pool_design_steps
    from validator.gpu.shard_repredict import completed_blocks, fit_block_pool

    shard = "archive/kernels/h200-torch-checks/deepseek-v4-flash-h200-shard-check.yaml"
    ra = load_profile(shard).request_attention
    assert priced_from_q(4, ra.q, ra.ctx) == 4 and priced_from_q(128, ra.q, ra.ctx) == 0
    steps = pool_design_steps()
    level = {}
    rows = []
    for st in steps:
        q, c = st["q"], st["ctx"]
        t = level.setdefault(st["shape"].split("-")[0], 30.0 + 3 * len(level))
        h = completed_blocks(q, c, 128)
        t += (2.3 + 0.03 * h) if h else 0.0
        b4 = completed_blocks(q, c, 4)
        if b4 and max(q) < 4:
            t += 1.8 + 0.012 * b4
        rows.append(dict(step=st["step"], measured_ms=t))
    with_fast_start = [dict(r, measured_ms=r["measured_ms"] * (0.93 if i == 0 else 1.0)) for i, r in enumerate(rows)]
    for data in (rows, with_fast_start):
        import json
        import tempfile
        from pathlib import Path

        with tempfile.TemporaryDirectory() as td:
            design = Path(td) / "pool-design.jsonl"
            design.write_text("".join(json.dumps(s) + "\n" for s in steps))
            fit = fit_block_pool(shard, {"logs": {str(design): {"rows": data}}}, design)
        got = {k["ratio"]: k for k in fit["kinds"]}
        assert got[128]["layers"] == 20 and got[4]["layers"] == 21 and got[4]["priced_from_q"] == 4
        assert got[128]["ms_per_step"] == pytest.approx(2.3, abs=1e-3)
        assert got[128]["ms_per_block"] == pytest.approx(0.03, abs=1e-4)
        assert got[4]["ms_per_step"] == pytest.approx(1.8, abs=1e-3)
        assert got[4]["ms_per_block"] == pytest.approx(0.012, abs=1e-4)
    m = load_model("deepseek-v4-flash")
    assert with_block_pool(m, ra, fit).block_pool.kinds[0].ratio == 128
    bad = dict(fit, kinds=[dict(fit["kinds"][1], priced_from_q=0)])
    with pytest.raises(InputError, match="priced_from_q 0.*from q = 4"):
        with_block_pool(m, ra, bad)
    with pytest.raises(InputError, match="ratio 64 x 20 layers is not in"):
        with_block_pool(m, ra, dict(fit, kinds=[dict(fit["kinds"][0], ratio=64)]))
    with pytest.raises(InputError, match="needs the per-request attention table"):
        with_block_pool(m, None, fit)
    assert dataclasses.replace(ra, block_pool=None).block_pool is None


def test_lifted_share_carries_the_attention_part_of_the_non_decreasing_lift():
    """A forward size whose attention drops (split-K off) is lifted to the smaller size's price;
    the share takes the lift up to its own drop, the rest of a lift stays in the step."""
    from dsim.profiling.request_attention import lifted_share

    share = np.array([1.0, 3.0, 1.0, 2.0, 2.0])
    lift = np.array([0.0, 0.0, 1.5, 2.5, 0.5])  # sizes 2-4 held up by size 1's price
    # drop below the largest share so far: 0, 0, 2, 1, 1
    assert lifted_share(share, lift).tolist() == [1.0, 3.0, 2.5, 3.0, 2.5]


def test_shard_profile_step_keys_from_the_h200_torch_records():
    """The executor's split rule comes from the table's launch tuning (132 SMs, block_n 32, one
    512-wide value block: 264 programs); the combine per work item from the hca records at 512 and
    1,024 context (split and not, 132 vs 136 keys); the per-request table carries no combine, so
    a step of 32 x 8 tokens at one context, not split, costs its records; and a composed shard
    profile's 32 x 8 step pays the forward table's non-attention part exactly (the lift at 256 tokens)."""
    from dsim.profiling.compose import compose_profile
    from dsim.profiling.executor_terms import step_keys_term
    from dsim.profiling.kernel_ops import attn_record, kernel_op
    from dsim.profiling.pricer import Pricer
    from dsim.profiling.topology import parse_topology

    m, topo = load_model("deepseek-v4-flash"), parse_topology("dp8-ep8")
    tab = load_kernel_table("h200-torch")
    pr = Pricer([tab], Roofline(hardware="h200"), frozenset({"comm"}), None)
    sk, rule = step_keys_term(m, topo, "h200", pr, 1.68)
    assert rule == (264, 32, 64) and (sk.programs, sk.block, sk.min_chunk) == rule
    hca = {r["kv"]: r["ms"] for r in tab.records if r["op"] == "attn" and r.get("kind") == "v4_hca"
           and r["batch"] == 256 and r["q"] == 1 and r["heads"] == 64 and r["phase"] == "decode"}  # fmt: skip
    assert sk.combine_ms_per_work == pytest.approx((hca[512] - hca[1024]) / 512, rel=0.05)
    assert [(k.layers, k.ratio, k.cap, k.window) for k in sk.kinds] == [
        (21, 4, 512, 128),
        (20, 128, 0, 128),
        (2, 0, 0, 128),
    ]
    assert all(5.0 < k.ms_per_mcell < 60.0 for k in sk.kinds[:2])
    p = compose_profile(m, topo, "h200", tab, zero_ops=("comm",), moe_dp_chunk=0, step_indexer=True, step_keys=True)
    cm = CostModel(p)
    ra = p.request_attention
    # 32 x 8 tokens at 8,192 cached: not split (csa k 640, hca 192; chunks 640, 192), equal requests
    rec = sum(
        n * pr.ms(kernel_op("attn_core", 1, **attn_record(m, topo, kind, "decode", 32, 8, 8192)))
        for kind, n in (("v4_csa", 21), ("v4_hca", 20), ("v4_swa", 2))
    )
    q, c = np.full(32, 8), np.full(32, 8192)
    from dsim.cost import request_attention_ms

    assert request_attention_ms(q, c, ra) == pytest.approx(rec, rel=1e-6)
    nonattn = cm.step_ms(256, 0) - cm._forward_share(256)
    assert cm.step_ms(256, int(c.sum()) + 256) + cm.context_ms(q, c) == pytest.approx(nonattn + rec, rel=1e-6)
    # 240 one-token requests split their key lists, 256 do not: the forward table holds 256 at 240's
    # price, and that lift is attention, so the non-attention part does not jump there
    nonattn_240 = cm.step_ms(240, 0) - cm._forward_share(240)
    assert cm.step_ms(256, 0) == pytest.approx(cm.step_ms(240, 0), rel=1e-9)
    assert 0 <= nonattn - nonattn_240 < 0.05 * nonattn_240


# ------------------------------------------------------------------ wide expert parallelism (paper scenario)
def test_one_expert_rank_is_priced_as_that_experts_gemms():
    """EP = routed experts (one expert per GPU, DeepSeek-V3 report Sec. 3.4): with no moe record for
    the group, the rank's experts cost its one expert's gate+up and down GEMMs at rows = tokens x
    topk / experts, plus the elementwise traffic; the moe op's preferred table is asked first."""
    m, t = load_model("deepseek-v4-flash"), parse_topology("dp256-ep256")
    op = [o for o in layer_ops(m, t, "h200", 16) if o.part == "moe_experts"][0]
    rows = 16 * 256 * m.topk // m.experts
    assert op.rec["tokens"] == 16 * 256 and op.rec["ep"] == m.experts
    gu = dict(op="gemm", dtype="fp8", m=rows, n=2 * m.moe_inter, k=m.hidden)
    dn = dict(op="gemm", dtype="fp8", m=rows, n=m.hidden, k=m.moe_inter)
    ew_bytes = rows * (2 * m.moe_inter * 2 + m.moe_inter * 2 + 4 * m.hidden * 2)
    a = KernelTable(
        "a",
        {"kind": "measured"},
        [dict(gu, ms=0.03), dict(dn, ms=0.02), dict(op="elementwise", bytes=ew_bytes, ms=0.005)],
    )
    b = KernelTable("b", {"kind": "measured"}, [dict(gu, ms=0.3), dict(dn, ms=0.2)])
    pr = Pricer([a, b], Roofline())
    assert pr.ms(op) == pytest.approx(0.055) and pr.moe_as_gemm == 1
    pr_b = Pricer([a, b], Roofline(), prefer={"moe": "b"})
    assert pr_b.ms(op) == pytest.approx(0.5 + 0.005)
    # a rank of several experts (EP8) is not a dense GEMM: no table answers, the roofline prices it
    op8 = [o for o in layer_ops(m, parse_topology("dp8-ep8"), "h200", 16) if o.part == "moe_experts"][0]
    pr8 = Pricer([a], Roofline())
    assert pr8.ms(op8) == pytest.approx(Roofline().ms(op8.rec)) and pr8.moe_as_gemm == 0


def test_flattened_verify_attention_prices_each_token_as_a_decode():
    """--verify-attention tokens: a step of B requests verifying q tokens costs the attention of B x q
    one-token decodes at the same context (in proportion beyond the table's 512 requests); the
    q = 1 entries and the forward share are the window table's."""
    from dsim.profiling.request_attention import REQ_BATCH_MAX, attention_cores_ms

    m, t = load_model("deepseek-v4-flash"), parse_topology("dp8-ep8")
    win = compose_profile(m, t, "h200", None).request_attention
    tok = compose_profile(m, t, "h200", None, verify_attention="tokens")
    ra = tok.request_attention
    assert "q one-token decodes" in ra.source and "verify_attention" in tok.provenance["assumptions"]
    np.testing.assert_allclose(ra.step_ms[:, 0, :], win.step_ms[:, 0, :])
    np.testing.assert_allclose(ra.forward_share_ms, win.forward_share_ms)
    pr = Pricer(None, Roofline())
    b, j, c = list(ra.batch).index(16), list(ra.q).index(4), 2
    assert ra.step_ms[b, j, c] == pytest.approx(
        attention_cores_ms(m, t, "h200", pr, phase="decode", batch=64, q=1, kv=int(ra.ctx[c]))
    )
    b = list(ra.batch).index(256)
    full = attention_cores_ms(m, t, "h200", pr, phase="decode", batch=REQ_BATCH_MAX, q=1, kv=int(ra.ctx[c]))
    assert ra.step_ms[b, j, c] == pytest.approx(full * 256 * 4 / REQ_BATCH_MAX)
    with pytest.raises(InputError, match="verify-attention"):
        compose_profile(m, t, "h200", None, verify_attention="tokens", request_attention=False)


def test_deepep_internode_table_prices_every_wide_ep_all_to_all():
    """The shipped inter-node table answers every dispatch / combine record of the wide-EP paper
    profiles (no roofline fallback for comm), and grows with the tokens per rank."""
    from dsim.profiling.deepep_tables import DEEPEP_README_LL_US, ep_scale

    tab = load_kernel_table("h200-deepep-internode")
    for name, topo in (("deepseek-v4-flash", "dp256-ep256"), ("deepseek-v4-pro", "dp384-ep384")):
        m, t = load_model(name), parse_topology(topo)
        for n in (1, 7, 40, 256):
            ops = [o for o in layer_ops(m, t, "h200", n) if o.part == "comm"]
            assert {o.rec["kind"] for o in ops} == {"a2a_dispatch", "a2a_combine"}
            assert all(o.rec["scope"] == "inter_node" and tab.ms(o.rec) is not None for o in ops)
        d = [
            tab.ms(o.rec)
            for n in (16, 64, 256)
            for o in layer_ops(m, t, "h200", n)
            if o.rec.get("kind") == "a2a_dispatch"
        ]
        assert d == sorted(d) and d[0] < d[-1]
    assert ep_scale(64, "a2a_dispatch") == 1.0
    assert ep_scale(256, "a2a_combine") == pytest.approx(DEEPEP_README_LL_US[256][1] / DEEPEP_README_LL_US[64][1])
    assert ep_scale(384, "a2a_dispatch") == ep_scale(256, "a2a_dispatch")


def test_deepep_price_scales_with_message_volume():
    """A record is priced at AIC's shape of equal tokens x hidden x top-k; measured node counts are
    read directly, wider groups scaled from 8 nodes; below the smallest count, its latency floor."""
    from dsim.profiling.deepep_tables import price

    rows = [
        dict(
            node_num=nn,
            num_experts=256,
            num_token=x,
            dispatch_avg_t_us=10.0 * nn + x,
            combine_avg_t_us=20.0 * nn + 2 * x,
        )
        for nn in (2, 4, 8)
        for x in (2, 8, 32, 128)
    ]
    ms, how = price(rows, "a2a_dispatch", 32, 7168, 8, 64)
    assert ms == pytest.approx((80 + 32) / 1000) and how["ep_scale"] == 1.0
    ms_half, _ = price(rows, "a2a_dispatch", 32, 3584, 8, 32)  # half the volume at 4 nodes: 16 tokens
    assert ms_half * 1000 == pytest.approx(float(np.exp(np.interp(np.log(16), np.log([8, 32]), np.log([48, 72])))))
    floor, _ = price(rows, "a2a_combine", 1, 4096, 6, 16)
    assert floor == pytest.approx((40 + 4) / 1000)
    with pytest.raises(InputError):
        price(rows, "a2a_dispatch", 8, 7168, 8, 8)


def test_deepep_build_rejects_bad_specs_in_one_line(tmp_path, capsys):
    from dsim.profiling.deepep_tables import main

    out = tmp_path / "t.json"
    for bad in ("deepseek-v4-flash:8", "deepseek-v4-flash", ":256", "deepseek-v4-flash:x"):
        assert main(["build", "--model", bad, "--out", str(out)]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("dsim profile deepep: error: --model") and "\n" not in err and not out.exists()


def test_forward_table_follows_the_moe_chunk_staircase_above_the_capture_limit():
    """Above the capture limit a step runs at its own size and the engine interpolates the table
    linearly; with the MoE in 256-token chunks each boundary b is a jump (a further chunk starts at
    b + 1). The table's sizes resolve it: at sizes between its points the interpolated forward stays
    within 3% of the composed one, and the jump across every boundary to 4096 is in the table."""
    from dsim.profiling.forward import forward_ms, forward_sizes

    model, topo = load_model("deepseek-v4-flash"), parse_topology("dp8-ep8")
    kt = load_kernel_table("h200-torch")
    prof = compose_profile(model, topo, "h200", kt, request_attention=False)
    cm = CostModel(prof)
    pr = Pricer(kt, Roofline(hardware="h200"))
    sizes = forward_sizes(prof.capture_sizes, 256)
    assert list(prof.forward.x) == sizes

    def direct(n):  # the table is the zero-context forward: the composer takes the KV slope's share at 1024 out
        return forward_ms(model, topo, "h200", n, pr, 512, moe_chunk=256) - prof.kv_ms_per_ktok / 1000 * 1024 * n

    rng = np.random.default_rng(3)
    for n in rng.integers(513, 8192, 40):
        assert cm.forward_ms(int(n)) == pytest.approx(direct(int(n)), rel=0.03)
    for b in range(512, 4096, 256):
        jump = cm.forward_ms(b + 1) - cm.forward_ms(b)
        assert jump == pytest.approx(direct(b + 1) - direct(b), rel=0.05) and jump > 0.5
    # without chunking there is no staircase: the regular grid alone
    assert forward_sizes(prof.capture_sizes, 0)[len(prof.capture_sizes) :][:3] == [513, 640, 768]


# ------------------------------------------------------------- prefill_terms version 2
def _v2_profile(tmp_path, terms: dict, base=None):
    import yaml

    from dsim.cost import load_profile, save_profile

    path = tmp_path / "v2.yaml"
    save_profile(base or _format3_profile(), path)
    d = yaml.safe_load(path.read_text())
    d["prefill_terms"] = terms
    path.write_text(yaml.safe_dump(d))
    return load_profile(str(path)), path, d


def test_prefill_terms_v2_price_the_doc_formula(tmp_path):
    """Version 2: per chunk cached pairs x a + within pairs x b + tokens x t + e, once per step s."""
    terms = dict(
        version=2,
        cached_ms_per_mpair=0.5,
        within_ms_per_mpair=3.0,
        token_ms_per_ktok=-1.25,
        ms_per_chunk=0.75,
        ms_per_step=4.0,
    )
    p, _, _ = _v2_profile(tmp_path, terms)
    cm = CostModel(p)
    assert cm.has_prefill_terms and p.prefill_v2.ms_per_step == 4.0
    chunks = [(512, 1000), (300, 0), (0, 7)]

    def one(q, c):
        return 0.5 * q * c / 1e6 + 3.0 * q * q / 2 / 1e6 - 1.25 * q / 1000 + 0.75

    assert cm.prefill_ms(chunks) == pytest.approx(one(512, 1000) + one(300, 0) + 4.0, rel=1e-12)
    assert cm.prefill_ms(iter(chunks)) == pytest.approx(cm.prefill_ms(chunks), rel=1e-15)  # the engine's generator
    assert cm.prefill_ms([]) == 0.0 and cm.prefill_ms([(0, 5)]) == 0.0
    assert CostModel(p, cost_scale=2.0).prefill_ms(chunks) == pytest.approx(2 * cm.prefill_ms(chunks), rel=1e-12)


def test_prefill_terms_v1_profiles_price_as_before(tmp_path):
    """A profile without version keeps the version-1 keys and their arithmetic exactly."""
    p, _, _ = _v2_profile(tmp_path, dict(discount_ms_per_ktok=2.0, attention_ms_per_mpair=0.3, ms_per_chunk=1.5))
    assert p.prefill_v2 is None
    cm = CostModel(p)
    d, a, e = 2.0 / 1000, 0.3 / 1e6, 1.5
    chunks = [(512, 1000), (300, 0)]
    assert cm.prefill_ms(chunks) == sum(q * (a * (c + 0.5 * q) - d) + e for q, c in chunks)


@pytest.mark.slow
def test_prefill_terms_v2_round_trip_and_errors(tmp_path):
    import yaml

    from dsim.cost import load_profile, save_profile

    terms = dict(version=2, within_ms_per_mpair=2.0, token_ms_per_ktok=3.0, ms_per_step=1.0)
    p, path, d = _v2_profile(tmp_path, terms)
    save_profile(p, path)
    q = load_profile(str(path))
    assert q.prefill_v2 == p.prefill_v2
    assert yaml.safe_load(path.read_text())["prefill_terms"] == terms
    for bad, match in (
        (dict(terms, discount_ms_per_ktok=1.0), "prefill_terms.discount_ms_per_ktok: not a version-2 key"),
        (dict(terms, version=3), "prefill_terms.version"),
        (dict(terms, within_ms_per_mpair=-1.0), "prefill_terms.within_ms_per_mpair"),
        (dict(terms, own_keys_tokens=1025), "own_keys_tokens: needs request_attention.step_keys"),
        (
            dict(terms, token_ms_per_ktok=-1e5),
            r"prefill_terms.token_ms_per_ktok -100000 \(a prompt token 100000 ms per 1000 below a decode token\): exceeds forward.ms",
        ),
        (dict(version=1, within_ms_per_mpair=2.0), "prefill_terms.version"),
    ):
        path.write_text(yaml.safe_dump(dict(d, prefill_terms=bad)))
        with pytest.raises(InputError, match=match):
            load_profile(str(path))


def test_prefill_own_keys_are_priced_at_the_step_keys_cells():
    """own_keys_tokens: a chunk's own key cells (csa min(512, v // 4), hca v // 128, indexer
    max(1, v // 4), v = c + q) less a decode token's at own_keys_tokens, q tokens, at the shipped
    shard-check profile's cell prices; the step-keys term then pads the chunk to the step's longest."""
    from dsim.cost import load_profile

    p = load_profile("archive/kernels/h200-torch-checks/deepseek-v4-flash-h200-shard-check.yaml")
    pt, ra = p.prefill_v2, p.request_attention
    assert pt is not None and pt.own_keys_tokens == 1025 and pt.cached_ms_per_mpair == pt.within_ms_per_mpair == 0
    csa, hca = (k.ms_per_mcell for k in ra.step_keys.kinds[:2])
    cm = CostModel(p)

    def ref(q, c):
        v, d = c + q, 1025
        own = csa * (min(512, v // 4) - 256) + hca * (v // 128 - d // 128) + ra.indexer_ms_per_mcell * (v // 4 - 256)
        return q * own / 1e6 + q * pt.token_ms_per_ktok / 1000

    for chunks in ([(8192, 32768)], [(512, 0)], [(1287, 0), (584, 184), (272, 0)]):
        want = sum(ref(q, c) for q, c in chunks) + pt.ms_per_step
        assert cm.prefill_ms(chunks) == pytest.approx(want, rel=1e-9)
    # a step of 2,048 prompt tokens in four chunks of 512 costs less than one chunk of 2,048 (shorter lists)
    assert cm.prefill_ms([(512, 0)] * 4) < cm.prefill_ms([(2048, 0)])


def test_fit_prefill_terms_recovers_known_terms():
    """Points made from known version-2 terms are fitted back exactly (both forms)."""
    from dsim.cost import PrefillTerms, load_profile, own_keys_ms
    from dsim.profiling.prefill import fit_prefill_terms

    pts = [(q, c) for q in (256, 512, 1024, 2048, 8192) for c in (0, 512, 2048, 8192, 32768)]
    ex = [(q, c, 0.2 * q * c / 1e6 + 4.0 * q * q / 2e6 - 1.5 * q / 1000 + 3.0) for q, c in pts]
    f = fit_prefill_terms(ex, None, 1000.0)
    assert (f.cached_ms_per_mpair, f.within_ms_per_mpair, f.token_ms_per_ktok, f.ms_per_step) == pytest.approx(
        (0.2, 4.0, -1.5, 3.0), abs=1e-6
    )
    assert f.fit["residual_ms_max"] < 1e-6 and f.fit["residual_ms_max_version_1"] > 1.0
    ra = load_profile("archive/kernels/h200-torch-checks/deepseek-v4-flash-h200-shard-check.yaml").request_attention
    base = PrefillTerms(own_keys_tokens=1025)
    ex = [(q, c, own_keys_ms(q, c, base, ra) + 2.0 * q / 1000 + 5.0) for q, c in pts]
    f = fit_prefill_terms(ex, ra, 1000.0)
    assert f.own_keys_tokens == 1025 and (f.token_ms_per_ktok, f.ms_per_step) == pytest.approx((2.0, 5.0), abs=1e-6)


def test_graph_less_overhead_is_a_jump_at_the_capture_limit():
    """vLLM runs a step above its largest capture size without CUDA graphs: the forward table holds
    limit + 1, so the graph-less overhead is paid from the first token past the limit (a jump), and
    every size above it pays it, while the captured sizes do not."""
    from dsim.profiling.forward import EAGER_US_PER_LAYER, forward_ms

    model, topo = load_model("deepseek-v4-pro"), parse_topology("tp8-ep8")
    prof = compose_profile(model, topo, "b300", None, request_attention=False)
    limit = prof.capture_sizes[-1]
    assert limit == 1024 and limit + 1 in set(int(x) for x in prof.forward.x)
    pr = Pricer(None, Roofline(hardware="b300"))
    eager = model.layers * EAGER_US_PER_LAYER * 1e-3
    below = forward_ms(model, topo, "b300", limit + 1, pr, limit + 1)  # the same step, captured
    above = forward_ms(model, topo, "b300", limit + 1, pr, limit)
    assert above - below == pytest.approx(eager)
    c = CostModel(prof)
    assert c.forward_ms(limit + 1) - c.forward_ms(limit) >= eager


def test_fixed_dspark_drafts_its_own_length():
    """vLLM's DSpark proposer drafts batch x num_speculative_tokens positions: the profile carries a
    drafter table per length below the draft block (dspark@K, fewer positions: no dearer than the
    block's), and a fixed K prices its drafter from it; K = block and adaptive K = block use the
    block's table."""
    from dsim.spec.methods import make_method

    model, topo = load_model("deepseek-v4-flash"), parse_topology("dp8-ep8")
    prof = compose_profile(model, topo, "h200", None, request_attention=False)
    c = CostModel(prof)
    assert {f"dspark@{k}" for k in range(1, 7)} <= set(prof.draft)
    for R in (1, 32, 256):
        full = c.draft_table_ms("dspark", R)
        costs = [make_method("dspark", k).draft_ms(c, R) for k in (1, 3, 5)]
        assert costs == sorted(costs) and costs[-1] <= full * (1 + 1e-9)
        assert costs[1] == c.draft_table_ms("dspark@3", R)
        assert make_method("dspark", 7).draft_ms(c, R) == full
        assert make_method("dspark", 7, adaptive=True).draft_ms(c, R) == full
    assert make_method("dspark", 3).draft_ms(c, 256) < 0.8 * c.draft_table_ms("dspark", 256)


def test_eager_overhead_is_a_stated_parameter():
    """--eager-us-per-layer sets what a step above the capture limit adds per layer: the tables of
    two values differ by layers x the difference above the limit and not at all at or below it (0:
    an executor that captures every step, as the shard-check profile's); a negative value is an error."""
    model, topo = load_model("deepseek-v4-flash"), parse_topology("tp8-ep8")
    a = compose_profile(model, topo, "h200", None, request_attention=False, eager_us_per_layer=0.0)
    b = compose_profile(model, topo, "h200", None, request_attention=False, eager_us_per_layer=100.0)
    x, limit = a.forward.x, a.capture_sizes[-1]
    d = b.forward.ms - a.forward.ms
    assert np.allclose(d[x <= limit], 0.0) and np.allclose(d[x > limit], model.layers * 0.1)
    assert b.provenance["assumptions"]["eager_us_per_layer"] == 100.0
    with pytest.raises(InputError, match="eager-us-per-layer"):
        compose_profile(model, topo, "h200", None, request_attention=False, eager_us_per_layer=-1.0)


@pytest.mark.golden
def test_stored_shard_repredictions_are_the_current_profiles():
    """Every stored V4-Flash shard re-prediction (archive/kernels/h200-torch-checks/repredict-*.json,
    the figures docs/results/gpu-moe-profiling.md quotes) is what the shard-check profile prices now, step by
    step; a cost or profile change that moves them must store them again (`python3 -m
    validator.gpu.shard_repredict PROFILE REPLAY STEPLOGS --out ...`)."""
    import json
    from pathlib import Path

    from validator.gpu.shard_repredict import repredict

    base = Path("archive/kernels/h200-torch-checks")
    stored = sorted(base.glob("repredict-deepseek-v4-flash-*.json"))
    assert len(stored) >= 8
    for path in stored:
        rec = json.loads(path.read_text())
        replay = json.loads(Path(rec["replay"]).read_text())
        now = repredict(rec["profile"], replay, base / "steplogs")
        for name, log in rec["logs"].items():
            got = {r["step"]: r["predicted_ms"] for r in now[name]["rows"]}
            for r in log["rows"]:
                assert got[r["step"]] == pytest.approx(r["predicted_ms"], abs=2e-3), (path.name, name, r["step"])


@pytest.mark.golden
def test_shard_repredict_counts_completed_hca_blocks(tmp_path):
    """validator.gpu.shard_repredict counts the ratio-128 blocks a step's decode/verify requests
    complete (positions ctx .. ctx + q - 1: a block completes at a multiple of 128 minus one) and
    splits decode-only steps by it. On the stored seed-5 c = 1 replay the two steps that complete a
    block are priced like the others with the shard-check profile's block_pool term (fitted on the
    pool design set, not on this log), and 5 points under them without it (the executor's pooling)."""
    import dataclasses
    import json
    from pathlib import Path

    from dsim.cost import load_profile, save_profile
    from validator.gpu.shard_repredict import completed_blocks, repredict

    assert completed_blocks([8], [120]) == 1  # writes 120..127: 127 ends the first block
    assert completed_blocks([8], [119]) == 0 and completed_blocks([8], [128]) == 0
    assert completed_blocks([256, 1, 1, 8], [0, 127, 126, 1663]) == 2 + 1 + 0 + 1
    assert completed_blocks([], []) == 0
    base = Path("archive/kernels/h200-torch-checks")
    rec = json.loads((base / "repredict-deepseek-v4-flash-dp8-ep8-s5.json").read_text())
    replay = json.loads(Path(rec["replay"]).read_text())
    p = load_profile(rec["profile"])
    bare = tmp_path / "no-pool.yaml"
    save_profile(
        dataclasses.replace(p, request_attention=dataclasses.replace(p.request_attention, block_pool=None)), bare
    )
    for profile, lo, hi in ((rec["profile"], -1.0, 1.0), (str(bare), -7.0, -4.0)):
        c1 = repredict(profile, replay, base / "steplogs")["dspark-v4f-s5-c1.jsonl"]
        assert [r["step"] for r in c1["rows"] if r["hca_blocks"]] == [190, 522]
        split = c1["decode_only"]
        assert split["blocks"]["steps"] == 2 and split["no_block"]["steps"] == 14
        gap = split["blocks"]["median_signed_pct"] - split["no_block"]["median_signed_pct"]
        assert lo < gap < hi, (profile, split)
    # a model without heavily compressed layers (V3's MLA) has no blocks to count
    v3 = json.loads((base / "repredict-deepseek-v3-tp8-ep8.json").read_text())
    now3 = repredict(v3["profile"], json.loads(Path(v3["replay"]).read_text()), base / "steplogs")
    assert all(r["hca_blocks"] == 0 for log in now3.values() for r in log["rows"])


def test_compose_for_takes_hardware_and_backend_and_names_both():
    """compose_for(model, hardware, backend, topology): the shipped silicon-table kernel table of that
    hardware and backend where there is one, the name and provenance carrying both; an unknown backend
    or hardware is one input error naming the choices."""
    from dsim.errors import InputError
    from dsim.profiling.aic_tables import compose_for

    p = compose_for("deepseek-v3", "h200", "vllm", "dp8-ep8")
    assert p.name == "deepseek-v3-h200-vllm-dp8-ep8" and p.provenance["backend"].startswith("vllm (vllm 0.24.0")
    assert p.provenance["hardware"] == "8 x NVIDIA H200 SXM" and p.provenance["kind"] == "silicon-table"
    assert "h200-aic-vllm" in p.provenance["method"]
    with pytest.raises(InputError, match="one of vllm, sglang, trtllm"):
        compose_for("deepseek-v3", "h200", "tensorrt")
    with pytest.raises(InputError, match="--hardware 'a100'"):
        compose_for("deepseek-v3", "a100")
    # a GPU with datasheet figures but no AIC system (H800: DeepSeek's): named as such
    with pytest.raises(InputError, match="--hardware h800: AIC has no kernel tables"):
        compose_for("deepseek-v3", "h800", topology="dp16-ep16")


@pytest.mark.skipif(
    __import__("importlib").util.find_spec("aiconfigurator_core") is None, reason="the aic extra is not installed"
)
def test_compose_for_prices_unshipped_hardware_and_wide_ep_from_aic_on_demand():
    """No shipped table for the H100: the composer's records are priced from AIC's h100_sxm tables on
    demand; at EP16 AIC's moe rows are guarded (the rank's experts re-priced per GPU) and the profile's
    assumptions say so."""
    from dsim.profiling.aic_tables import compose_for

    p = compose_for("deepseek-v3", "h100", "vllm", "dp16-ep16")
    assert p.name == "deepseek-v3-h100-vllm-dp16-ep16" and p.provenance["hardware"] == "16 x NVIDIA H100 SXM"
    assert "h100-aic-vllm" in p.provenance["method"]
    assert "moe records at ep [16] guarded, priced by per-GPU re-pricing" in p.provenance["assumptions"]["table_guard"]
