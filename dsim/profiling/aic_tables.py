"""Kernel tables read from NVIDIA AIConfigurator's silicon data, in dsim's kernel-op record format.

AIConfigurator (``aiconfigurator-core`` on PyPI, Apache-2.0, pinned here at 0.12.0) ships per-system
performance tables measured on real GPUs with real engines (vLLM 0.24.0, SGLang 0.5.14, TRT-LLM): GEMMs, fused
MoE, attention modules, DeepSeek-V4 attention / mHC modules, all-reduce, NCCL and DeepEP all-to-all. This module
reads those tables as data and prices dsim's kernel-op records (the producer side of the composer's interface)
for hardware we cannot measure (B300) and for the H200 (to compare with our own measurements).

Commands (``dsim profile aic ...``):
  grid     op records for a model and topology on a fixed grid (used until the composer lists its own)
  price    price op records from one system's tables -> a kernel table JSON
  build    grid + price for every shipped model and topology -> one kernel table per system
  compare  ratio table (b)/(a) of two kernel tables, op by op and shape by shape (needs no AIC)
  anchors  AIC's own end-to-end step estimates for the public anchor points

Only ``compare`` runs without the optional extra (``pip install 'dsim[aic]'``); shipped tables need no extra.

What each AIC table measures (read from the AIC collectors for vLLM 0.24.0; this decides how records
are priced and what the composer may add on top):
  gemm       one linear layer forward; bf16 / fp8 (per-tensor) / nvfp4 under CUDA-graph replay. vLLM 0.24's
             fp8_block (DeepSeek FP8 recipe) rows are timed EAGER (host launch + activation quantization,
             a ~0.18 ms floor on B300), so fp8 records are priced from SGLang 0.5.14's fp8_block table
             (DeepGEMM, CUDA graphs) and say so.
  moe        the routed-expert FusedMoE forward on one EP rank given the routing logits of all T tokens
             (gate+up, activation, down; no router, no shared expert, no communication); CUDA graphs;
             routing "balanced" = every token picks k experts at a fixed stride (uniform load).
  dsv4 attn  vLLM's whole DeepseekV4Attention forward on one rank (TP simulated, collectives removed):
             q/kv low-rank projections, norms inside the block, RoPE, KV compressor, lightning indexer with
             top-k (CSA), FlashMLA sparse attention, KV-cache writes, grouped o projection; CUDA graphs.
             It INCLUDES the q/kv/o projection GEMMs (record field "includes"); it excludes the pre-attention
             RMSNorm, mHC and the TP all-reduce. Sliding-window-only layers have no table: AIC prices them
             as HCA layers, and so does this module (flagged in the record).
  mla        vLLM's whole DeepseekV2MLAAttention forward (fused q_a/kv_a, q_b, absorbed kv_b, MLA kernel,
             o projection), one rank, CUDA graphs; also includes the projections.
  mhc        the DeepSeek-V4 tilelang mHC pre or post kernels at both sites of one layer (before attention
             and before the MoE); a record costs pre + post.
  all_reduce vLLM custom all-reduce, CUDA-graph replay; all_gather / reduce_scatter: nccl-tests 2.29.2;
  a2a        DeepEP low-latency (decode) or high-throughput (prefill) dispatch / combine, one node.
"""

from __future__ import annotations

if __name__ == "__main__":  # a Ctrl-C while the modules below load: quiet exit 130
    from dsim.cli.toolmain import startup_guard

    startup_guard("dsim profile aic")

import argparse
import datetime as _dt
import gzip
import json
import math
import statistics
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from dsim.errors import InputError
from dsim.profiling.models import infer_model

AIC_PACKAGE = "aiconfigurator-core"
AIC_VERSION = "0.12.0"
FALLBACK_BACKEND = ("sglang", "0.5.14")
# every AIC 0.12.0 system with per-kernel tables (systems/data/<system>/gemm/<backend>/<version>), AIC name ->
# the hardware's name; A30, A100 PCIe, H100 PCIe and L4 ship no kernel tables
SYSTEMS = {
    "a100_sxm": "NVIDIA A100 SXM",
    "b200_sxm": "NVIDIA B200 SXM",
    "b300_sxm": "NVIDIA B300 SXM",
    "b60": "Intel Arc Pro B60",
    "gb200": "NVIDIA GB200",
    "gb300": "NVIDIA GB300",
    "h100_sxm": "NVIDIA H100 SXM",
    "h200_sxm": "NVIDIA H200 SXM",
    "l40s": "NVIDIA L40S",
    "rtx_pro_6000_server": "NVIDIA RTX PRO 6000 Blackwell Server Edition",
}
# AIC system -> dsim.profiling.kernel_tables.HARDWARE key (its datasheet: the roofline fallback, the composer's --hardware)
DATASHEET = {
    "h100_sxm": "h100",
    "h200_sxm": "h200",
    "b200_sxm": "b200",
    "b300_sxm": "b300",
    "gb200": "gb200",
    "gb300": "gb300",
}
SYSTEM_OF = {hw: system for system, hw in DATASHEET.items()}  # dsim hardware -> AIC system
# serving engines whose kernels AIC measured (its directory names), with the name users know them by
BACKENDS = {"vllm": "vLLM", "sglang": "SGLang", "trtllm": "TensorRT-LLM"}


def _version_key(v: str) -> tuple:
    """A version's sort key: '0.5.6.post2' < '0.5.14'; '1.3.0rc20' < '1.3.0rc23' < '1.3.0'; '2-29-2' as '2.29.2'."""
    import re

    parts = []
    for x in re.split(r"[.-]", v):
        m = re.fullmatch(r"(\d+)(?:(rc|post)(\d+))?", x)
        if m is None:
            parts.append((0, 0, 0))
            continue
        tag = {"rc": -1, None: 0, "post": 1}[m.group(2)]
        parts.append((int(m.group(1)), tag, int(m.group(3) or 0)))
    return tuple(parts)


def backend_versions(system: str, backend: str) -> list[str]:
    """The versions of ``backend`` whose GEMM tables AIC ships for ``system``, oldest first (needs AIC)."""
    d = aic_root() / "systems" / "data" / system / "gemm" / backend
    return sorted((x.name for x in d.iterdir() if x.is_dir()), key=_version_key) if d.is_dir() else []


def default_version(system: str, backend: str) -> str:
    """The newest version of ``backend`` with tables for ``system``: an input error naming what there is
    where there is none."""
    if system not in SYSTEMS:
        raise InputError(f"--system: {system!r} is not one of {', '.join(SYSTEMS)} (AIC's systems with kernel tables)")
    if backend not in BACKENDS:
        raise InputError(f"--backend: {backend!r} is not one of {', '.join(BACKENDS)}")
    have = backend_versions(system, backend)
    if not have:
        others = [b for b in BACKENDS if backend_versions(system, b)]
        raise InputError(f"--backend {backend}: AIC has no {backend} tables for {system} (it has {', '.join(others)})")
    return have[-1]


# dsim model name -> (AIC model config file stem, name used in AIC's DeepSeek-V4 attention tables)
MODELS = {
    "deepseek-v4-flash": ("deepseek-ai--DeepSeek-V4-Flash", "DeepSeek-V4-Flash"),
    "deepseek-v4-pro": ("deepseek-ai--DeepSeek-V4-Pro", "DeepSeek-V4-Pro"),
    "deepseek-v3": ("deepseek-ai--DeepSeek-V3", "DeepSeek-V3"),
}
TOPOLOGIES = ("dp8-ep8", "tp8-ep8")

# record dtype -> AIC quant mode
GEMM_MODES = {"bf16": "bfloat16", "fp8": "fp8_block", "fp4": "nvfp4"}
MOE_MODES = {
    "bf16": ("bfloat16",),
    "fp8": ("fp8_block",),
    # MXFP4 weights / MXFP8 activations is the released DeepSeek-V4 expert format; NVFP4 otherwise
    "fp4": ("w4a8_mxfp4_mxfp8", "nvfp4"),
    "w4a16": ("w4a16_mxfp4", "w4a16_nvfp4"),
}
# what AIC's attention modules include beyond the attention core, in the composer's part names (dsim.profiling.compose
# layer_ops): the composer does not price these parts again when a table's attention records include them
ATTN_INCLUDES = ["q_proj", "kv_proj", "o_proj", "compressor", "indexer_proj"]
MLA_INCLUDES = ["q_proj", "kv_proj", "mla_absorb", "o_proj"]
# bytes per token of the composer's a2a records: FP8 dispatch, BF16 combine
A2A_BYTES_PER_ELEMENT = {"a2a_dispatch": 1, "a2a_combine": 2}

# the fallback grid (KERNEL_OPS.md) until the composer lists its records
GRID_TOKENS = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048, 4096, 8192, 16384)
GRID_BATCH = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
GRID_Q_DECODE = (1, 2, 4, 6, 8)
GRID_Q_PREFILL = (256, 1024, 2048, 8192)
GRID_BATCH_PREFILL = (1, 2, 4)
GRID_KV = (512, 2048, 8192, 32768, 131072)

# fields that identify a record's shape (everything else is the price or its annotations)
KEY_FIELDS = {
    "gemm": ("dtype", "m", "n", "k", "groups"),
    "moe": ("dtype", "tokens", "hidden", "inter", "topk", "experts", "ep", "distribution"),
    "attn": ("kind", "phase", "batch", "q", "kv", "heads", "model"),
    "mhc": ("tokens", "hidden", "hc_mult"),
    "comm": ("kind", "gpus", "bytes", "scope", "hidden", "topk", "experts"),
    "elementwise": ("bytes",),
    "layer": ("model", "topology", "tokens", "batch", "q", "kv"),
}
KEY_DEFAULTS = {"distribution": "uniform", "scope": "intra_node", "groups": 1}


# ---- the optional dependency ---------------------------------------------------------------------------------


