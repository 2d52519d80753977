"""Variable-length causal attention with the query heads of a KV group packed into one tile
(Triton): the executor's one-call path at vLLM's shape.

torch's flash kernel packs a KV group's query heads only for one-token queries, so a verify window
of 2-8 tokens runs one CTA per query head and each reads the request's whole KV
(docs/gpu-profiling.md). Here a tile's rows are (token, query head of the group) pairs, heads
fastest, so one CTA reads a request's K/V once per KV head for the whole window (FlashAttention-3's
pack_gqa does the same). Long KV ranges are split across CTAs where the step has too few tiles to
fill the GPU (split-KV, as FlashDecoding), and the splits' partial outputs are merged by their
log-sum-exp in a second kernel.

Layout, as StepMeta's one-call path: q [total_q, H, d] pre-scaled, k/v [total_k, kv, d], request r
owns query rows cu_q[r]:cu_q[r+1] and keys cu_k[r]:cu_k[r+1], causal bottom-right aligned (query
token t of a request with s new tokens and L keys sees keys 0 .. L - s + t).
"""

from __future__ import annotations

from typing import Any

import numpy as np

BLOCK_M = 64  # rows of a tile: (token, query head) pairs
BLOCK_N = 64  # keys per inner step
MIN_SPLIT_KEYS = 512  # a split covers at least this many keys


