"""The step-wide attention terms of our shard executor (validator/gpu/moe_ops.py) in a composed profile:
the lightning indexer scoring every token over the step's longest context (format 4 step_indexer), key
lists as long as the step's longest, split-K by the step's own tokens (format 4 step_keys), and pooling
completed compressed-cache blocks, fitted on replays (format 5 block_pool). vLLM's kernels run none of
them: engine profiles leave them out.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from dsim.cost import BlockPool, BlockPoolKind, RequestAttention, priced_from_q, vllm_capture_sizes
from dsim.errors import InputError
from dsim.profiling.kernel_ops import attn_record, kernel_op
from dsim.profiling.kernel_tables import KernelTable
from dsim.profiling.models import MoEModel
from dsim.profiling.pricer import Pricer
from dsim.profiling.request_attention import REQ_BATCH_MAX
from dsim.profiling.topology import Topology

STEP_INDEXER_Q = (512, 2048, 8192)  # prompt-chunk tokens whose indexer slope prices a logits cell
STEP_INDEXER_KV = (32768, 131072)  # contexts the slope is taken between (top-k saturated: key lists fixed)


def step_indexer_ms_per_mcell(model: MoEModel, topo: Topology, hardware: str, pricer: Pricer) -> float:
    """ms per million lightning-indexer logits cells (token x compressed key), all csa layers: the
    growth of the csa attention core with context between STEP_INDEXER_KV, where the top-k is
    saturated and the attended key lists stay fixed, so only the indexer's logits and their top-k
    grow; taken on prompt chunks (thousands of tokens, the rows a longest-context indexer widens
    most), the median over STEP_INDEXER_Q. Format 4 step_indexer (dsim.cost module doc)."""
    ratio = 4
    n_csa = sum(1 for r in model.compress_ratios[: model.layers] if r == ratio)
    lo, hi = STEP_INDEXER_KV
    slopes = []
    for qn in STEP_INDEXER_Q:
        t = [
            pricer.ms(kernel_op("attn_core", 1, **attn_record(model, topo, "v4_csa", "prefill", 1, qn, kv)))
            for kv in (lo, hi)
        ]
        slopes.append(max(0.0, (t[1] - t[0]) / (qn * (hi - lo) / ratio / 1e6)))
    return n_csa * float(np.median(slopes))


#: the V4 attention kinds an executor's step_keys term prices: (compression ratio, key cap source)
_STEP_KEY_KINDS = ("v4_csa", "v4_hca", "v4_swa")
#: contexts (q = 1) between which a kind's key lists grow at a large batch (no split): csa 128 -> 512
#: selected entries (top-k filling), hca 64 -> 512 compressed entries
STEP_KEYS_KV = {"v4_csa": (512, 2048), "v4_hca": (8192, 65536)}


def _executor_split_rule(table: KernelTable, model: MoEModel) -> tuple[int, int, int]:
    """(programs, block, min_chunk) of our shard executor's split-K rule (validator/gpu/moe_ops.py
    plan_work) from the kernel table's recorded launch tuning: key lists are split when the step's
    row blocks x value blocks fill fewer than 2 programs per SM, into chunks of
    max(2 x block_n, ceil(N k / programs / block_n) x block_n) keys."""
    gpu = table.provenance.get("gpu") or {}
    tune = (gpu.get("tune") or {}).get("attn")
    if not tune or not gpu.get("sms"):
        raise InputError(
            f"--step-keys: kernel table {table.name} records no attention launch tuning (provenance.gpu.tune.attn, sms)"
        )
    dvb = max(1, model.head_dim // min(int(tune["block_dv"]), model.head_dim))
    return -(-2 * int(gpu["sms"]) // dvb), int(tune["block_n"]), 2 * int(tune["block_n"])


def _key_width(model: MoEModel, kind: str, ctx_plus_q: int) -> int:
    """Entries a token of `kind` selects beyond its window, over ctx + q tokens (format 4 step_keys)."""
    if kind == "v4_csa":
        return min(model.index_topk, ctx_plus_q // 4)
    if kind == "v4_hca":
        return ctx_plus_q // 128
    return 0


def _record_work(model: MoEModel, rec: dict, rule: tuple[int, int, int]) -> int:
    """Split-K work items of one decode attention-core record (B equal requests of q tokens over kv)
    as our shard executor runs it (0: not split)."""
    from dsim.cost import split_work

    k = model.sliding_window + _key_width(model, rec["kind"], int(rec["kv"]) + int(rec["q"]))
    return int(split_work(int(rec["batch"]) * int(rec["q"]), k, *rule))


def split_combine_ms_per_work(model: MoEModel, topo: Topology, table: KernelTable, rule: tuple[int, int, int]) -> float:
    """ms per split-K work item of the executor's logsumexp combine, from the table's own decode
    attention-core records: adjacent contexts of one (kind, batch, q) series, one split and one
    not, whose key lists differ by under 10 %: (split - unsplit) / the split's work items, the
    median over such pairs."""
    heads = model.heads // topo.attn_tp
    series: dict = {}
    for r in table.records:
        if r["op"] == "attn" and r.get("phase") == "decode" and r.get("kind") in _STEP_KEY_KINDS:
            if r.get("heads") == heads:
                series.setdefault((r["kind"], r["batch"], r["q"]), []).append(r)
    vals = []
    for (kind, _, q), rs in series.items():
        rs.sort(key=lambda r: r["kv"])
        for a, b in zip(rs, rs[1:]):
            wa, wb = _record_work(model, a, rule), _record_work(model, b, rule)
            if bool(wa) == bool(wb):
                continue
            ka, kb = (model.sliding_window + _key_width(model, kind, int(r["kv"]) + q) for r in (a, b))
            if abs(ka - kb) > 0.1 * min(ka, kb):
                continue
            sp, un = (a, b) if wa else (b, a)
            vals.append((float(sp["ms"]) - float(un["ms"])) / max(wa, wb))
    if not vals:
        raise InputError(
            f"--step-keys: kernel table {table.name} has no pair of adjacent-context attention records, one split "
            f"and one not, at {heads} heads (needed for the split-K combine's cost)"
        )
    return max(0.0, float(np.median(vals)))


def without_split_combine(table: KernelTable, model: MoEModel, topo: Topology, rule, per_work: float) -> KernelTable:
    """The table with each decode V4 attention-core record's split-K combine (per_work x its work
    items, as the executor runs the record's shape) taken out: the per-request table of a step_keys
    profile is priced from these, the step's own combine added by the cost model."""
    heads = model.heads // topo.attn_tp
    recs = []
    for r in table.records:
        if r["op"] == "attn" and r.get("phase") == "decode" and r.get("kind") in _STEP_KEY_KINDS:
            if r.get("heads") == heads:
                w = _record_work(model, r, rule)
                if w:
                    r = dict(r, ms=max(1e-4, float(r["ms"]) - per_work * w))
        recs.append(r)
    return KernelTable(table.name, table.provenance, recs, table.source_path)