def _aic():
    """Import aiconfigurator-core lazily; a missing or different version is an input error."""
    try:
        from importlib.metadata import version

        import aiconfigurator_core
    except ImportError:
        raise InputError(f"{AIC_PACKAGE}=={AIC_VERSION} is not installed (pip install 'dsim[aic]')") from None
    got = version(AIC_PACKAGE)
    if got != AIC_VERSION:
        raise InputError(f"{AIC_PACKAGE}: version {got} installed, tables are pinned to {AIC_VERSION}")
    return aiconfigurator_core


def aic_root() -> Path:
    return Path(_aic().__file__).parent


# ---- interpolation over a measured grid ----------------------------------------------------------------------


@dataclass
class GridTable:
    """Latency over measured points in log-space axes: linear inside the convex hull, clamped outside.

    Axes are log2(x) (or log2(1 + x) for context lengths that may be 0). A query outside the measured range on
    an axis is clamped to that range; the record then carries "clamped" with the axis names."""

    names: tuple[str, ...]
    points: np.ndarray  # [n, d] raw axis values
    ms: np.ndarray  # [n]
    plus_one: tuple[bool, ...]  # axis uses log2(1 + x)
    _lin: Any = None
    _near: Any = None

    def _tx(self, x: np.ndarray) -> np.ndarray:
        out = np.empty_like(x, dtype=float)
        for j, p1 in enumerate(self.plus_one):
            out[..., j] = np.log2(x[..., j] + (1.0 if p1 else 0.0))
        return out

    def __call__(self, query: Iterable[float]) -> tuple[float, list[str]]:
        q = np.asarray(list(query), dtype=float)
        lo, hi = self.points.min(axis=0), self.points.max(axis=0)
        clamped = [self.names[j] for j in range(len(q)) if q[j] < lo[j] or q[j] > hi[j]]
        q = np.clip(q, lo, hi)
        x = self._tx(self.points)
        live = [j for j in range(x.shape[1]) if np.ptp(x[:, j]) > 0]
        xq = self._tx(q[None, :])[:, live]
        x = x[:, live]
        if len(live) == 0:
            return float(self.ms.mean()), clamped
        if len(live) == 1:
            order = np.argsort(x[:, 0])
            return float(np.interp(xq[0, 0], x[order, 0], self.ms[order])), clamped
        from scipy.interpolate import LinearNDInterpolator, NearestNDInterpolator

        if self._lin is None:
            self._lin = LinearNDInterpolator(x, self.ms)
            self._near = NearestNDInterpolator(x, self.ms)
        v = float(self._lin(xq)[0])
        if not math.isfinite(v):  # inside the box but outside the hull (a corner not measured, e.g. OOM)
            v = float(self._near(xq)[0])
            clamped.append("hull")
        return v, clamped


# ---- pricing ------------------------------------------------------------------------------------------------


@dataclass
class Priced:
    ms: float
    backend: str
    tables: list[str]
    extra: dict = field(default_factory=dict)


