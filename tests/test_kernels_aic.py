"""Kernel tables from AIConfigurator's silicon data: the comparison tool (runs without the extra), the shipped
tables' contents, and, where aiconfigurator-core is installed, pricing checked against the raw parquet rows."""

from __future__ import annotations

import copy
import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dsim.errors import InputError
from dsim.profiling import aic_anchors, aic_build, aic_compare, aic_pricing, aic_source
from dsim.profiling.kernel_tables import read_json_text

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = {s: ROOT / "profiles" / "kernels" / f"{s.split('_')[0]}-aic-vllm.json.gz" for s in ("b300_sxm", "h200_sxm")}
ANCHORS = ROOT / "profiles" / "kernels" / "aic-anchors.json"

try:
    import aiconfigurator_core  # noqa: F401

    HAVE_AIC = True
except ImportError:
    HAVE_AIC = False
needs_aic = pytest.mark.skipif(not HAVE_AIC, reason="aiconfigurator-core (the aic extra) not installed")


def table(name: str, records: list[dict]) -> dict:
    return {"name": name, "provenance": {"kind": "measured"}, "records": records}


def gemm(m: int, ms: float, n: int = 4096, k: int = 7168, dtype: str = "fp8") -> dict:
    return {"op": "gemm", "dtype": dtype, "m": m, "n": n, "k": k, "ms": ms}


def moe(t: int, ms: float) -> dict:
    return {
        "op": "moe",
        "dtype": "fp8",
        "tokens": t,
        "hidden": 4096,
        "inter": 2048,
        "topk": 6,
        "experts": 256,
        "ep": 8,
        "ms": ms,
    }


# ---- the comparison tool (no AIC) ----------------------------------------------------------------------------


def test_compare_closed_form_ratios_and_medians():
    a = table("a", [gemm(m, 0.01 * m) for m in (1, 2, 4, 8, 16)] + [moe(t, 0.1 * t) for t in (1, 2, 4)])
    b = copy.deepcopy(a)
    b["name"] = "b"
    for r, f in zip(b["records"], (1.1, 0.8, 1.05, 1.3, 0.95, 2.0, 2.0, 3.0)):
        r["ms"] *= f
    b["records"].append(gemm(32, 1.0))  # only in (b)
    a["records"].append(gemm(64, 1.0))  # only in (a)
    c = aic_compare.compare_tables(b, a)
    kinds = {k.kind: k for k in c.kinds}
    assert kinds["gemm:fp8"].shapes == 5
    # |err| over gemm: 0.1, 0.2, 0.05, 0.3, 0.05 -> median 0.1
    assert kinds["gemm:fp8"].median_abs_error == pytest.approx(0.1)
    assert kinds["gemm:fp8"].median_ratio == pytest.approx(1.05)
    assert kinds["moe:fp8"].median_abs_error == pytest.approx(1.0)
    assert c.median_abs_error == pytest.approx(0.25)  # errors of all 8 shapes: 0.05 0.05 0.1 0.2 0.3 1 1 2
    assert (c.only_in_a, c.only_in_b) == (1, 1)
    ratios = sorted(round(s.ratio, 6) for s in c.shapes)
    assert ratios == sorted([1.1, 0.8, 1.05, 1.3, 0.95, 2.0, 2.0, 3.0])


def test_compare_defaults_and_model_less_measurements_match():
    # (a) leaves distribution at its default and does not name the model; (b) spells both out
    a = table(
        "a",
        [
            dict(moe(8, 0.5)),
            {"op": "attn", "kind": "v4_hca", "phase": "decode", "batch": 4, "q": 1, "kv": 2048, "heads": 64, "ms": 0.2},
        ],
    )
    b = table(
        "b",
        [
            dict(moe(8, 0.55), distribution="uniform"),
            {
                "op": "attn",
                "kind": "v4_hca",
                "phase": "decode",
                "batch": 4,
                "q": 1,
                "kv": 2048,
                "heads": 64,
                "model": "deepseek-v4-flash",
                "ms": 0.3,
            },
        ],
    )
    c = aic_compare.compare_tables(b, a)
    assert sorted(s.kind for s in c.shapes) == ["attn:v4_hca:decode", "moe:fp8"]
    # a power-law routed record is a different shape
    b["records"][0]["distribution"] = "power_law_1.2"
    assert [s.kind for s in aic_compare.compare_tables(b, a).shapes] == ["attn:v4_hca:decode"]