def step_keys_term(model: MoEModel, topo: Topology, hardware: str, pricer: Pricer, indexer_ms_per_mcell: float):
    """The format-4 step_keys term of our shard executor (dsim.cost module doc): the split-K rule
    from the table's launch tuning, the combine per work item and each kind's ms per padded key
    cell from the table's attention-core records: the decode core's growth between STEP_KEYS_KV
    at the largest batch (one query token each, not split) per key cell, less the csa indexer's
    own growth (indexer_ms_per_mcell, all csa layers) over the same cells."""
    from dsim.cost import StepKeyKind, StepKeys

    table = pricer.table
    if table is None or model.family != "deepseek_v4":
        raise InputError("--step-keys: needs a kernel table and a V4 model")
    rule = _executor_split_rule(table, model)
    per_work = split_combine_ms_per_work(model, topo, table, rule)
    n_kind = {k: sum(1 for a in model.attn_kinds if a == k) for k in _STEP_KEY_KINDS}
    big = max(vllm_capture_sizes(REQ_BATCH_MAX))
    if big < rule[0]:
        raise InputError(f"--step-keys: the largest batch {big} splits its key lists (fewer than {rule[0]} tokens)")
    kinds = []
    for kind in _STEP_KEY_KINDS:
        if not n_kind[kind]:
            continue
        coef = 0.0
        if kind in STEP_KEYS_KV:
            lo, hi = STEP_KEYS_KV[kind]
            t = [
                pricer.ms(kernel_op("attn_core", 1, **attn_record(model, topo, kind, "decode", big, 1, kv)))
                for kv in (lo, hi)
            ]
            cells = big * (_key_width(model, kind, hi + 1) - _key_width(model, kind, lo + 1)) / 1e6
            idx = 0.0
            if kind == "v4_csa" and n_kind[kind]:
                idx = indexer_ms_per_mcell / n_kind[kind] * big * ((hi + 1) // 4 - (lo + 1) // 4) / 1e6
            coef = n_kind[kind] * max(0.0, (t[1] - t[0] - idx) / cells)
        kinds.append(
            StepKeyKind(
                layers=n_kind[kind],
                ratio={"v4_csa": 4, "v4_hca": 128}.get(kind, 0),
                cap=model.index_topk if kind == "v4_csa" else 0,
                window=model.sliding_window,
                ms_per_mcell=round(coef, 6),
            )
        )
    return StepKeys(rule[0], rule[1], rule[2], round(per_work, 8), tuple(kinds)), rule


def with_block_pool(model: MoEModel, req_attn: RequestAttention | None, fit: dict) -> RequestAttention:
    """The per-request table with a format-5 block_pool term from a fit (``python3 -m
    validator.gpu.shard_repredict fit-pool``: kinds of ratio, layers, ms_per_step, ms_per_block,
    priced_from_q). Every ratio must be one of the model's compressed kinds, and its priced_from_q
    what this table's grid gives (the fit applied the term where this table does not price it)."""
    if req_attn is None:
        raise InputError("--block-pool: needs the per-request attention table (format 3)")
    kinds = []
    for i, k in enumerate(fit.get("kinds") or []):
        try:
            ratio, layers = int(k["ratio"]), int(k["layers"])
            per_step, per_block, from_q = float(k["ms_per_step"]), float(k["ms_per_block"]), int(k["priced_from_q"])
        except (KeyError, TypeError, ValueError):
            raise InputError(
                f"--block-pool: kinds[{i}]: needs ratio, layers, ms_per_step, ms_per_block, priced_from_q"
            ) from None
        if ratio not in model.compress_ratios or layers != model.compress_ratios.count(ratio):
            raise InputError(f"--block-pool: kinds[{i}]: ratio {ratio} x {layers} layers is not in {model.name}")
        want = priced_from_q(ratio, req_attn.q, req_attn.ctx)
        if from_q != want:
            raise InputError(
                f"--block-pool: kinds[{i}]: priced_from_q {from_q}, but this table's records complete ratio-{ratio} "
                f"blocks from q = {want} (0: never)"
            )
        if per_step < 0 or per_block < 0:
            raise InputError(f"--block-pool: kinds[{i}]: a negative cost")
        kinds.append(BlockPoolKind(ratio, layers, per_step, per_block, from_q))
    if not kinds:
        raise InputError("--block-pool: no kinds")
    src = str(fit.get("source") or "")
    return dataclasses.replace(req_attn, block_pool=BlockPool(tuple(kinds), src))


def block_pool_source(fit: dict, path: str) -> str:
    """The provenance line of a block_pool fit file: what was replayed, and how it was fitted."""
    return (
        f"{path}: fitted by validator.gpu.shard_repredict fit-pool (least absolute deviations, a level per design "
        f"set) on {len(fit.get('steps') or [])} steps of {fit.get('design', '?')} replayed in {fit.get('replay', '?')}"
    )