class AicTables:
    """One system's AIC tables, primary engine backend plus the SGLang fallback."""

    def __init__(self, system: str, backend: str = "vllm", version: str | None = None):
        version = version or default_version(system, backend)
        if system not in SYSTEMS:
            raise InputError(f"--system: {system!r} is not one of {', '.join(SYSTEMS)}")
        self.system, self.backend, self.version = system, backend, version
        self.data = aic_root() / "systems" / "data" / system
        if not (self.data / "gemm" / backend / version).is_dir():
            raise InputError(f"--backend/--version: no {backend} {version} tables for {system}")
        self._frames: dict[str, Any] = {}
        self._dbs: dict[tuple[str, str], Any] = {}
        self._grids: dict[tuple, GridTable] = {}
        self.files_read: set[str] = set()
        self.model: str | None = None  # the model of the records being priced (attention, a2a shapes)

    # -- raw access
    def rel(self, family: str, backend: str, version: str, name: str) -> str:
        return f"{self.system}/{family}/{backend}/{version}/{name}"

    def frame(self, family: str, backend: str, version: str, name: str) -> Any:
        import pandas as pd

        rel = self.rel(family, backend, version, name)
        if rel not in self._frames:
            path = self.data / family / backend / version / name
            self._frames[rel] = pd.read_parquet(path) if path.is_file() else None
        return self._frames[rel]

    def db(self, backend: str, version: str) -> Any:
        key = (backend, version)
        if key not in self._dbs:
            _aic()
            from aiconfigurator_core.sdk.perf_database import get_database

            self._dbs[key] = get_database(self.system, backend, version)
        return self._dbs[key]

    def candidates(self) -> list[tuple[str, str]]:
        """The backend asked for, then SGLang 0.5.14's tables where this system has them."""
        own = (self.backend, self.version)
        fb = FALLBACK_BACKEND
        has_fb = (self.data / "gemm" / fb[0] / fb[1]).is_dir()
        return [own] + ([fb] if has_fb and fb != own else [])

    def label(self, backend: str, version: str) -> str:
        return f"{backend} {version}"

    def _read(self, rel: str) -> None:
        self.files_read.add(rel)

    # -- ops
    def gemm(self, r: dict) -> Priced:
        import aiconfigurator_core.sdk.operations as ops
        from aiconfigurator_core.sdk import common

        mode = _lookup(GEMM_MODES, r, "dtype")
        m, n, k = _ints(r, "m", "n", "k")
        extra: dict = {"quant_mode": mode}
        g = int(r.get("groups", 1))
        if g > 1:
            # AIC has no batched-GEMM table: the single GEMM of the same FLOPs, weight and activation
            # bytes in one launch ([m, g x k] x [g x k, n])
            k *= g
            extra["grouped"] = f"{g} products priced as one GEMM of k = {k}"
        cands = self.candidates()
        if mode == "fp8_block" and self.backend == "vllm" and len(cands) > 1:
            # vLLM 0.24.0's fp8_block GEMM rows were collected without CUDA graphs (host floor in every row)
            cands = cands[1:]
            extra["note"] = (
                "vllm 0.24.0 fp8_block gemm rows are eager (collector disables CUDA graphs for "
                "fp8_block); priced from sglang's DeepGEMM fp8_block table"
            )
        for b, v in cands:
            df = self.frame("gemm", b, v, "gemm_perf.parquet")
            if df is None or not (df.gemm_dtype == mode).any():
                continue
            self._read(self.rel("gemm", b, v, "gemm_perf.parquet"))
            op = ops.GEMM("gemm", 1, n, k, common.GEMMQuantMode[mode])
            ms = float(op._engine_query(self.db(b, v), x=m))
            return Priced(ms, self.label(b, v), [self.rel("gemm", b, v, "gemm_perf.parquet")], extra)
        raise _NoTable(f"no {mode} gemm table")

    def moe(self, r: dict) -> Priced:
        """The routed experts of one EP rank from AIC's moe table, guarded (moe_guard): where the table is
        read past its measured tokens, or prices a rank above the same routed rows per GPU at EP
        MOE_REF_EP, the price falls back in the order of MOE_GUARD_ORDER and the record says so."""
        modes = _lookup(MOE_MODES, r, "dtype")
        t, h, inter, topk, e, ep = _ints(r, "tokens", "hidden", "inter", "topk", "experts", "ep")
        dist = r.get("distribution", "uniform")
        table_dist = "balanced" if dist == "uniform" else dist
        p, lo, hi = self._moe_table(t, h, inter, topk, e, ep, modes, table_dist)
        guard = moe_guard(self, r, p.ms, (lo, hi), modes, table_dist)
        if guard is not None:
            p.extra["guard"] = guard
            return Priced(guard["ms"], p.backend, p.tables, p.extra)
        return p

    def _moe_table(
        self, t: int, h: int, inter: int, topk: int, e: int, ep: int, modes: tuple, table_dist: str
    ) -> tuple[Priced, int, int]:
        """AIC's price of the moe op at t tokens (all ranks' tokens, as its collector routes them) and
        EP ep, with the token range its rows measured at that EP."""
        import aiconfigurator_core.sdk.operations as ops
        from aiconfigurator_core.sdk import common

        for b, v in self.candidates():
            df = self.frame("moe", b, v, "moe_perf.parquet")
            if df is None:
                continue
            sel = df[
                (df.hidden_size == h)
                & (df.inter_size == inter)
                & (df.topk == topk)
                & (df.num_experts == e)
                & (df.moe_ep_size == ep)
                & (df.moe_tp_size == 1)
                & (df.distribution == table_dist)
            ]
            for mode in modes:
                if not (sel.moe_dtype == mode).any():
                    continue
                self._read(self.rel("moe", b, v, "moe_perf.parquet"))
                op = ops.MoE("moe", 1, h, inter, topk, e, 1, ep, common.MoEQuantMode[mode], table_dist, 1)
                ms = float(op._engine_query(self.db(b, v), x=t))
                rows = sel[sel.moe_dtype == mode]
                ks = sorted(set(rows.kernel_source))
                priced = Priced(
                    ms,
                    self.label(b, v),
                    [self.rel("moe", b, v, "moe_perf.parquet")],
                    {"quant_mode": mode, "routing": table_dist, "kernel": ks[0]},
                )
                return priced, int(rows.num_tokens.min()), int(rows.num_tokens.max())
        raise _NoTable(
            f"no moe table for hidden {h} inter {inter} top-{topk} of {e} experts at ep {ep}, "
            f"{'/'.join(modes)}, {table_dist}"
        )

    def attn(self, r: dict) -> Priced:
        kind = r.get("kind")
        if kind == "mla":
            return self._mla(r)
        if kind not in ("v4_csa", "v4_hca", "v4_swa"):
            raise InputError(f"attn record: kind {kind!r} is not v4_csa, v4_hca, v4_swa or mla")
        model = r.get("model") or self.model or infer_model(kind, int(r.get("heads", 0)))
        if model not in ("deepseek-v4-flash", "deepseek-v4-pro"):
            raise InputError(
                f"attn record {kind} with {r.get('heads')} heads: needs --model deepseek-v4-flash or "
                f"deepseek-v4-pro (the table includes the model's projections), got {model!r}"
            )
        tag = MODELS[model][1]
        b_, q, kv, heads = _ints(r, "batch", "q", "kv", "heads")
        phase = r.get("phase", "decode")
        family = "csa" if kind == "v4_csa" else "hca"
        decode_table = phase == "decode" and q == 1
        name = f"dsv4_{family}_{'generation' if decode_table else 'context'}_module_perf.parquet"
        for b, v in self.candidates():
            df = self.frame("sparse_attention", b, v, name)
            if df is None:
                continue
            sel = df[df.model.str.contains(tag) & (df.num_heads == heads)]
            if sel.empty:
                continue
            rel = self.rel("sparse_attention", b, v, name)
            self._read(rel)
            if decode_table:
                grid = self._grid((rel, tag, heads), sel, ("batch", "kv"), ("batch_size", "step"), (False, True))
                ms, clamped = grid((b_, kv))
            else:
                grid = self._grid(
                    (rel, tag, heads), sel, ("batch", "q", "kv"), ("batch_size", "isl", "step"), (False, False, True)
                )
                ms, clamped = grid((b_, q, kv))
            extra: dict = {
                "includes": ATTN_INCLUDES,
                "rows of": min(set(sel.model)),
                "kernel": min(set(sel.kernel_source)),
            }
            if kind == "v4_swa":
                extra["note"] = "no sliding-window-only table: priced as an HCA layer (AIC's own approximation)"
            if phase == "decode" and q > 1:
                extra["note"] = (extra.get("note", "") + "; " if "note" in extra else "") + (
                    "q > 1 priced from the context-module table (q new tokens after kv cached ones)"
                )
            if clamped:
                extra["clamped"] = clamped
            return Priced(ms, self.label(b, v), [rel], extra)
        raise _NoTable(f"no {name} rows for {tag} with {heads} heads per GPU")

    def _mla(self, r: dict) -> Priced:
        b_, q, kv, heads = _ints(r, "batch", "q", "kv", "heads")
        phase = r.get("phase", "decode")
        name = "mla_generation_module_perf.parquet" if phase == "decode" else "mla_context_module_perf.parquet"
        for b, v in self.candidates():
            df = self.frame("mla", b, v, name)
            if df is None:
                continue
            sel = df[(df.num_heads == heads) & (df.gemm_type == "fp8_block")]
            if sel.empty:
                continue
            # the slice (kernel, KV dtype) whose rows reach the query on the main axis; among those FP8 KV and
            # the kernel vLLM picks by default first (the slices cover different ranges: on the H200 the
            # FLASHMLA context rows stop at 128 tokens, FLASH_ATTN's prefill rows reach 32768)
            axis, need = ("step", kv) if phase == "decode" else ("isl", q + kv)
            pref = ("FLASHMLA", "FLASHINFER_MLA", "FLASH_ATTN_MLA", "FLASH_ATTN")
            slices = sorted(
                {(k, d) for k, d in zip(sel.kernel_source, sel.kv_cache_dtype)},
                key=lambda kd: (kd[1] != "fp8", pref.index(kd[0]) if kd[0] in pref else len(pref)),
            )
            reach = {kd: sel[(sel.kernel_source == kd[0]) & (sel.kv_cache_dtype == kd[1])][axis].max() for kd in slices}
            kernel, kv_dtype = next((kd for kd in slices if reach[kd] >= need), max(slices, key=lambda kd: reach[kd]))
            sel = sel[(sel.kernel_source == kernel) & (sel.kv_cache_dtype == kv_dtype)]
            rel = self.rel("mla", b, v, name)
            self._read(rel)
            extra: dict = {"includes": MLA_INCLUDES, "kv_cache_dtype": kv_dtype, "kernel": kernel}
            if phase == "decode":
                grid = self._grid(
                    (rel, kernel, kv_dtype, heads), sel, ("batch", "kv"), ("batch_size", "step"), (False, True)
                )
                ms, clamped = grid((b_ * q, kv))
                if q > 1:
                    extra["note"] = (
                        "no multi-token MLA decode table: q > 1 priced as batch x q single-token "
                        "decodes over the whole context (AIC's convention; over-counts KV reads)"
                    )
            else:
                grid = self._grid(
                    (rel, kernel, kv_dtype, heads), sel, ("batch", "q"), ("batch_size", "isl"), (False, False)
                )
                ms, clamped = grid((b_, q))
                if kv > 0:
                    # no cached-prefix axis in the table: add the prefix's causal pairs q x kv at the per-pair
                    # cost fitted on the slice's one-request rows (latency = a + b x isl + c x isl^2 / 2)
                    one = sel[sel.batch_size == 1].groupby("isl")["latency"].median()
                    x = one.index.to_numpy(dtype=float)
                    c_pair = float(
                        np.linalg.lstsq(
                            np.stack([np.ones_like(x), x, x * x / 2], axis=1), one.to_numpy(dtype=float), rcond=None
                        )[0][2]
                    )
                    ms += b_ * max(c_pair, 0.0) * q * kv
                    extra["note"] = (
                        f"cached prefix: + batch x q x kv x {max(c_pair, 0.0):.3e} ms per pair "
                        "(fitted on the prefix-free context rows)"
                    )
            if clamped:
                extra["clamped"] = clamped
            return Priced(ms, self.label(b, v), [rel], extra)
        raise _NoTable(f"no {name} rows with {heads} heads per GPU")

    def mhc(self, r: dict) -> Priced:
        t, h, hc = _ints(r, "tokens", "hidden", "hc_mult")
        name = "mhc_module_perf.parquet"
        for b, v in self.candidates():
            df = self.frame("mhc", b, v, name)
            if df is None:
                continue
            sel = df[(df.hidden_size == h) & (df.hc_mult == hc)]
            if set(sel.op_name) != {"pre", "post"}:
                continue
            rel = self.rel("mhc", b, v, name)
            self._read(rel)
            total, clamped = 0.0, []
            for site_op in ("pre", "post"):
                part = sel[sel.op_name == site_op]
                ms, c = self._grid((rel, h, hc, site_op), part, ("tokens",), ("num_tokens",), (False,))((t,))
                total += ms
                clamped += [f"{site_op}:{x}" for x in c]
            extra: dict = {"note": "mHC pre + post kernels at both sites of the layer"}
            if clamped:
                extra["clamped"] = clamped
            return Priced(total, self.label(b, v), [rel], extra)
        raise _NoTable(f"no mhc rows for hidden {h}, hc_mult {hc}")

    def comm(self, r: dict) -> Priced:
        kind = r.get("kind")
        g, nbytes = _ints(r, "gpus", "bytes")
        if r.get("scope", "intra_node") != "intra_node":
            raise _NoTable("only single-node communication tables are read")
        if kind == "all_reduce":
            for b, v in self.candidates():
                name = "custom_allreduce_perf.parquet"
                df = self.frame("comm", b, v, name)
                if df is None:
                    continue
                sel = df[(df.num_gpus == g) & (df.allreduce_dtype == "bfloat16")]
                graph = sel[sel.kernel_source.str.contains("graph")]
                sel = graph if not graph.empty else sel
                if sel.empty:
                    continue
                rel = self.rel("comm", b, v, name)
                self._read(rel)
                ms, clamped = self._grid((rel, g, "ar"), sel, ("elements",), ("message_size",), (False,))((nbytes / 2,))
                extra = {"kernel": min(set(sel.kernel_source)), "dtype": "bf16"}
                if clamped:
                    extra["clamped"] = clamped
                return Priced(ms, self.label(b, v), [rel], extra)
            raise _NoTable(f"no custom all-reduce table for {g} GPUs")
        if kind in ("all_gather", "reduce_scatter"):
            nccl_dir = self.data / "comm" / "nccl"
            versions = (
                sorted((p.name for p in nccl_dir.iterdir() if (p / "nccl_perf.parquet").is_file()), key=_version_key)
                if nccl_dir.is_dir()
                else []
            )
            if not versions:
                raise _NoTable("no nccl table")
            v = versions[-1]
            df = self.frame("comm", "nccl", v, "nccl_perf.parquet")
            sel = df[(df.op_name == kind) & (df.num_gpus == g) & (df.nccl_dtype == "half")]
            if sel.empty:
                raise _NoTable(f"no nccl {kind} rows for {g} GPUs")
            rel = self.rel("comm", "nccl", v, "nccl_perf.parquet")
            self._read(rel)
            ms, clamped = self._grid((rel, kind, g), sel, ("elements",), ("message_size",), (False,))((nbytes / 2,))
            extra = {
                "kernel": f"nccl {v} (nccl-tests)",
                "dtype": "bf16",
                "bytes_meaning": "nccl-tests size: the gathered (all_gather) / input (reduce_scatter) buffer",
            }
            if clamped:
                extra["clamped"] = clamped
            return Priced(ms, f"nccl {v}", [rel], extra)
        if kind in ("a2a_dispatch", "a2a_combine"):
            return self._a2a(r, kind, g, nbytes)
        raise InputError(
            f"comm record: kind {kind!r} is not all_reduce, all_gather, reduce_scatter, a2a_dispatch or a2a_combine"
        )

    def _a2a(self, r: dict, kind: str, g: int, nbytes: int) -> Priced:
        if all(k in r for k in ("hidden", "topk", "experts")):
            h, topk, e = _ints(r, "hidden", "topk", "experts")
        elif self.model is not None:
            c = model_config(self.model)
            h, topk, e = c["hidden_size"], c["num_experts_per_tok"], c["n_routed_experts"]
        else:
            raise InputError(f"{kind} record: needs hidden/topk/experts or --model (the DeepEP table is per shape)")
        phase = "dispatch" if kind == "a2a_dispatch" else "combine"
        # tokens per rank: from the record, else from bytes (the composer's FP8 dispatch / BF16 combine)
        tokens = int(r["tokens"]) if "tokens" in r else max(1, round(nbytes / (h * A2A_BYTES_PER_ELEMENT[kind])))
        mode = r.get("a2a_backend") or ("deepep_ll" if tokens <= 256 else "deepep_ht")
        for b, v in self.candidates():
            name = "moe_a2a_perf.parquet"
            df = self.frame("comm", b, v, name)
            if df is None:
                continue
            sel = df[
                (df.ep_size == g)
                & (df.hidden_size == h)
                & (df.topk == topk)
                & (df.num_experts == e)
                & (df.comm_backend == mode)
                & (df.phase == phase)
                & (df.node_num == 1)
            ]
            if sel.empty:
                continue
            rel = self.rel("comm", b, v, name)
            self._read(rel)
            us, clamped = self._grid((rel, g, h, topk, e, mode, phase), sel, ("tokens",), ("num_tokens",), (False,))(
                (tokens,)
            )
            extra = {"kernel": mode, "tokens per rank": tokens, "shape": f"hidden {h} top-{topk} of {e}"}
            if clamped:
                extra["clamped"] = clamped
            return Priced(us / 1000.0, self.label(b, v), [rel], extra)  # the a2a table is in microseconds
        raise _NoTable(f"no DeepEP {mode} {phase} table for ep {g}, hidden {h}, top-{topk} of {e}")

    def _grid(self, key: tuple, sel, names: tuple, cols: tuple, plus_one: tuple) -> GridTable:
        if key not in self._grids:
            agg = sel.groupby(list(cols), as_index=False)["latency"].median()
            self._grids[key] = GridTable(
                names, agg[list(cols)].to_numpy(dtype=float), agg["latency"].to_numpy(dtype=float), plus_one
            )
        return self._grids[key]

    def price(self, r: dict) -> Priced:
        op = str(r.get("op"))
        fn = {"gemm": self.gemm, "moe": self.moe, "attn": self.attn, "mhc": self.mhc, "comm": self.comm}.get(op)
        if fn is None:
            raise _NoTable(f"AIC has no table for op {op!r}")
        return fn(r)


