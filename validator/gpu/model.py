"""Torch executor: decoder layers of an HF-style config with random bf16 weights, a KV pool,
and serving-engine-like attention. Needs torch and numpy only.

Attention (one step of R requests, request i with s_i new query tokens over ctx_i cached tokens):
- decode/verify requests (s_i <= 16), every batch size (serving-engine style, FlashDecoding-like):
  the query heads of a KV group AND the request's query tokens are folded into one query block per
  KV head (g x s_i rows; the flash grid is one CTA per KV head and chunk, not per query head).
  Prefix: one variable-length flash call, each sequence = one chunk of a request's cached prefix with
  that request's real folded rows (no padding to the step's longest context or largest window).
  Split-KV (split_plan, FlashInfer-like load balancing): one chunk length L per step,
  L = max(min_chunk, min(total KV / ceil(fill x SMs / kv_heads), balance x mean context)); every
  request's prefix is cut into L-token chunks plus its remainder, so the longest chunk (the critical
  path) is L whatever the context mix, and L moves continuously with the step's KV tokens and request
  count (no regime boundary). The chunks are merged exactly by logsumexp on every step, so the kernel
  sequence does not change between steps: chunk j of a request goes to slot j of a [max chunks, rows]
  grid and one reduction over the slots combines them (FlashDecoding's combine, no atomics).
  New tokens: each decode token's band of the s_max new keys ending at it (an unfold view of the
  contiguous new K/V, no copy per request), masked to its own request's earlier new tokens, scores
  folded per KV head; combined with the prefix part by one softmax over [prefix logsumexp, band
  scores]. Work is proportional to KV tokens plus per-row terms that do not grow with the context.
- prefill chunks (s_i > 16): causal flash attention over [cache, chunk], bottom-right aligned.
The 1/sqrt(d) scale is applied to q before attention (scale=1 in the kernels).
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from validator.gpu.plan import ATTENTION_IMPLS, PREFILL_MIN_Q, StepShape, model_dims

FLASH_BLOCK_M = 128  # query rows per flash CTA (FA2 forward, head dim 128)
# Split-KV of the ragged path (split_plan): L_occ = total KV / ceil(fill x sms / (kv_heads x m-blocks))
# makes the chunk-CTAs about fill the SMs, L_bal = balance x mean context keeps any request longer
# than that off the critical path, min_chunk bounds the merge work. sms is set from the device
# (profile.py); the profiler's probe may pick fill / balance (probe.split_tune).
SPLIT: dict[str, Any] = dict(policy="continuous", fill=2.0, balance=2.0, min_chunk=64, sms=132)
SPLIT_KEYS = ("fill", "balance", "min_chunk", "sms")
# Attention implementation: "split" (the profiles' executor: folded GQA rows, split-KV chunks, exact
# logsumexp merge, band over the new tokens; prefill chunks one causal call each) or "varlen" (one
# variable-length causal flash call over every request of the step, decode and prefill alike, as
# vLLM's FlashAttention backend runs mixed batches; no split-KV, no GQA folding) or "packed" (the
# same layout, one Triton kernel whose tiles pack a KV group's query heads for every window length,
# split-KV where the step has too few tiles: packed_attention.py)
ATTENTION_IMPL: dict[str, str] = dict(impl="split")


def executor_device(dry_run: bool) -> tuple[torch.device, torch.dtype]:
    """The executor's device and dtype: the CPU in float32 for a dry run, else the GPU in bf16
    with reduced-precision bf16 reductions (as vLLM's GEMMs run) and the split planner set to the
    GPU's SM count."""
    if dry_run:
        return torch.device("cpu"), torch.float32
    torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = True
    SPLIT["sms"] = torch.cuda.get_device_properties(0).multi_processor_count
    return torch.device("cuda"), torch.bfloat16


def split_settings(record: dict | None) -> dict:
    """The split settings of a record (a profile's provenance.attention_check.split, a --split
    option): fill, balance, min_chunk (sms where given). Only the continuous split with the exact
    logsumexp merge on every step (merge 'always', 'dense' slot grid) is implemented."""
    rec = dict(record or {})
    if (
        rec.get("policy", "continuous") != "continuous"
        or rec.get("merge", "always") != "always"
        or rec.get("merge_impl", "dense") != "dense"
    ):
        raise ValueError(f"split {rec}: only the continuous split with the dense merge on every step is implemented")
    return {k: rec[k] for k in SPLIT_KEYS if k in rec}


def split_plan(dctx: list[int], rows: list[int], kv_heads: int, split: dict | None = None) -> list[list[int]]:
    """Chunk lengths per request for the ragged prefix call. dctx: cached tokens per decode request
    (>= 1); rows: folded query rows per request (g x s_i)."""
    sp = dict(SPLIT, **split_settings(split))
    R = len(dctx)
    mb = max(1, -(-max(rows) // FLASH_BLOCK_M))
    per = kv_heads * mb  # CTAs of one unsplit request
    cap = sp["fill"] * sp["sms"]
    n_t = -(-int(math.ceil(cap)) // per)  # chunk-sets that fill the SMs
    b = float(sp.get("balance") or 0.0)
    L = -(-sum(dctx) // n_t)
    if b > 0:
        L = min(L, int(math.ceil(b * sum(dctx) / R)))
    L = max(int(sp["min_chunk"]), L)
    return [[L] * (c // L) + ([c % L] if c % L else []) for c in dctx]


def parse_split(text: str) -> dict | None:
    """'auto' -> None (tuned by the probe); 'continuous[:fill=F,balance=B,min_chunk=N]'."""
    if text == "auto":
        return None
    pol, _, rest = text.partition(":")
    if pol != "continuous":
        raise ValueError(f"unknown split policy {text!r} (auto or continuous[:fill=F,balance=B,min_chunk=N])")
    d: dict = {}
    for kv in filter(None, rest.split(",")):
        k, _, v = kv.partition("=")
        if k not in ("fill", "balance", "min_chunk"):
            raise ValueError(f"--split: unknown setting {k!r} (fill, balance, min_chunk)")
        d[k] = int(v) if k == "min_chunk" else float(v)
    return d


# ---------------------------------------------------------------- flash primitives (+ CPU fallbacks)
def _ref_attn(q, k, v, causal: bool):
    """fp32 math attention, q [B,Sq,Hq,d], k/v [B,Sk,Hk,d]; bottom-right causal. -> out, lse[B,Hq,Sq]."""
    B, Sq, Hq, d = q.shape
    Sk, Hk = k.shape[1], k.shape[2]
    g = Hq // Hk
    qf = q.float().permute(0, 2, 1, 3)
    kf = k.float().permute(0, 2, 1, 3).repeat_interleave(g, 1)
    vf = v.float().permute(0, 2, 1, 3).repeat_interleave(g, 1)
    s = qf @ kf.transpose(-1, -2)
    if causal:
        i = torch.arange(Sq, device=q.device)[:, None]
        j = torch.arange(Sk, device=q.device)[None, :]
        s = s.masked_fill(j > i + (Sk - Sq), float("-inf"))
    lse = torch.logsumexp(s, -1)
    out = torch.softmax(s, -1) @ vf
    return out.permute(0, 2, 1, 3).to(q.dtype), lse


GQA_NATIVE = True  # set by the GPU probe: flash kernel accepts fewer KV heads than query heads


def flash_dense(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """q [B,Sq,H,d], k/v [B,Sk,Hk,d] -> out [B,Sq,H,d], lse [B,H,Sq] (fp32). Scale 1."""
    if q.is_cuda:
        if not GQA_NATIVE and k.shape[2] != q.shape[2]:
            g = q.shape[2] // k.shape[2]
            k, v = k.repeat_interleave(g, 2), v.repeat_interleave(g, 2)
        r = torch.ops.aten._flash_attention_forward(
            q, k, v, None, None, q.shape[1], k.shape[1], 0.0, causal, False, scale=1.0
        )
        return r[0], r[1]
    return _ref_attn(q, k, v, causal)


def flash_varlen_ragged(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_q: torch.Tensor,
    cu_k: torch.Tensor,
    max_q: int,
    max_k: int,
    lens_q: list[int],
    causal: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Variable query rows per sequence (no padding): q [total_q, Hq, d], k/v packed [total_k, Hk, d]
    (Hk divides Hq: native GQA). causal: bottom-right aligned per sequence.
    -> out [total_q, Hq, d], lse [Hq, total_q] (fp32). lens_q: python list of rows per sequence."""
    H = q.shape[1]
    if q.is_cuda:
        if not GQA_NATIVE and k.shape[1] != H:
            k, v = k.repeat_interleave(H // k.shape[1], 1), v.repeat_interleave(H // k.shape[1], 1)
        r = torch.ops.aten._flash_attention_forward(q, k, v, cu_q, cu_k, max_q, max_k, 0.0, causal, False, scale=1.0)
        out, lse = r[0], r[1]
        if lse.dim() == 3:  # [B, H, max_q] padded per sequence -> [H, total_q]
            B = lse.shape[0]
            idx = torch.tensor(
                np.concatenate([b * max_q + np.arange(n) for b, n in enumerate(lens_q)]),
                dtype=torch.long,
                device=q.device,
            )
            lse = lse.permute(1, 0, 2).reshape(H, B * max_q).index_select(1, idx)
        return out.reshape(-1, H, q.shape[-1]), lse
    outs, lses = [], []
    cq, ck = cu_q.tolist(), cu_k.tolist()
    for b in range(len(lens_q)):
        o, l = _ref_attn(q[cq[b] : cq[b + 1]][None], k[ck[b] : ck[b + 1]][None], v[ck[b] : ck[b + 1]][None], causal)
        outs.append(o[0])
        lses.append(l[0])
    return torch.cat(outs), torch.cat(lses, dim=1)


# ---------------------------------------------------------------- step metadata
def _t(a, device, dtype=torch.long):
    return torch.tensor(np.asarray(a), dtype=dtype, device=device)


class StepMeta:
    """Static index tensors and views for one step shape (built outside graph capture)."""

    def __init__(
        self, shape: StepShape, n_pad: int, dims: dict, device: Any, split: dict | None = None, impl: str | None = None
    ):
        self.shape = shape
        self.impl = impl or ATTENTION_IMPL["impl"]
        if self.impl not in ATTENTION_IMPLS:
            raise ValueError(f"attention impl {self.impl!r}: one of {', '.join(ATTENTION_IMPLS)}")
        q, ctx = list(shape.q), list(shape.ctx)
        H, kv, d = dims["heads"], dims["kv_heads"], dims["head_dim"]
        g = H // kv
        self.g, self.H, self.kv, self.d = g, H, kv, d
        dec = [i for i, s in enumerate(q) if s < PREFILL_MIN_Q]
        pre = [i for i, s in enumerate(q) if s >= PREFILL_MIN_Q]
        # token order: decode requests first, then prefill requests, then padding
        order = dec + pre
        self.q = [q[i] for i in order]
        self.ctx = [ctx[i] for i in order]
        self.n = sum(q)
        self.n_pad = max(n_pad, self.n)
        self.R_dec = len(dec)
        self.R_pre = len(pre)
        starts = np.concatenate([[0], np.cumsum(self.q)]).astype(int)
        pos = np.concatenate(
            [np.arange(c, c + s) for s, c in zip(self.q, self.ctx)] + [np.zeros(self.n_pad - self.n, dtype=int)]
        )
        self.positions = torch.tensor(pos, dtype=torch.long, device=device)
        self.ids = torch.randint(0, dims["vocab"], (self.n_pad,), device=device)
        # KV region layout (tokens, per layer): [decode prefixes][prefill caches+chunks][scratch][dummy]
        slot = np.zeros(self.n_pad, dtype=np.int64)
        Rd = self.R_dec
        self.mode: str | None = None  # 'varlen' where the step has decode/verify requests
        self.n_chunks = 0
        self.merge_rows = 0
        dec_tokens = 0
        ndec_tok = int(starts[Rd]) if Rd else 0
        self.n_dec = ndec_tok
        if self.impl in ("varlen", "packed"):
            self._one_call(starts, slot, device)
            if self.impl == "packed" and torch.device(device).type == "cuda":  # (the CPU runs the reference)
                from validator.gpu.packed_attention import PackedPlan

                sms = (split or {}).get("sms") or torch.cuda.get_device_properties(device).multi_processor_count
                self.packed = PackedPlan(list(self.q), self.lens_k, H, kv, d, int(sms), device)  # one call
            return
        if Rd:
            dctx = [max(c, 1) for c in self.ctx[:Rd]]
            self.dctx = dctx
            self.s_max = max(self.q[:Rd])
            self.mode = "varlen"
            dec_tokens = sum(dctx)
            self._ragged(dctx, starts, g, split, device)
        base = dec_tokens
        self.pre_regions = []
        for j in range(self.R_pre):
            i = Rd + j
            s, c = self.q[i], self.ctx[i]
            slot[starts[i] : starts[i + 1]] = base + c + np.arange(s)
            self.pre_regions.append((base, c, s, int(starts[i])))
            base += c + s
        # s_max - 1 tokens of gap before the new decode K/V: each new token's band window (the s_max
        # keys ending at it) stays inside the region; the gap's keys are always masked
        scratch = base + ((self.s_max - 1) if Rd else 0)
        self.scratch = scratch
        slot[:ndec_tok] = scratch + np.arange(ndec_tok)  # new decode K/V: contiguous, token order
        dummy = scratch + ndec_tok
        slot[self.n :] = dummy
        self.region_tokens = dummy + 1
        self.slot = torch.tensor(slot, dtype=torch.long, device=device)
        un = np.zeros(self.n_pad, dtype=np.int64)
        un[:ndec_tok] = np.arange(ndec_tok)  # decode rows already in token order
        off = ndec_tok
        # unpad: rows of cat([decode rows, prefill rows]) -> token order, n_pad
        for _, _, s, st in self.pre_regions:
            un[st : st + s] = off + np.arange(s)
            off += s
        self.unpad_idx = torch.tensor(un, dtype=torch.long, device=device)
        # logits: every decode/verify token, the last token of each prefill chunk, the padding
        lg = (
            list(range(ndec_tok)) + [st + s - 1 for (b, c, s, st) in self.pre_regions] + list(range(self.n, self.n_pad))
        )
        self.logit_idx = torch.tensor(lg, dtype=torch.long, device=device)

    def _one_call(self, starts: np.ndarray, slot: np.ndarray, device: Any) -> None:
        """Metadata of the one-call path: every request (decode, verify or prefill chunk) owns one
        KV region [its cached tokens, its new tokens] (a block table whose blocks are consecutive:
        torch's flash kernel takes no block table), its new K/V written at the region's end, and one
        variable-length causal call (bottom-right aligned per request) covers the whole step."""
        self.mode = "varlen1"
        lens_k, base = [], 0
        for i, (s, c) in enumerate(zip(self.q, self.ctx)):
            slot[starts[i] : starts[i + 1]] = base + c + np.arange(s)
            lens_k.append(c + s)
            base += c + s
        self.lens_k: list[int] = lens_k
        slot[self.n :] = base  # padding rows write to one dummy token past the regions
        self.region_tokens = base + 1
        self.kv_tokens = base
        self.slot = torch.tensor(slot, dtype=torch.long, device=device)
        self.lens_q = list(self.q)
        self.cu_q = _t(np.concatenate([[0], np.cumsum(self.q)]), device, torch.int32)
        self.cu_k = _t(np.concatenate([[0], np.cumsum(lens_k)]), device, torch.int32)
        self.max_q, self.max_k = int(max(self.q)), int(max(lens_k))
        self.pre_regions = []
        un = np.zeros(self.n_pad, dtype=np.int64)
        un[: self.n] = np.arange(self.n)  # padding rows read row 0 (their output is never used)
        self.unpad_idx = torch.tensor(un, dtype=torch.long, device=device)
        nd = int(starts[self.R_dec]) if self.R_dec else 0
        lg = list(range(nd)) + [int(starts[self.R_dec + j + 1]) - 1 for j in range(self.R_pre)]
        self.logit_idx = torch.tensor(lg + list(range(self.n, self.n_pad)), dtype=torch.long, device=device)

    def _ragged(self, dctx: list[int], starts: np.ndarray, g: int, split: dict | None, device: Any) -> None:
        """Metadata of the ragged path. Folded query rows are token-major: row tok*g + j is query head
        h*g + j of decode token tok for KV head h; request r owns rows [g*starts[r], g*starts[r+1])."""
        Rd = len(dctx)
        qd = self.q[:Rd]
        parts = split_plan(dctx, [g * s for s in qd], self.kv, split)
        ks = [len(x) for x in parts]
        self.split_chunks = ks
        owner, lens = [], []
        for r, ls in enumerate(parts):
            owner += [r] * len(ls)  # the request's chunks, in order
            lens += ls
        self.n_chunks = len(owner)
        self.cu_k = _t(np.concatenate([[0], np.cumsum(lens)]), device, torch.int32)
        self.max_k = int(max(lens))
        rq = [g * self.q[r] for r in owner]  # each chunk: its request's real rows only
        self.chunk_rows = rq
        self.max_q = int(max(rq))
        self.cu_q = _t(np.concatenate([[0], np.cumsum(rq)]), device, torch.int32)
        Qf = g * int(starts[Rd])
        self.n_folded = Qf
        self.merge_rows = sum(rq)  # merged on every step: the kernel sequence never changes
        self.k_max = int(max(ks))
        # query rows of each chunk = their merge targets (folded row index); chunk j of a request
        # writes its rows to slot j of a [k_max, Qf] grid (every (slot, row) written at most once:
        # no atomics), then one reduction over the slots
        qi = np.concatenate([np.arange(g * starts[r], g * starts[r + 1]) for r in owner])
        self.chunk_q_idx = _t(qi, device)
        slot = np.concatenate(
            [np.full(g * self.q[r], j) for r, j in zip(owner, np.concatenate([np.arange(k) for k in ks]))]
        )
        self.slot_row_idx = _t(slot * Qf + qi, device)
        # new tokens: band of s_max keys ending at each decode token; key j of token tok's band is new
        # token tok - s_max + 1 + j, allowed iff it belongs to tok's request (j >= s_max - 1 - t)
        sm = self.s_max
        t_in = np.concatenate([np.arange(s) for s in qd])  # position within the request
        j = np.arange(sm)[None, :]
        allowed = j >= (sm - 1 - t_in)[:, None]
        bias = np.where(allowed, 0.0, -np.inf).astype(np.float32)
        self.band_bias = torch.tensor(bias, device=device).view(len(t_in), 1, 1, sm)


def attention(qkv_rot: torch.Tensor, pool_l: tuple[torch.Tensor, torch.Tensor], m: StepMeta) -> torch.Tensor:
    """qkv_rot [n_pad, H+2kv, d] (q pre-scaled, rope applied); pool_l = (K, V), each [T, kv, d],
    this layer's region (new K/V already written at m.slot). Returns [n_pad, H*d]."""
    pk, pv = pool_l
    H, kv, d, g = m.H, m.kv, m.d, m.g
    if m.impl == "packed" and qkv_rot.is_cuda:
        o = m.packed(qkv_rot[: m.n, :H], pk[: m.kv_tokens], pv[: m.kv_tokens])
        return o.reshape(m.n, H * d).index_select(0, m.unpad_idx)
    if m.impl in ("varlen", "packed"):
        o, _ = flash_varlen_ragged(
            qkv_rot[: m.n, :H], pk[: m.kv_tokens], pv[: m.kv_tokens], m.cu_q, m.cu_k, m.max_q, m.max_k, m.lens_q, True
        )
        return o.reshape(m.n, H * d).index_select(0, m.unpad_idx)
    parts = []
    if m.R_dec:
        nd, Qf, sm = m.n_dec, m.n_folded, m.s_max
        qd = qkv_rot[:nd, :H]  # [nd, H, d]
        qf = qd.reshape(nd, kv, g, d).transpose(1, 2).reshape(Qf, kv, d)  # folded, token-major
        nt = int(sum(m.dctx))
        # chunks against their request's real rows, exact logsumexp merge per row over a slot grid
        ci = m.chunk_q_idx
        oc, lc = flash_varlen_ragged(
            qf.index_select(0, ci), pk[:nt], pv[:nt], m.cu_q, m.cu_k, m.max_q, m.max_k, m.chunk_rows
        )
        lc = lc.float()
        K = m.k_max
        lg = (
            torch.full((kv, K * Qf), float("-inf"), device=lc.device).index_copy_(1, m.slot_row_idx, lc).view(kv, K, Qf)
        )
        og = (
            torch.zeros(K * Qf, kv, d, device=lc.device, dtype=oc.dtype)
            .index_copy_(0, m.slot_row_idx, oc)
            .view(K, Qf, kv, d)
        )
        mx = lg.amax(1)  # [kv, Qf]
        wg = torch.exp(lg - mx.unsqueeze(1))  # [kv, K, Qf]
        den = wg.sum(1)
        op = (og.float() * wg.permute(1, 2, 0).unsqueeze(-1)).sum(0) / den.t().unsqueeze(-1)
        lp = mx + den.log()
        # new tokens: band windows over the contiguous new K/V (views, no per-request copies)
        lo = m.scratch - sm + 1
        kw = pk[lo : m.scratch + nd].unfold(0, sm, 1)  # [nd, kv, d, sm]
        vw = pv[lo : m.scratch + nd].unfold(0, sm, 1)
        sc = torch.matmul(qd.reshape(nd, kv, g, d), kw).float() + m.band_bias  # [nd, kv, g, sm]
        lp4 = lp.float().view(kv, nd, g).permute(1, 0, 2).unsqueeze(-1)  # [nd, kv, g, 1]
        w = torch.softmax(torch.cat([lp4, sc], -1), -1)
        o = torch.matmul(w[..., 1:].to(vw.dtype), vw.transpose(-1, -2)).float()  # [nd, kv, g, d]
        o = o + w[..., :1] * op.view(nd, g, kv, d).transpose(1, 2).float()
        parts.append(o.reshape(nd, H * d).to(qkv_rot.dtype))
    for b, c, s, st in m.pre_regions:
        q = qkv_rot[st : st + s, :H].unsqueeze(0)
        o, _ = flash_dense(q, pk[b : b + c + s].unsqueeze(0), pv[b : b + c + s].unsqueeze(0), causal=True)
        parts.append(o.reshape(s, H * d))
    allrows = parts[0] if len(parts) == 1 else torch.cat(parts, 0)
    return allrows.index_select(0, m.unpad_idx)


# ---------------------------------------------------------------- model
def _w(out_f: int, in_f: int, device: Any, dtype: torch.dtype) -> torch.Tensor:
    w = torch.randn(out_f, in_f, device=device, dtype=dtype)
    return w.mul_(1.0 / math.sqrt(in_f))


class Layer:
    def __init__(self, dims: dict, device: Any, dtype: torch.dtype, qkv_in: int | None = None):
        h, H, kv, d, I = dims["hidden"], dims["heads"], dims["kv_heads"], dims["head_dim"], dims["inter"]
        self.dims = dims
        self.qkv_in = qkv_in or h
        self.wqkv = _w((H + 2 * kv) * d, self.qkv_in, device, dtype)
        scale = 1.0 / math.sqrt(d)
        self.wqkv[: H * d].mul_(scale)  # fold the softmax scale into q (scale=1 in kernels)
        self.wo = _w(h, H * d, device, dtype)
        self.wgu = _w(2 * I, h, device, dtype)
        self.wd = _w(h, I, device, dtype)
        self.n1 = torch.ones(self.qkv_in, device=device, dtype=dtype)
        self.n2 = torch.ones(h, device=device, dtype=dtype)
        self.qn = torch.ones(d, device=device, dtype=dtype) if dims["qk_norm"] else None
        self.kn = torch.ones(d, device=device, dtype=dtype) if dims["qk_norm"] else None
        self.eps = 1e-6

    def __call__(
        self,
        hdn: torch.Tensor,
        x_in: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        m: StepMeta,
        pool_l: tuple[torch.Tensor, torch.Tensor],
    ) -> torch.Tensor:
        """hdn: residual stream [n, h]; x_in: input to the qkv projection (hdn, or a concat)."""
        H, kv, d = self.dims["heads"], self.dims["kv_heads"], self.dims["head_dim"]
        n = hdn.shape[0]
        x = F.rms_norm(x_in, (x_in.shape[-1],), self.n1, self.eps)
        qkv = (x @ self.wqkv.t()).view(n, H + 2 * kv, d)
        qk = qkv[:, : H + kv]
        if self.qn is not None:
            qk = torch.cat(
                [
                    F.rms_norm(qkv[:, :H], (d,), self.qn, self.eps),
                    F.rms_norm(qkv[:, H : H + kv], (d,), self.kn, self.eps),
                ],
                1,
            )
        x1, x2 = qk[..., : d // 2], qk[..., d // 2 :]
        rot = torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1)
        qkv_rot = torch.cat([rot, qkv[:, H + kv :]], 1)  # [n, H+2kv, d]
        pool_l[0].index_copy_(0, m.slot, qkv_rot[:, H : H + kv])  # write new K/V
        pool_l[1].index_copy_(0, m.slot, qkv_rot[:, H + kv :])
        a = attention(qkv_rot, pool_l, m)
        hdn = hdn + a @ self.wo.t()
        x = F.rms_norm(hdn, (hdn.shape[-1],), self.n2, self.eps)
        gu = x @ self.wgu.t()
        I = gu.shape[-1] // 2
        return hdn + (F.silu(gu[:, :I]) * gu[:, I:]) @ self.wd.t()


class Model:
    """Target model: embedding, `layers` decoder layers, final norm, LM head; plus KV pool."""

    def __init__(
        self,
        cfg: dict,
        device: Any,
        dtype: torch.dtype = torch.bfloat16,
        layers: int | None = None,
        pool_gib: float = 8.0,
        seed: int = 0,
    ):
        torch.manual_seed(seed)
        self.dims = dims = model_dims(cfg)
        self.device, self.dtype = device, dtype
        self.n_layers = layers or dims["layers"]
        h, V, d = dims["hidden"], dims["vocab"], dims["head_dim"]
        self.emb = torch.randn(V, h, device=device, dtype=dtype)
        self.layers: list[Any] = [Layer(dims, device, dtype) for _ in range(self.n_layers)]
        self.norm = torch.ones(h, device=device, dtype=dtype)
        self.lm_head = _w(V, h, device, dtype)
        theta = float(cfg.get("rope_theta", 10000.0))
        self.max_pos = 1 << 17
        inv = 1.0 / theta ** (torch.arange(0, d // 2, device=device, dtype=torch.float32) * 2 / d)
        ang = torch.arange(self.max_pos, device=device, dtype=torch.float32)[:, None] * inv[None]
        self.cos_t, self.sin_t = ang.cos().to(dtype), ang.sin().to(dtype)
        per_tok = 2 * dims["kv_heads"] * d * torch.finfo(dtype).bits // 8
        self.pool_tokens = int(pool_gib * 2**30 // per_tok)
        self.pool_k = torch.randn(self.pool_tokens, dims["kv_heads"], d, device=device, dtype=dtype)
        self.pool_v = torch.randn(self.pool_tokens, dims["kv_heads"], d, device=device, dtype=dtype)

    def weight_bytes(self, full_depth: bool = True) -> int:
        L = self.dims["layers"] if full_depth else self.n_layers
        return (L * self.dims["layer_params"] + 2 * self.dims["vocab"] * self.dims["hidden"]) * 2

    def layer_pool(self, l: int, T: int) -> tuple[torch.Tensor, torch.Tensor]:
        """This layer's KV region of T tokens: distinct per layer while the pool allows, else shared."""
        if T > self.pool_tokens:
            raise MemoryError(f"step needs {T} KV tokens per layer, pool holds {self.pool_tokens}")
        slots = max(1, self.pool_tokens // T)
        off = (l % slots) * T
        return self.pool_k[off : off + T], self.pool_v[off : off + T]

    def rope(self, m: StepMeta) -> tuple[torch.Tensor, torch.Tensor]:
        return (
            self.cos_t.index_select(0, m.positions)[:, None, :],
            self.sin_t.index_select(0, m.positions)[:, None, :],
        )

    def forward(self, m: StepMeta) -> torch.Tensor:
        hdn = self.emb.index_select(0, m.ids)
        cos, sin = self.rope(m)
        T = m.region_tokens
        for l, layer in enumerate(self.layers):
            hdn = layer(hdn, hdn, cos, sin, m, self.layer_pool(l, T))
        x = F.rms_norm(hdn, (hdn.shape[-1],), self.norm, 1e-6)
        return x.index_select(0, m.logit_idx) @ self.lm_head.t()


class Drafters:
    """Draft models keyed by kind; each `run(kind, m)` is one draft pass for the StepMeta m."""

    def __init__(self, target: Model, block_layers: int, draft_vocab: int):
        t = target
        dims, dev, dt = t.dims, t.device, t.dtype
        h = dims["hidden"]
        self.t = t
        self.mtp_eh = _w(h, 2 * h, dev, dt)
        self.mtp_layer = Layer(dims, dev, dt)
        self.e3_fc = _w(h, 3 * h, dev, dt)
        self.e3_layer = Layer(dims, dev, dt, qkv_in=2 * h)
        self.e3_head = _w(draft_vocab, h, dev, dt)
        self.block_layers = [Layer(dims, dev, dt) for _ in range(block_layers)]
        self.conf_w1 = _w(256, h + 1, dev, dt)
        self.conf_w2 = _w(1, 256, dev, dt)
        self.hid3 = None

    def run(self, kind: str, m: StepMeta, K: int = 8) -> torch.Tensor:
        t = self.t
        h = t.dims["hidden"]
        n = m.n_pad
        emb = t.emb.index_select(0, m.ids)
        cos, sin = t.rope(m)
        norm = t.norm
        if kind == "mtp":  # DeepSeek-style MTP: eh_proj(concat(norm(emb), norm(hidden))) -> layer
            x = torch.cat([F.rms_norm(emb, (h,), norm), F.rms_norm(emb, (h,), norm)], -1) @ self.mtp_eh.t()
            x = self.mtp_layer(x, x, cos, sin, m, t.layer_pool(0, m.region_tokens))
            return F.rms_norm(x, (h,), norm) @ t.lm_head.t()
        if kind == "eagle3":  # EAGLE-3 head step: fc(3 target hiddens), layer on concat(emb, hidden)
            hid = torch.cat([emb, emb, emb], -1) @ self.e3_fc.t()
            x = self.e3_layer(hid, torch.cat([emb, hid], -1), cos, sin, m, t.layer_pool(0, m.region_tokens))
            return F.rms_norm(x, (h,), norm) @ self.e3_head.t()
        if kind in ("block", "dspark"):  # parallel block pass over R x K tokens
            x = emb
            for l, layer in enumerate(self.block_layers):
                x = layer(x, x, cos, sin, m, t.layer_pool(l, m.region_tokens))
            logits = F.rms_norm(x, (h,), norm) @ t.lm_head.t()
            if kind == "dspark":  # small sequential confidence head over the K positions
                R = n // K
                hs = x.view(R, K, h)
                c = torch.zeros(R, 1, device=x.device, dtype=x.dtype)
                for k in range(K):
                    z = F.silu(torch.cat([hs[:, k], c], -1) @ self.conf_w1.t())
                    c = torch.sigmoid(z @ self.conf_w2.t())
            return logits
        raise ValueError(kind)


# ---------------------------------------------------------------- timing
def time_fn(
    fn: Callable[[], Any], reps: int = 5, graph: bool = True, pool: Any = None, warm: int = 2
) -> tuple[float, list[float]]:
    """Median ms of `reps` runs of fn, captured in a CUDA graph when graph=True (after one eager
    warm-up run), else eager. Returns (median_ms, all_ms). The median of an even count is the mean
    of the middle two (the upper one, taken before, made a two-rep time the slower rep's)."""
    fn()
    torch.cuda.synchronize()
    g = None
    if graph:
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, pool=pool):
            fn()
        run = g.replay
    else:
        run = fn
    for _ in range(warm):
        run()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        run()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b))
    del g
    return statistics.median(ts), ts


class Timer:
    """Median ms of a step function: CUDA events (and graphs) on the GPU, perf_counter on the CPU."""

    def __init__(self, device: Any, reps: int, warm: int = 2):
        self.cuda = device.type == "cuda"
        self.reps = reps
        self.warm = warm
        self.pool = None  # private pool per graph, freed with the graph

    def __call__(self, fn: Callable[[], Any], graph: bool = True) -> tuple[float, list[float]]:
        if self.cuda:
            return time_fn(fn, reps=self.reps, graph=graph, pool=self.pool, warm=self.warm)
        fn()
        ts = []
        for _ in range(self.reps):
            t0 = time.perf_counter()
            fn()
            ts.append((time.perf_counter() - t0) * 1e3)
        return statistics.median(ts), ts


def reference_attention(qkv_rot: torch.Tensor, pool_l: tuple[torch.Tensor, torch.Tensor], m: StepMeta) -> torch.Tensor:
    """float64 per-request reference of `attention` (causal over [cached prefix, new tokens])."""
    pk, pv = pool_l
    H, kv, d, g = m.H, m.kv, m.d, m.g
    x = qkv_rot.double()
    out = torch.zeros(m.n_pad, H * d, dtype=torch.float64)
    starts = np.concatenate([[0], np.cumsum(m.q)]).astype(int)
    if m.impl in ("varlen", "packed"):  # the new K/V are already in each request's region
        ck = m.cu_k.tolist()
        for r, s in enumerate(m.q):
            K, V = pk[ck[r] : ck[r + 1]].double(), pv[ck[r] : ck[r + 1]].double()
            out[starts[r] : starts[r + 1]] = _naive(x[starts[r] : starts[r + 1], :H], K, V, g).reshape(s, H * d)
        out[m.n :] = out[0]
        return out
    koff = 0
    for r in range(m.R_dec):
        s, c = m.q[r], m.dctx[r]
        kp, vp = pk[koff : koff + c], pv[koff : koff + c]
        koff += c
        rows = slice(starts[r], starts[r + 1])
        K = torch.cat([kp.double(), x[rows, H : H + kv]], 0)
        V = torch.cat([vp.double(), x[rows, H + kv :]], 0)
        out[rows] = _naive(x[rows, :H], K, V, g).reshape(s, H * d)
    for b, c, s, st in m.pre_regions:
        K, V = pk[b : b + c + s].double(), pv[b : b + c + s].double()
        out[st : st + s] = _naive(x[st : st + s, :H], K, V, g).reshape(s, H * d)
    return out


def _naive(q, K, V, g):
    """q [s, H, d] (pre-scaled), K/V [L, kv, d]; token t sees keys 0..L-s+t."""
    s, L = q.shape[0], K.shape[0]
    Kr, Vr = K.repeat_interleave(g, 1), V.repeat_interleave(g, 1)  # [L, H, d]
    sc = torch.einsum("thd,lhd->htl", q, Kr)
    t = torch.arange(s)[:, None]
    j = torch.arange(L)[None, :]
    sc = sc.masked_fill((j > t + L - s)[None], float("-inf"))
    return torch.einsum("htl,lhd->thd", torch.softmax(sc, -1), Vr)


# ---------------------------------------------------------------- compiled dense path
def _pre_attention(x_in, n1, wqkv, qn, kn, cos, sin, H: int, kv: int, d: int, eps: float):
    """rms_norm, fused QKV projection, per-head q/k norms (Qwen3), rotate-half RoPE: one function
    for torch.compile to fuse (the norms and RoPE become a few Triton kernels around the GEMM)."""
    n = x_in.shape[0]
    x = F.rms_norm(x_in, (x_in.shape[-1],), n1, eps)
    qkv = (x @ wqkv.t()).view(n, H + 2 * kv, d)
    qk = qkv[:, : H + kv]
    if qn is not None:
        qk = torch.cat([F.rms_norm(qkv[:, :H], (d,), qn, eps), F.rms_norm(qkv[:, H : H + kv], (d,), kn, eps)], 1)
    x1, x2 = qk[..., : d // 2], qk[..., d // 2 :]
    rot = torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1)
    return torch.cat([rot, qkv[:, H + kv :]], 1)


def _post_attention(hdn, a, wo, n2, wgu, wd, eps: float):
    """Output projection, residual, rms_norm, gate/up projection, SiLU x up, down projection."""
    hdn = hdn + a @ wo.t()
    x = F.rms_norm(hdn, (hdn.shape[-1],), n2, eps)
    gu = x @ wgu.t()
    inter = gu.shape[-1] // 2
    return hdn + (F.silu(gu[:, :inter]) * gu[:, inter:]) @ wd.t()


_COMPILED: dict[str, Any] = {}


def compile_dense(model: Model, mode: str | None = None) -> None:
    """Run every layer's dense parts (everything but attention and the KV write) through
    torch.compile (dynamic token count: one compilation serves every step size); attention stays
    the split-KV path above. The step is still captured whole as a CUDA graph by Timer."""
    if not _COMPILED:
        _COMPILED["pre"] = torch.compile(_pre_attention, dynamic=True, mode=mode)
        _COMPILED["post"] = torch.compile(_post_attention, dynamic=True, mode=mode)
    model.layers = [_CompiledLayer(layer, _COMPILED["pre"], _COMPILED["post"]) for layer in model.layers]


class _CompiledLayer:
    """A Layer whose dense parts run through the compiled functions (same weights)."""

    def __init__(self, layer: Layer, pre: Callable, post: Callable):
        self.layer, self.pre, self.post = layer, pre, post

    def __call__(self, hdn, x_in, cos, sin, m: StepMeta, pool_l):
        ly = self.layer
        H, kv, d = ly.dims["heads"], ly.dims["kv_heads"], ly.dims["head_dim"]
        qkv_rot = self.pre(x_in, ly.n1, ly.wqkv, ly.qn, ly.kn, cos, sin, H, kv, d, ly.eps)
        pool_l[0].index_copy_(0, m.slot, qkv_rot[:, H : H + kv])
        pool_l[1].index_copy_(0, m.slot, qkv_rot[:, H + kv :])
        return self.post(hdn, attention(qkv_rot, pool_l, m), ly.wo, ly.n2, ly.wgu, ly.wd, ly.eps)


def kernels_per_layer(model: Model, m: StepMeta) -> float:
    """GPU kernels one forward of StepMeta m launches, per decoder layer (torch.profiler count of
    device kernels, embedding and LM head included, divided by the layer count)."""
    from torch.profiler import ProfilerActivity, profile

    model.forward(m)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        model.forward(m)
        torch.cuda.synchronize()
    n = sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA)
    return n / model.n_layers
