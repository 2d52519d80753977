"""Torch executor: decoder layers of an HF-style config with random bf16 weights, a KV pool,
and serving-engine-like attention. Needs torch and numpy only.

Attention (one step of R requests, request i with s_i new query tokens over ctx_i cached tokens):
- decode/verify requests (s_i <= 16): the query heads of each KV group are folded into the
  query-length dimension (design.md 5), so each KV head is read once per query block.
  force_mode='dense': queries [R, g*s_max, kv_heads, d] against the cache [R, ctx_max, kv_heads, d], one
  flash call without a mask for the cached prefix (-> out, logsumexp), the new tokens' own keys as a
  small masked score block, merged exactly by a softmax over [prefix logsumexp, new-token scores].
  Every decode step (ragged split-KV, what FlashDecoding-style serving kernels do; the dense path
  above is kept as force_mode='dense'): every request's prefix is cut into round(ctx / KV_CHUNK)
  (at least one) chunks of equal length; one variable-length flash call runs every chunk against only
  its request's real folded rows (g x s_i, no padding to the step's largest window); a second
  variable-length call, causal, native GQA, runs each request's new tokens against their own keys;
  the partial results are merged per query row by logsumexp with scatter/index_add over the real
  rows only. Work is proportional to KV tokens, chunks and real query rows; nothing is padded to
  the step's longest context or largest window.
- prefill chunks (s_i > 16): causal flash attention over [cache, chunk], bottom-right aligned.
The 1/sqrt(d) scale is applied to q before attention (scale=1 in the kernels).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from validator.gpu.plan import PREFILL_MIN_Q, StepShape, model_dims

VARLEN_MIN_REQUESTS = 1     # ragged split-KV for every decode step (force_mode='dense' for the old path)
KV_CHUNK = 512           # split-KV chunk of the ragged path (target length; chunks are balanced)


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


GQA_NATIVE = True     # set by the GPU probe: flash kernel accepts fewer KV heads than query heads


def flash_dense(q, k, v, causal=False):
    """q [B,Sq,H,d], k/v [B,Sk,Hk,d] -> out [B,Sq,H,d], lse [B,H,Sq] (fp32). Scale 1."""
    if q.is_cuda:
        if not GQA_NATIVE and k.shape[2] != q.shape[2]:
            g = q.shape[2] // k.shape[2]
            k, v = k.repeat_interleave(g, 2), v.repeat_interleave(g, 2)
        r = torch.ops.aten._flash_attention_forward(q, k, v, None, None, q.shape[1], k.shape[1],
                                                    0.0, causal, False, scale=1.0)
        return r[0], r[1]
    return _ref_attn(q, k, v, causal)


def flash_varlen_ragged(q, k, v, cu_q, cu_k, max_q, max_k, lens_q, causal=False):
    """Variable query rows per sequence (no padding): q [total_q, Hq, d], k/v packed [total_k, Hk, d]
    (Hk divides Hq: native GQA). causal: bottom-right aligned per sequence.
    -> out [total_q, Hq, d], lse [Hq, total_q] (fp32). lens_q: python list of rows per sequence."""
    H = q.shape[1]
    if q.is_cuda:
        if not GQA_NATIVE and k.shape[1] != H:
            k, v = k.repeat_interleave(H // k.shape[1], 1), v.repeat_interleave(H // k.shape[1], 1)
        r = torch.ops.aten._flash_attention_forward(q, k, v, cu_q, cu_k, max_q, max_k, 0.0, causal,
                                                    False, scale=1.0)
        out, lse = r[0], r[1]
        if lse.dim() == 3:          # [B, H, max_q] padded per sequence -> [H, total_q]
            B = lse.shape[0]
            idx = torch.tensor(np.concatenate([b * max_q + np.arange(n) for b, n in enumerate(lens_q)]),
                               dtype=torch.long, device=q.device)
            lse = lse.permute(1, 0, 2).reshape(H, B * max_q).index_select(1, idx)
        return out.reshape(-1, H, q.shape[-1]), lse
    outs, lses = [], []
    cq, ck = cu_q.tolist(), cu_k.tolist()
    for b in range(len(lens_q)):
        o, l = _ref_attn(q[cq[b]:cq[b + 1]][None], k[ck[b]:ck[b + 1]][None],
                         v[ck[b]:ck[b + 1]][None], causal)
        outs.append(o[0])
        lses.append(l[0])
    return torch.cat(outs), torch.cat(lses, dim=1)


# ---------------------------------------------------------------- step metadata
def _t(a, device, dtype=torch.long):
    return torch.tensor(np.asarray(a), dtype=dtype, device=device)


class StepMeta:
    """Static index tensors and views for one step shape (built outside graph capture)."""

    def __init__(self, shape: StepShape, n_pad: int, dims: dict, device, force_mode: str | None = None,
                 kv_chunk: int | None = None):
        self.shape = shape
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
        pos = np.concatenate([np.arange(c, c + s) for s, c in zip(self.q, self.ctx)] +
                             [np.zeros(self.n_pad - self.n, dtype=int)])
        self.positions = torch.tensor(pos, dtype=torch.long, device=device)
        self.ids = torch.randint(0, dims["vocab"], (self.n_pad,), device=device)
        # KV region layout (tokens, per layer): [decode prefixes][prefill caches+chunks][scratch][dummy]
        slot = np.zeros(self.n_pad, dtype=np.int64)
        Rd = self.R_dec
        self.mode = None
        self.overread = 0
        self.n_chunks = 0
        dec_tokens = 0
        ndec_tok = int(starts[Rd]) if Rd else 0
        self.n_dec = ndec_tok
        if Rd:
            dctx = [max(c, 1) for c in self.ctx[:Rd]]
            self.dctx = dctx
            self.uniform = len(set(dctx)) == 1
            self.s_max = max(self.q[:Rd])
            self.mode = force_mode or ("dense" if (Rd < VARLEN_MIN_REQUESTS) else "varlen")
            if self.mode == "dense":
                self.ctx_max = max(dctx)
                dec_tokens = Rd * self.ctx_max
                self.overread = Rd * self.ctx_max - sum(dctx)
            else:
                dec_tokens = sum(dctx)
                self._ragged(dctx, starts, g, kv_chunk or KV_CHUNK, device)
        base = dec_tokens
        self.pre_regions = []
        for j in range(self.R_pre):
            i = Rd + j
            s, c = self.q[i], self.ctx[i]
            slot[starts[i]:starts[i + 1]] = base + c + np.arange(s)
            self.pre_regions.append((base, c, s, int(starts[i])))
            base += c + s
        scratch = base
        self.scratch = scratch
        slot[:ndec_tok] = scratch + np.arange(ndec_tok)     # new decode K/V: contiguous, token order
        dummy = scratch + ndec_tok
        slot[self.n:] = dummy
        self.region_tokens = dummy + 1
        self.slot = torch.tensor(slot, dtype=torch.long, device=device)
        un = np.zeros(self.n_pad, dtype=np.int64)
        if self.mode == "dense":
            sm = self.s_max
            # gather real decode tokens into a padded [Rd, s_max] layout (padding rows -> token 0)
            pad_idx = np.zeros(Rd * sm, dtype=np.int64)
            for r in range(Rd):
                pad_idx[r * sm: r * sm + self.q[r]] = starts[r] + np.arange(self.q[r])
            self.pad_idx = torch.tensor(pad_idx, dtype=torch.long, device=device)
            # mask over new-token keys: folded row (t, j) sees new key t' iff t' <= t and t' < s_r
            t = np.arange(sm)
            rows_t = np.repeat(t, g)                      # row index t*g + j -> t
            allowed = (t[None, None, :] <= rows_t[None, :, None]) & \
                      (t[None, None, :] < np.array(self.q[:Rd])[:, None, None])
            bias = np.where(allowed, 0.0, -np.inf).astype(np.float32)[:, None]   # [Rd,1,rows,sm]
            self.bias = torch.tensor(bias, device=device)
            for r in range(Rd):
                un[starts[r]:starts[r + 1]] = r * sm + np.arange(self.q[r])
            off = Rd * sm
        else:
            un[:ndec_tok] = np.arange(ndec_tok)           # ragged: decode rows already in token order
            off = ndec_tok
        # unpad: rows of cat([decode rows, prefill rows]) -> token order, n_pad
        for (b, c, s, st) in self.pre_regions:
            un[st:st + s] = off + np.arange(s)
            off += s
        self.unpad_idx = torch.tensor(un, dtype=torch.long, device=device)
        # logits: every decode/verify token, the last token of each prefill chunk, the padding
        lg = list(range(ndec_tok)) + [st + s - 1 for (b, c, s, st) in self.pre_regions] + \
            list(range(self.n, self.n_pad))
        self.logit_idx = torch.tensor(lg, dtype=torch.long, device=device)

    def _ragged(self, dctx, starts, g, chunk, device):
        """Split-KV metadata of the ragged path. Folded query rows are token-major: row tok*g + j is
        query head h*g + j of decode token tok for KV head h; request r owns rows
        [g*starts[r], g*starts[r+1])."""
        Rd = len(dctx)
        self.kv_chunk = chunk
        owner, lens = [], []
        for r, c in enumerate(dctx):
            # balanced split: round(c / chunk) equal parts (>= 1), so the chunk count follows the KV
            # tokens (about kv / chunk) rather than adding a partial chunk per request
            k = max(1, int(c / chunk + 0.5))
            owner += [r] * k
            lens += [c // k + (1 if i < c % k else 0) for i in range(k)]
        self.n_chunks = len(owner)
        self.cu_k = _t(np.concatenate([[0], np.cumsum(lens)]), device, torch.int32)
        self.max_k = int(max(lens))
        rq = [g * self.q[r] for r in owner]               # each chunk: its request's real rows only
        self.chunk_rows = rq
        self.max_q = int(max(rq))
        self.cu_q = _t(np.concatenate([[0], np.cumsum(rq)]), device, torch.int32)
        # query rows of each chunk = their merge targets (folded row index)
        qi = np.concatenate([np.arange(g * starts[r], g * starts[r + 1]) for r in owner])
        self.chunk_q_idx = _t(qi, device)
        self.chunk_q_idx_kv = self.chunk_q_idx.expand(self.kv, -1).contiguous()   # scatter index
        Qf = g * int(starts[Rd])
        self.n_folded = Qf
        # new tokens against their own keys: one sequence per request, causal, native GQA
        qd = self.q[:Rd]
        self.new_lens = qd
        self.cu_new = _t(np.concatenate([[0], np.cumsum(qd)]), device, torch.int32)
        self.max_new = int(max(qd))


def attention(qkv_rot, pool_l, m: StepMeta):
    """qkv_rot [n_pad, H+2kv, d] (q pre-scaled, rope applied); pool_l = (K, V), each [T, kv, d],
    this layer's region (new K/V already written at m.slot). Returns [n_pad, H*d]."""
    pk, pv = pool_l
    H, kv, d, g = m.H, m.kv, m.d, m.g
    parts = []
    if m.R_dec and m.mode == "dense":
        Rd, sm = m.R_dec, m.s_max
        rows = g * sm
        Tp = qkv_rot.index_select(0, m.pad_idx).view(Rd, sm, H + 2 * kv, d)
        qf = Tp[:, :, :H].reshape(Rd, sm, kv, g, d).permute(0, 1, 3, 2, 4).reshape(Rd, rows, kv, d)
        kn = Tp[:, :, H:H + kv]
        vn = Tp[:, :, H + kv:]
        nt = Rd * m.ctx_max
        out_p, lse = flash_dense(qf, pk[:nt].view(Rd, m.ctx_max, kv, d),
                                 pv[:nt].view(Rd, m.ctx_max, kv, d))
        lse, out_p = lse.unsqueeze(-1), out_p.unsqueeze(1)                # one prefix part
        # new-token keys: scores [Rd, kv, rows, sm]
        sc = torch.einsum("brhd,bthd->bhrt", qf, kn).float() + m.bias
        w = torch.softmax(torch.cat([lse, sc], -1), -1)
        o = torch.einsum("bhrt,bthd->bhrd", w[..., 1:], vn.float())
        o = o + torch.einsum("bhrm,bmrhd->bhrd", w[..., :1].to(out_p.dtype), out_p).float()
        # unfold rows (t, j) of kv head h -> token t, head h*g + j
        o = o.view(Rd, kv, sm, g, d).permute(0, 2, 1, 3, 4).reshape(Rd * sm, H * d)
        parts.append(o.to(qkv_rot.dtype))
    elif m.R_dec:
        nd, Qf = m.n_dec, m.n_folded
        qd = qkv_rot[:nd, :H]                                             # [nd, H, d]
        qf = qd.reshape(nd, kv, g, d).transpose(1, 2).reshape(Qf, kv, d)  # folded, token-major
        # prefix: every chunk against its request's real rows
        nt = int(sum(m.dctx))
        oc, lc = flash_varlen_ragged(qf.index_select(0, m.chunk_q_idx), pk[:nt], pv[:nt], m.cu_q,
                                     m.cu_k, m.max_q, m.max_k, m.chunk_rows)
        # new tokens: causal over the request's own new keys (contiguous at m.scratch)
        kn = pk[m.scratch:m.scratch + nd]
        vn = pv[m.scratch:m.scratch + nd]
        on, ln = flash_varlen_ragged(qd.contiguous(), kn, vn, m.cu_new, m.cu_new, m.max_new,
                                     m.max_new, m.new_lens, causal=True)
        on = on.reshape(nd, kv, g, d).transpose(1, 2).reshape(Qf, kv, d)
        ln = ln.reshape(kv, g, nd).transpose(1, 2).reshape(kv, Qf)
        # exact merge over the real rows: out = sum_p exp(lse_p - M) o_p / sum_p exp(lse_p - M), M the
        # row max; the new-token part covers every row once, the chunks scatter into their rows
        ci = m.chunk_q_idx
        lc, ln = lc.float(), ln.float()
        mx = ln.scatter_reduce(1, m.chunk_q_idx_kv, lc, "amax", include_self=True)    # [kv, Qf]
        wc = torch.exp(lc - mx.index_select(1, ci))                                  # [kv, P]
        wn = torch.exp(ln - mx)                                                      # [kv, Qf]
        den = wn.index_add(1, ci, wc)
        num = on * wn.t().unsqueeze(-1)                                              # fp32 [Qf, kv, d]
        num.index_add_(0, ci, oc * wc.t().unsqueeze(-1))
        o = num / den.t().unsqueeze(-1)
        o = o.view(nd, g, kv, d).transpose(1, 2).reshape(nd, H * d)
        parts.append(o.to(qkv_rot.dtype))
    for (b, c, s, st) in m.pre_regions:
        q = qkv_rot[st:st + s, :H].unsqueeze(0)
        o, _ = flash_dense(q, pk[b:b + c + s].unsqueeze(0), pv[b:b + c + s].unsqueeze(0), causal=True)
        parts.append(o.reshape(s, H * d))
    allrows = parts[0] if len(parts) == 1 else torch.cat(parts, 0)
    return allrows.index_select(0, m.unpad_idx)