class _NoTable(Exception):
    """The tables hold nothing for this record (it goes to "unpriced", with the reason)."""


# ---- guarding the tables ---------------------------------------------------------------------------------------
# AIC's moe rows time one GPU given the routing of ALL T tokens (its collector's single-GPU simulation of EP):
# past one node their cost follows the global tokens, not the rank's rows. On the H200's vLLM table
# (DeepSeek-V3's experts, fp8) EP64 at 16,384 tokens costs 9.43 ms against EP8's 12.06 ms at the same
# tokens, though the EP64 rank holds 8x fewer experts and receives 8x fewer rows, and 5.7x EP8's 1.67 ms
# for the same 2,048 rows per GPU (2,048 tokens at EP8). A rank holding fewer experts with the same rows
# cannot cost more, so the same rows per GPU at EP MOE_REF_EP bound it.
MOE_REF_EP = 8  # one node: the EP at which AIC's rows and a deployment's per-rank work agree
MOE_GUARD_RATIO = 1.25  # a table price this far above the same rows per GPU at MOE_REF_EP is implausible
MOE_GUARD_ORDER = (
    "1. AIC's moe table, where the tokens are inside its measured range and the price is at most "
    f"{MOE_GUARD_RATIO:g}x the same routed rows per GPU at EP {MOE_REF_EP} (AIC's table at tokens x "
    f"{MOE_REF_EP} / EP); 2. the per-GPU re-pricing: the rank's own experts as gate+up and down GEMMs at "
    "their rows (tokens x top-k / experts each) from AIC's GEMM table, plus their SwiGLU, routing-weight and "
    "permute traffic at the roofline (no routing of other ranks' tokens); "
    f"3. the same rows per GPU at EP {MOE_REF_EP}, an upper bound (that rank reads more experts' weights); "
    "4. the roofline of the record on the system's datasheet (dsim.profiling.kernel_tables.Roofline); 5. AIC's own "
    "extrapolation, flagged. Read past its measured tokens but not above the bound, the table's "
    "extrapolation (linear in tokens) is kept and flagged"
)


def moe_as_gemms(tables: AicTables, rec: dict) -> float | None:
    """The routed experts of one EP rank priced per GPU, without the global routing AIC's moe rows
    carry: its E / ep experts, each a gate+up GEMM [rows, hidden] x [hidden, 2 inter] and a down
    GEMM [rows, inter] x [inter, hidden] at rows = tokens x top-k / experts (uniform routing; the
    composer's lockstep factor adds the slowest rank's excess), from the GEMM table, plus their
    SwiGLU, routing-weight and permute traffic at the roofline (as compose.Pricer prices a one-expert
    rank). None where a GEMM has no row or the system no datasheet."""
    from dsim.profiling.kernel_tables import Roofline

    t, h, inter, topk, e, ep = _ints(rec, "tokens", "hidden", "inter", "topk", "experts", "ep")
    hw = DATASHEET.get(tables.system)
    if hw is None or ep == 0 or e % ep:
        return None
    local, rows = e // ep, max(1, round(t * topk / e))
    try:
        g = sum(tables.gemm(dict(dtype=rec["dtype"], m=rows, n=n_, k=k_)).ms for n_, k_ in ((2 * inter, h), (h, inter)))
    except (_NoTable, InputError):
        return None
    ew = dict(op="elementwise", bytes=int(local * rows * (2 * inter * 2 + inter * 2 + 4 * h * 2)))
    return local * g + Roofline(hardware=hw).ms(ew)


def moe_guard(
    tables: AicTables, rec: dict, ms: float, measured: tuple[int, int], modes: tuple, table_dist: str
) -> dict | None:
    """None where AIC's price of a moe record is read inside its measured tokens and is not above
    MOE_GUARD_RATIO x the same routed rows per GPU at EP MOE_REF_EP; else what was found, the
    fallback prices and the one used (MOE_GUARD_ORDER): {"reasons", "table_ms", "per_gpu_ms",
    "bound_ms", "roofline_ms", "used", "ms"}."""
    t, h, inter, topk, e, ep = _ints(rec, "tokens", "hidden", "inter", "topk", "experts", "ep")
    lo, hi = measured
    reasons = []
    if not lo <= t <= hi:
        reasons.append(f"{t} tokens outside the {lo}-{hi} AIC measured at ep {ep}")
    bound = None  # (ms, inside its measured range)
    if ep > MOE_REF_EP:
        t_ref = max(1, round(t * MOE_REF_EP / ep))
        try:
            ref_p, rlo, rhi = tables._moe_table(t_ref, h, inter, topk, e, MOE_REF_EP, modes, table_dist)
            bound = (ref_p.ms, rlo <= t_ref <= rhi)
        except _NoTable:
            bound = None
        if bound is not None and ms > MOE_GUARD_RATIO * bound[0]:
            reasons.append(
                f"{ms:.3f} ms is {ms / bound[0]:.1f}x the same {t * topk // ep} routed rows per GPU at ep "
                f"{MOE_REF_EP} ({t_ref} tokens: {bound[0]:.3f} ms)"
            )
    if not reasons:
        return None
    from dsim.profiling.kernel_tables import Roofline

    hw = DATASHEET.get(tables.system)
    roof = Roofline(hardware=hw).ms(rec) if hw else None
    per_gpu = moe_as_gemms(tables, rec)
    if not (bound is not None and ms > MOE_GUARD_RATIO * bound[0]):  # read past its tokens, plausibly
        used, v = "table (extrapolated past the measured tokens, linear in tokens)", ms
    elif per_gpu is not None:
        used, v = "per-GPU re-pricing (the rank's experts from the GEMM table)", per_gpu
    elif bound[1]:
        used, v = f"same rows per GPU at ep {MOE_REF_EP} (an upper bound)", bound[0]
    elif roof is not None:
        used, v = f"roofline ({hw} datasheet)", roof
    else:
        used, v = "table (extrapolated; no fallback)", ms
    return dict(
        reasons=reasons,
        table_ms=round(ms, 6),
        per_gpu_ms=round(per_gpu, 6) if per_gpu is not None else None,
        bound_ms=round(bound[0], 6) if bound else None,
        roofline_ms=round(roof, 6) if roof is not None else None,
        used=used,
        ms=round(v, 6),
    )


def _lookup(table: dict, r: dict, key: str):
    if r.get(key) not in table:
        raise InputError(f"{r.get('op')} record: {key} {r.get(key)!r} is not one of {', '.join(table)}")
    return table[r[key]]


def _ints(r: dict, *keys: str) -> list[int]:
    out = []
    for k in keys:
        v = r.get(k)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0 or int(v) != v:
            raise InputError(f"{r.get('op')} record: {k} must be a non-negative integer, got {v!r}")
        out.append(int(v))
    return out


def price_records(
    records: list[dict],
    system: str,
    backend: str = "vllm",
    version: str | None = None,
    model: str | None = None,
    tables: AicTables | None = None,
) -> dict:
    """Price op records from one system's AIC tables -> {"records": [...], "unpriced": [...], "files": [...]}.

    A priced record is the input record plus "ms", "backend" (the engine whose table answered), "note" (the
    table file and how it was read) and, for attention modules, "includes" (the composer's parts the record
    already covers). model: the model of the records (attention and a2a shapes), else inferred from heads."""
    tables = tables or AicTables(system, backend, version)
    tables.model = model
    priced, unpriced, seen = [], [], set()
    for i, r in enumerate(records):
        if not isinstance(r, dict) or "op" not in r:
            raise InputError(f'ops[{i}]: not an op record (an object with "op")')
        rec = {k: v for k, v in r.items() if k not in ("ms", "backend", "note", "includes")}
        key = record_key(rec)
        if key in seen:
            continue
        seen.add(key)
        try:
            p = tables.price(rec)
        except InputError as e:
            raise InputError(f"ops[{i}]: {e}") from None
        except _NoTable as e:
            unpriced.append({**rec, "reason": str(e)})
            continue
        extra = dict(p.extra)
        includes = extra.pop("includes", None)
        guard = extra.pop("guard", None)
        note = [f"table {p.tables[0]}"] + [v if k == "note" else f"{k} {v}" for k, v in extra.items()]
        if guard:
            note.append(f"guarded: {'; '.join(guard['reasons'])}; priced by the {guard['used']}")
        out = {**rec, "ms": round(p.ms, 6), "backend": p.backend, "note": "; ".join(str(x) for x in note)}
        if includes:
            out["includes"] = list(includes)
        if guard:
            out["guard"] = {k: v for k, v in guard.items() if k != "ms"}
        priced.append(out)
    return {"records": priced, "unpriced": unpriced, "files": sorted(tables.files_read)}


