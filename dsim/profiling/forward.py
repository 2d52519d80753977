"""The target forward's cost: the forward table's sizes (``forward_sizes``), one forward of n tokens per
GPU (``forward_ms``) and the per-layer glue fitted on whole-layer measurements (``LayerGlue``).

Step of n tokens per GPU (every token priced as a decode/verify token with an LM-head row):
    F(n) = sum over ops of count x ms(op) + layers x graph gap (+ eager overhead above the
    capture limit); routed experts wait for the most loaded EP rank (dsim.profiling.pricer.priced_total).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from dsim.errors import InputError
from dsim.profiling.kernel_ops import KV_LO, layer_ops, step_ops
from dsim.profiling.models import MoEModel
from dsim.profiling.pricer import Pricer, priced_total
from dsim.profiling.topology import Topology

if TYPE_CHECKING:
    from collections.abc import Sequence


TAIL_TOKENS = (768, 1024, 1536, 2048, 4096, 8192, 16384)
# above the capture limit a step runs at its own token count and the table interpolates linearly:
# sizes every 128 tokens to 2048, 256 to 4096, 512 to 8192, 1024 to 16384 (the experts' row tiles and
# the mHC kernels change regime inside the coarse tail's gaps)
TAIL_SPACING = ((2048, 128), (4096, 256), (8192, 512), (16384, 1024))
# with the MoE in chunks, each chunk boundary b is a step in cost (a further chunk's dispatch, combine
# and expert weight reads start at b + 1, and most of its cost is paid by b + 64): sizes b, b + 1,
# b + 16, b + 64
CHUNK_OFFSETS = (0, 1, 16, 64)
GRAPH_GAP_US_PER_LAYER = 4.0  # gaps between kernels inside a CUDA graph, per layer (stated)
# above the capture limit a step runs without CUDA graphs (vLLM's dispatcher picks no graph for a batch
# above its largest capture size): what each layer adds then (stated for vLLM's compiled forward; our
# H200 shard executor, which issues about ten times a compiled layer's launches, measures 200-225 us
# per layer at 1,024-2,048 tokens per GPU, validator/gpu/moe_eager.py: an upper bound)
EAGER_US_PER_LAYER = 25.0


@dataclass(frozen=True)
class LayerGlue:
    """What a layer costs beyond the sum of its priced kernels (activation quantization, small
    norms and elementwise kernels, launch gaps): a + b x tokens per layer, fitted on whole-layer
    measurements ("layer" records of our shard executor) against the composer's own sum."""

    a_ms: float = 0.0
    b_ms_per_tok: float = 0.0
    fit: dict | None = None

    def ms(self, n: float) -> float:
        return self.a_ms + self.b_ms_per_tok * n


def composed_layer_ms(model: MoEModel, topo: Topology, hardware: str, rec: dict, pricer: Pricer) -> float:
    """The composer's sum for one decoder layer of a measured "layer" record's kind and shape."""
    kind = rec.get("attn_kind")
    # V3's layers are MLA with a dense MLP (mla_dense, the first layers) or with MoE (mla_moe)
    idx = [
        i
        for i, k in enumerate(model.attn_kinds)
        if (k == kind and kind != "mla")
        or (kind == "mla_dense" and not model.moe_layer[i])
        or (kind in ("mla", "mla_moe") and k == "mla" and model.moe_layer[i])
    ]
    if not idx:
        raise InputError(f"layer record: no layer of kind {kind!r} in {model.name}")
    q, B = int(rec["q"]), int(rec["batch"])
    phase = "prefill" if q >= 256 else "decode"
    ops = layer_ops(model, topo, hardware, B * q, phase=phase, batch=B, q=q, kv=int(rec["kv"]), layers=[idx[0]])
    ops = [o for o in ops if o.part != "comm"]
    return priced_total(model, topo, hardware, ops, pricer) + GRAPH_GAP_US_PER_LAYER * 1e-3