# ---------------------------------------------------------------- model
def _w(out_f, in_f, device, dtype, gen=None):
    w = torch.randn(out_f, in_f, device=device, dtype=dtype)
    return w.mul_(1.0 / math.sqrt(in_f))


class Layer:
    def __init__(self, dims, device, dtype, qkv_in=None):
        h, H, kv, d, I = dims["hidden"], dims["heads"], dims["kv_heads"], dims["head_dim"], dims["inter"]
        self.dims = dims
        self.qkv_in = qkv_in or h
        self.wqkv = _w((H + 2 * kv) * d, self.qkv_in, device, dtype)
        scale = 1.0 / math.sqrt(d)
        self.wqkv[:H * d].mul_(scale)          # fold the softmax scale into q (scale=1 in kernels)
        self.wo = _w(h, H * d, device, dtype)
        self.wgu = _w(2 * I, h, device, dtype)
        self.wd = _w(h, I, device, dtype)
        self.n1 = torch.ones(self.qkv_in, device=device, dtype=dtype)
        self.n2 = torch.ones(h, device=device, dtype=dtype)
        self.qn = torch.ones(d, device=device, dtype=dtype) if dims["qk_norm"] else None
        self.kn = torch.ones(d, device=device, dtype=dtype) if dims["qk_norm"] else None
        self.eps = 1e-6

    def __call__(self, hdn, x_in, cos, sin, m: StepMeta, pool_l):
        """hdn: residual stream [n, h]; x_in: input to the qkv projection (hdn, or a concat)."""
        H, kv, d = self.dims["heads"], self.dims["kv_heads"], self.dims["head_dim"]
        n = hdn.shape[0]
        x = F.rms_norm(x_in, (x_in.shape[-1],), self.n1, self.eps)
        qkv = (x @ self.wqkv.t()).view(n, H + 2 * kv, d)
        qk = qkv[:, :H + kv]
        if self.qn is not None:
            qk = torch.cat([F.rms_norm(qkv[:, :H], (d,), self.qn, self.eps),
                            F.rms_norm(qkv[:, H:H + kv], (d,), self.kn, self.eps)], 1)
        x1, x2 = qk[..., :d // 2], qk[..., d // 2:]
        rot = torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1)
        qkv_rot = torch.cat([rot, qkv[:, H + kv:]], 1)                     # [n, H+2kv, d]
        pool_l[0].index_copy_(0, m.slot, qkv_rot[:, H:H + kv])             # write new K/V
        pool_l[1].index_copy_(0, m.slot, qkv_rot[:, H + kv:])
        a = attention(qkv_rot, pool_l, m)
        hdn = hdn + a @ self.wo.t()
        x = F.rms_norm(hdn, (hdn.shape[-1],), self.n2, self.eps)
        gu = x @ self.wgu.t()
        I = gu.shape[-1] // 2
        return hdn + (F.silu(gu[:, :I]) * gu[:, I:]) @ self.wd.t()