# ---- record keys and the comparison (no AIC needed) ----------------------------------------------------------


def record_key(r: dict) -> tuple:
    op = str(r.get("op"))
    fields = KEY_FIELDS.get(op, tuple(sorted(k for k in r if k != "ms")))
    return (op,) + tuple((f, r.get(f, KEY_DEFAULTS.get(f))) for f in fields)


def _kind_label(r: dict) -> str:
    op = r["op"]
    if op in ("attn", "comm"):
        return f"{op}:{r.get('kind')}:{r.get('phase', '')}".rstrip(":")
    if op in ("gemm", "moe"):
        return f"{op}:{r.get('dtype')}"
    return op


@dataclass(frozen=True)
class ComparedShape:
    kind: str
    key: tuple
    a_ms: float
    b_ms: float

    @property
    def ratio(self) -> float:
        return self.b_ms / self.a_ms


@dataclass(frozen=True)
class KindSummary:
    kind: str
    shapes: int
    median_abs_error: float
    p90_abs_error: float
    median_ratio: float


@dataclass(frozen=True)
class Comparison:
    b_name: str
    a_name: str
    shapes: list[ComparedShape]
    kinds: list[KindSummary]
    not_comparable: list[tuple[str, tuple, str]]  # (kind, key, why)
    only_in_a: int
    only_in_b: int

    @property
    def median_abs_error(self) -> float:
        errs = [abs(s.ratio - 1) for s in self.shapes]
        return statistics.median(errs) if errs else float("nan")


def _strip_model(key: tuple) -> tuple:
    return tuple(x for x in key if not (isinstance(x, tuple) and x[0] == "model"))


def compare_tables(b: dict, a: dict) -> Comparison:
    """Table (b) against table (a), shape by shape: ratio b/a and per-kind |b/a - 1|.

    A shape is comparable when both tables price the same record key and cost the same work: an attention
    record whose "includes" differ between the tables (AIC's attention modules include the projections) is
    is compared against (a)'s attention core plus (a)'s own records of the included parts (the composer's
    projection GEMMs of one such layer at batch x q tokens; kind "+proj") when (a) has them all, else listed
    as not comparable."""
    a_by = {}
    for r in _records(a, "a"):
        a_by[record_key(r)] = r
        a_by.setdefault(_strip_model(record_key(r)), r)  # a measured table may not name the model
    hardware = "b300" if "B300" in str((a.get("provenance") or {}).get("hardware", "")) else "h200"
    shapes, skipped, matched_a = [], [], set()
    only_b = 0
    for r in _records(b, "b"):
        key = record_key(r)
        ra = a_by.get(key) or a_by.get(_strip_model(key))
        if ra is None:
            only_b += 1
            continue
        matched_a.add(id(ra))
        kind = _kind_label(r)
        a_ms = float(ra["ms"])
        if r["op"] == "attn" and sorted(r.get("includes") or []) != sorted(ra.get("includes") or []):
            added = _projections_from(r, a_by, hardware) if not ra.get("includes") else None
            if added is None:
                why = (
                    f"includes differ: b {r.get('includes')} vs a {ra.get('includes')}, "
                    "and (a) lacks the projection GEMMs to add"
                )
                skipped.append((kind, key, why))
                continue
            a_ms += added
            kind += "+proj"
        if not (a_ms > 0 and r["ms"] > 0):
            skipped.append((kind, key, "non-positive ms"))
            continue
        shapes.append(ComparedShape(kind, key, a_ms, float(r["ms"])))
    kinds = []
    for kind in sorted({s.kind for s in shapes}):
        sel = [s for s in shapes if s.kind == kind]
        errs = sorted(abs(s.ratio - 1) for s in sel)
        kinds.append(
            KindSummary(
                kind,
                len(sel),
                statistics.median(errs),
                float(np.quantile(errs, 0.9)),
                statistics.median(s.ratio for s in sel),
            )
        )
    only_a = len({id(r) for r in a_by.values()} - matched_a)
    return Comparison(str(b.get("name", "b")), str(a.get("name", "a")), shapes, kinds, skipped, only_a, only_b)


def projection_records(rb: dict, hardware: str = "h200") -> list[tuple[dict, float]] | None:
    """The composer's GEMM records (with their counts) of the parts that attention record rb includes, for one
    layer of its kind: dsim.profiling.compose.layer_ops over that single layer. None when the model is not known."""
    from dsim.profiling.compose import layer_ops, parse_topology
    from dsim.profiling.models import load_model

    name = rb.get("model") or infer_model(str(rb.get("kind")), int(rb.get("heads", 0)))
    if name is None:
        return None
    try:
        model = load_model(name)
    except InputError:
        return None
    heads = int(rb["heads"])
    if heads <= 0 or model.heads % heads or rb["kind"] not in model.attn_kinds:
        return None
    tp = model.heads // heads
    topo = parse_topology(f"tp{tp}-ep8" if tp > 1 else "dp8-ep8")
    layer = model.attn_kinds.index(rb["kind"])
    b, q = int(rb["batch"]), int(rb["q"])
    ops = layer_ops(
        model, topo, hardware, b * q, phase=rb.get("phase", "decode"), batch=b, q=q, kv=int(rb["kv"]), layers=[layer]
    )
    parts = set(rb.get("includes") or ())
    return [(op.rec, op.count) for op in ops if op.part in parts and op.rec["op"] == "gemm"]


def _projections_from(rb: dict, a_by: dict, hardware: str) -> float | None:
    """(a)'s cost of the projection GEMMs that (b)'s attention record includes, or None if (a) lacks one."""
    recs = projection_records(rb, hardware)
    if not recs:
        return None
    total = 0.0
    for rec, count in recs:
        ra = a_by.get(record_key(rec))
        if ra is None:
            return None
        total += count * float(ra["ms"])
    return total


def _records(table: dict, which: str) -> list[dict]:
    recs = table.get("records") if isinstance(table, dict) else None
    if not isinstance(recs, list):
        raise InputError(f'table {which}: no "records" list')
    for i, r in enumerate(recs):
        if not isinstance(r, dict) or "op" not in r or not isinstance(r.get("ms"), (int, float)):
            raise InputError(f'table {which}: records[{i}]: needs "op" and a numeric "ms"')
    return recs


def format_comparison(c: Comparison, shapes: bool = True) -> str:
    head = (
        f"(b) {c.b_name} against (a) {c.a_name}: {len(c.shapes)} shapes compared, "
        f"{len(c.not_comparable)} not comparable, {c.only_in_b} only in (b), {c.only_in_a} only in (a)"
    )
    lines = [head]
    if shapes:
        lines.append(f"{'kind':<26} {'shape':<64} {'a_ms':>10} {'b_ms':>10} {'b/a':>7}")
        for s in sorted(c.shapes, key=lambda s: (s.kind, str(s.key))):
            shape = " ".join(f"{k}={v}" for k, v in s.key[1:] if v is not None and k not in ("dtype", "kind"))
            lines.append(f"{s.kind:<26} {shape[:64]:<64} {s.a_ms:>10.4f} {s.b_ms:>10.4f} {s.ratio:>7.3f}")
    lines.append(f"{'kind':<26} {'shapes':>6} {'median|err|':>12} {'p90|err|':>10} {'median b/a':>11}")
    for k in c.kinds:
        lines.append(
            f"{k.kind:<26} {k.shapes:>6} {k.median_abs_error:>11.1%} {k.p90_abs_error:>9.1%} {k.median_ratio:>11.3f}"
        )
    lines.append(f"{'all':<26} {len(c.shapes):>6} {c.median_abs_error:>11.1%}   (target: median <= 10%)")
    groups: dict[tuple[str, str], int] = {}
    for kind, _key, why in c.not_comparable:
        groups[(kind, why)] = groups.get((kind, why), 0) + 1
    for (kind, why), n in sorted(groups.items()):
        lines.append(f"not comparable: {kind}: {n} shapes: {why}")
    return "\n".join(lines)


def comparison_json(c: Comparison) -> dict:
    return {
        "b": c.b_name,
        "a": c.a_name,
        "median_abs_error": c.median_abs_error,
        "kinds": [k.__dict__ for k in c.kinds],
        "shapes": [
            {
                "label": s.kind,
                "op": s.key[0],
                **{f: v for f, v in s.key[1:] if v is not None},
                "a_ms": s.a_ms,
                "b_ms": s.b_ms,
                "ratio": s.ratio,
            }
            for s in c.shapes
        ],
        "not_comparable": [
            {"label": k, "op": key[0], **{f: v for f, v in key[1:] if v is not None}, "why": w}
            for k, key, w in c.not_comparable
        ],
        "only_in_a": c.only_in_a,
        "only_in_b": c.only_in_b,
    }


# ---- the fallback grid of op records -------------------------------------------------------------------------


def model_config(model: str) -> dict:
    """The model's public Hugging Face config: the repository's profiles/models copy, else AIC's packaged one."""
    if model not in MODELS:
        raise InputError(f"--model: {model!r} is not one of {', '.join(MODELS)}")
    ours = Path(__file__).resolve().parents[2] / "profiles" / "models" / f"{model}.json"
    if ours.is_file():
        return json.loads(ours.read_text())
    path = aic_root() / "model_configs" / f"{MODELS[model][0]}_config.json"
    return json.loads(path.read_text())


