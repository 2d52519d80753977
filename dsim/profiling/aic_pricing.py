"""dsim's kernel-op records priced from one system's AIC tables (AicTables, price_records).

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

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from dsim.errors import InputError
from dsim.profiling.aic_compare import record_key
from dsim.profiling.aic_guard import moe_guard
from dsim.profiling.aic_source import (
    A2A_BYTES_PER_ELEMENT,
    ATTN_INCLUDES,
    FALLBACK_BACKEND,
    GEMM_MODES,
    MLA_INCLUDES,
    MODELS,
    MOE_MODES,
    SYSTEMS,
    GridTable,
    NoTable,
    aic_package,
    aic_root,
    default_version,
    model_config,
    record_ints,
    version_key,
)
from dsim.profiling.models import infer_model

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
            aic_package()
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
        m, n, k = record_ints(r, "m", "n", "k")
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
        raise NoTable(f"no {mode} gemm table")

    def moe(self, r: dict) -> Priced:
        """The routed experts of one EP rank from AIC's moe table, guarded (moe_guard): where the table is
        read past its measured tokens, or prices a rank above the same routed rows per GPU at EP
        MOE_REF_EP, the price falls back in the order of MOE_GUARD_ORDER and the record says so."""
        modes = _lookup(MOE_MODES, r, "dtype")
        t, h, inter, topk, e, ep = record_ints(r, "tokens", "hidden", "inter", "topk", "experts", "ep")
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
        raise NoTable(
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
        b_, q, kv, heads = record_ints(r, "batch", "q", "kv", "heads")
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
        raise NoTable(f"no {name} rows for {tag} with {heads} heads per GPU")

    def _mla(self, r: dict) -> Priced:
        b_, q, kv, heads = record_ints(r, "batch", "q", "kv", "heads")
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
        raise NoTable(f"no {name} rows with {heads} heads per GPU")

    def mhc(self, r: dict) -> Priced:
        t, h, hc = record_ints(r, "tokens", "hidden", "hc_mult")
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
        raise NoTable(f"no mhc rows for hidden {h}, hc_mult {hc}")

    def comm(self, r: dict) -> Priced:
        kind = r.get("kind")
        g, nbytes = record_ints(r, "gpus", "bytes")
        if r.get("scope", "intra_node") != "intra_node":
            raise NoTable("only single-node communication tables are read")
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
            raise NoTable(f"no custom all-reduce table for {g} GPUs")
        if kind in ("all_gather", "reduce_scatter"):
            nccl_dir = self.data / "comm" / "nccl"
            versions = (
                sorted((p.name for p in nccl_dir.iterdir() if (p / "nccl_perf.parquet").is_file()), key=version_key)
                if nccl_dir.is_dir()
                else []
            )
            if not versions:
                raise NoTable("no nccl table")
            v = versions[-1]
            df = self.frame("comm", "nccl", v, "nccl_perf.parquet")
            sel = df[(df.op_name == kind) & (df.num_gpus == g) & (df.nccl_dtype == "half")]
            if sel.empty:
                raise NoTable(f"no nccl {kind} rows for {g} GPUs")
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
            h, topk, e = record_ints(r, "hidden", "topk", "experts")
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
        raise NoTable(f"no DeepEP {mode} {phase} table for ep {g}, hidden {h}, top-{topk} of {e}")

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
            raise NoTable(f"AIC has no table for op {op!r}")
        return fn(r)


def _lookup(table: dict, r: dict, key: str):
    if r.get(key) not in table:
        raise InputError(f"{r.get('op')} record: {key} {r.get(key)!r} is not one of {', '.join(table)}")
    return table[r[key]]


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
        except NoTable as e:
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
