"""Step-cost composer: a dsim profile for a MoE model under a deployment topology, from kernel tables.

One engine step on one GPU is decomposed into kernel ops (dsim.profiling.kernel_ops), each op is priced
by a kernel source (dsim.profiling.pricer: a measured/published ``KernelTable``, the ``Roofline`` for what
a table lacks), and the sum becomes the profile's forward table at vLLM's CUDA-graph capture sizes (the
staircase) plus tail sizes (dsim.profiling.forward; with two-batch overlap dsim.profiling.overlap), its
context slope, prefill terms (dsim.profiling.prefill), draft tables (dsim.profiling.drafters) and the
per-request attention table (dsim.profiling.request_attention, with our shard executor's step-wide terms
from dsim.profiling.executor_terms). This module assembles them (``compose_profile``), sizes the KV cache
(``kv_capacity``) and lists every record a composition looks up (``required_ops``); the topologies are
dsim.profiling.topology's, the command ``dsim profile compose`` dsim.profiling.compose_cli.

Context: attention cores priced at two contexts give the KV slope (ms per 1000 KV tokens).
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import json

import numpy as np

from dsim.cost import Profile, Table, vllm_capture_sizes
from dsim.errors import InputError
from dsim.profiling.attention_published import attention_source
from dsim.profiling.drafters import DRAFT_COLLECTED_REQUESTS, DRAFT_REQUESTS, draft_ops, draft_tables
from dsim.profiling.executor_terms import (
    step_indexer_ms_per_mcell,
    step_keys_term,
    with_block_pool,
    without_split_combine,
)
from dsim.profiling.forward import (
    EAGER_US_PER_LAYER,
    GRAPH_GAP_US_PER_LAYER,
    LayerGlue,
    fit_layer_glue,
    forward_ms,
    forward_sizes,
)
from dsim.profiling.kernel_ops import KV_HI, KV_LO, Op, kernel_op, layer_ops, served_dtypes, step_ops
from dsim.profiling.kernel_tables import HARDWARE, WEIGHT_BYTES, KernelTable, Roofline
from dsim.profiling.models import MoEModel
from dsim.profiling.overlap import DBO_DECODE_TOKEN_THRESHOLD, overlapped_forward
from dsim.profiling.prefill import PREFILL_KV, PREFILL_Q, fit_prefill_terms, prefill_excess
from dsim.profiling.pricer import Pricer
from dsim.profiling.request_attention import (
    REQ_BATCH_MAX,
    REQ_CTX_GRID,
    REQ_Q,
    VERIFY_ATTENTION,
    attention_cores_ms,
    flattened_verify_attention,
    lifted_share,
    profile_format,
    request_attention_table,
)
from dsim.profiling.topology import Topology, physical_experts

SLOPE_BATCH = 64  # requests at which the slope is taken
ACTIVATION_RESERVE_GB = 6.0  # activations, graphs, workspace per GPU (stated, vLLM-like)
MEM_UTIL = 0.9  # vLLM gpu_memory_utilization default
VLLM_MOE_DP_CHUNK = 256  # vLLM's VLLM_MOE_DP_CHUNK_SIZE default (tokens per DP rank per MoE chunk)


def kv_capacity(model: MoEModel, topo: Topology, hardware: str, max_num_seqs: int) -> tuple[float, dict]:
    """(KV-cache GiB per replica, memory breakdown per GPU in GB). Weights per GPU: attention and
    embeddings replicated per DP rank (split over TP ranks), experts split over EP ranks; the
    sliding windows of max_num_seqs requests reserved."""
    pb = model.param_bytes()
    hw = HARDWARE[hardware]
    # param_bytes counts experts as released (fp4: 0.53 B); rescale to the dtype actually served
    released = WEIGHT_BYTES["fp4"] if model.expert_dtype in ("fp4", "w4a16") else WEIGHT_BYTES["fp8"]
    e_scale = WEIGHT_BYTES[served_dtypes(model, hardware)[1]] / released
    per_gpu = dict(
        attention=pb["attention"] / topo.attn_tp,
        dense_and_shared=pb["shared_and_dense"] / topo.attn_tp,
        router=pb["router"],
        embeddings=pb["embeddings"] / topo.attn_tp,
        routed_experts=pb["routed_experts"] * e_scale * physical_experts(model, topo) / model.experts / topo.ep,
        mtp=pb["mtp"] / topo.ep,
    )
    weights_gb = sum(per_gpu.values()) / 1e9
    windows_gb = max_num_seqs * model.kv_bytes_per_request() / 1e9
    free_gb = hw["hbm_gb"] * MEM_UTIL - weights_gb - ACTIVATION_RESERVE_GB - windows_gb
    mem = {k: round(v / 1e9, 2) for k, v in per_gpu.items()}
    mem.update(
        weights_total=round(weights_gb, 2),
        activation_reserve=ACTIVATION_RESERVE_GB,
        sliding_windows=round(windows_gb, 2),
        kv_cache=round(free_gb, 2),
    )
    if free_gb <= 1.0:
        raise InputError(
            f"{model.name}: weights ({weights_gb:.0f} GB per GPU) leave no KV cache on "
            f"{topo.name} x {hw['name']} ({hw['hbm_gb']:.0f} GB); use more GPUs (e.g. dp16-ep16) or FP4 experts"
        )
    return free_gb * 1e9 / 2**30, mem


def compose_profile(
    model: MoEModel,
    topo: Topology,
    hardware: str,
    table: KernelTable | list[KernelTable] | None = None,
    *,
    name: str | None = None,
    max_capture: int | None = None,
    draft_block: int = 7,
    max_num_seqs: int = 1024,
    cpu_overhead_ms: float = 2.0,
    roofline: Roofline | None = None,
    table_error: dict | None = None,
    command: str = "",
    zero_ops: frozenset = frozenset(),
    layer_records: list[dict] | None = None,
    layer_source: str = "",
    prefer: dict | None = None,
    forward_q: int = 1,
    moe_dp_chunk: int | None = None,
    request_attention: bool = True,
    overlap: str = "none",
    dbo_threshold: int | str = DBO_DECODE_TOKEN_THRESHOLD,
    step_indexer: bool = False,
    step_keys: bool = False,
    verify_attention: str = "window",
    eager_us_per_layer: float = EAGER_US_PER_LAYER,
    block_pool: dict | None = None,
    attention_kernels: str | None = None,
) -> Profile:
    """Build the profile (see the module doc). `table`: one kernel table or several in order of
    preference. `table_error`: the measured error of the (first) table against our own
    measurements on comparable hardware, carried into provenance. `zero_ops`: op kinds priced at
    0 (e.g. comm, for a one-GPU shard check). `layer_records`: whole-layer measurements the
    per-layer glue is fitted on (see LayerGlue). `moe_dp_chunk`: tokens per rank per MoE chunk on
    data-parallel topologies (None: vLLM's default, 256; 0: one pass, as our shard executor runs).
    `request_attention`: add the format-3 per-request attention table (dsim.cost module doc).
    `verify_attention`: "window" (the kernel tables' q-token records) or "tokens" (each verify token
    as a one-token decode, flattened_verify_attention). `step_indexer`: price V4's lightning
    indexer as our shard executor runs it, every token of the step scored over the step's longest context (format 4; vLLM's kernels score each request over
    its own context, so engine profiles leave it out). `step_keys`: price the V4 attention cores'
    key lists as our shard executor runs them, every token's as long as the step's longest, split
    by the step's own tokens (format 4 step_keys; needs step_indexer). `eager_us_per_layer`: what each
    layer adds to a step above the capture limit, run without CUDA graphs (0 for an executor that
    captures every step, as our shard executor does). `attention_kernels`: a published attention
    kernel source asked first for the attention cores (dsim.profiling.attention_published: e.g.
    flashmla-published, DeepSeek's FlashMLA at its published rates, for a deployment that runs it)."""
    if not (0.0 <= float(eager_us_per_layer) < 1e6):
        raise InputError(f"--eager-us-per-layer: expected a finite value >= 0 (us), got {eager_us_per_layer!r}")
    roof = roofline or Roofline(hardware=hardware)
    attn_src = attention_source(attention_kernels, hardware)
    if attn_src is not None and "mla" not in model.attn_kinds:
        raise InputError(f"--attention-kernels {attention_kernels}: {model.name} has no MLA attention layers")
    pricer = Pricer(table, roof, frozenset(zero_ops), prefer, attn_src)
    tables = pricer.tables
    table = tables[0] if tables else None
    glue = fit_layer_glue(model, topo, hardware, pricer, layer_records, layer_source) if layer_records else LayerGlue()
    if max_capture is None:
        max_capture = 1024 if hardware == "b300" else 512  # vLLM: 1024 on data-center Blackwell
    caps = vllm_capture_sizes(max_capture)
    limit = caps[-1]
    fq = max(1, int(forward_q))
    chunk = (VLLM_MOE_DP_CHUNK if moe_dp_chunk is None else max(0, int(moe_dp_chunk))) if topo.attn_dp > 1 else 0
    tokens = forward_sizes(caps, chunk)
    fwd = np.array(
        [
            forward_ms(
                model, topo, hardware, n, pricer, limit, glue=glue, q=fq, moe_chunk=chunk, eager_us=eager_us_per_layer
            )
            for n in tokens
        ]
    )
    overlap_note = None
    if overlap != "none":
        fwd, overlap_note = overlapped_forward(
            model,
            topo,
            hardware,
            tokens,
            fwd,
            pricer,
            limit,
            glue,
            fq,
            dbo_threshold,
            moe_chunk=chunk,
            decode_tokens_max=max(limit, max_num_seqs * fq) if request_attention else None,
            eager_us=eager_us_per_layer,
        )
    # KV slope: attention cores of SLOPE_BATCH requests of fq query tokens at two contexts, per KV token
    lo = attention_cores_ms(model, topo, hardware, pricer, phase="decode", batch=SLOPE_BATCH, q=fq, kv=KV_LO)
    hi = attention_cores_ms(model, topo, hardware, pricer, phase="decode", batch=SLOPE_BATCH, q=fq, kv=KV_HI)
    slope_ms_per_tok = max(0.0, (hi - lo) / (SLOPE_BATCH * (KV_HI - KV_LO)))
    # the table was priced at KV_LO context per request: take that context's share out (zero-context table)
    reqs = np.array([-(-n // max(1, min(fq, n))) for n in tokens])
    fwd = np.maximum(fwd - slope_ms_per_tok * reqs * KV_LO, 1e-3)
    fwd_lift = np.maximum.accumulate(fwd) - fwd  # what the non-decreasing table adds above a size's own price
    fwd = fwd + fwd_lift
    excess = prefill_excess(model, topo, hardware, pricer, slope_ms_per_tok)
    last_slope = (fwd[-1] - fwd[-2]) / (tokens[-1] - tokens[-2]) * 1000
    draft = draft_tables(model, topo, hardware, pricer, glue, draft_block, chunk, verify_attention == "tokens")
    keys_term = None
    table_pricer = None
    if step_keys:
        if not (step_indexer and request_attention) or pricer.table is None:
            raise InputError("--step-keys: needs a kernel table, --step-indexer and the per-request attention table")
        keys_term, rule = step_keys_term(
            model, topo, hardware, pricer, step_indexer_ms_per_mcell(model, topo, hardware, pricer)
        )
        free = without_split_combine(pricer.table, model, topo, rule, keys_term.combine_ms_per_work)
        table_pricer = Pricer([free] + pricer.tables[1:], roof, frozenset(zero_ops), prefer, attn_src)
    req_attn = (
        request_attention_table(model, topo, hardware, pricer, tokens, fq, slope_ms_per_tok, table_pricer)
        if request_attention
        else None
    )
    if req_attn is not None:
        req_attn = dataclasses.replace(req_attn, forward_share_ms=lifted_share(req_attn.forward_share_ms, fwd_lift))
    if verify_attention not in VERIFY_ATTENTION:
        raise InputError(f"--verify-attention {verify_attention!r}: expected one of {', '.join(VERIFY_ATTENTION)}")
    if verify_attention == "tokens":
        if req_attn is None:
            raise InputError("--verify-attention tokens: needs the per-request attention table (format 3)")
        req_attn = flattened_verify_attention(model, topo, hardware, pricer, req_attn)
    if step_indexer:
        if req_attn is None or not any(r == 4 for r in model.compress_ratios):
            raise InputError("--step-indexer: needs the per-request attention table and a model with an indexer (V4)")
        req_attn = dataclasses.replace(
            req_attn,
            indexer_ratio=4,
            indexer_ms_per_mcell=step_indexer_ms_per_mcell(model, topo, hardware, pricer),
            step_keys=keys_term,
        )
    if block_pool is not None:
        req_attn = with_block_pool(model, req_attn, block_pool)
    prefill = fit_prefill_terms(excess, req_attn if step_keys else None, last_slope)
    kv_gib, mem = kv_capacity(model, topo, hardware, max_num_seqs)
    hw = HARDWARE[hardware]
    if table is not None:
        # kernel times measured: by us (a measured profile) or read from published silicon tables (a
        # silicon-table profile), after the table asked first
        tk = table.provenance.get("kind")
        kind = tk if tk in ("measured", "silicon-table") else "analytical"
        src = (
            f"kernel table {table.name} ({table.provenance.get('kind')}: {table.provenance.get('method', '')}; "
            f"{table.provenance.get('engine', '')} {table.provenance.get('engine_version', '')})"
        )
        if len(tables) > 1:
            src += "; where it has no record: " + ", ".join(t.name for t in tables[1:])
        src += f"; lookups per table {dict(sorted(pricer.by_table.items()))}"
        if prefer:
            src += "; " + ", ".join(f"{op} from {name} first" for op, name in sorted(prefer.items()))
        if zero_ops:
            src += f"; {', '.join(sorted(zero_ops))} priced at 0 (one-GPU shard check)"
        if pricer.moe_as_gemm:
            src += (
                f"; {pricer.moe_as_gemm} routed-expert lookups of a few-expert EP rank priced as its experts' "
                "gate+up and down GEMMs (no moe record for the group in the tables)"
            )
        if pricer.grouped_as_single:
            src += (
                f"; {sum(pricer.grouped_as_single.values())} batched-GEMM lookups priced as the single GEMM of "
                "the same FLOPs and bytes (no batched record in the tables)"
            )
    else:
        kind, src = "analytical", "roofline only (no kernel table)"
    if attn_src is not None:
        src = (
            f"decode attention cores from {attn_src.name} ({attn_src.provenance['method']}; "
            f"{attn_src.provenance['source']}), their projections as their own GEMMs; the rest from " + src
        )
    fell = sum(pricer.fallback.values())
    tot = fell + sum(pricer.priced.values())
    method = (
        f"composed per kernel op from {src}; {fell} of {tot} op lookups fell back to the roofline "
        f"({', '.join(sorted(pricer.fallback)) or 'none'}); {topo.describe()}"
    )
    prov = dict(
        kind=kind,
        hardware=f"{topo.gpus} x {hw['name']}",
        gpus_per_replica=topo.gpus_per_replica,
        model=model.name,
        engine="vLLM-like (CUDA graphs at vLLM's capture sizes, chunked prefill)",
        engine_version="n/a",
        date=str(_dt.date.today()),
        method=method,
        command=command
        or f"dsim profile compose profile --model {model.name} --topology {topo.name} --hardware {hardware}"
        + (f" --kernels {table.name}" if table else ""),
        topology=dict(name=topo.name, gpus_per_node=topo.gpus, attn_tp=topo.attn_tp, attn_dp=topo.attn_dp, ep=topo.ep),
        model_source=model.source,
        hardware_source=hw["source"],
        assumptions=dict(
            expert_dtype=served_dtypes(model, hardware)[1],
            dense_dtype="fp8 block-scaled",
            lockstep="DP ranks step together with similar batches; experts wait for the slowest EP rank "
            "(uniform top-k routing, EPLB-balanced)"
            if topo.attn_dp > 1
            else "TP ranks hold the same tokens; experts wait for the slowest EP rank",
            **(
                dict(
                    redundant_experts=f"{physical_experts(model, topo) - model.experts} redundant routed experts so "
                    f"that {model.experts} divide over EP{topo.ep} ({physical_experts(model, topo) // topo.ep} per "
                    "GPU; DeepSeek's EP144 decode layout, open-infra-index day 6), routing uniform over the copies"
                )
                if physical_experts(model, topo) != model.experts
                else {}
            ),
            graph_gap_us_per_layer=GRAPH_GAP_US_PER_LAYER,
            eager_us_per_layer=eager_us_per_layer,
            activation_reserve_gb=ACTIVATION_RESERVE_GB,
            gpu_memory_utilization=MEM_UTIL,
            kv_layout="V4: compressed entries FP8 + bf16 rope, indexer keys FP8; MLA: bf16 latent",
            max_num_seqs_windows_reserved=max_num_seqs,
            **(
                dict(
                    step_indexer="the lightning indexer scores every token of a step over the step's longest "
                    "context (our shard executor; vLLM's kernels score each request over its own): "
                    "request_attention.step_indexer prices the extra logits cells (format 4)"
                )
                if step_indexer
                else {}
            ),
            **(
                dict(
                    step_keys="every token's key lists (csa top-k selection, hca compressed entries, window) as long "
                    "as the step's longest, split-K decided by the step's own tokens (our shard executor, "
                    "validator/gpu/moe_ops.py plan_work): request_attention.step_keys prices the padded key cells "
                    "and the split's combine; the per-request table is priced without any combine (format 4)"
                )
                if step_keys
                else {}
            ),
            draft_block=draft_block,
            **(
                dict(
                    verify_attention="each verify token priced as a one-token decode of its request's context "
                    "(DeepSeek's V4 kernels process a step's tokens as independent elements, DSpark paper "
                    "Sec. 5.3); an upper bound on a kernel that reads a request's shared keys once"
                )
                if verify_attention == "tokens"
                else {}
            ),
            forward_table=f"steps priced as requests of {max(1, int(forward_q))} query token(s) each"
            + (
                "; decode/verify attention priced per request from request_attention (format 3)"
                if request_attention
                else ""
            ),
            moe_dp_chunk=(
                f"the MoE block (experts, dispatch, combine) in chunks of {chunk} tokens per DP rank, as vLLM's "
                "chunking MoE runner with the DeepEP low-latency kernels (VLLM_MOE_DP_CHUNK_SIZE)"
                if chunk
                else "one MoE pass per step"
            ),
            overlap=overlap_note or "none: every op of a step in sequence (all-to-all exposed)",
            roofline=roof.provenance["method"],
        ),
        memory_per_gpu_gb=mem,
        prefill_fit=prefill.fit,
    )
    if table is not None:
        prov["kernel_table"] = dict(
            name=table.name, file=table.source_path.split("profiles/")[-1], provenance=table.provenance
        )
        if len(tables) > 1:
            prov["kernel_table_fallbacks"] = [dict(name=t.name, provenance=t.provenance) for t in tables[1:]]
    if attn_src is not None:
        prov["attention_kernels"] = dict(name=attn_src.name, **attn_src.provenance)
    if glue.fit:
        prov["layer_glue"] = glue.fit
    if table_error:
        prov["kernel_table_error"] = table_error
    guarded = [(t.name, t.provenance["table_guard"]) for t in tables if t.provenance.get("table_guard")]
    if guarded:  # kernel_aic.moe_guard: silicon-table records read past their range or implausibly
        prov["assumptions"]["table_guard"] = (
            "; ".join(
                f"kernel table {n}: {g['records']} moe records at ep {g['eps']} guarded, priced by "
                + ", ".join(f"{k} ({v})" for k, v in g["priced_by"].items())
                for n, g in guarded
            )
            + f" (fallback order: {guarded[0][1]['order']})"
        )
    return Profile(
        name=name or f"{model.name}-{hardware}-{topo.name}",
        provenance=prov,
        kv_cache_gib=round(float(kv_gib), 2),
        kv_bytes_per_token=float(model.kv_bytes_per_token()),
        cpu_overhead_ms=cpu_overhead_ms,
        capture_sizes=tuple(caps),
        forward=Table(np.array(tokens, dtype=float), fwd),
        kv_ms_per_ktok=float(slope_ms_per_tok * 1000),
        draft=draft,
        prefill_v2=prefill,
        format_version=profile_format(req_attn),
        request_attention=req_attn,
    )


def required_ops(
    model: MoEModel,
    topo: Topology,
    hardware: str,
    max_capture: int | None = None,
    draft_block: int = 7,
    forward_q: int = 1,
    moe_dp_chunk: int | None = None,
    overlap: str = "none",
    new_points: bool = True,
) -> list[dict]:
    """Every op record compose_profile looks up (without 'ms'), deduplicated, sorted; of the per-request
    attention table, its points on the kernel-op grid (the rest interpolate between them). new_points=False:
    without the capture limit + 1 forward point (unless a MoE chunk boundary puts it there) and the
    fixed-length drafter records, which tables built before them lack (the composer interpolates them)."""
    if max_capture is None:
        max_capture = 1024 if hardware == "b300" else 512
    caps = vllm_capture_sizes(max_capture)
    ops: list[Op] = []
    fq = max(1, int(forward_q))
    chunk = (VLLM_MOE_DP_CHUNK if moe_dp_chunk is None else max(0, int(moe_dp_chunk))) if topo.attn_dp > 1 else 0
    tokens = forward_sizes(caps, chunk)
    if not new_points and not (chunk and caps[-1] % chunk == 0):
        tokens = [n for n in tokens if n != caps[-1] + 1]
    for n in tokens:
        qq = min(fq, n)
        ops += step_ops(model, topo, hardware, n, q=qq, batch=-(-n // qq))
        if chunk:
            ops += step_ops(model, topo, hardware, n, q=qq, batch=-(-n // qq), moe_chunk=chunk)
        if overlap != "none" and n >= 2:  # the two micro-batches' layers
            for h in {-(-n // 2), n // 2}:
                qh = min(fq, h)
                ops += layer_ops(model, topo, hardware, h, q=qh, batch=-(-h // qh), moe_chunk=chunk)
    # the per-request attention table at the fixed grid's points (batch powers of two, REQ_CTX_GRID);
    # its other points interpolate along the attention series a table holds there
    for B in (b for b in vllm_capture_sizes(REQ_BATCH_MAX) if b & (b - 1) == 0):
        for q in REQ_Q:
            for c in REQ_CTX_GRID:
                ops += [o for o in layer_ops(model, topo, hardware, B * q, batch=B, q=q, kv=c) if o.part == "attn_core"]
    for kv in (KV_LO, KV_HI):
        ops += [
            o
            for o in layer_ops(model, topo, hardware, SLOPE_BATCH * fq, batch=SLOPE_BATCH, q=fq, kv=kv)
            if o.part == "attn_core"
        ]
    for qn in PREFILL_Q:
        for c in PREFILL_KV:
            ops += [
                o
                for o in layer_ops(model, topo, hardware, qn, phase="prefill", batch=1, q=qn, kv=c)
                if o.part == "attn_core"
            ]
    for m in (8192, 16384):
        ops.append(kernel_op("lm_head", 1, op="gemm", dtype="bf16", m=m, n=model.vocab // topo.attn_tp, k=model.hidden))
    for kind in ("mtp", "eagle3", "dspark"):
        # the kernel collections' grid (powers of two); the drafter's other sizes and its flattened
        # block read the tables between these records, as every lookup off the grid does
        for R in DRAFT_COLLECTED_REQUESTS:
            ops += draft_ops(model, topo, hardware, kind, R, draft_block, chunk)
    for kb in range(1, draft_block) if new_points else ():  # the fixed lengths' drafter tables (dspark@K)
        for R in DRAFT_REQUESTS:
            ops += draft_ops(model, topo, hardware, "dspark", R, kb, chunk)
    seen = {op.record for op in ops}
    return sorted((dict(r) for r in seen), key=lambda r: json.dumps(r, sort_keys=True))