def test_compare_adds_projection_gemms_when_b_includes_them():
    """AIC's attention modules include the projections; (a)'s attention core is compared after adding (a)'s own
    records of those parts (the composer's GEMMs of one layer at batch x q tokens), and is not compared when
    one of them is missing."""
    rec = {"op": "attn", "kind": "v4_csa", "phase": "decode", "batch": 4, "q": 2, "kv": 8192, "heads": 8}
    proj = aic_compare.projection_records(dict(rec, includes=aic_source.ATTN_INCLUDES))
    parts = {r["n"] for r, _ in proj}
    # q_a, q_b, kv, o_a (one output group per rank at TP8), o_b, the ratio-4 compressor (2 x 2 x 512), the
    # indexer's q, per-head weights and its own compressor (4 x 128) of V4-Flash at TP8 (public config)
    assert {1024, 64 * 512 // 8, 512, 4096, 2 * 2 * 512, 64 * 128, 64, 4 * 128} <= parts
    assert all(r["op"] == "gemm" and c == 1 for r, c in proj)
    a_recs = [dict(rec, ms=0.05)] + [dict(r, ms=0.01 * (i + 1)) for i, (r, _) in enumerate(proj)]
    b = table("b", [dict(rec, includes=aic_source.ATTN_INCLUDES, ms=0.42)])
    c = aic_compare.compare_tables(b, table("a", a_recs))
    (s,) = [s for s in c.shapes if s.kind.startswith("attn")]
    assert s.kind == "attn:v4_csa:decode+proj"
    by_key = {aic_compare.record_key(r): r["ms"] for r in a_recs[1:]}  # records of equal shape: the last one counts
    assert s.a_ms == pytest.approx(0.05 + sum(by_key[aic_compare.record_key(r)] for r, _ in proj))
    assert s.ratio == pytest.approx(0.42 / s.a_ms)
    c = aic_compare.compare_tables(b, table("a", a_recs[:-1]))
    assert not [s for s in c.shapes if s.kind.startswith("attn")]
    assert len(c.not_comparable) == 1 and "includes differ" in c.not_comparable[0][2]


@settings(max_examples=40, deadline=None)
@given(st.lists(st.floats(0.001, 10.0), min_size=1, max_size=30), st.floats(0.2, 5.0))
def test_compare_scaling_property(ms_list, factor):
    a = table("a", [gemm(m + 1, ms) for m, ms in enumerate(ms_list)])
    same = aic_compare.compare_tables(a, a)
    assert same.median_abs_error == 0.0
    b = table("b", [dict(r, ms=r["ms"] * factor) for r in a["records"]])
    c = aic_compare.compare_tables(b, a)
    assert c.median_abs_error == pytest.approx(abs(factor - 1), rel=1e-9, abs=1e-12)
    assert all(s.ratio == pytest.approx(factor) for s in c.shapes)


def test_compare_cli_text_json_and_errors(tmp_path):
    a = table("a", [gemm(m, 0.01 * m) for m in (1, 2, 4)])
    b = table("b", [dict(r, ms=r["ms"] * 1.2) for r in a["records"]])
    pa, pb, pj = tmp_path / "a.json", tmp_path / "b.json", tmp_path / "cmp.json"
    pa.write_text(json.dumps(a))
    pb.write_text(json.dumps(b))
    run = [sys.executable, "-m", "dsim.profiling.aic_tables", "compare"]
    ps = tmp_path / "err.json"
    out = subprocess.run(
        run + [str(pb), str(pa), "--json", str(pj), "--error-summary", str(ps)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    assert "gemm:fp8" in out.stdout and "20.0%" in out.stdout
    got = json.loads(pj.read_text())
    assert got["median_abs_error"] == pytest.approx(0.2)
    assert [round(s["ratio"], 9) for s in got["shapes"]] == [1.2, 1.2, 1.2]
    summary = json.loads(ps.read_text())
    assert summary["median_abs_error"] == pytest.approx(0.2) and summary["by_kind"]["gemm:fp8"]["shapes"] == 3
    assert summary["against"] == "a" and summary["command"].startswith("dsim profile aic compare")
    bad = tmp_path / "bad.json"
    for text, what in (
        ("{not json", "not JSON"),
        (json.dumps({"records": [{"op": "gemm"}]}), 'numeric "ms"'),
        (json.dumps([1, 2]), 'no "records"'),
    ):
        bad.write_text(text)
        out = subprocess.run(run + [str(bad), str(pa)], capture_output=True, text=True, cwd=ROOT, check=False)
        assert out.returncode == 2 and what in out.stderr
        assert out.stderr.count("\n") == 1 and "Traceback" not in out.stderr
    out = subprocess.run(
        run + [str(tmp_path / "missing.json"), str(pa)], capture_output=True, text=True, cwd=ROOT, check=False
    )
    assert out.returncode == 2 and "not found" in out.stderr


# ---- interpolation and the grid (no AIC) ---------------------------------------------------------------------


def test_grid_table_reproduces_log_linear_surfaces_and_clamps():
    bs, kvs = [1, 2, 4, 8, 16], [0, 127, 1023, 8191]
    pts = np.array([(b, kv) for b in bs for kv in kvs], dtype=float)

    def f(b, kv):
        return 0.05 + 0.01 * math.log2(b) + 0.002 * math.log2(1 + kv)

    g = aic_source.GridTable(("batch", "kv"), pts, np.array([f(b, kv) for b, kv in pts]), (False, True))
    for q in ((3, 500), (1, 0), (16, 8191), (5.5, 2000)):
        v, clamped = g(q)
        assert v == pytest.approx(f(*q)) and clamped == []
    v, clamped = g((64, 100000))
    assert clamped == ["batch", "kv"] and v == pytest.approx(f(16, 8191))
    one = aic_source.GridTable(("tokens",), np.array([[1.0], [4.0], [16.0]]), np.array([1.0, 3.0, 5.0]), (False,))
    assert one((2,))[0] == pytest.approx(2.0) and one((0.5,)) == (1.0, ["tokens"])


def test_grid_records_cover_the_composers_shapes():
    req = aic_build.composer_records("deepseek-v4-flash", "tp8-ep8", "b300_sxm")
    tp8 = aic_build.grid_records("deepseek-v4-flash", "tp8-ep8", "b300_sxm", req)
    dp8 = aic_build.grid_records("deepseek-v4-flash", "dp8-ep8", "h200_sxm")
    assert {r["heads"] for r in tp8 if r["op"] == "attn"} == {8}
    assert {r["heads"] for r in dp8 if r["op"] == "attn"} == {64}
    assert {r["kind"] for r in tp8 if r["op"] == "attn"} == {"v4_csa", "v4_hca", "v4_swa"}
    grid_gemms = {(r["dtype"], r["n"], r["k"]) for r in tp8 if r["op"] == "gemm"}
    assert {(r["dtype"], r["n"], r["k"]) for r in req if r["op"] == "gemm"} <= grid_gemms
    assert ("fp8", 64 * 512 // 8, 1024) in grid_gemms and ("bf16", 64 * 512 // 8, 1024) in grid_gemms
    assert {r["m"] for r in tp8 if r["op"] == "gemm"} == set(aic_build.GRID_TOKENS)
    assert {r["dtype"] for r in tp8 if r["op"] == "moe"} == {"fp8", "bf16", "fp4"}  # FP4 experts on Blackwell
    assert {r["dtype"] for r in dp8 if r["op"] == "moe"} == {"fp8", "bf16"}
    assert {r["kind"] for r in tp8 if r["op"] == "comm"} == {"all_reduce"}
    assert {r["kind"] for r in dp8 if r["op"] == "comm"} == {"a2a_dispatch", "a2a_combine"}
    with pytest.raises(InputError, match="topology"):
        aic_build.grid_records("deepseek-v4-flash", "tp4", "b300_sxm", req)


# ---- the shipped tables (no AIC) ---------------------------------------------------------------------------


@pytest.mark.parametrize("system", sorted(SHIPPED))
def test_shipped_tables_carry_provenance_and_semantics(system):
    t = json.loads(read_json_text(SHIPPED[system]))
    prov = t["provenance"]
    assert prov["kind"] == "silicon-table" and prov["package"] == "aiconfigurator-core==0.12.0"
    assert prov["system"] == system and f"aic build --system {system} " in prov["command"]  # its recorded command
    assert prov["files"] and all(f.startswith(system + "/") for f in prov["files"])
    recs = t["records"]
    assert len(recs) > 5000
    for r in recs:
        assert r["ms"] > 0 and r["backend"] in ("vllm 0.24.0", "sglang 0.5.14", "nccl 2.29.2")
        assert r["note"].split(";")[0].removeprefix("table ") in prov["files"]
    attn = [r for r in recs if r["op"] == "attn"]
    assert {r["kind"] for r in attn} == {"v4_csa", "v4_hca", "v4_swa", "mla"}
    # the composer's part names, so it does not price the projections again
    assert all(set(r["includes"]) == set(aic_source.ATTN_INCLUDES) for r in attn if r["kind"] != "mla")
    assert all(set(r["includes"]) == set(aic_source.MLA_INCLUDES) for r in attn if r["kind"] == "mla")
    assert all("HCA" in r["note"] for r in attn if r["kind"] == "v4_swa")
    # vLLM's fp8_block GEMM rows are eager: every fp8 GEMM comes from SGLang and says so
    fp8 = [r for r in recs if r["op"] == "gemm" and r["dtype"] == "fp8"]
    assert fp8 and all(r["backend"] == "sglang 0.5.14" and "eager" in r["note"] for r in fp8)
    # the three models x two topologies are all there
    assert {r["heads"] for r in attn if r["kind"] != "mla"} == {8, 64, 16, 128}
    assert {r["heads"] for r in attn if r["kind"] == "mla"} == {16, 128}
    # what AIC has no table for is listed with the reason: memory-bound elementwise ops, bf16 routed experts of
    # these shapes, 4-bit-weight experts on Hopper
    assert t["unpriced"] and all(u["reason"] for u in t["unpriced"])
    assert {(u["op"], u.get("dtype")) for u in t["unpriced"]} <= {
        ("elementwise", None),
        ("moe", "bf16"),
        ("moe", "w4a16"),
    }
    # every record the composer asks for, other than those, is priced
    keys = {aic_compare.record_key(r) for r in recs}
    req = aic_build.composer_records("deepseek-v4-pro", "tp8-ep8", system)
    missing = [r for r in req if aic_compare.record_key(r) not in keys and r["op"] != "elementwise"]
    assert not missing


def test_shipped_decode_attention_is_flat_in_context_and_grows_with_batch():
    """V4's attention barely grows with context (the DeepSeek-V4 design); V3's MLA does."""
    t = json.loads(read_json_text(SHIPPED["h200_sxm"]))
    at = {
        (r["kind"], r["heads"], r["batch"], r["q"], r["kv"]): r["ms"]
        for r in t["records"]
        if r["op"] == "attn" and r["phase"] == "decode"
    }

    def hca(b, kv):
        return at[("v4_hca", 64, b, 1, kv)]

    assert hca(1, 32768) / hca(1, 512) < 1.3
    assert hca(256, 2048) > hca(1, 2048)
    pre = {
        (r["kind"], r["heads"], r["batch"], r["q"], r["kv"]): r["ms"]
        for r in t["records"]
        if r["op"] == "attn" and r["phase"] == "prefill"
    }
    # a prompt chunk after a cached prefix costs more the longer the prefix (MLA: the fitted per-pair term; V4
    # CSA up to 8192: AIC's own rows at a ~63k-token prefix are below those at 4096, the sparse top-k caps it)
    for kind, heads, kvs in (("mla", 16, (0, 2048, 8192, 32768)), ("v4_csa", 64, (0, 2048, 8192))):
        chunk = [pre[(kind, heads, 1, 2048, kv)] for kv in kvs]
        assert chunk == sorted(chunk) and chunk[-1] > chunk[0]

    def mla(b, kv):
        return at[("mla", 16, b, 1, kv)]

    assert mla(64, 32768) / mla(64, 512) > 2.0


def test_shipped_anchors_reproduce_the_quoted_figures():
    a = json.loads(ANCHORS.read_text())
    assert a["provenance"]["command"].endswith("aic anchors --out profiles/kernels/aic-anchors.json")  # as recorded
    for an in a["anchors"]:
        assert an["step_ms"] == pytest.approx(an["quoted_ms"], rel=0.01)
        assert sum(an["step_ms_by_op"].values()) == pytest.approx(an["step_ms"], rel=1e-3)


# ---- pricing against the raw tables (needs aiconfigurator-core) ---------------------------------------------


def _raw(system: str, rel: str):
    import pandas as pd

    return pd.read_parquet(aic_source.aic_root() / "systems" / "data" / rel)


@needs_aic
def test_pricing_at_measured_points_equals_the_rows():
    priced = aic_pricing.price_records(
        [
            {"op": "gemm", "dtype": "bf16", "m": 64, "n": 4096, "k": 7168},
            {"op": "gemm", "dtype": "fp8", "m": 64, "n": 4096, "k": 7168},
            {
                "op": "moe",
                "dtype": "fp8",
                "tokens": 512,
                "hidden": 7168,
                "inter": 3072,
                "topk": 6,
                "experts": 384,
                "ep": 8,
            },
            {"op": "attn", "kind": "v4_csa", "phase": "decode", "batch": 32, "q": 1, "kv": 8192, "heads": 64},
            {"op": "attn", "kind": "v4_hca", "phase": "prefill", "batch": 4, "q": 1024, "kv": 2048, "heads": 64},
            {"op": "mhc", "tokens": 256, "hidden": 4096, "hc_mult": 4},
            {"op": "comm", "kind": "all_reduce", "gpus": 8, "bytes": 2 * 1048576},
        ],
        "h200_sxm",
        model="deepseek-v4-flash",
    )
    assert not priced["unpriced"]
    g, g8, m, csa, hca, mhc, ar = priced["records"]
    d = _raw("h200_sxm", "h200_sxm/gemm/vllm/0.24.0/gemm_perf.parquet")
    row = d[(d.gemm_dtype == "bfloat16") & (d.m == 64) & (d.n == 4096) & (d.k == 7168)]
    assert g["ms"] == pytest.approx(float(row.latency.iloc[0]), abs=1e-6) and g["backend"] == "vllm 0.24.0"
    d = _raw("h200_sxm", "h200_sxm/gemm/sglang/0.5.14/gemm_perf.parquet")
    row = d[(d.gemm_dtype == "fp8_block") & (d.m == 64) & (d.n == 4096) & (d.k == 7168)]
    assert g8["ms"] == pytest.approx(float(row.latency.iloc[0]), abs=1e-6) and g8["backend"] == "sglang 0.5.14"
    d = _raw("h200_sxm", "h200_sxm/moe/vllm/0.24.0/moe_perf.parquet")
    row = d[
        (d.moe_dtype == "fp8_block")
        & (d.num_tokens == 512)
        & (d.hidden_size == 7168)
        & (d.num_experts == 384)
        & (d.inter_size == 3072)
        & (d.topk == 6)
        & (d.moe_ep_size == 8)
        & (d.moe_tp_size == 1)
        & (d.distribution == "balanced")
    ]
    assert m["ms"] == pytest.approx(float(row.latency.iloc[0]), abs=1e-6) and "routing balanced" in m["note"]
    d = _raw("h200_sxm", "h200_sxm/sparse_attention/vllm/0.24.0/dsv4_csa_generation_module_perf.parquet")
    row = d[d.model.str.contains("V4-Flash") & (d.num_heads == 64) & (d.batch_size == 32) & (d.step == 8192)]
    assert csa["ms"] == pytest.approx(float(row.latency.median()), abs=1e-6)
    assert "indexer_proj" in csa["includes"] and "V4-Flash" in csa["note"]
    d = _raw("h200_sxm", "h200_sxm/sparse_attention/vllm/0.24.0/dsv4_hca_context_module_perf.parquet")
    row = d[
        d.model.str.contains("V4-Flash")
        & (d.num_heads == 64)
        & (d.batch_size == 4)
        & (d.isl == 1024)
        & (d.step == 2048)
    ]
    assert hca["ms"] == pytest.approx(float(row.latency.median()), abs=1e-6)
    d = _raw("h200_sxm", "h200_sxm/mhc/vllm/0.24.0/mhc_module_perf.parquet")
    rows = d[(d.hidden_size == 4096) & (d.num_tokens == 256)]
    assert mhc["ms"] == pytest.approx(float(rows.latency.sum()), abs=1e-6) and len(rows) == 2
    d = _raw("h200_sxm", "h200_sxm/comm/vllm/0.24.0/custom_allreduce_perf.parquet")
    row = d[(d.num_gpus == 8) & (d.message_size == 1048576) & d.kernel_source.str.contains("graph")]
    assert ar["ms"] == pytest.approx(float(row.latency.iloc[0]), abs=1e-6)


@needs_aic
def test_pricing_reasons_and_errors():
    out = aic_pricing.price_records(
        [
            {
                "op": "moe",
                "dtype": "bf16",
                "tokens": 8,
                "hidden": 4096,
                "inter": 2048,
                "topk": 6,
                "experts": 256,
                "ep": 8,
            },
            {"op": "elementwise", "bytes": 1 << 20},
            {
                "op": "attn",
                "kind": "v4_swa",
                "phase": "decode",
                "batch": 2,
                "q": 1,
                "kv": 512,
                "heads": 64,
                "model": "deepseek-v4-flash",
            },
        ],
        "b300_sxm",
    )
    assert [u["op"] for u in out["unpriced"]] == ["moe", "elementwise"]
    (swa,) = out["records"]
    assert "HCA" in swa["note"] and "dsv4_hca_generation_module_perf.parquet" in swa["note"]
    with pytest.raises(InputError, match="needs --model"):  # 32 heads per GPU: no shipped model at TP 1 or 8
        aic_pricing.price_records(
            [{"op": "attn", "kind": "v4_csa", "phase": "decode", "batch": 1, "q": 1, "kv": 512, "heads": 32}],
            "b300_sxm",
        )
    with pytest.raises(InputError, match="--model"):
        aic_pricing.price_records([{"op": "comm", "kind": "a2a_dispatch", "gpus": 8, "bytes": 4096}], "b300_sxm")
    with pytest.raises(InputError, match="system"):
        aic_pricing.AicTables("h100_pcie")  # an AIC system without kernel tables
    with pytest.raises(InputError, match="no trtllm tables for b60"):
        aic_pricing.AicTables("b60", "trtllm")
    with pytest.raises(InputError, match="non-negative integer"):
        aic_pricing.price_records([{"op": "gemm", "dtype": "bf16", "m": -1, "n": 1, "k": 1}], "b300_sxm")


@needs_aic
@pytest.mark.parametrize("system", sorted(SHIPPED))
def test_shipped_tables_regenerate(system):
    t = json.loads(read_json_text(SHIPPED[system]))
    own = [r for r in t["records"] if not (r["op"] == "comm" and r["kind"].startswith("a2a") and "hidden" not in r)]
    sample = own[:: max(1, len(own) // 60)]
    again = aic_pricing.price_records(
        [{k: v for k, v in r.items() if k not in ("ms", "backend", "note", "includes")} for r in sample], system
    )
    assert [r["ms"] for r in again["records"]] == [r["ms"] for r in sample]


@needs_aic
def test_anchor_v4_pro_batch_1_is_aics_figure():
    got = aic_anchors.run_anchor(aic_anchors.ANCHORS[0])
    assert got["step_ms"] == pytest.approx(36.8, abs=0.05)
    # most of it is the eager host floor of vLLM's fp8_block rows on the shared expert
    shared = got["shared_expert_fp8_gemm_ms_per_step"]
    assert shared["vllm 0.24.0"] > 20 * shared["sglang 0.5.14"]


def test_shipped_error_summary_is_a_compose_table_error():
    err = json.loads((ROOT / "profiles" / "kernels" / "h200-aic-vllm-error.json").read_text())
    assert err["table"] == "h200-aic-vllm" and err["against"] == "h200-torch"
    assert err["against_provenance"]["kind"] == "measured"
    assert err["shapes"] == sum(k["shapes"] for k in err["by_kind"].values())
    assert 0 <= err["median_abs_error"] and all(0 < k["median_ratio"] for k in err["by_kind"].values())
    torch_table = ROOT / "profiles" / "kernels" / "h200-torch.json"
    if torch_table.is_file():  # with the measured table present, the summary is what compare says now
        c = aic_compare.compare_tables(
            json.loads(read_json_text(ROOT / "profiles" / "kernels" / "h200-aic-vllm.json.gz")),
            json.loads(torch_table.read_text()),
        )
        assert len(c.shapes) == err["shapes"] and round(c.median_abs_error, 4) == err["median_abs_error"]


def test_table_name_drops_json_and_gz():
    """A table built to NAME.json or NAME.json.gz is named NAME (the composer's --kernels and --prefer use it)."""
    assert aic_build.table_name("profiles/kernels/h200-aic-vllm.json.gz") == "h200-aic-vllm"
    assert aic_build.table_name("out/b300-aic-vllm.json") == "b300-aic-vllm"
    for t in ("h200-aic-vllm", "b300-aic-vllm"):
        assert json.loads(read_json_text(ROOT / "profiles" / "kernels" / f"{t}.json.gz"))["name"] == t


@needs_aic
def test_wide_ep_moe_records_are_guarded_against_the_per_gpu_repricing():
    """The issue's case: AIC's vLLM H200 moe table prices DeepSeek-V3's routed experts at EP64 / EP128
    with 256 tokens per rank at 9.4-9.8 ms (linear in the global tokens), against 1.67 ms for the same
    2,048 rows per GPU at EP8. Such records are flagged and priced per GPU (the rank's own experts from
    the GEMM table), below that EP8 bound; EP8 itself is the table's, and a record past the measured
    tokens at EP8 keeps the table's linear extrapolation, flagged. The kernel table's provenance counts
    them and states the fallback order."""
    recs = [
        {
            "op": "moe",
            "dtype": "fp8",
            "tokens": 256 * ep,
            "hidden": 7168,
            "inter": 2048,
            "topk": 8,
            "experts": 256,
            "ep": ep,
        }
        for ep in (8, 64, 128)
    ] + [
        {
            "op": "moe",
            "dtype": "fp8",
            "tokens": 32768,
            "hidden": 7168,
            "inter": 2048,
            "topk": 8,
            "experts": 256,
            "ep": 8,
        }
    ]
    out = aic_pricing.price_records(recs, "h200_sxm")["records"]
    ep8, ep64, ep128, big = out
    assert "guard" not in ep8 and ep8["ms"] == pytest.approx(1.667, abs=0.01)
    for r, table_ms in ((ep64, 9.43), (ep128, 9.80)):
        g = r["guard"]
        assert g["table_ms"] == pytest.approx(table_ms, abs=0.01) and g["bound_ms"] == pytest.approx(1.667, abs=0.01)
        assert g["used"].startswith("per-GPU re-pricing") and r["ms"] == g["per_gpu_ms"] < g["bound_ms"]
        assert r["ms"] >= g["roofline_ms"] and "guarded" in r["note"]
    assert any("outside the 1-16384" in x for x in ep128["guard"]["reasons"])
    assert big["guard"]["used"].startswith("table (extrapolated") and big["ms"] == big["guard"]["table_ms"]
    t = aic_build.kernel_table("x", "h200_sxm", "vllm", "0.24.0", {"records": out, "unpriced": [], "files": []}, "", "")
    tg = t["provenance"]["table_guard"]
    assert tg["records"] == 3 and tg["eps"] == [8, 64, 128] and "1. AIC's moe table" in tg["order"]


def test_guarded_tables_reach_the_profile_and_the_plan(tmp_path):
    """A composed profile whose kernel table has guarded records says so in its assumptions, and the
    plan's assumptions carry it (profile_caveats), as they carry missing attention terms."""
    from dsim.profiling.compose import compose_profile
    from dsim.profiling.kernel_tables import KernelTable
    from dsim.profiling.models import load_model
    from dsim.profiling.topology import parse_topology
    from dsim.study.capacity import profile_caveats

    rec = {
        "op": "moe",
        "dtype": "fp8",
        "tokens": 16384,
        "hidden": 7168,
        "inter": 2048,
        "topk": 8,
        "experts": 256,
        "ep": 64,
        "ms": 0.2448,
        "guard": {"used": "per-GPU re-pricing"},
    }
    prov = {
        "kind": "silicon-table",
        "method": "test",
        "table_guard": {
            "records": 1,
            "priced_by": {"per-GPU re-pricing": 1},
            "eps": [64],
            "order": "1. table; 2. per GPU",
        },
    }
    table = KernelTable(name="guarded", provenance=prov, records=[rec])
    p = compose_profile(load_model("deepseek-v3"), parse_topology("dp8-ep8"), "h200", table)
    g = p.provenance["assumptions"]["table_guard"]
    assert "kernel table guarded: 1 moe records at ep [64]" in g and "1. table; 2. per GPU" in g
    (cav,) = profile_caveats(p.provenance)
    assert cav.startswith("silicon tables guarded:")
    missing = {"attention_terms": "attention terms missing (--no-attention-terms): format 1"}
    assert profile_caveats(missing) == [missing["attention_terms"]] and profile_caveats({}) == []