def composer_records(model: str, topology: str, system: str, expert_dtype: str | None = None) -> list[dict]:
    """The records the composer looks up for a model, topology and system (dsim.profiling.compose required-ops)."""
    import dataclasses

    from dsim.profiling.compose import parse_topology, required_ops
    from dsim.profiling.models import load_model

    m = load_model(model)
    if expert_dtype:
        m = dataclasses.replace(m, expert_dtype=expert_dtype)
    # without the capture limit + 1 point and the fixed-length DSpark drafter records (dspark@K): the pinned
    # tables were built before them, and the composer prices them by AIC's and its own interpolation
    return required_ops(m, parse_topology(topology), DATASHEET[system], new_points=False)


def grid_records(model: str, topology: str, system: str, required: list[dict] | None = None) -> list[dict]:
    """Op records on the fixed grid (KERNEL_OPS.md's fallback grid) over the shapes the composer needs for one
    model and topology: every GEMM (n, k) at the grid's m (fp8 shapes also in bf16), the routed experts in
    fp8 and bf16 (and the composer's dtype) at the grid's tokens, each attention kind at the grid's batch x q
    x kv, mHC, and the topology's collectives at the grid's tokens. For comparisons and for interpolation
    beyond the composer's own points."""
    if topology not in TOPOLOGIES:
        raise InputError(f"--topology: {topology!r} is not one of {', '.join(TOPOLOGIES)}")
    req = required if required is not None else composer_records(model, topology, system)
    recs: list[dict] = []
    gemms = sorted({(r["dtype"], r["n"], r["k"], r.get("groups", 1)) for r in req if r["op"] == "gemm"})
    gemms = sorted(set(gemms) | {("bf16", n, k, g) for d, n, k, g in gemms if d == "fp8"})
    recs += [
        {"op": "gemm", "dtype": d, "m": m, "n": n, "k": k, **({"groups": g} if g > 1 else {})}
        for d, n, k, g in gemms
        for m in GRID_TOKENS
    ]
    for shape in sorted(
        {tuple((k, r[k]) for k in ("hidden", "inter", "topk", "experts", "ep")) for r in req if r["op"] == "moe"}
    ):
        dtypes = sorted({"fp8", "bf16"} | {r["dtype"] for r in req if r["op"] == "moe"})
        recs += [{"op": "moe", "dtype": d, "tokens": t, **dict(shape)} for d in dtypes for t in GRID_TOKENS]
    for kind, heads in sorted({(r["kind"], r["heads"]) for r in req if r["op"] == "attn"}):
        recs += [
            {"op": "attn", "kind": kind, "phase": "decode", "batch": bb, "q": q, "kv": kv, "heads": heads}
            for bb in GRID_BATCH
            for q in GRID_Q_DECODE
            for kv in GRID_KV
        ]
        recs += [
            {"op": "attn", "kind": kind, "phase": "prefill", "batch": bb, "q": q, "kv": kv, "heads": heads}
            for bb in GRID_BATCH_PREFILL
            for q in GRID_Q_PREFILL
            for kv in (0,) + GRID_KV
        ]
    for h, hc in sorted({(r["hidden"], r["hc_mult"]) for r in req if r["op"] == "mhc"}):
        recs += [{"op": "mhc", "tokens": t, "hidden": h, "hc_mult": hc} for t in GRID_TOKENS]
    hidden = next((r["hidden"] for r in req if r["op"] == "moe"), None)
    for kind, gpus in sorted({(r["kind"], r["gpus"]) for r in req if r["op"] == "comm"}):
        per_token = {"all_reduce": 2, **A2A_BYTES_PER_ELEMENT}.get(kind)
        if per_token is None or hidden is None:
            continue
        recs += [{"op": "comm", "kind": kind, "gpus": gpus, "bytes": t * hidden * per_token} for t in GRID_TOKENS]
    return recs


# ---- files --------------------------------------------------------------------------------------------------


def kernel_table(name: str, system: str, backend: str, version: str, priced: dict, command: str, what: str) -> dict:
    return {
        "name": name,
        "provenance": {
            "kind": "silicon-table",
            "hardware": SYSTEMS[system],
            "engine": f"{BACKENDS.get(backend, backend)} (SGLang {FALLBACK_BACKEND[1]} where a record says so)",
            "engine_version": version,
            "date": _dt.date.today().isoformat(),
            "method": (
                f"{AIC_PACKAGE}=={AIC_VERSION} system {system}: per-kernel tables read as data "
                "(AIC's own interpolation for gemm/moe, log-space linear interpolation of the module "
                "tables for attention/mhc/comm); " + what
            ),
            "command": command,
            "source": (
                f"NVIDIA AIConfigurator ({AIC_PACKAGE} {AIC_VERSION} on PyPI, Apache-2.0), measured "
                "tables under aiconfigurator_core/systems/data"
            ),
            "package": f"{AIC_PACKAGE}=={AIC_VERSION}",
            "system": system,
            "backend": f"{backend} {version}",
            "fallback_backend": " ".join(FALLBACK_BACKEND),
            "files": priced["files"],
            "moe_routing": "balanced (uniform: each token's k experts at a fixed stride) unless a record says",
            **table_guard(priced["records"]),
        },
        "records": priced["records"],
        "unpriced": priced["unpriced"],
    }


def table_guard(records: list[dict]) -> dict:
    """{"table_guard": ...} where records were guarded (moe_guard): how many, read how, in which order;
    {} where none was."""
    g = [r for r in records if r.get("guard")]
    if not g:
        return {}
    used: dict[str, int] = {}
    for r in g:
        used[r["guard"]["used"]] = used.get(r["guard"]["used"], 0) + 1
    return {
        "table_guard": {
            "records": len(g),
            "priced_by": used,
            "eps": sorted({int(r["ep"]) for r in g if "ep" in r}),
            "order": MOE_GUARD_ORDER,
        }
    }


def _load_json(path: str, what: str):
    from dsim.schema import read_json

    return read_json(path, what=what)


def _dumps(obj: Any) -> str:
    """JSON with one record per line for lists of records (diffable, a third of the indented size)."""
    if not isinstance(obj, dict):
        return json.dumps(obj, indent=1) + "\n"
    parts = []
    for k, v in obj.items():
        if isinstance(v, list) and v and all(isinstance(x, dict) for x in v):
            body = ",\n".join("  " + json.dumps(x, separators=(", ", ": ")) for x in v)
            parts.append(f" {json.dumps(k)}: [\n{body}\n ]")
        else:
            parts.append(f" {json.dumps(k)}: " + json.dumps(v, indent=1).replace("\n", "\n "))
    return "{\n" + ",\n".join(parts) + "\n}\n"


def table_name(out: str) -> str:
    """A kernel table's name from its output path: the file name without .json / .json.gz."""
    name = Path(out).name
    for suffix in (".gz", ".json"):
        name = name.removesuffix(suffix)
    return name


def _write_json(path: str, obj: Any) -> None:
    from dsim.outputs import write_file

    text = _dumps(obj)
    # mtime 0: the same bytes for the same table; whole or nothing, never over a special file
    data = gzip.compress(text.encode(), mtime=0) if Path(path).name.endswith(".gz") else text
    write_file(path, data, parents=True)


def _ops_from(path: str) -> list[dict]:
    obj = _load_json(path, "op records")
    recs = obj.get("records", obj.get("ops")) if isinstance(obj, dict) else obj
    if not isinstance(recs, list):
        raise InputError(f'{path}: expected a list of op records (or an object with "records")')
    return recs


# ---- CLI ---------------------------------------------------------------------------------------------------


def _cmd_grid(a) -> None:
    print(json.dumps(grid_records(a.model, a.topology, a.system), indent=0))


def _cmd_price(a) -> None:
    a.version = a.version or default_version(a.system, a.backend)
    recs: list[dict] = []
    for p in a.ops:
        recs += _ops_from(p)
    priced = price_records(recs, a.system, a.backend, a.version, a.model)
    name = table_name(a.out)
    cmd = " ".join(
        [
            "dsim profile aic price",
            f"--system {a.system}",
            f"--backend {a.backend}",
            f"--version {a.version}",
        ]
        + [f"--ops {p}" for p in a.ops]
        + ([f"--model {a.model}"] if a.model else [])
        + [f"--out {a.out}"]
    )
    _write_json(a.out, kernel_table(name, a.system, a.backend, a.version, priced, cmd, "records from --ops"))
    print(f"{a.out}: {len(priced['records'])} records priced, {len(priced['unpriced'])} unpriced")


#: (model, topology, expert dtype or None = the composer's default) per system in the shipped tables
SHIPPED_CASES: dict[str, list[tuple[str, str, str | None]]] = {
    "b300_sxm": [(m, t, None) for m in ("deepseek-v4-flash", "deepseek-v4-pro", "deepseek-v3") for t in TOPOLOGIES],
    "h200_sxm": [(m, t, None) for m in ("deepseek-v4-flash", "deepseek-v4-pro", "deepseek-v3") for t in TOPOLOGIES]
    + [("deepseek-v4-pro", "tp8-ep8", "w4a16")],
}