def plan_work(lens_q: list[int], lens_k: list[int], g: int, kv: int, sms: int) -> dict[str, np.ndarray]:
    """The launch's work items (host side, once per step shape): one per (request, row tile,
    key split), with where its partial output goes (slot -1: the tile has one split and writes
    the output itself), and the merge items (request, row tile, first slot, slots) of the tiles
    with several splits. Splits are added where the tiles x KV heads are fewer than two waves of
    the SMs, each split at least MIN_SPLIT_KEYS keys."""
    tiles = [(r, row0) for r, s in enumerate(lens_q) for row0 in range(0, s * g, BLOCK_M)]
    target = 2 * sms
    want = max(1, -(-target // max(1, len(tiles) * kv)))
    req, row, k0, k1, slot = [], [], [], [], []
    m_req, m_row, m_slot0, m_n = [], [], [], []
    n_slots = 0
    for r, row0 in tiles:
        L = lens_k[r]
        n_split = int(min(want, max(1, L // MIN_SPLIT_KEYS)))
        step = -(-L // n_split)
        step = -(-step // BLOCK_N) * BLOCK_N  # (whole inner steps per split)
        bounds = list(range(0, L, step)) or [0]
        if len(bounds) > 1:
            m_req.append(r)
            m_row.append(row0)
            m_slot0.append(n_slots)
            m_n.append(len(bounds))
        for b in bounds:
            req.append(r)
            row.append(row0)
            k0.append(b)
            k1.append(min(b + step, L))
            if len(bounds) > 1:
                slot.append(n_slots)
                n_slots += 1
            else:
                slot.append(-1)
    i32 = np.int32
    return dict(
        req=np.array(req, i32),
        row0=np.array(row, i32),
        k0=np.array(k0, i32),
        k1=np.array(k1, i32),
        slot=np.array(slot, i32),
        m_req=np.array(m_req, i32),
        m_row0=np.array(m_row, i32),
        m_slot0=np.array(m_slot0, i32),
        m_n=np.array(m_n, i32),
        n_slots=np.array(n_slots),
    )


_KERNELS: dict[str, Any] = {}


def _kernels() -> dict[str, Any]:
    """The Triton kernels, defined on first use (importing this module needs no Triton)."""
    if _KERNELS:
        return _KERNELS
    import triton
    import triton.language as tl

    @triton.jit
    def packed_fwd(
        Q, K, V, O, OP, LP,
        w_req, w_row0, w_k0, w_k1, w_slot, cu_q, cu_k,
        sq_t, sq_h, sk_t, sk_h, so_t, so_h,
        G: tl.constexpr, D: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
    ):  # fmt: skip
        w = tl.program_id(0)
        h = tl.program_id(1)
        nkv = tl.num_programs(1)
        r = tl.load(w_req + w)
        row0 = tl.load(w_row0 + w)
        k0 = tl.load(w_k0 + w)
        k1 = tl.load(w_k1 + w)
        slot = tl.load(w_slot + w)
        q0 = tl.load(cu_q + r)
        s = tl.load(cu_q + r + 1) - q0
        kb = tl.load(cu_k + r)
        L = tl.load(cu_k + r + 1) - kb
        rows = row0 + tl.arange(0, BM)
        tok = rows // G
        hq = h * G + rows % G
        valid = rows < s * G
        dd = tl.arange(0, D)
        # (offsets in int64: a step's K/V pool passes 2^31 elements at 256 requests x 16K keys)
        qrow = (q0 + tok).to(tl.int64)
        q = tl.load(Q + qrow[:, None] * sq_t + hq[:, None] * sq_h + dd[None, :], mask=valid[:, None], other=0.0)
        lim = L - s + tok  # the last key each row sees
        tok_last = tl.minimum((row0 + BM - 1) // G, s - 1)
        kend = tl.minimum(k1, L - s + tok_last + 1)
        m_i = tl.full([BM], float("-inf"), tl.float32)
        l_i = tl.zeros([BM], tl.float32)
        acc = tl.zeros([BM, D], tl.float32)
        for start in range(k0, kend, BN):
            kk = start + tl.arange(0, BN)
            kin = kk < kend
            krow = (kb + kk).to(tl.int64)
            k = tl.load(K + krow[None, :] * sk_t + h * sk_h + dd[:, None], mask=kin[None, :], other=0.0)
            qk = tl.dot(q, k)
            qk = tl.where((kk[None, :] <= lim[:, None]) & kin[None, :], qk, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(qk, 1))
            m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
            p = tl.exp(qk - m_use[:, None])
            alpha = tl.exp(m_i - m_use)
            l_i = l_i * alpha + tl.sum(p, 1)
            v = tl.load(V + krow[:, None] * sk_t + h * sk_h + dd[None, :], mask=kin[:, None], other=0.0)
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
            m_i = m_new
        l_use = tl.where(l_i == 0.0, 1.0, l_i)
        out = acc / l_use[:, None]
        if slot < 0:
            tl.store(
                O + qrow[:, None] * so_t + hq[:, None] * so_h + dd[None, :],
                out.to(O.dtype.element_ty),
                mask=valid[:, None],
            )
        else:
            lse = tl.where(l_i == 0.0, float("-inf"), m_i + tl.log(l_use))
            base = (slot.to(tl.int64) * nkv + h) * BM
            tl.store(OP + (base + tl.arange(0, BM))[:, None] * D + dd[None, :], out)
            tl.store(LP + base + tl.arange(0, BM), lse)

    @triton.jit
    def packed_merge(
        O, OP, LP, m_req, m_row0, m_slot0, m_n, cu_q, so_t, so_h,
        G: tl.constexpr, D: tl.constexpr, BM: tl.constexpr,
    ):  # fmt: skip
        i = tl.program_id(0)
        h = tl.program_id(1)
        nkv = tl.num_programs(1)
        r = tl.load(m_req + i)
        row0 = tl.load(m_row0 + i)
        s0 = tl.load(m_slot0 + i)
        ns = tl.load(m_n + i)
        q0 = tl.load(cu_q + r)
        s = tl.load(cu_q + r + 1) - q0
        rows = row0 + tl.arange(0, BM)
        tok = rows // G
        hq = h * G + rows % G
        valid = rows < s * G
        dd = tl.arange(0, D)
        mx = tl.full([BM], float("-inf"), tl.float32)
        for j in range(0, ns):
            lse = tl.load(LP + ((s0 + j).to(tl.int64) * nkv + h) * BM + tl.arange(0, BM))
            mx = tl.maximum(mx, lse)
        mx = tl.where(mx == float("-inf"), 0.0, mx)
        den = tl.zeros([BM], tl.float32)
        acc = tl.zeros([BM, D], tl.float32)
        for j in range(0, ns):
            base = ((s0 + j).to(tl.int64) * nkv + h) * BM
            wgt = tl.exp(tl.load(LP + base + tl.arange(0, BM)) - mx)
            den += wgt
            acc += wgt[:, None] * tl.load(OP + (base + tl.arange(0, BM))[:, None] * D + dd[None, :])
        den = tl.where(den == 0.0, 1.0, den)
        tl.store(
            O + (q0 + tok).to(tl.int64)[:, None] * so_t + hq[:, None] * so_h + dd[None, :],
            (acc / den[:, None]).to(O.dtype.element_ty),
            mask=valid[:, None],
        )

    _KERNELS.update(fwd=packed_fwd, merge=packed_merge)
    return _KERNELS


class PackedPlan:
    """A step shape's work items as device tensors and the partial-output buffers (built outside
    graph capture; the launches read them)."""

    def __init__(self, lens_q: list[int], lens_k: list[int], H: int, kv: int, d: int, sms: int, device: Any):
        import torch

        self.g, self.kv, self.d = H // kv, kv, d
        w = plan_work(lens_q, lens_k, self.g, kv, sms)
        self.n_work = len(w["req"])
        self.n_merge = len(w["m_req"])
        self.t = {k: torch.tensor(v, dtype=torch.int32, device=device) for k, v in w.items() if k != "n_slots"}
        ns = max(int(w["n_slots"]), 1)
        self.op = torch.empty(ns * kv * BLOCK_M, d, dtype=torch.float32, device=device)
        self.lp = torch.empty(ns * kv * BLOCK_M, dtype=torch.float32, device=device)
        self.cu_q = torch.tensor(np.concatenate([[0], np.cumsum(lens_q)]), dtype=torch.int32, device=device)
        self.cu_k = torch.tensor(np.concatenate([[0], np.cumsum(lens_k)]), dtype=torch.int32, device=device)

    def __call__(self, q: Any, k: Any, v: Any, out: Any | None = None) -> Any:
        import torch

        K = _kernels()
        o = torch.empty_like(q) if out is None else out
        t = self.t
        K["fwd"][(self.n_work, self.kv)](
            q, k, v, o, self.op, self.lp,
            t["req"], t["row0"], t["k0"], t["k1"], t["slot"], self.cu_q, self.cu_k,
            q.stride(0), q.stride(1), k.stride(0), k.stride(1), o.stride(0), o.stride(1),
            G=self.g, D=self.d, BM=BLOCK_M, BN=BLOCK_N,
        )  # fmt: skip
        if self.n_merge:
            K["merge"][(self.n_merge, self.kv)](
                o, self.op, self.lp, t["m_req"], t["m_row0"], t["m_slot0"], t["m_n"], self.cu_q,
                o.stride(0), o.stride(1), G=self.g, D=self.d, BM=BLOCK_M,
            )  # fmt: skip
        return o