class Model:
    """Target model: embedding, `layers` decoder layers, final norm, LM head; plus KV pool."""

    def __init__(self, cfg: dict, device, dtype=torch.bfloat16, layers: int | None = None,
                 pool_gib: float = 8.0, seed: int = 0):
        torch.manual_seed(seed)
        self.dims = dims = model_dims(cfg)
        self.device, self.dtype = device, dtype
        self.n_layers = layers or dims["layers"]
        h, V, d = dims["hidden"], dims["vocab"], dims["head_dim"]
        self.emb = torch.randn(V, h, device=device, dtype=dtype)
        self.layers = [Layer(dims, device, dtype) for _ in range(self.n_layers)]
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

    def weight_bytes(self, full_depth=True) -> int:
        L = self.dims["layers"] if full_depth else self.n_layers
        return (L * self.dims["layer_params"] + 2 * self.dims["vocab"] * self.dims["hidden"]) * 2

    def layer_pool(self, l: int, T: int):
        """This layer's KV region of T tokens: distinct per layer while the pool allows, else shared."""
        if T > self.pool_tokens:
            raise MemoryError(f"step needs {T} KV tokens per layer, pool holds {self.pool_tokens}")
        slots = max(1, self.pool_tokens // T)
        off = (l % slots) * T
        return self.pool_k[off:off + T], self.pool_v[off:off + T]

    def rope(self, m: StepMeta):
        return (self.cos_t.index_select(0, m.positions)[:, None, :],
                self.sin_t.index_select(0, m.positions)[:, None, :])

    def forward(self, m: StepMeta):
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

    def run(self, kind: str, m: StepMeta, K: int = 8):
        t = self.t
        h = t.dims["hidden"]
        n = m.n_pad
        emb = t.emb.index_select(0, m.ids)
        cos, sin = t.rope(m)
        norm = t.norm
        if kind == "mtp":       # DeepSeek-style MTP: eh_proj(concat(norm(emb), norm(hidden))) -> layer
            x = torch.cat([F.rms_norm(emb, (h,), norm), F.rms_norm(emb, (h,), norm)], -1) @ self.mtp_eh.t()
            x = self.mtp_layer(x, x, cos, sin, m, t.layer_pool(0, m.region_tokens))
            return F.rms_norm(x, (h,), norm) @ t.lm_head.t()
        if kind == "eagle3":    # EAGLE-3 head step: fc(3 target hiddens), layer on concat(emb, hidden)
            hid = torch.cat([emb, emb, emb], -1) @ self.e3_fc.t()
            x = self.e3_layer(hid, torch.cat([emb, hid], -1), cos, sin, m, t.layer_pool(0, m.region_tokens))
            return F.rms_norm(x, (h,), norm) @ self.e3_head.t()
        if kind in ("block", "dspark"):   # parallel block pass over R x K tokens
            x = emb
            for l, layer in enumerate(self.block_layers):
                x = layer(x, x, cos, sin, m, t.layer_pool(l, m.region_tokens))
            logits = F.rms_norm(x, (h,), norm) @ t.lm_head.t()
            if kind == "dspark":          # small sequential confidence head over the K positions
                R = n // K
                hs = x.view(R, K, h)
                c = torch.zeros(R, 1, device=x.device, dtype=x.dtype)
                for k in range(K):
                    z = F.silu(torch.cat([hs[:, k], c], -1) @ self.conf_w1.t())
                    c = torch.sigmoid(z @ self.conf_w2.t())
            return logits
        raise ValueError(kind)


# ---------------------------------------------------------------- timing
def time_fn(fn, reps: int = 5, graph: bool = True, pool=None, warm: int = 2):
    """Median ms of `reps` runs of fn, captured in a CUDA graph when graph=True (after one eager
    warm-up run), else eager. Returns (median_ms, all_ms)."""
    dev = torch.device("cuda")
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
    ts_sorted = sorted(ts)
    return ts_sorted[len(ts) // 2], ts


def reference_attention(qkv_rot, pool_l, m: StepMeta):
    """float64 per-request reference of `attention` (causal over [cached prefix, new tokens])."""
    pk, pv = pool_l
    H, kv, d, g = m.H, m.kv, m.d, m.g
    x = qkv_rot.double()
    out = torch.zeros(m.n_pad, H * d, dtype=torch.float64)
    starts = np.concatenate([[0], np.cumsum(m.q)]).astype(int)
    koff = 0
    for r in range(m.R_dec):
        s, c = m.q[r], m.dctx[r]
        if m.mode == "dense":
            kp, vp = pk[r * m.ctx_max: r * m.ctx_max + c], pv[r * m.ctx_max: r * m.ctx_max + c]
        else:
            kp, vp = pk[koff:koff + c], pv[koff:koff + c]
            koff += c
        rows = slice(starts[r], starts[r + 1])
        K = torch.cat([kp.double(), x[rows, H:H + kv]], 0)
        V = torch.cat([vp.double(), x[rows, H + kv:]], 0)
        out[rows] = _naive(x[rows, :H], K, V, g).reshape(s, H * d)
    for (b, c, s, st) in m.pre_regions:
        K, V = pk[b:b + c + s].double(), pv[b:b + c + s].double()
        out[st:st + s] = _naive(x[st:st + s, :H], K, V, g).reshape(s, H * d)
    return out


def _naive(q, K, V, g):
    """q [s, H, d] (pre-scaled), K/V [L, kv, d]; token t sees keys 0..L-s+t."""
    s, L = q.shape[0], K.shape[0]
    Kr, Vr = K.repeat_interleave(g, 1), V.repeat_interleave(g, 1)        # [L, H, d]
    sc = torch.einsum("thd,lhd->htl", q, Kr)
    t = torch.arange(s)[:, None]
    j = torch.arange(L)[None, :]
    sc = sc.masked_fill((j > t + L - s)[None], float("-inf"))
    return torch.einsum("htl,lhd->thd", torch.softmax(sc, -1), Vr)