def build_table(
    system: str,
    backend: str = "vllm",
    version: str | None = None,
    cases: list[tuple[str, str, str | None]] | None = None,
) -> dict:
    """Price the composer's records (required-ops) and the fixed grid for every shipped case of one system.

    A record key priced differently for two models (possible only for collectives whose record carries no
    model shape: an a2a of equal bytes) keeps the first model's price and is counted in provenance; every a2a
    record also has a twin carrying its shape (hidden, topk, experts), which never clashes."""
    tables = AicTables(system, backend, version)
    merged: dict[tuple, dict] = {}
    unpriced: dict[tuple, dict] = {}
    clashes = 0
    cases = (
        cases
        or SHIPPED_CASES.get(system)
        or [(m, t, None) for m in ("deepseek-v4-flash", "deepseek-v4-pro", "deepseek-v3") for t in TOPOLOGIES]
    )
    for model, topo, edt in cases:
        req = composer_records(model, topo, system, edt)
        got = price_records(req + grid_records(model, topo, system, req), system, backend, version, model, tables)
        c = model_config(model)
        shape = {"hidden": c["hidden_size"], "topk": c["num_experts_per_tok"], "experts": c["n_routed_experts"]}
        twins = [
            {**r, **shape}
            for r in got["records"]
            if r["op"] == "comm" and r["kind"].startswith("a2a") and "hidden" not in r
        ]
        for r in got["records"] + twins:
            k = record_key(r)
            if k in merged:
                clashes += merged[k]["ms"] != r["ms"]
                continue
            merged[k] = r
        for u in got["unpriced"]:
            unpriced.setdefault(record_key(u), u)
    cases_txt = ", ".join(f"{m} {t}" + (f" ({e} experts)" if e else "") for m, t, e in cases)
    return {
        "records": list(merged.values()),
        "unpriced": [u for k, u in unpriced.items() if k not in merged],
        "files": sorted(tables.files_read),
        "clashes": clashes,
        "cases": cases_txt,
    }


def case_table(hardware: str, backend: str, model: str, topology: str, expert_dtype: str | None = None) -> Any:
    """A kernel table for one composer case priced on demand from AIC's tables (the aic extra): the
    composer's records and the fixed grid of ``model`` x ``topology`` on ``hardware`` (dsim's key: h100,
    h200, b200, b300, gb200, gb300) with ``backend``'s tables (vllm, sglang, trtllm), as
    ``dsim profile aic build`` prices them; guarded as build's. Returns a dsim.profiling.kernel_tables.KernelTable
    named <hardware>-aic-<backend>."""
    from dsim.profiling.kernel_tables import KernelTable

    system = SYSTEM_OF.get(hardware)
    if system is None:
        raise InputError(
            f"--hardware {hardware}: AIC has no kernel tables dsim can compose from for it "
            f"(it composes on {', '.join(sorted(SYSTEM_OF))})"
        )
    version = default_version(system, backend)
    if topology in TOPOLOGIES:  # the composer's records and the fixed grid over their shapes
        priced = build_table(system, backend, version, [(model, topology, expert_dtype)])
    else:  # (the fixed grid is written for the shipped topologies): the composer's own records
        priced = _case_records(system, backend, version, model, topology, expert_dtype)
    name = f"{hardware}-aic-{backend}"
    cmd = f"dsim.profiling.aic_tables.case_table({hardware!r}, {backend!r}, {model!r}, {topology!r})"
    t = kernel_table(name, system, backend, version, priced, cmd, f"the composer's records for {model} {topology}")
    return KernelTable(name=name, provenance=t["provenance"], records=t["records"])


def _case_records(system: str, backend: str, version: str, model: str, topology: str, expert_dtype: str | None) -> dict:
    """The composer's own records of a topology outside the fixed grid's (wide EP): priced, no grid."""
    tables = AicTables(system, backend, version)
    got = price_records(
        composer_records(model, topology, system, expert_dtype), system, backend, version, model, tables
    )
    return {**got, "files": sorted(tables.files_read), "clashes": 0, "cases": f"{model} {topology}"}


def _cmd_build(a) -> None:
    a.version = a.version or default_version(a.system, a.backend)
    priced = build_table(a.system, a.backend, a.version)
    cmd = f"dsim profile aic build --system {a.system} --backend {a.backend} --version {a.version} --out {a.out}"
    what = (
        f"the composer's records (dsim.profiling.compose required-ops) and the fixed grid over their shapes for "
        f"{priced['cases']}; {priced['clashes']} record keys priced differently for two models kept the "
        "first"
    )
    _write_json(a.out, kernel_table(table_name(a.out), a.system, a.backend, a.version, priced, cmd, what))
    print(
        f"{a.out}: {len(priced['records'])} records priced, {len(priced['unpriced'])} unpriced, "
        f"{priced['clashes']} clashes"
    )


def comparison_summary(c: Comparison, command: str = "", a_provenance: dict | None = None) -> dict:
    """The compact error record a profile built from (b) carries in provenance (compose --table-error)."""
    ap = a_provenance or {}
    return {
        "against": c.a_name,
        "table": c.b_name,
        "date": _dt.date.today().isoformat(),
        "command": command,
        "against_provenance": {
            k: ap[k] for k in ("kind", "hardware", "engine", "engine_version", "date", "command") if k in ap
        },
        "error": "median |b/a - 1| over the shapes both tables price; attention modules of (b) against (a)'s "
        "attention core plus (a)'s projection GEMMs",
        "shapes": len(c.shapes),
        "median_abs_error": round(c.median_abs_error, 4),
        "median_ratio_b_over_a": round(statistics.median(s.ratio for s in c.shapes), 4) if c.shapes else None,
        "by_kind": {
            k.kind: {
                "shapes": k.shapes,
                "median_abs_error": round(k.median_abs_error, 4),
                "p90_abs_error": round(k.p90_abs_error, 4),
                "median_ratio": round(k.median_ratio, 4),
            }
            for k in c.kinds
        },
        "not_comparable": len(c.not_comparable),
    }


def _cmd_compare(a) -> None:
    b = _load_json(a.b, "kernel table (b)")
    t = _load_json(a.a, "kernel table (a)")
    c = compare_tables(b, t)
    print(format_comparison(c, shapes=not a.summary))
    if a.json:
        _write_json(a.json, comparison_json(c))
    if a.error_summary:
        cmd = f"dsim profile aic compare {a.b} {a.a} --error-summary {a.error_summary}"
        _write_json(a.error_summary, comparison_summary(c, cmd, t.get("provenance") if isinstance(t, dict) else None))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="dsim profile aic", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    g = sub.add_parser("grid", help="op records on the fixed grid for a model and topology")
    g.add_argument("--model", required=True, choices=sorted(MODELS))
    g.add_argument("--topology", required=True, choices=TOPOLOGIES)
    g.add_argument("--system", default="b300_sxm", choices=sorted(SYSTEMS))
    p = sub.add_parser("price", help="price op records from AIC's tables")
    p.add_argument("--system", required=True, choices=sorted(SYSTEMS))
    p.add_argument("--backend", default="vllm", choices=sorted(BACKENDS))
    p.add_argument("--version", default=None, help="the backend's table version (default: the newest AIC ships)")
    p.add_argument("--ops", required=True, action="append", help="op records JSON (repeatable)")
    p.add_argument("--model", choices=sorted(MODELS), help="model of attention records that do not name one")
    p.add_argument("--out", required=True)
    bd = sub.add_parser("build", help="grid + price for the shipped models and both topologies")
    bd.add_argument("--system", required=True, choices=sorted(SYSTEMS))
    bd.add_argument("--backend", default="vllm", choices=sorted(BACKENDS))
    bd.add_argument("--version", default=None, help="the backend's table version (default: the newest AIC ships)")
    bd.add_argument("--out", required=True)
    c = sub.add_parser("compare", help="ratio (b)/(a) of two kernel tables, shape by shape")
    c.add_argument("b", help="kernel table (b), e.g. profiles/kernels/h200-aic-vllm.json.gz")
    c.add_argument("a", help="kernel table (a), e.g. profiles/kernels/h200-torch.json")
    c.add_argument("--summary", action="store_true", help="per-kind summary only")
    c.add_argument("--json", help="also write the comparison as JSON here")
    c.add_argument("--error-summary", help="also write the per-kind error summary here (for compose --table-error)")
    pr = sub.add_parser("profile", help="a composed profile of a model on any hardware x backend with tables")
    pr.add_argument(
        "--model", required=True, help="a model under profiles/models (deepseek-v3, deepseek-v4-flash, ...)"
    )
    pr.add_argument("--hardware", required=True, help="h100, h200, b200, b300, gb200 or gb300")
    pr.add_argument("--backend", default="vllm", choices=sorted(BACKENDS))
    pr.add_argument("--topology", default="dp8-ep8", help="e.g. dp8-ep8, tp8-ep8, dp16-ep16")
    pr.add_argument("--overlap", default="none", choices=("none", "dbo"))
    pr.add_argument("--expert-dtype", default=None, help="fp8 or fp4 (default: as released where the hardware runs it)")
    pr.add_argument("--out", required=True)
    an = sub.add_parser("anchors", help="AIC's end-to-end estimates for the public anchor points")
    an.add_argument("--out", default="profiles/kernels/aic-anchors.json")
    a = ap.parse_args(argv)
    from dsim.cli.toolmain import run_tool
    from dsim.outputs import check_apart, check_file_target

    def body() -> int:
        outs = [(getattr(a, k, None), f"--{k.replace('_', '-')}") for k in ("out", "json", "error_summary")]
        for path, what in outs:  # every output refused before any work
            if path is not None:
                check_file_target(path, what, parents=True)
        check_apart(*outs)
        {
            "grid": _cmd_grid,
            "price": _cmd_price,
            "build": _cmd_build,
            "compare": _cmd_compare,
            "profile": _cmd_profile,
            "anchors": _cmd_anchors,
        }[a.cmd](a)
        return 0

    return run_tool("dsim profile aic", body)


# ---- a composed profile on any hardware x backend AIC has tables for -------------------------------------------