def fit_layer_glue(
    model: MoEModel, topo: Topology, hardware: str, pricer: Pricer, records: list[dict], source: str = ""
) -> LayerGlue:
    """Least squares a + b x tokens on the measured-minus-composed residual of every other layer
    record (even positions: fit); the odd positions are the check, reported with the fit."""
    rows = [
        r for r in records if r.get("op") == "layer" and r.get("model") == model.name and r.get("topology") == topo.name
    ]
    if len(rows) < 4:
        raise InputError(
            f"{source or 'layer records'}: {len(rows)} layer records for {model.name} {topo.name} "
            "(at least 4 needed to fit and check)"
        )
    comp = np.array([composed_layer_ms(model, topo, hardware, r, pricer) for r in rows])
    meas = np.array([float(r["ms"]) for r in rows])
    tok = np.array([float(r["batch"]) * float(r["q"]) for r in rows])
    fit_i, chk_i = np.arange(0, len(rows), 2), np.arange(1, len(rows), 2)
    A = np.stack([np.ones(len(fit_i)), tok[fit_i]], axis=1)
    (a, b), *_ = np.linalg.lstsq(A, meas[fit_i] - comp[fit_i], rcond=None)
    a, b = max(float(a), 0.0), max(float(b), 0.0)

    def err(ix: np.ndarray, with_glue: bool) -> np.ndarray:
        pred = comp[ix] + (a + b * tok[ix] if with_glue else 0.0)
        return np.abs(pred / meas[ix] - 1.0) * 100

    fit = dict(
        source=source,
        records=len(rows),
        fit_records=len(fit_i),
        check_records=len(chk_i),
        a_ms=round(a, 5),
        b_ms_per_ktok=round(b * 1000, 5),
        check_median_abs_pct_without=round(float(np.median(err(chk_i, False))), 2),
        check_median_abs_pct=round(float(np.median(err(chk_i, True))), 2),
        check_p90_abs_pct=round(float(np.percentile(err(chk_i, True), 90)), 2),
        fit_median_abs_pct=round(float(np.median(err(fit_i, True))), 2),
    )
    if np.median(err(chk_i, True)) >= np.median(err(chk_i, False)):
        # the glue does not improve the held-out records: not applied
        fit.update(applied=False, a_ms=0.0, b_ms_per_ktok=0.0)
        return LayerGlue(0.0, 0.0, fit)
    fit["applied"] = True
    return LayerGlue(a, b, fit)


def forward_ms(
    model: MoEModel,
    topo: Topology,
    hardware: str,
    n: int,
    pricer: Pricer,
    limit: int,
    *,
    kv: int = KV_LO,
    glue: LayerGlue = LayerGlue(),
    q: int = 1,
    moe_chunk: int = 0,
    eager_us: float = EAGER_US_PER_LAYER,
) -> float:
    """One target forward of n tokens, as ceil(n / q) requests of q query tokens each at kv context;
    above the capture limit each layer adds eager_us (the step runs without CUDA graphs)."""
    qq = max(1, min(int(q), int(n)))
    ops = step_ops(model, topo, hardware, n, kv=kv, q=qq, batch=-(-int(n) // qq), moe_chunk=moe_chunk)
    t = priced_total(model, topo, hardware, ops, pricer)
    t += model.layers * (GRAPH_GAP_US_PER_LAYER * 1e-3 + glue.ms(n))
    if n > limit:
        t += model.layers * eager_us * 1e-3
    return t


def forward_sizes(caps: Sequence[int], moe_chunk: int = 0) -> list[int]:
    """The forward table's sizes: vLLM's capture sizes (a step is padded to the next one), then sizes
    above the capture limit dense enough that linear interpolation follows the composed cost:
    limit + 1, TAIL_TOKENS, TAIL_SPACING's grid and, with the MoE in chunks of `moe_chunk` tokens per rank,
    CHUNK_OFFSETS around every chunk boundary (up to TAIL_TOKENS[-1])."""
    caps = [int(c) for c in caps]
    limit, top = caps[-1], TAIL_TOKENS[-1]
    # limit + 1: the first size without a CUDA graph, so the graph-less overhead is a jump at the limit
    # (vLLM runs a step above its largest capture size without graphs), not a ramp to the next tail size
    extra = set(TAIL_TOKENS) | {limit + 1}
    lo = limit
    for hi, step in TAIL_SPACING:
        extra.update(range((lo // step + 1) * step, hi + 1, step))
        lo = max(lo, hi)
    if moe_chunk > 0:
        for b in range(moe_chunk, top, moe_chunk):
            extra.update(b + j for j in CHUNK_OFFSETS)
    return caps + sorted(t for t in extra if limit < t <= top)
