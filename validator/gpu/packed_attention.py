"""Variable-length causal attention with the query heads of a KV group packed into one tile
(Triton): the executor's one-call path at vLLM's shape.

torch's flash kernel packs a KV group's query heads only for one-token queries, so a verify window
of 2-8 tokens runs one CTA per query head and each reads the request's whole KV
(docs/user/gpu-profiling.md). Here a tile's rows are (token, query head of the group) pairs, heads
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
        bounds = range(0, L, step)
        split = len(bounds) > 1
        if split:  # partial outputs in consecutive slots, merged by one merge item
            m_req.append(r)
            m_row.append(row0)
            m_slot0.append(n_slots)
            m_n.append(len(bounds))
        for b in bounds:
            req.append(r)
            row.append(row0)
            k0.append(b)
            k1.append(min(b + step, L))
            slot.append(n_slots if split else -1)
            n_slots += split
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


def _kernels() -> Any:
    """The Triton kernels (packed_kernels), imported on first use: importing this module needs no
    Triton."""
    from validator.gpu import packed_kernels

    return packed_kernels


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
        K.packed_fwd[(self.n_work, self.kv)](
            q, k, v, o, self.op, self.lp,
            t["req"], t["row0"], t["k0"], t["k1"], t["slot"], self.cu_q, self.cu_k,
            q.stride(0), q.stride(1), k.stride(0), k.stride(1), o.stride(0), o.stride(1),
            G=self.g, D=self.d, BM=BLOCK_M, BN=BLOCK_N,
        )  # fmt: skip
        if self.n_merge:
            K.packed_merge[(self.n_merge, self.kv)](
                o, self.op, self.lp, t["m_req"], t["m_row0"], t["m_slot0"], t["m_n"], self.cu_q,
                o.stride(0), o.stride(1), G=self.g, D=self.d, BM=BLOCK_M,
            )  # fmt: skip
        return o
