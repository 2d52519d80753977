"""The Triton kernels of the packed attention path (validator.gpu.packed_attention: the layout,
the work plan and the launches). Imported on first use: it needs Triton."""

import triton
import triton.language as tl


@triton.jit
def tile_rows(cu_q, r, row0, h, G: tl.constexpr, BM: tl.constexpr):
    """A tile's rows: (token, query head of KV head h) pairs from row0, heads fastest; the
    request's first query row and new-token count; which rows exist."""
    q0 = tl.load(cu_q + r)
    s = tl.load(cu_q + r + 1) - q0
    rows = row0 + tl.arange(0, BM)
    return q0, s, rows // G, h * G + rows % G, rows < s * G


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
    q0, s, tok, hq, valid = tile_rows(cu_q, r, row0, h, G, BM)
    kb = tl.load(cu_k + r)
    L = tl.load(cu_k + r + 1) - kb
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
    q0, s, tok, hq, valid = tile_rows(cu_q, r, row0, h, G, BM)
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
