"""Pricing kernel ops: the kernel tables a composition reads (a name or path, ``NAME@HW`` carried to
other hardware, a backend's shipped silicon table), the ``Pricer`` that asks them in order of preference
and the roofline for what they lack, and the routed experts' wait for the slowest EP rank
(``moe_lockstep_factor``: expected max over ranks of a roofline load proxy under uniform top-k routing,
Monte Carlo with a fixed seed; the router's systematic skew is assumed removed by EPLB-style redundant
experts), which ``priced_total`` applies.

Wide expert parallelism (EP = the routed experts, one expert per GPU, the DeepSeek-V3 report's
decode layout): a rank's experts are that expert's dense GEMMs (``Pricer._one_expert_ms``) and the
all-to-all runs over the inter-node network (``scope: inter_node`` records; dsim.profiling.deepep_tables).
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from dsim.errors import InputError
from dsim.profiling.attention_published import PublishedAttention
from dsim.profiling.kernel_ops import Op, included_part_records
from dsim.profiling.kernel_tables import (
    HARDWARE,
    MATH_DTYPE,
    WEIGHT_BYTES,
    KernelTable,
    Roofline,
    carried_table,
    load_kernel_table,
)
from dsim.profiling.models import MoEModel
from dsim.profiling.topology import Topology, physical_experts

if TYPE_CHECKING:
    from collections.abc import Iterable


def load_table_spec(spec: str) -> KernelTable:
    """A kernel table by name or path, or ``NAME@HW``: that table carried to hardware HW
    (dsim.profiling.kernel_tables.carried_table, an attention module's included projections priced with it), from the
    hardware its name starts with (h200-aic-vllm@h800: AIC's H200 vLLM table on an H800)."""
    name, at, hw = spec.rpartition("@")
    if not at or "/" in hw or hw.endswith((".json", ".gz")):  # a plain name or path (a path may hold an @)
        return load_kernel_table(spec)
    src = Path(name).name.split("-")[0].lower()
    if src not in HARDWARE or hw.lower() not in HARDWARE:
        raise InputError(
            f"{spec!r}: NAME@HW needs a table named <hardware>-... and HW one of {', '.join(sorted(HARDWARE))}"
        )
    return _carried(name, src, hw.lower())


@lru_cache(maxsize=8)
def _carried(name: str, src: str, hw: str) -> KernelTable:
    # (a table is read-only once built: one carry per table and GPU in a process)
    return carried_table(load_kernel_table(name), src, hw, included_part_records)


class Pricer:
    """Prices ops from kernel tables in order of preference (the first that answers), falling back
    to the roofline; counts what each source priced. `zero_ops`: op kinds priced at 0 (a one-GPU
    shard check excludes communication). Parts that the preferred attention table's records
    include (e.g. projections inside an attention module) are not priced again."""

    def __init__(
        self,
        table: KernelTable | list[KernelTable] | None,
        roofline: Roofline,
        zero_ops: frozenset = frozenset(),
        prefer: dict | None = None,
        attention: PublishedAttention | None = None,
    ):
        self.tables = [t for t in (table if isinstance(table, list) else [table]) if t is not None]
        # attention: a source asked first for attention cores (FlashMLA's published rates); the
        # projections an attention-module table includes are then priced as their own GEMMs
        self.attention = attention
        # prefer: op kind -> table name asked first for that kind (e.g. mhc from an engine's table)
        self.order = {
            op: [t for t in self.tables if t.name == name] + [t for t in self.tables if t.name != name]
            for op, name in (prefer or {}).items()
        }
        for op, name in (prefer or {}).items():
            if name not in {t.name for t in self.tables}:
                raise InputError(f"--prefer {op}={name}: {name} is not one of the kernel tables given")
        self.table = self.tables[0] if self.tables else None
        self.roofline = roofline
        self.zero_ops = set(zero_ops)
        attn_table = next((t for t in self.tables if any(r["op"] == "attn" for r in t.records)), None)
        self.skip = attn_table.includes("attn") | attn_table.includes("moe") if attn_table else set()
        if attention is not None and attn_table is not None:
            self.skip = attn_table.includes("moe")
        self.priced: dict = {}
        self.fallback: dict = {}
        self.by_table: dict = {}
        self.grouped_as_single: dict = {}
        self.moe_as_gemm = 0  # moe lookups priced as one expert's GEMMs (_one_expert_ms)

    def ms(self, op: Op) -> float:
        if op.part in self.skip:
            return 0.0
        rec = op.rec
        if rec["op"] in self.zero_ops:
            return 0.0
        if self.attention is not None and rec["op"] == "attn":
            return self._attention_ms(rec)
        return self._rec_ms(rec)

    def _attention_ms(self, rec: dict) -> float:
        """An attention core with an attention source given: the source's price where it has one; else
        the tables' (an attention-module record less the parts it includes, priced as the composer
        prices them when they run as their own ops: the module's total is unchanged)."""
        assert self.attention is not None
        v = self.attention.ms(rec)
        if v is not None:
            self.by_table[self.attention.name] = self.by_table.get(self.attention.name, 0) + 1
            self.priced["attn"] = self.priced.get("attn", 0) + 1
            return float(v)
        t = self._rec_ms(rec)
        parts = included_part_records({**rec, "includes": self._table_includes(rec)})
        return max(0.0, t - sum(self._rec_ms(p) for p in parts))

    def _table_includes(self, rec: dict) -> list:
        """The parts the table record answering `rec` includes (those of the first table that answers)."""
        for tb in self.order.get(rec["op"], self.tables):
            if tb.ms(rec) is not None:
                return sorted(tb.includes(rec["op"]))
        return []

    def _rec_ms(self, rec: dict) -> float:
        v = self._lookup(rec)
        if v is None and rec["op"] == "gemm" and rec.get("groups", 1) > 1:
            # a table without batched-GEMM records: the single GEMM of the same FLOPs, weight and
            # activation bytes in one launch ([m, groups x k] x [groups x k, n]; only its output is
            # groups times smaller)
            eq = {k: v for k, v in rec.items() if k != "groups"}
            eq["k"] = int(rec["k"]) * int(rec["groups"])
            v = self._lookup(eq)
            if v is not None:
                self.grouped_as_single[rec["op"]] = self.grouped_as_single.get(rec["op"], 0) + 1
        if v is None and rec["op"] == "moe":
            v = self._one_expert_ms(rec)
        bucket = self.priced if v is not None else self.fallback
        bucket[rec["op"]] = bucket.get(rec["op"], 0) + 1
        if v is None:
            v = self.roofline.ms(rec)
        return float(v)

    def _one_expert_ms(self, rec: dict) -> float | None:
        """The routed experts of an EP rank holding ONE expert (EP = the routed experts; DeepSeek-V3
        report Sec. 3.4: in decoding each GPU hosts one routed expert) where no table has a moe record
        for the group: that expert's FFN is a dense gate+up GEMM [rows, hidden] x [hidden, 2 inter] and
        a down GEMM [rows, inter] x [inter, hidden] (the shapes of one shared expert), priced from the
        tables' GEMM records (the moe op's preferred table first), plus its SwiGLU, routing-weight and
        permute traffic as elementwise bytes. rows = tokens x topk / experts, the mean rank's (the
        lockstep factor adds the slowest rank's excess). A rank of several experts (E / P of them, wide EP:
        2 on DeepSeek's EP144) runs that pair once per expert its tokens reach (the mean number under
        uniform routing), as kernels_aic.moe_as_gemms re-prices AIC's rows per GPU. None where the experts do not divide over the ranks or a GEMM has no record."""
        T, H, inter, k, E, P = (int(rec[x]) for x in ("tokens", "hidden", "inter", "topk", "experts", "ep"))
        if E % P:
            return None
        # a rank of several experts runs those its tokens reach: the mean of them under uniform routing
        # (the lockstep factor adds the slowest rank's excess); one expert always runs (the slowest rank)
        local: float = E // P
        if local > 1:
            local = max(1.0, local * (1.0 - (1.0 - k / E) ** T))
        rows = max(1, round(T * k / (local * P)))
        order = self.order.get("moe", self.tables)
        parts = []
        for n_, k_ in ((2 * inter, H), (H, inter)):
            g = dict(op="gemm", dtype=rec["dtype"], m=rows, n=n_, k=k_)
            v = next((x for x in (t.ms(g) for t in order) if x is not None), None)
            if v is None:
                return None
            parts.append(v)
        ew = dict(op="elementwise", bytes=int(local * rows * (2 * inter * 2 + inter * 2 + 4 * H * 2)))
        v_ew = next((x for x in (t.ms(ew) for t in self.tables) if x is not None), None)
        self.moe_as_gemm += 1
        return float(local * sum(parts) + (v_ew if v_ew is not None else self.roofline.ms(ew)))

    def _lookup(self, rec: dict) -> float | None:
        for t in self.order.get(rec["op"], self.tables):
            v = t.ms(rec)
            if v is not None:
                self.by_table[t.name] = self.by_table.get(t.name, 0) + 1
                return v
        return None

    def total(self, ops: list[Op]) -> float:
        return sum(op.count * self.ms(op) for op in ops)


LOCKSTEP_SAMPLED_TOKENS = 16384
"""Group tokens up to which moe_lockstep_factor samples each token's experts; above, it draws the
per-expert counts directly (the same with-replacement law, O(experts) a trial). The slowest rank's
excess shrinks as 1/sqrt(rows): clamping the group at this size, as before, overstated it at EP256
from 64 tokens per rank on (1.15 for 1.07 at 256 tokens per rank)."""


@lru_cache(maxsize=4096)
def moe_lockstep_factor(
    tokens: int, topk: int, experts: int, ep: int, expert_bytes: float, row_flop_s: float, bw: float, trials: int = 64
) -> float:
    """E[max over EP ranks] / E[one rank] of a rank's expert time proxy under uniform top-k routing:
    max(distinct local experts x expert bytes / BW, rows x FLOPs per row / peak). A step waits for
    its slowest rank; at small batches the experts touched differ from rank to rank. Monte Carlo,
    fixed seed (deterministic); each token's k experts distinct."""
    if ep <= 1 or tokens <= 0:
        return 1.0
    rng = np.random.default_rng(12345 + tokens)
    local = experts // ep
    mx = mean = 0.0
    for _ in range(trials):
        if tokens <= 256:  # exact: k distinct experts per token
            choice = np.argpartition(rng.random((tokens, experts)), topk, axis=1)[:, :topk]
            counts = np.bincount(choice.ravel(), minlength=experts)
        elif tokens <= LOCKSTEP_SAMPLED_TOKENS:  # with replacement (the difference is k/E per token)
            choice = rng.integers(0, experts, size=(tokens, topk))
            counts = np.bincount(choice.ravel(), minlength=experts)
        else:  # the same law drawn as its counts: a multinomial of tokens x k over the experts
            counts = rng.multinomial(tokens * topk, np.full(experts, 1.0 / experts))
        counts = counts.reshape(ep, local)
        active = (counts > 0).sum(axis=1)
        rows = counts.sum(axis=1)
        proxy = np.maximum(active * expert_bytes / bw, rows * row_flop_s)
        mx += proxy.max()
        mean += proxy.mean()
    return float(mx / mean) if mean > 0 else 1.0


def _moe_factor(model: MoEModel, topo: Topology, hardware: str, op: Op, roof: Roofline) -> float:
    r = op.rec
    hw = HARDWARE[hardware]
    wb = WEIGHT_BYTES.get(r["dtype"], 2.0)
    peak = {"fp4": hw["fp4"] or hw["fp8"], "fp8": hw["fp8"]}.get(MATH_DTYPE.get(r["dtype"], "bf16"), hw["bf16"])
    T = int(r["tokens"])
    return moe_lockstep_factor(
        T,
        model.topk,
        physical_experts(model, topo),
        topo.ep,
        3.0 * model.hidden * model.moe_inter * wb,
        2.0 * 3 * model.hidden * model.moe_inter / (peak * roof.eff_flops),
        hw["bw"] * roof.eff_bw,
    )


def priced_total(model: MoEModel, topo: Topology, hardware: str, ops: Iterable[Op], pricer: Pricer) -> float:
    t = 0.0
    for op in ops:
        v = op.count * pricer.ms(op)
        if op.part == "moe_experts":
            v *= _moe_factor(model, topo, hardware, op, pricer.roofline)
        t += v
    return t


BACKENDS = ("vllm", "sglang", "trtllm")  # the serving engines whose kernels AIC's tables measured


def shipped_table_for(hardware: str, backend: str, topology: str) -> KernelTable:
    """The shipped silicon-table kernel table profiles/kernels/<hardware>-aic-<backend>.json.gz for a
    shipped topology; anything else is priced from AIC's tables on demand by
    dsim.profiling.aic_tables.compose_for (`dsim profile aic profile`, the aic extra), which sits
    above this module (it prices the composer's records)."""
    from dsim.profiling.kernel_tables import kernel_table_path

    if backend not in BACKENDS:
        raise InputError(f"--backend {backend!r}: one of {', '.join(BACKENDS)}")
    if hardware not in HARDWARE:
        raise InputError(f"--hardware {hardware!r}: one of {', '.join(sorted(HARDWARE))}")
    shipped = kernel_table_path(f"{hardware}-aic-{backend}")
    if shipped.is_file() and topology in ("dp8-ep8", "tp8-ep8"):
        return load_kernel_table(str(shipped))
    raise InputError(
        f"--backend {backend}: no shipped {hardware}-aic-{backend} table for {topology}; "
        f"`dsim profile aic profile --model MODEL --hardware {hardware} --backend {backend} "
        f"--topology {topology} --out FILE` prices it from AIC's tables on demand (pip install -e '.[aic]')"
    )
