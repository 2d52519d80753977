"""The Triton kernels of the kernel-op benchmarks (compiled lazily, on first use) and their launch plan: the
split-K attention launcher, the lightning indexer's scoring, the launch parameters tuned per process
(ATTN_TUNE, INDEXER_TUNE, SMS). torch and Triton are imported only inside functions."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

# ------------------------------------------------------------------ Triton kernels (defined lazily)
_K: dict = {}


def kernels() -> dict:
    """The Triton kernels, compiled on first use (TRITON_INTERPRET=1 runs them on the CPU for tests)."""
    if _K:
        return _K
    import triton
    import triton.language as tl

    @triton.jit
    def attn_kernel(
        Q,
        KV,
        IDX,
        WORK,
        ROWLIM,
        SINK,
        O,
        PACC,
        PM,
        PL,
        scale,
        stride_q,
        stride_kv,
        stride_idx,
        stride_o,
        n_sink,
        D_MAIN: tl.constexpr,
        D_EXTRA: tl.constexpr,
        BLOCK_H: tl.constexpr,
        BLOCK_DV: tl.constexpr,
        BLOCK_N: tl.constexpr,
        USE_IDX: tl.constexpr,
        USE_ROWLIM: tl.constexpr,
        FINAL: tl.constexpr,
        HAS_SINK: tl.constexpr,
    ):
        # One work item: a tile of BLOCK_H query rows (heads of one token, or tokens x heads of one request)
        # against keys [ks, ke) of its key list (index list row, or a contiguous range of the KV pool).
        p = tl.program_id(0)
        dvb = tl.program_id(1)
        rb = tl.load(WORK + p * 4).to(tl.int64)
        ks = tl.load(WORK + p * 4 + 1)
        ke = tl.load(WORK + p * 4 + 2)
        kb = tl.load(WORK + p * 4 + 3).to(tl.int64)
        p64 = p.to(tl.int64)
        offs_h = tl.arange(0, BLOCK_H)
        offs_d = tl.arange(0, D_MAIN)
        offs_v = dvb * BLOCK_DV + tl.arange(0, BLOCK_DV)
        q = tl.load(Q + rb * stride_q + offs_h[:, None] * (D_MAIN + D_EXTRA) + offs_d[None, :])
        if D_EXTRA > 0:
            offs_e = tl.arange(0, D_EXTRA)
            qe = tl.load(Q + rb * stride_q + offs_h[:, None] * (D_MAIN + D_EXTRA) + D_MAIN + offs_e[None, :])
        if USE_ROWLIM:
            lim = tl.load(ROWLIM + rb * BLOCK_H + offs_h)
        m_i = tl.full([BLOCK_H], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_H], tl.float32)
        acc = tl.zeros([BLOCK_H, BLOCK_DV], tl.float32)
        for start in range(ks, ke, BLOCK_N):
            pos = start + tl.arange(0, BLOCK_N)
            inb = pos < ke
            if USE_IDX:
                row = tl.load(IDX + kb * stride_idx + pos, mask=inb, other=-1).to(tl.int64)
                valid = row >= 0
                row = tl.where(valid, row, 0)
            else:
                row = kb + pos
                valid = inb
            k = tl.load(KV + row[:, None] * stride_kv + offs_d[None, :], mask=valid[:, None], other=0.0)
            s = tl.dot(q, tl.trans(k))
            if D_EXTRA > 0:
                kx = tl.load(KV + row[:, None] * stride_kv + D_MAIN + offs_e[None, :], mask=valid[:, None], other=0.0)
                s += tl.dot(qe, tl.trans(kx))
            s = s * scale
            msk = valid[None, :]
            if USE_ROWLIM:
                msk = msk & (pos[None, :] < lim[:, None])
            s = tl.where(msk, s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
            alpha = tl.exp(m_i - m_safe)
            pij = tl.exp(s - m_safe[:, None])
            l_i = l_i * alpha + tl.sum(pij, 1)
            if BLOCK_DV == D_MAIN:
                v = k
            else:
                v = tl.load(KV + row[:, None] * stride_kv + offs_v[None, :], mask=valid[:, None], other=0.0)
            acc = acc * alpha[:, None] + tl.dot(pij.to(v.dtype), v)
            m_i = m_new
        if FINAL:
            if HAS_SINK:
                sink = tl.load(SINK + offs_h, mask=offs_h < n_sink, other=float("-inf"))
                m_f = tl.maximum(m_i, sink)
                m_f = tl.where(m_f == float("-inf"), 0.0, m_f)
                corr = tl.exp(m_i - m_f)
                l_i = l_i * corr + tl.exp(sink - m_f)
                acc = acc * corr[:, None]
            l_safe = tl.where(l_i > 0, l_i, 1.0)
            out = acc / l_safe[:, None]
            tl.store(O + rb * stride_o + offs_h[:, None] * D_MAIN + offs_v[None, :], out.to(O.dtype.element_ty))
        else:
            tl.store(PACC + p64 * (BLOCK_H * D_MAIN) + offs_h[:, None] * D_MAIN + offs_v[None, :], acc)
            if dvb == 0:
                tl.store(PM + p64 * BLOCK_H + offs_h, m_i)
                tl.store(PL + p64 * BLOCK_H + offs_h, l_i)

    @triton.jit
    def indexer_kernel(
        QI,
        WI,
        KI,
        GROUPS,
        NVIS,
        OUT,
        l_max,
        stride_out,
        HI: tl.constexpr,
        DI: tl.constexpr,
        BLOCK_N: tl.constexpr,
        TQ: tl.constexpr,
    ):
        # Lightning-indexer logits for up to TQ consecutive tokens of one request against one block of its
        # compressed index keys: logit = sum_h w[h] * relu(q_h . k); the key block is loaded once per group.
        g = tl.program_id(0)
        nb = tl.program_id(1)
        tok0 = tl.load(GROUPS + g * 4).to(tl.int64)
        ntok = tl.load(GROUPS + g * 4 + 1)
        kbase = tl.load(GROUPS + g * 4 + 2).to(tl.int64)
        kmax = tl.load(GROUPS + g * 4 + 3)
        cols = nb * BLOCK_N + tl.arange(0, BLOCK_N)
        kval = cols < kmax
        offs_h = tl.arange(0, HI)
        offs_d = tl.arange(0, DI)
        k = tl.load(KI + (kbase + cols)[:, None] * DI + offs_d[None, :], mask=kval[:, None], other=0.0)
        for i in tl.static_range(TQ):
            if i < ntok:
                t = tok0 + i
                q = tl.load(QI + t * (HI * DI) + offs_h[:, None] * DI + offs_d[None, :])
                w = tl.load(WI + t * HI + offs_h)
                s = tl.dot(q, tl.trans(k))
                s = tl.maximum(s, 0.0)
                lg = tl.sum(s * w[:, None], 0)
                nv = tl.load(NVIS + t)
                lg = tl.where(cols < nv, lg, float("-inf"))
                tl.store(OUT + t * stride_out + cols, lg, mask=cols < l_max)

    @triton.jit
    def sinkhorn_kernel(X, Y, T, iters, eps, M: tl.constexpr, BT: tl.constexpr):
        # Sinkhorn normalisation of per-token M x M mixing logits (exp, then alternate row / column sums).
        pid = tl.program_id(0)
        t = (pid * BT + tl.arange(0, BT)).to(tl.int64)
        mask = t < T
        offs = t[:, None] * (M * M) + tl.arange(0, M * M)[None, :]
        x = tl.load(X + offs, mask=mask[:, None], other=0.0).to(tl.float32)
        x = tl.exp(x - tl.max(x, 1)[:, None])
        x3 = tl.reshape(x, (BT, M, M))
        for _ in range(iters):
            x3 = x3 / (tl.sum(x3, 2)[:, :, None] + eps)
            x3 = x3 / (tl.sum(x3, 1)[:, None, :] + eps)
        tl.store(Y + offs, tl.reshape(x3, (BT, M * M)).to(Y.dtype.element_ty), mask=mask[:, None])

    @triton.jit
    def act_quant_kernel(X, XQ, S, n, n_pad, k, stride_x, G: tl.constexpr, BT: tl.constexpr):
        # Per-token-group (1 x G) e4m3 quantisation of activations; scales stored [k / G, n] so that their
        # transpose is the outer-dim-major [n, k / G] layout the block-scaled matmul reads.
        pt = tl.program_id(0)
        pg = tl.program_id(1)
        rows = (pt * BT + tl.arange(0, BT)).to(tl.int64)
        cols = pg * G + tl.arange(0, G)
        m = rows < n
        x = tl.load(X + rows[:, None] * stride_x + cols[None, :], mask=m[:, None], other=0.0).to(tl.float32)
        amax = tl.maximum(tl.max(tl.abs(x), 1), 1e-4)
        sc = amax / 448.0
        xq = x / sc[:, None]
        mp = rows < n_pad
        tl.store(XQ + rows[:, None] * k + cols[None, :], xq.to(XQ.dtype.element_ty), mask=mp[:, None])
        tl.store(S + pg * n_pad + rows, sc, mask=mp)

    _K.update(attn=attn_kernel, indexer=indexer_kernel, sinkhorn=sinkhorn_kernel, act_quant=act_quant_kernel)
    return _K


# Kernel launch parameters; price / the shard executor tune them once per process on the GPU (tune_attention).
ATTN_TUNE = {"block_n": 32, "block_dv": 256, "num_warps": 8, "num_stages": 2}
INDEXER_TUNE = {"block_n": 64, "tq": 8, "num_warps": 4}
SMS = 132


@dataclass
class WorkPlan:
    """Static launch metadata of one attention call: work items (row block, key start, key end, key base)."""

    work: object  # int32 tensor [P, 4]
    wmap: object  # int64 tensor [P]: output row block of each work item
    n_work: int
    n_rb: int
    final: bool


def plan_work(
    key_counts: np.ndarray, key_bases: np.ndarray, dv_blocks: int, device, block_n: int, sms: int | None = None
) -> WorkPlan:
    """Split each row block's key list so the launch fills the GPU (FlashDecoding-style): no split when the
    row blocks alone give >= 2 programs per SM; else chunks of equal length (a multiple of block_n, >= 2 blocks)
    chosen from the total key count."""
    import torch

    sms = sms or SMS
    n_rb = len(key_counts)
    target = 2 * sms
    kc = np.maximum(key_counts.astype(np.int64), 0)
    if n_rb * dv_blocks >= target or kc.sum() == 0:
        chunk = None
    else:
        want = max(1, math.ceil(target / dv_blocks))
        chunk = max(2 * block_n, math.ceil(kc.sum() / want / block_n) * block_n)
    rows = []
    for i in range(n_rb):
        c = int(kc[i])
        if chunk is None or c <= chunk:
            rows.append((i, 0, c, int(key_bases[i])))
        else:
            for s in range(0, c, chunk):
                rows.append((i, s, min(c, s + chunk), int(key_bases[i])))
    arr = np.asarray(rows, dtype=np.int32).reshape(-1, 4)
    final = len(rows) == n_rb
    return WorkPlan(
        torch.as_tensor(arr, device=device),
        torch.as_tensor(arr[:, 0].astype(np.int64), device=device),
        len(rows),
        n_rb,
        final,
    )


class AttnLauncher:
    """Runs attn_kernel for one static WorkPlan; output [n_rb, block_h, d_main] (dtype of q)."""

    def __init__(
        self,
        plan: WorkPlan,
        block_h: int,
        d_main: int,
        d_extra: int,
        use_idx: bool,
        use_rowlim: bool,
        sink,
        device,
        dtype,
        tune: dict | None = None,
    ):
        import torch

        self.t = dict(ATTN_TUNE, **(tune or {}))
        self.plan, self.bh, self.dm, self.de = plan, block_h, d_main, d_extra
        self.use_idx, self.use_rowlim, self.sink = use_idx, use_rowlim, sink
        self.bdv = min(self.t["block_dv"], d_main)
        self.dvb = d_main // self.bdv
        self.out = torch.empty(plan.n_rb, block_h, d_main, device=device, dtype=dtype)
        if not plan.final:
            self.pacc = torch.empty(plan.n_work, block_h, d_main, device=device, dtype=torch.float32)
            self.pm = torch.empty(plan.n_work, block_h, device=device, dtype=torch.float32)
            self.pl = torch.empty(plan.n_work, block_h, device=device, dtype=torch.float32)
            self.m_init = torch.full((plan.n_rb, block_h), float("-inf"), device=device)
        else:
            self.pacc = self.pm = self.pl = self.out
        self.dummy = torch.zeros(1, device=device, dtype=torch.int32)

    def __call__(self, q, kv, idx=None, rowlim=None):
        import torch

        K = kernels()
        P = self.plan
        scale = 1.0 / math.sqrt(self.dm + self.de)
        sink = self.sink if self.sink is not None else self.dummy
        idx_t = idx if idx is not None else self.dummy
        K["attn"][(P.n_work, self.dvb)](
            q,
            kv,
            idx_t,
            P.work,
            rowlim if rowlim is not None else self.dummy,
            sink,
            self.out,
            self.pacc,
            self.pm,
            self.pl,
            scale,
            q.stride(0),
            kv.stride(0),
            idx.stride(0) if idx is not None else 0,
            self.out.stride(0),
            self.sink.numel() if self.sink is not None else 0,
            D_MAIN=self.dm,
            D_EXTRA=self.de,
            BLOCK_H=self.bh,
            BLOCK_DV=self.bdv,
            BLOCK_N=self.t["block_n"],
            USE_IDX=self.use_idx,
            USE_ROWLIM=self.use_rowlim,
            FINAL=P.final,
            HAS_SINK=self.sink is not None,
            num_warps=self.t["num_warps"],
            num_stages=self.t["num_stages"],
        )
        if P.final:
            return self.out
        # logsumexp combine over the split work items of each row block (FlashDecoding's combine)
        w = P.wmap
        M = self.m_init.scatter_reduce(0, w[:, None].expand(-1, self.bh), self.pm, "amax", include_self=True)
        if self.sink is not None:
            sk = torch.full((self.bh,), float("-inf"), device=M.device)
            sk[: self.sink.numel()] = self.sink
            M = torch.maximum(M, sk[None])
        Ms = torch.where(torch.isinf(M), torch.zeros_like(M), M)
        wt = torch.exp(self.pm - Ms[w])
        num = torch.zeros(P.n_rb, self.bh, self.dm, device=M.device).index_add_(0, w, self.pacc * wt[..., None])
        den = torch.zeros(P.n_rb, self.bh, device=M.device).index_add_(0, w, self.pl * wt)
        if self.sink is not None:
            den = den + torch.exp(sk[None] - Ms)
        den = torch.where(den > 0, den, torch.ones_like(den))
        self.out.copy_(num / den[..., None])
        return self.out


def indexer_logits(q_idx, w_idx, idx_pool, groups, nvis, l_max: int, out, tune: dict | None = None):
    """Triton lightning-indexer logits into out [N, l_max] (fp32; -inf past each token's visible entries)."""
    t = dict(INDEXER_TUNE, **(tune or {}))
    K = kernels()
    G = groups.shape[0]
    bn = t["block_n"]
    K["indexer"][(G, triton_cdiv(l_max, bn))](
        q_idx,
        w_idx,
        idx_pool,
        groups,
        nvis,
        out,
        l_max,
        out.stride(0),
        HI=q_idx.shape[1],
        DI=q_idx.shape[2],
        BLOCK_N=bn,
        TQ=t["tq"],
        num_warps=t["num_warps"],
    )
    return out


def triton_cdiv(a: int, b: int) -> int:
    return (a + b - 1) // b


# ------------------------------------------------------------------ V4 attention core
