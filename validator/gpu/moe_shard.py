"""Layer-shard executor: one GPU's share of a DeepSeek-V4 (DP attention + EP experts) or DeepSeek-V3 (TP
attention + EP experts) engine step, all layers, as one CUDA graph per step shape; communication excluded.

    python3 -m validator.gpu.moe_shard layers --out layers.json            # `layer` check records
    python3 -m validator.gpu.moe_shard replay STEPLOG.jsonl [...] --out results.json
        [--model deepseek-v4-flash --topology dp8-ep8] [--layers N]

One GPU of the deployment:
- dp<G>-ep<P> (V4): the step's requests are spread over the G attention ranks by least-loaded assignment
  (largest requests first; load = query tokens, then context); the GPU runs the most loaded rank's requests
  through full attention (all query heads), and its E/P local experts on the routed rows of the whole step's
  tokens (every rank's tokens, top-k uniform over the experts: what DeepEP's dispatch delivers).
- tp<G>-ep<P> (V3): every request, heads/G query heads (MLA), o_proj on the local heads; the experts of the
  rank on the rows routed to them out of all the step's tokens (TP ranks hold every token).
Excluded and stated: all-reduce / all-to-all dispatch and combine, sampling, the draft (MTP / DSpark) model,
scheduler CPU time. Included per layer: hyper-connection mixing (V4, both sites), norms, the projection GEMMs
(block-scaled FP8 where the build runs them, see moe_gemm.Linear), the attention core (moe_attention.V4Core /
MLACore), router GEMM + top-k, routed experts (moe_gemm.MoEOp), shared expert; per step: final norm and the LM
head on the rows that need logits (every token of a decode/verify request, the last token of a prefill chunk).

Step logs: JSONL, one object per engine step {"q": [query tokens per request], "ctx": [cached tokens per
request], "predicted_ms": ..., optionally "predicted_shard_ms" (the per-GPU compute prediction, communication
excluded: preferred when present), "concurrency"}. A request with q > 64 tokens is a prefill chunk.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

from validator.gpu import moe_attention, moe_gemm, moe_records, moe_timing, moe_triton

PREFILL_Q = 64


# ------------------------------------------------------------------ step -> one GPU's share
def shard_of(step: dict, topo: moe_records.Topology) -> tuple[list[int], list[int], int]:
    """(query tokens, contexts) of the requests this GPU's attention runs, and the tokens entering the experts.
    A step log of a dp<G> profile is one attention rank's (dsim's replica is one GPU): the other G - 1 ranks
    step in lockstep with similar batches, so G x n tokens reach the experts (the composer's assumption).
    A tp<G> log is the replica's: every rank holds all its tokens."""
    q = [int(x) for x in step["q"]]
    c = [int(x) for x in step["ctx"]]
    n = sum(q)
    return q, c, n * (topo.gpus if topo.attn == "dp" else 1)


def logit_rows(q: list[int]) -> np.ndarray:
    """Rows of the step's tokens that need logits: all of a decode/verify request, the last of a prefill."""
    rows, o = [], 0
    for n in q:
        rows.extend(range(o, o + n) if n <= PREFILL_Q else [o + n - 1])
        o += n
    return np.asarray(rows, dtype=np.int64)


# ------------------------------------------------------------------ weights
def _moe_weights(layer, d: dict, tp: int, device, dtype) -> None:
    """A MoE layer's router, shared expert (tensor-parallel over tp) and this rank's routed experts
    (FP8), set on `layer` (the same for V4 and V3 layers)."""
    import torch

    h = d["hidden"]
    layer.router = torch.randn(d["experts"], h, device=device, dtype=dtype) * h**-0.5
    si = d["inter"] * d["shared"] // tp
    layer.sh_gu = moe_gemm.Linear(2 * si, h, True, device, dtype)
    layer.sh_down = moe_gemm.Linear(h, si, True, device, dtype)
    moe = dict(tokens=1, hidden=h, inter=d["inter"], topk=d["topk_experts"], experts=d["experts"], ep=d["ep"])
    layer.moe_w = moe_gemm.MoEOp(dict(moe, dtype="fp8"), device, dtype)


class V4Layer:
    def __init__(self, d: dict, kind: str, device, dtype, tp: int):
        import torch

        L = moe_gemm.Linear
        h, D, H = d["hidden"], d["head_dim"], d["heads"]
        self.kind, self.d = kind, d
        self.wq_a = L(d["q_lora"], h, True, device, dtype)
        self.wq_b = L(H * D, d["q_lora"], True, device, dtype)
        self.wkv = L(D, h, True, device, dtype)
        G = d["o_groups"]
        # grouped low-rank output projection: one (heads / G x D -> o_lora) matrix per group of heads
        self.wo_a = moe_gemm.GroupedProj(G, d["o_lora"], H * D // G, device, dtype)
        self.wo_b = L(h, G * d["o_lora"], True, device, dtype)
        ratio = {"v4_csa": 4, "v4_hca": 128, "v4_swa": 0}[kind]
        # the compressors' fused wkv + wgate are bf16 in the released checkpoint (not FP8-quantized)
        self.comp = L(2 * moe_records.compressor_width(ratio) * D, h, False, device, dtype) if ratio else None
        if kind == "v4_csa":
            self.iq = L(d["index_heads"] * d["index_dim"], d["q_lora"], True, device, dtype)
            self.iw = L(d["index_heads"], h, False, device, dtype)
            self.icomp = L(2 * moe_records.compressor_width(4) * d["index_dim"], h, False, device, dtype)
        M = d["hc_mult"]
        self.phi = [torch.randn(M * h, 2 * M + M * M, device=device, dtype=dtype) * (M * h) ** -0.5 for _ in range(2)]
        self.norms = torch.ones(4, max(h, d["q_lora"]), device=device, dtype=dtype)
        _moe_weights(self, d, tp, device, dtype)


class V3Layer:
    def __init__(self, d: dict, dense: bool, device, dtype):
        import torch

        L = moe_gemm.Linear
        h, H = d["hidden"], d["heads"]
        self.dense = dense
        self.q_a = L(d["q_lora"], h, True, device, dtype)
        self.q_b = L(H * (d["nope_dim"] + d["rope_dim"]), d["q_lora"], True, device, dtype)
        self.kv_a = L(d["kv_lora"] + d["rope_dim"], h, True, device, dtype)
        self.w_uk = torch.randn(H, d["nope_dim"], d["kv_lora"], device=device, dtype=dtype) * d["nope_dim"] ** -0.5
        self.w_uv = torch.randn(H, d["kv_lora"], d["v_dim"], device=device, dtype=dtype) * d["kv_lora"] ** -0.5
        self.o_proj = L(h, H * d["v_dim"], True, device, dtype)
        self.norms = torch.ones(4, max(h, d["q_lora"]), device=device, dtype=dtype)
        tp = d["tp"]
        if dense:
            self.gu = L(2 * d["dense_inter"] // tp, h, True, device, dtype)
            self.down = L(h, d["dense_inter"] // tp, True, device, dtype)
        else:
            _moe_weights(self, d, tp, device, dtype)


def _swiglu(h, limit=10.0):
    import torch

    i = h.shape[-1] // 2
    g, u = h[:, :i].float(), h[:, i:].float()
    if limit:
        g, u = g.clamp(max=limit), u.clamp(-limit, limit)
    return (torch.nn.functional.silu(g) * u).to(h.dtype)


def _rms(x, w):
    import torch

    return torch.nn.functional.rms_norm(x, (x.shape[-1],), w[: x.shape[-1]], 1e-6)


# ------------------------------------------------------------------ the shard model
class Shard:
    """All layers of one GPU's shard (weights resident); step(q, ctx, total_tokens) builds the step's attention
    cores, routing and buffers and returns a closure that runs the whole step (capturable)."""

    def __init__(self, model: str, topo: moe_records.Topology, device, dtype, layers: int = 0, dry: bool = False):
        import torch

        self.cfg = moe_records.dry_cfg("mla" if "v3" in model else "v4") if dry else moe_records.load_config(model)
        self.v4 = moe_records.is_v4(self.cfg)
        self.topo, self.device, self.dtype = topo, device, dtype
        tp = topo.attn_tp
        if self.v4:
            d = moe_records.v4_dims(self.cfg, tp)
            if dry:
                d.update(
                    hidden=256,
                    q_lora=128,
                    o_lora=64,
                    inter=64,
                    experts=16,
                    vocab=512,
                    head_dim=64,
                    heads=16 // tp or 1,
                    o_groups=2,
                )
            d["ep"] = topo.ep
            self.d = d
            ratios = d["ratios"]
            n = layers or len(ratios)
            idx = np.round(np.linspace(0, len(ratios) - 1, n)).astype(int) if n < len(ratios) else np.arange(n)
            self.kinds = [{0: "v4_swa", 4: "v4_csa", 128: "v4_hca"}[ratios[i]] for i in idx]
            self.layers = [V4Layer(d, k, device, dtype, tp) for k in self.kinds]
            self.full_layers = len(ratios)
        else:
            d = moe_records.mla_dims(self.cfg, tp)
            if dry:
                d.update(hidden=256, q_lora=128, inter=64, dense_inter=128, experts=16, vocab=512, heads=4)
            d["ep"], d["tp"] = topo.ep, tp
            self.d = d
            n = layers or d["layers"]
            dense_frac = d["dense_layers"] / d["layers"]
            n_dense = int(round(dense_frac * n)) if n < d["layers"] else d["dense_layers"]
            self.kinds = ["mla_dense"] * n_dense + ["mla_moe"] * (n - n_dense)
            self.layers = [V3Layer(d, k == "mla_dense", device, dtype) for k in self.kinds]
            self.full_layers = d["layers"]
        self.depth_scale = self.full_layers / len(self.layers)
        h = self.d["hidden"]
        self.lm_head = torch.randn(self.d["vocab"] // tp, h, device=device, dtype=dtype) * h**-0.5
        self.final_norm = torch.ones(h, device=device, dtype=dtype)

    def weight_bytes(self) -> int:
        import torch

        tot = 0
        seen = set()
        for lay in self.layers:
            for v in vars(lay).values():
                objs = v if isinstance(v, list) else [v]
                for o in objs:
                    ts = (
                        [o]
                        if isinstance(o, torch.Tensor)
                        else [
                            getattr(o, a) for a in ("w", "w13", "w2") if isinstance(getattr(o, a, None), torch.Tensor)
                        ]
                    )
                    for t in ts:
                        if t.data_ptr() not in seen:
                            seen.add(t.data_ptr())
                            tot += t.numel() * t.element_size()
        return tot

    # -------------------------------------------------------------- V4
    def _mhc_pre(self, X, phi, res):
        import torch

        T, M, h = X.shape
        flat = torch.nn.functional.rms_norm(X.reshape(T, M * h), (M * h,), eps=1e-6)
        mix = (flat @ phi).float()
        h_pre = torch.sigmoid(mix[:, :M])
        h_post = 2 * torch.sigmoid(mix[:, M : 2 * M])
        lg = mix[:, 2 * M :].contiguous()
        moe_triton.kernels()["sinkhorn"][(moe_triton.triton_cdiv(T, 64),)](
            lg, res, T, self.d["hc_iters"], 1e-6, M=M, BT=64
        )
        x_in = (X.float() * h_pre[..., None]).sum(1).to(X.dtype)
        return x_in, h_post

    def _mhc_post(self, X, y, h_post, res):
        import torch

        T, M, _ = X.shape
        Xn = torch.bmm(res.view(T, M, M).to(X.dtype), X) + (h_post[..., None] * y[:, None].float()).to(X.dtype)
        X.copy_(Xn)

    def _v4_step(self, q_lens, ctx_lens, total, seed):
        import torch

        d, dev, dt = self.d, self.device, self.dtype
        N = int(sum(q_lens))
        h, D, H, M = d["hidden"], d["head_dim"], d["heads"], d["hc_mult"]
        tune = {"attn": dict(moe_triton.ATTN_TUNE), "indexer": dict(moe_triton.INDEXER_TUNE)}
        cores = {}
        for k in sorted(set(self.kinds)):
            cores[k] = moe_attention.V4Core(k, d, q_lens, ctx_lens, dev, dt, seed, tune)
        moe_rec = dict(
            tokens=total,
            hidden=h,
            inter=d["inter"],
            topk=d["topk_experts"],
            experts=d["experts"],
            ep=d["ep"],
            dtype="fp8",
            swiglu_limit=d["swiglu_limit"],
        )
        moes = [
            moe_gemm.MoEOp(moe_rec, dev, dt, seed + i, weights=lay.moe_w, rank="max")
            for i, lay in enumerate(self.layers)
        ]
        X = torch.randn(N, M, h, device=dev, dtype=dt)
        res = torch.empty(N, M * M, device=dev, dtype=torch.float32)
        rows = torch.as_tensor(logit_rows(q_lens), device=dev)
        layers = self.layers
        G = d["o_groups"]

        def run():
            for lay, moe in zip(layers, moes):
                core = cores[lay.kind]
                x_in, h_post = self._mhc_pre(X, lay.phi[0], res)
                xn = _rms(x_in, lay.norms[0])
                qa = _rms(lay.wq_a(xn), lay.norms[1])
                q = lay.wq_b(qa).view(N, H, D)
                kv = lay.wkv(xn)
                cs = lay.comp(xn) if lay.comp is not None else None
                if lay.kind == "v4_csa":
                    iq = lay.iq(qa).view(N, d["index_heads"], d["index_dim"])
                    iw = lay.iw(xn).float()
                    ist = lay.icomp(xn)
                    o = core.run(q, kv, cs, iq, iw, ist)
                else:
                    o = core.run(q, kv, cs)
                oa = lay.wo_a(o.reshape(N, G, H * D // G))
                y = lay.wo_b(oa)
                self._mhc_post(X, y, h_post, res)
                x_in, h_post = self._mhc_pre(X, lay.phi[1], res)
                xn = _rms(x_in, lay.norms[2])
                logits = xn @ lay.router.t()
                sc = torch.sqrt(torch.nn.functional.softplus(logits.float()))
                torch.topk(sc, d["topk_experts"], dim=-1)
                moe()  # routed experts on the rows dispatched to this rank
                y = lay.sh_down(_swiglu(lay.sh_gu(xn), d["swiglu_limit"]))
                self._mhc_post(X, y, h_post, res)
            xf = _rms(X.sum(1), self.final_norm)
            return xf.index_select(0, rows) @ self.lm_head.t()

        return run

    # -------------------------------------------------------------- V3
    def _v3_step(self, q_lens, ctx_lens, total, seed):
        import torch

        d, dev, dt = self.d, self.device, self.dtype
        N = int(sum(q_lens))
        h, H = d["hidden"], d["heads"]
        dn, dr, dl = d["nope_dim"], d["rope_dim"], d["kv_lora"]
        tune = {"attn": dict(moe_triton.ATTN_TUNE)}
        core = moe_attention.MLACore(d, q_lens, ctx_lens, dev, dt, seed, tune)
        moe_rec = dict(
            tokens=total,
            hidden=h,
            inter=d["inter"],
            topk=d["topk_experts"],
            experts=d["experts"],
            ep=d["ep"],
            dtype="fp8",
            swiglu_limit=0.0,
        )
        moes = [
            moe_gemm.MoEOp(moe_rec, dev, dt, seed + i, weights=lay.moe_w, rank="max") if not lay.dense else None
            for i, lay in enumerate(self.layers)
        ]
        x = torch.randn(N, h, device=dev, dtype=dt)
        rows = torch.as_tensor(logit_rows(q_lens), device=dev)
        qabs = torch.empty(N, H, dl + dr, device=dev, dtype=dt)
        layers = self.layers

        def run():
            for lay, moe in zip(layers, moes):
                xn = _rms(x, lay.norms[0])
                qa = _rms(lay.q_a(xn), lay.norms[1])
                q = lay.q_b(qa).view(N, H, dn + dr)
                lat = lay.kv_a(xn)
                qn = torch.bmm(q[..., :dn].transpose(0, 1), lay.w_uk)  # [H, N, dl]
                qabs[..., :dl].copy_(qn.transpose(0, 1))
                qabs[..., dl:].copy_(q[..., dn:])
                o = core.run(qabs, lat, q)  # [N, H, dl]
                ov = torch.bmm(o.transpose(0, 1), lay.w_uv).transpose(0, 1).reshape(N, H * d["v_dim"])
                x.add_(lay.o_proj(ov))
                xn = _rms(x, lay.norms[2])
                if lay.dense:
                    x.add_(lay.down(_swiglu(lay.gu(xn), 0.0)))
                else:
                    logits = xn @ lay.router.t()
                    torch.topk(torch.sigmoid(logits.float()), d["topk_experts"], dim=-1)
                    moe()
                    x.add_(lay.sh_down(_swiglu(lay.sh_gu(xn), 0.0)))
            xf = _rms(x, self.final_norm)
            return xf.index_select(0, rows) @ self.lm_head.t()

        return run

    def step(self, q_lens, ctx_lens, total, seed=0):
        return (self._v4_step if self.v4 else self._v3_step)(q_lens, ctx_lens, total, seed)


def time_step(fn, device, reps: int = 5, warm: int = 2) -> tuple[float, list[float]]:
    """Median ms of the step as one CUDA graph (CPU: eager wall time)."""
    import torch

    if device.type != "cuda":
        fn()
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e3, []
    fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    for _ in range(warm):
        g.replay()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b))
    del g
    return float(np.median(ts)), ts


# ------------------------------------------------------------------ step logs
def read_steplog(path: str) -> list[dict]:
    from dsim.errors import InputError
    from dsim.schema import read_json_lines

    try:  # bounded in size, records and nesting
        records = read_json_lines(path, "step log", max_bytes=1 << 30)
    except InputError as e:
        raise SystemExit(f"error: {e}") from None
    steps = []
    for ln, st in records:
        if (
            not isinstance(st, dict)
            or not isinstance(st.get("q"), list)
            or not isinstance(st.get("ctx"), list)
            or len(st["q"]) != len(st["ctx"])
            or not st["q"]
        ):
            raise SystemExit(f"error: {path}:{ln}: a step needs equal-length non-empty 'q' and 'ctx' lists")
        steps.append(st)
    return steps


def error_summary(rows: list[dict]) -> dict:
    errs = [
        abs(r["measured_ms"] - r["predicted_ms"]) / r["measured_ms"] * 100
        for r in rows
        if r.get("predicted_ms") is not None and r["measured_ms"] > 0
    ]
    signed = [
        (r["predicted_ms"] - r["measured_ms"]) / r["measured_ms"] * 100
        for r in rows
        if r.get("predicted_ms") is not None and r["measured_ms"] > 0
    ]
    if not errs:
        return dict(steps=len(rows), compared=0)
    return dict(
        steps=len(rows),
        compared=len(errs),
        median_abs_pct=round(float(np.median(errs)), 2),
        p90_abs_pct=round(float(np.percentile(errs, 90)), 2),
        mean_signed_pct=round(float(np.mean(signed)), 2),
    )


def step_line(src: str, row: dict) -> str:
    """One replayed step as a compact line (the run's figures survive a lost file transfer):
    `R <log> <step> tokens=<n> ms=<median> reps=<rep>/<rep>/... pred=<ms> at=<unix s>`."""
    reps = "/".join(f"{x:.3f}" for x in row.get("reps_ms") or [row["measured_ms"]])
    pred = row.get("predicted_ms")
    return (
        f"R {Path(src).name} {row['step']} tokens={row['tokens']} ms={row['measured_ms']:.3f} reps={reps}"
        f" pred={'-' if pred is None else f'{pred:.3f}'} at={row.get('end_unix_s', 0):.3f}"
    )


def rows_from_printed(text: str) -> dict[str, list[dict]]:
    """{log file name: rows} from a run's printed step lines (step_line; other lines ignored): what a
    replay file holds for re-prediction (step, tokens, measured_ms, reps_ms, predicted_ms,
    end_unix_s), for a run whose files did not come back. A step printed twice keeps its last line."""
    out: dict[str, dict[int, dict]] = {}
    for ln in text.splitlines():
        f = ln.split()
        if len(f) < 8 or f[0] != "R" or not f[3].startswith("tokens="):
            continue
        kv = dict(x.split("=", 1) for x in f[3:] if "=" in x)
        try:
            row = dict(
                step=int(f[2]),
                tokens=int(kv["tokens"]),
                measured_ms=float(kv["ms"]),
                reps_ms=[float(x) for x in kv["reps"].split("/")],
                predicted_ms=None if kv.get("pred", "-") == "-" else float(kv["pred"]),
                end_unix_s=float(kv.get("at", 0)),
            )
        except (KeyError, ValueError):
            continue
        out.setdefault(f[1], {})[row["step"]] = row
    return {log: list(rows.values()) for log, rows in out.items()}


def replay(shard: Shard, steps: list[dict], device, reps: int, dry: bool, on_row=None) -> tuple[list[dict], dict]:
    """Measure each step shape; on_row(rows) after every step (partial results survive a time limit)."""
    rows = []
    for i, st in enumerate(steps):
        ql, cl, total = shard_of(st, shard.topo)
        if dry:
            ql = [min(x, 80) for x in ql][:4]
            cl = [min(x, 300) for x in cl][:4]
            total = sum(ql) * (shard.topo.gpus if shard.topo.attn == "dp" else 1)
        fn = shard.step(ql, cl, total, seed=i)
        ms, ts = time_step(fn, device, reps)
        ms *= shard.depth_scale
        pred = st.get("predicted_shard_ms", st.get("predicted_ms"))
        rows.append(
            dict(
                step=st.get("step", i),
                concurrency=st.get("concurrency"),
                requests=len(st["q"]),
                tokens=sum(int(x) for x in st["q"]),
                shard_requests=len(ql),
                shard_tokens=sum(ql),
                shard_kv=sum(cl),
                moe_tokens=total,
                measured_ms=round(ms, 4),
                predicted_ms=pred,
                predicted_key="predicted_shard_ms" if "predicted_shard_ms" in st else "predicted_ms",
                spread=round((max(ts) - min(ts)) / max(ms, 1e-9), 4) if ts else None,
                # every timed replay in order, and when the step's timing ended (to set against the GPU's
                # clock and power samples of the same run)
                reps_ms=[round(t * shard.depth_scale, 4) for t in ts],
                end_unix_s=round(time.time(), 3),
            )
        )
        del fn
        if on_row is not None:
            on_row(rows)
        if device.type == "cuda":
            import torch

            torch.cuda.empty_cache()
    return rows, error_summary(rows)


LAYER_SHAPES = [  # (batch, q, kv): decode/verify per attention rank, then prefill chunks
    (1, 1, 2048),
    (1, 8, 8192),
    (8, 4, 8192),
    (32, 1, 8192),
    (32, 4, 8192),
    (32, 8, 32768),
    (64, 2, 8192),
    (128, 4, 4096),
    (256, 1, 2048),
    (256, 4, 8192),
    (1, 2048, 0),
    (1, 8192, 8192),
    (2, 1024, 32768),
]


def layer_records(shard: Shard, device, reps: int, dry: bool, shapes=None, on_record=None) -> list[dict]:
    """`layer` check records: one decoder layer of each attention kind, per shape, measured end to end as a
    CUDA graph of the shard's layers of that kind (ms per layer)."""
    recs = []
    model = shard.cfg.get("_name", "")
    topo = f"{shard.topo.attn}{shard.topo.gpus}-ep{shard.topo.ep}"
    all_layers, all_kinds = shard.layers, shard.kinds
    for b, q, kv in shapes or LAYER_SHAPES:
        if dry:
            b, q, kv = min(b, 2), min(q, 80), min(kv, 300)
        for kind in sorted(set(all_kinds)):
            sel = [i for i, k in enumerate(all_kinds) if k == kind][:4]
            shard.layers = [all_layers[i] for i in sel]
            shard.kinds = [kind] * len(sel)
            try:
                total = b * q * (shard.topo.gpus if shard.topo.attn == "dp" else 1)
                fn = shard.step([q] * b, [kv] * b, total)
                ms, ts = time_step(fn, device, reps)
                # subtract the per-step tail (final norm + LM head) measured alone: layers only
                shard.layers, shard.kinds = [], []
                tail, _ = time_step(shard.step([q] * b, [kv] * b, total), device, reps)
                recs.append(
                    dict(
                        op="layer",
                        model=model,
                        topology=topo,
                        attn_kind=kind,
                        tokens=b * q,
                        batch=b,
                        q=q,
                        kv=kv,
                        moe_tokens=total,
                        layers_timed=len(sel),
                        ms=round((ms - tail) / len(sel), 5),
                        step_tail_ms=round(tail, 5),
                    )
                )
                if on_record is not None:
                    on_record(recs)
            finally:
                shard.layers, shard.kinds = all_layers, all_kinds
            del fn
    return recs


def run_info(device, shard, a) -> dict:
    """The GPU and the shard a run measured: the head of every output file (gpu line, model, topology,
    layers run of the model's full count)."""
    info = moe_timing.gpu_line(device)
    info.update(model=a.model, topology=a.topology, layers_run=len(shard.layers), full_layers=shard.full_layers)
    return info


def _setup(a):
    import torch

    if a.dry_run:
        os.environ.setdefault("TRITON_INTERPRET", "1")
    device = torch.device("cpu" if a.dry_run else "cuda")
    dtype = torch.float32 if a.dry_run else torch.bfloat16
    if device.type == "cuda":
        moe_triton.SMS = torch.cuda.get_device_properties(0).multi_processor_count
        moe_gemm.detect_fp8(device)
        if a.tune:
            moe_triton.ATTN_TUNE.update(json.loads(a.tune).get("attn", {}))
            moe_triton.INDEXER_TUNE.update(json.loads(a.tune).get("indexer", {}))
    topo = moe_records.Topology.parse(a.topology)
    shard = Shard(a.model, topo, device, dtype, a.layers, dry=a.dry_run)
    shard.cfg = dict(shard.cfg, _name=a.model)
    return device, shard


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name in ("replay", "layers"):
        p = sub.add_parser(name)
        if name == "replay":
            p.add_argument("steplog", nargs="+")
        p.add_argument("--out", required=True)
        p.add_argument("--model", default="deepseek-v4-flash")
        p.add_argument("--topology", default="")
        p.add_argument(
            "--layers",
            type=int,
            default=0,
            help="layers run (0: all; fewer: spread over the depth, time scaled to full depth)",
        )
        p.add_argument("--reps", type=int, default=5)
        p.add_argument("--max-steps", type=int, default=0)
        p.add_argument("--tune", default="", help="JSON launch parameters (moe_ops price's provenance.gpu.tune)")
        p.add_argument("--dry-run", action="store_true")
    a = ap.parse_args(argv)
    if not a.topology:
        a.topology = "tp8-ep8" if "v3" in a.model else "dp8-ep8"
    logs = {}
    if a.cmd == "replay":
        for src in a.steplog:
            if not Path(src).is_file():
                print(f"error: step log {src}: no such file", file=sys.stderr)
                return 2
            logs[src] = read_steplog(src)
    device, shard = _setup(a)
    info = run_info(device, shard, a)
    info.update(
        weight_gib=round(shard.weight_bytes() / 2**30, 2),
        fp8=dict(moe_gemm.FP8),
        tune=dict(attn=moe_triton.ATTN_TUNE, indexer=moe_triton.INDEXER_TUNE),
    )
    print(json.dumps(info), flush=True)
    out = dict(info=info)
    if a.cmd == "layers":

        def save(recs):
            out["records"] = recs
            moe_timing.write_json_atomic(a.out, out)
            print(json.dumps(recs[-1]), flush=True)

        layer_records(shard, device, a.reps, a.dry_run, on_record=save)
        return 0
    out["logs"] = {}
    for src, steps in logs.items():
        t0 = time.time()
        if a.max_steps:
            steps = steps[: a.max_steps]
        if a.dry_run:
            steps = steps[:2]

        def partial(rows, src=src):
            out["logs"][src] = dict(rows=rows, summary=error_summary(rows), partial=True)
            moe_timing.write_json_atomic(a.out, out)
            print(step_line(src, rows[-1]), flush=True)

        rows, summ = replay(shard, steps, device, a.reps, a.dry_run, on_row=partial)
        out["logs"][src] = dict(rows=rows, summary=summ)
        moe_timing.write_json_atomic(a.out, out)
        print(src, json.dumps(summ), f"({time.time() - t0:.1f}s)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
