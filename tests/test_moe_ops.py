"""CPU checks of the DeepSeek-V4 / V3 kernel-op benchmarks and the layer-shard executor (tiny shapes; the
Triton kernels run in Triton's interpreter). Skipped where torch or triton is not installed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.gpu

os.environ.setdefault("TRITON_INTERPRET", "1")
torch = pytest.importorskip("torch")
pytest.importorskip("triton")

# (after the skips: these import torch and triton)
from validator.gpu import moe_attention, moe_gemm, moe_records, moe_timing, moe_triton  # noqa: E402
from validator.gpu import moe_shard as S  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
CPU = torch.device("cpu")
# force splits and several value blocks so the split-K combine path runs too
SPLIT_TUNE = {"attn": {"block_n": 4, "block_dv": 32}, "indexer": {"block_n": 16, "tq": 2}}


def _v4_dims(heads=8):
    d = moe_records.v4_dims(moe_records.load_config("deepseek-v4-flash"))
    d.update(head_dim=64, rope_dim=16, window=8, index_heads=16, index_dim=32, topk=8, heads=heads)
    return d


def _rel(a, b):
    return float((a - b).norm() / b.norm())


@pytest.mark.parametrize("kind", ["v4_csa", "v4_hca", "v4_swa"])
@pytest.mark.parametrize("tune", [None, SPLIT_TUNE], ids=["nosplit", "split"])
def test_v4_core_matches_float64(kind, tune):
    # decode, verify windows, a request at context 0 and a prefill chunk crossing many compressor blocks
    core = moe_attention.V4Core(kind, _v4_dims(), [1, 3, 30, 2], [5, 40, 3, 0], CPU, torch.float32, seed=3, tune=tune)
    out = core.run().double()
    assert torch.isfinite(out).all()
    assert _rel(out, core.reference()) < 1e-5
    if tune and kind != "v4_swa":  # (window-only keys are too few to split)
        assert not core.launch.plan.final  # the combine ran


def test_v4_key_lists_follow_the_architecture():
    d = _v4_dims()
    W, m = d["window"], 4
    # HCA at ratio 128: no compressed entry yet at 38 tokens: window only, W keys for each token
    core128 = moe_attention.V4Core("v4_hca", dict(d), [2], [37], CPU, torch.float32)
    assert (core128.idx_buf.numpy() >= 0).sum(1).tolist() == [W, W]
    csa = moe_attention.V4Core("v4_csa", dict(d), [2], [37], CPU, torch.float32)
    csa.run()
    vis = (np.array([37, 38]) + 1) // m  # compressed entries complete before each token
    assert csa.nvis.numpy().tolist() == vis.tolist()
    sel = csa.idx_buf.numpy()[:, : csa.k_sel]
    assert ((sel >= 0).sum(1) == np.minimum(vis, d["topk"])).all()  # top-k of the visible entries
    assert csa.n_new == (39 // m) - (37 // m)  # entries completed in this step


def test_indexer_logits_match_float64():
    core = moe_attention.V4Core(
        "v4_csa", _v4_dims(), [1, 4, 20], [60, 200, 10], CPU, torch.float32, seed=1, tune=SPLIT_TUNE
    )
    core.run()
    ref = core.reference_logits()
    lg = core.logits.double()
    fin = torch.isfinite(ref)
    assert torch.equal(torch.isfinite(lg), fin)
    assert _rel(lg[fin], ref[fin]) < 1e-5


@pytest.mark.parametrize("tune", [None, SPLIT_TUNE], ids=["nosplit", "split"])
def test_mla_decode_matches_float64(tune):
    d = dict(
        moe_records.mla_dims(moe_records.load_config("deepseek-v3")),
        heads=4,
        kv_lora=64,
        rope_dim=16,
        nope_dim=16,
        v_dim=16,
    )
    core = moe_attention.MLACore(d, [1, 2, 5], [5, 70, 33], CPU, torch.float32, seed=2, tune=tune)
    out = core.run().double()
    assert _rel(out, core.reference_decode()) < 1e-5


def test_plan_work_covers_every_key_once():
    kc = np.array([5, 300, 0, 64, 1000])
    for dvb, bn in [(1, 32), (4, 8)]:
        plan = moe_triton.plan_work(kc, np.arange(5) * 7, dvb, CPU, bn, sms=4)
        w = plan.work.numpy()
        for rb, c in enumerate(kc):
            mine = w[w[:, 0] == rb]
            assert len(mine) >= 1
            spans = sorted((int(s), int(e)) for _, s, e, _ in mine)
            assert spans[0][0] == 0 and spans[-1][1] == c
            assert all(a[1] == b[0] for a, b in zip(spans, spans[1:]))
            assert (mine[:, 3] == rb * 7).all()
    # enough row blocks to fill the GPU: one work item each, no combine
    assert moe_triton.plan_work(np.full(600, 100), np.zeros(600), 1, CPU, 32, sms=132).final


def test_uniform_routing_counts():
    t, k, E, P = 4096, 6, 256, 8
    mean = moe_gemm.uniform_routing_counts(t, k, E, P, seed=0)
    again = moe_gemm.uniform_routing_counts(t, k, E, P, seed=0)
    mx = moe_gemm.uniform_routing_counts(t, k, E, P, seed=0, rank="max")
    assert len(mean) == E // P and np.array_equal(mean, again)
    assert abs(mean.sum() - t * k / P) < 0.05 * t * k / P
    assert mx.sum() >= mean.sum() or (mx > 0).sum() >= (mean > 0).sum()
    one = moe_gemm.uniform_routing_counts(1, k, E, P, seed=0, rank="max")
    assert one.sum() <= k and (one <= 1).all()  # one token picks distinct experts


def test_moe_op_rows_and_output():
    rec = dict(op="moe", dtype="bf16", tokens=64, hidden=32, inter=16, topk=2, experts=8, ep=2)
    op = moe_gemm.MoEOp(rec, CPU, torch.float32)
    y = op()
    assert op.rows == int(op.counts.sum()) and y.shape == (op.rows, 32) and torch.isfinite(y).all()
    # the grouped result equals a per-row reference (expert of each row from the offsets)
    x = op.x.index_select(0, op.perm)
    ref = torch.zeros_like(y)
    o = 0
    for e, c in enumerate(op.counts):
        h = x[o : o + c] @ op.w13[e].t()
        ref_rows = op._act(h).to(x.dtype) @ op.w2[e].t()
        ref[op.perm[o : o + c]] = ref_rows * op.wts[o : o + c]
        o += c
    assert _rel(y.double(), ref.double()) < 1e-5


def test_fallback_grid_and_layer_gemms():
    cfg = moe_records.load_config("deepseek-v4-flash")
    g = dict((n, (nn, k)) for n, nn, k in moe_records.layer_gemms(cfg, moe_records.Topology.parse("dp8-ep8")))
    assert g["wq_b"] == (64 * 512, 1024) and g["lm_head"] == (129280, 4096)
    g8 = dict((n, (nn, k)) for n, nn, k in moe_records.layer_gemms(cfg, moe_records.Topology.parse("tp8-ep8")))
    assert g8["wq_b"] == (8 * 512, 1024)
    recs = moe_records.fallback_grid([("deepseek-v4-flash", "dp8-ep8")], quick=True)
    kinds = {r["kind"] for r in recs if r["op"] == "attn"}
    assert kinds == {"v4_csa", "v4_hca", "v4_swa"}
    assert all(r["tokens"] % 8 == 0 for r in recs if r["op"] == "moe")  # DP8: 8 ranks' tokens
    assert len({json.dumps(r, sort_keys=True) for r in recs}) == len(recs)


def test_v4_model_configs_from_the_public_configs():
    for name, layers, experts in [("deepseek-v4-flash", 43, 256), ("deepseek-v4-pro", 61, 384)]:
        c = json.loads((ROOT / "profiles" / "models" / f"{name}.json").read_text())
        assert "Hugging Face" in c["source"]
        assert c["num_hidden_layers"] == layers and c["n_routed_experts"] == experts
        assert len(c["compress_ratios"]) == layers + c["num_nextn_predict_layers"]
        assert set(c["compress_ratios"]) <= {0, 4, 128}


def test_shard_of_and_logit_rows():
    st = {"q": [1, 4, 300], "ctx": [10, 20, 0]}
    q, c, total = S.shard_of(st, moe_records.Topology.parse("dp8-ep8"))
    assert q == [1, 4, 300] and total == 8 * 305
    assert S.shard_of(st, moe_records.Topology.parse("tp8-ep8"))[2] == 305
    assert S.logit_rows([1, 4, 300]).tolist() == [0, 1, 2, 3, 4, 304]


def test_shard_step_runs_on_cpu():
    shard = S.Shard("deepseek-v4-flash", moe_records.Topology.parse("dp8-ep8"), CPU, torch.float32, layers=3, dry=True)
    assert sorted(set(shard.kinds)) == ["v4_csa", "v4_hca", "v4_swa"]
    logits = shard.step([2, 1], [9, 30], 24)()
    assert logits.shape[0] == 3 and torch.isfinite(logits).all()
    v3 = S.Shard("deepseek-v3", moe_records.Topology.parse("tp8-ep8"), CPU, torch.float32, layers=2, dry=True)
    assert torch.isfinite(v3.step([1, 80], [5, 0], 81)()).all()


def test_bad_inputs_exit_2(tmp_path):
    bad = tmp_path / "ops.json"
    bad.write_text('{"not": "a list"')
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "validator.gpu.moe_ops",
            "price",
            "--ops",
            str(bad),
            "--out",
            str(tmp_path / "t.json"),
            "--dry-run",
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert r.returncode == 2 and "error: --ops" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "t.json").exists()
    log = tmp_path / "s.jsonl"
    log.write_text('{"q": [1, 2], "ctx": [3]}\n')
    with pytest.raises(SystemExit, match="s.jsonl:1"):
        S.read_steplog(str(log))
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "validator.gpu.moe_shard",
            "replay",
            str(tmp_path / "none.jsonl"),
            "--out",
            str(tmp_path / "r.json"),
            "--dry-run",
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert r.returncode == 2 and "no such file" in r.stderr


def test_committed_kernel_table_loads_in_the_composer():
    from dsim.profiling.kernel_tables import load_kernel_table

    t = load_kernel_table("h200-torch")
    assert t.provenance["kind"] == "measured" and "H200" in t.provenance["hardware"]
    assert all(r["ms"] > 0 for r in t.records)
    ops = {r["op"] for r in t.records}
    assert {"gemm", "moe", "attn", "mhc", "elementwise"} <= ops


def test_batched_gemm_record_runs_each_group_on_its_own_input():
    """A gemm record with groups: `groups` independent [m, k] x [k, n] products of one launch (bf16
    torch.bmm; GroupedProj's fallback on the CPU), each group its own input slice and weights."""
    op = moe_gemm.GemmOp(dict(op="gemm", dtype="bf16", m=5, n=12, k=8, groups=3), CPU, torch.float64)
    y = op()
    assert tuple(y.shape) == (3, 5, 12)
    gp = moe_gemm.GroupedProj(3, 12, 8, CPU, torch.float64)
    x = torch.randn(5, 3, 8, dtype=torch.float64)
    want = torch.cat([x[:, g] @ gp.w[g] for g in range(3)], dim=1)
    assert torch.allclose(gp(x), want)
    assert moe_timing.op_footprint(dict(op="gemm", dtype="bf16", m=5, n=12, k=8, groups=3)) == 3 * (
        (5 * 8 + 12 * 8) * 2 + 5 * 12 * 2
    )


def test_fold_appends_only_new_records_with_provenance(tmp_path):
    """fold keeps the table's own records, appends the run's new keys, and says how far the run
    re-measured the old ones; bad input is one line and exit 2, the table untouched."""
    rec = dict(op="mhc", hidden=4096, hc_mult=4)
    table = dict(name="t", provenance=dict(kind="measured"), records=[dict(rec, tokens=512, ms=0.5)])
    add = dict(
        provenance=dict(
            date="2026-12-01",
            wall_s=3.0,
            gpu=dict(gpu="NVIDIA H200", torch="2.11"),
            records_skipped=[dict(rec, tokens=9, skipped="x")],
            records_not_reached=1,
        ),
        records=[dict(rec, tokens=512, ms=0.55), dict(rec, tokens=544, ms=0.6), dict(rec, tokens=576, ms=0.62)],
    )
    tp, ap = tmp_path / "t.json", tmp_path / "a.json"
    tp.write_text(json.dumps(table))
    ap.write_text(json.dumps(add))
    r = subprocess.run(
        [sys.executable, "-m", "validator.gpu.moe_ops", "fold", str(ap), "--into", str(tp), "--what", "mhc tail"],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert r.returncode == 0, r.stderr
    out = json.loads(tp.read_text())
    assert sorted((x["tokens"], x["ms"]) for x in out["records"]) == [(512, 0.5), (544, 0.6), (576, 0.62)]
    e = out["provenance"]["additions"][-1]
    assert (e["records"], e["what"], e["gpu"], e["skipped"], e["not_reached"]) == (2, "mhc tail", "NVIDIA H200", 1, 1)
    assert e["remeasured"] == dict(records=1, median_ratio=1.1, max_abs_dev=0.1)
    before = tp.read_text()
    ap.write_text('{"records": [{"ms": 1}]}')
    r = subprocess.run(
        [sys.executable, "-m", "validator.gpu.moe_ops", "fold", str(ap), "--into", str(tp), "--what", "x"],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert r.returncode == 2 and "record 0 has no op" in r.stderr and "Traceback" not in r.stderr
    assert tp.read_text() == before


def test_shard_repredict_prices_each_replayed_step_as_the_engine(tmp_path):
    """The re-prediction of a replayed step is step_ms + prefill_ms + context_ms of its logged shape,
    and the per-log figures are the median / p90 of the per-step |error|."""
    from dsim.cost import CostModel, load_profile
    from validator.gpu.shard_repredict import repredict

    prof = str(ROOT / "archive/kernels/h200-torch-checks/deepseek-v4-flash-h200-shard-check.yaml")
    steps = [
        dict(step=1, q=[8, 8, 600], ctx=[3000, 500, 0]),
        dict(step=2, q=[4] * 16, ctx=[2048] * 16),
        dict(step=3, q=[1], ctx=[100]),
    ]
    (tmp_path / "x.jsonl").write_text("".join(json.dumps(s) + "\n" for s in steps))
    cost = CostModel(load_profile(prof))
    want = [
        cost.step_ms(616, 4116) + cost.prefill_ms([(600, 0)]) + cost.context_ms([8, 8], [3000, 500], [(600, 0)]),
        cost.step_ms(64, 64 + 16 * 2048) + cost.context_ms([4] * 16, [2048] * 16),
        cost.step_ms(1, 101) + cost.context_ms([1], [100]),
    ]
    measured = [w * f for w, f in zip(want, (1.1, 0.95, 1.0))]
    replay = dict(logs={"a/x.jsonl": dict(rows=[dict(step=s["step"], measured_ms=m) for s, m in zip(steps, measured)])})
    out = repredict(prof, replay, tmp_path)["x.jsonl"]
    err = [(w - m) / m * 100 for w, m in zip(want, measured)]
    assert [r["error_pct"] for r in out["rows"]] == pytest.approx(err, abs=0.01)
    assert out["median_abs_pct"] == pytest.approx(float(np.median(np.abs(err))), abs=0.01)
    assert out["p90_abs_pct"] == pytest.approx(float(np.percentile(np.abs(err), 90)), abs=0.01)
    assert [r["prompt_tokens"] for r in out["rows"]] == [600, 0, 0]