def kernel_tables_for(hardware: str, backend: str, model: str | None, topology: str) -> Any:
    """The silicon-table kernel table of ``hardware`` x ``backend``: the shipped
    profiles/kernels/<hardware>-aic-<backend>.json.gz for a shipped topology (dsim.profiling.compose.shipped_table_for),
    else priced for this model and topology from AIC's tables on demand (case_table; the aic extra; only for
    a model of MODELS: ``model`` None is a model AIC's composer records cannot be written for)."""
    from dsim.profiling.compose import BACKENDS as COMPOSE_BACKENDS
    from dsim.profiling.compose import shipped_table_for
    from dsim.profiling.kernel_tables import HARDWARE, kernel_table_path

    if backend not in COMPOSE_BACKENDS:
        raise InputError(f"--backend {backend!r}: one of {', '.join(COMPOSE_BACKENDS)}")
    if hardware not in HARDWARE:
        raise InputError(f"--hardware {hardware!r}: one of {', '.join(sorted(HARDWARE))}")
    if kernel_table_path(f"{hardware}-aic-{backend}").is_file() and topology in ("dp8-ep8", "tp8-ep8"):
        return shipped_table_for(hardware, backend, topology)
    if model is None:
        raise InputError(
            f"no shipped {hardware}-aic-{backend} table for {topology}, and AIC's tables are priced on demand only "
            f"for {', '.join(MODELS)}"
        )
    return case_table(hardware, backend, model, topology)


def compose_for(
    model: Any,
    hardware: str,
    backend: str = "vllm",
    topology: str = "dp8-ep8",
    *,
    overlap: str = "none",
    expert_dtype: str | None = None,
    name: str | None = None,
    after: Sequence[Any] = (),
    command: str | None = None,
    **kw: Any,
) -> Any:
    """A composed profile of ``model`` (profiles/models/<model>.json, or a dsim.profiling.models.MoEModel, e.g. read from
    a user's config.json) on ``hardware`` (a dsim.profiling.kernel_tables.HARDWARE key: h100, h200, b200, b300, gb200, gb300)
    served by ``backend`` (vllm, sglang, trtllm: whose kernels AIC's silicon tables measured) at ``topology``.
    ``after``: further kernel tables asked after the silicon one (e.g. our own measured table). Named
    <model>-<hardware>-<backend>-<topology>[-dbo]; provenance.hardware and provenance.backend say both. Other
    keywords go to dsim.profiling.compose.compose_profile."""
    import dataclasses

    from dsim.profiling.compose import compose_profile, parse_topology
    from dsim.profiling.kernel_tables import HARDWARE
    from dsim.profiling.models import MoEModel, load_model

    m = model if isinstance(model, MoEModel) else load_model(model)
    known = m.name if m.name in MODELS else None
    if expert_dtype:
        if expert_dtype == "fp4" and HARDWARE[hardware]["fp4"] is None:
            raise InputError(f"expert dtype fp4: {HARDWARE[hardware]['name']} has no FP4 tensor cores")
        m = dataclasses.replace(m, expert_dtype=expert_dtype)
    topo = parse_topology(topology)
    table = kernel_tables_for(hardware, backend, known, topo.name)
    label = f"{m.name}-{hardware}-{backend}-{topo.name}" + ("-dbo" if overlap == "dbo" else "")
    cmd = command or (
        f"dsim.profiling.aic_tables.compose_for({m.name!r}, {hardware!r}, {backend!r}, {topology!r}"
        + (f", overlap={overlap!r}" if overlap != "none" else "")
        + (f", expert_dtype={expert_dtype!r}" if expert_dtype else "")
        + ")"
    )
    tables = [table, *after]
    prof = compose_profile(m, topo, hardware, tables, name=name or label, overlap=overlap, command=cmd, **kw)
    prof.provenance["backend"] = f"{backend} ({table.provenance.get('backend', table.provenance.get('engine'))})"
    return prof


def _cmd_profile(a: argparse.Namespace) -> None:
    from dsim.cost import save_profile

    prof = compose_for(a.model, a.hardware, a.backend, a.topology, overlap=a.overlap, expert_dtype=a.expert_dtype)
    save_profile(prof, a.out)  # (the target was checked before any work; written whole or not at all)
    print(f"wrote {a.out}: {prof.label}")


# ---- AIC's own end-to-end anchors --------------------------------------------------------------------------


@dataclass(frozen=True)
class Anchor:
    """One public anchor point: AIC's static decode estimate for a model, system and parallel layout."""

    name: str
    system: str
    backend: str
    version: str
    model_path: str
    batch: int
    isl: int
    osl: int
    tp: int
    ep: int
    quoted_ms: float  # the figure as first read from AIC (rounded)


ANCHORS = (
    Anchor(
        "DeepSeek-V4-Pro, 8 x B300, TP8 + EP8, vLLM, decode batch 1",
        "b300_sxm",
        "vllm",
        "0.24.0",
        "deepseek-ai/DeepSeek-V4-Pro",
        1,
        1024,
        128,
        8,
        8,
        36.8,
    ),
    Anchor(
        "DeepSeek-V4-Pro, 8 x B300, TP8 + EP8, vLLM, decode batch 8",
        "b300_sxm",
        "vllm",
        "0.24.0",
        "deepseek-ai/DeepSeek-V4-Pro",
        8,
        1024,
        128,
        8,
        8,
        27.9,
    ),
    Anchor(
        "DeepSeek-V3 FP8, 8 x H200, TP8 + EP8, vLLM, decode 256 requests",
        "h200_sxm",
        "vllm",
        "0.24.0",
        "deepseek-ai/DeepSeek-V3",
        256,
        1024,
        128,
        8,
        8,
        46.0,
    ),
    Anchor(
        "DeepSeek-V3 FP8, 8 x H200, TP8 + EP8, vLLM, decode 512 requests",
        "h200_sxm",
        "vllm",
        "0.24.0",
        "deepseek-ai/DeepSeek-V3",
        512,
        1024,
        128,
        8,
        8,
        62.0,
    ),
)


def run_anchor(an: Anchor) -> dict:
    """AIC's static generation estimate (its SDK's run_static, mode static_gen) for one anchor."""
    _aic()
    import logging

    from aiconfigurator_core.sdk.backends.factory import get_backend
    from aiconfigurator_core.sdk.config import ModelConfig, RuntimeConfig
    from aiconfigurator_core.sdk.models import get_model
    from aiconfigurator_core.sdk.perf_database import get_database

    logging.getLogger("aiconfigurator_core").setLevel(logging.ERROR)
    db = get_database(an.system, an.backend, an.version)
    model = get_model(
        an.model_path, ModelConfig(tp_size=an.tp, moe_tp_size=1, moe_ep_size=an.ep, attention_dp_size=1), an.backend
    )
    summary = get_backend(an.backend).run_static(
        model, db, RuntimeConfig(batch_size=an.batch, beam_width=1, isl=an.isl, osl=an.osl), mode="static_gen"
    )
    row = summary.get_summary_df().iloc[0].to_dict()
    steps = an.osl - 1  # AIC's TPOT: generation latency over the osl - 1 decode steps after the first token
    per_op = {k: round(v / steps, 3) for k, v in summary.get_generation_latency_dict().items() if v}
    shared = _shared_expert_gemm_check(an)
    return {
        "shared_expert_fp8_gemm_ms_per_step": shared,
        "name": an.name,
        "system": an.system,
        "engine": f"{an.backend} {an.version}",
        "model": an.model_path,
        "parallel": row["parallel"],
        "batch": an.batch,
        "isl": an.isl,
        "osl": an.osl,
        "quant": {"gemm": row["gemm"], "moe": row["moe"], "kvcache": row["kvcache"], "fmha": row["fmha"]},
        "step_ms": round(float(row["tpot"]), 3),
        "quoted_ms": an.quoted_ms,
        "tokens_per_s_per_gpu": round(float(row["tokens/s/gpu"]), 2),
        "step_ms_by_op": per_op,
        "moe_workload_distribution": "power_law_1.01 (AIC's default for DeepSeek models)",
    }


def _shared_expert_gemm_check(an: Anchor) -> dict:
    """The shared-expert fp8_block GEMMs of one decode step priced from the engine's own (eager) table and from
    SGLang's CUDA-graph table: how much of AIC's estimate is the eager host floor of vLLM's fp8_block rows."""
    import aiconfigurator_core.sdk.operations as ops
    from aiconfigurator_core.sdk import common
    from aiconfigurator_core.sdk.perf_database import get_database

    name = next(k for k, (stem, _) in MODELS.items() if stem.split("--")[1] == an.model_path.split("/")[1])
    c = model_config(name)
    h, inter = c["hidden_size"], c["moe_intermediate_size"] * c.get("n_shared_experts", 1)
    layers = c["num_hidden_layers"] - c.get("first_k_dense_replace", 0)
    out = {"moe_layers": layers}
    for b, v in ((an.backend, an.version), FALLBACK_BACKEND):
        db = get_database(an.system, b, v)
        per_layer = sum(
            float(ops.GEMM("g", 1, n, k, common.GEMMQuantMode.fp8_block)._engine_query(db, x=an.batch))
            for n, k in ((2 * inter // an.tp, h), (h, inter // an.tp))
        )
        out[f"{b} {v}"] = round(per_layer * layers, 3)
    return out


def _cmd_anchors(a) -> None:
    anchors = [run_anchor(an) for an in ANCHORS]
    cmd = f"dsim profile aic anchors --out {a.out}"
    out = {
        "name": "aic-anchors",
        "provenance": {
            "kind": "silicon-table-estimate",
            "date": _dt.date.today().isoformat(),
            "method": (
                "AIConfigurator's own end-to-end static decode estimate: aiconfigurator_core.sdk "
                "get_model + get_backend(...).run_static(mode='static_gen') with ModelConfig(tp_size, "
                "moe_tp_size=1, moe_ep_size, attention_dp_size=1) and RuntimeConfig(batch_size, isl, osl), "
                "AIC's default quantization for each checkpoint; step_ms is AIC's TPOT"
            ),
            "command": cmd,
            "package": f"{AIC_PACKAGE}=={AIC_VERSION}",
            "source": f"NVIDIA AIConfigurator ({AIC_PACKAGE} {AIC_VERSION}, Apache-2.0)",
        },
        "anchors": anchors,
    }
    _write_json(a.out, out)
    for an in anchors:
        print(f"{an['name']}: {an['step_ms']} ms per step (quoted {an['quoted_ms']})")


if __name__ == "__main__":
    sys.exit(main())
