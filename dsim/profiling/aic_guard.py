"""The guard on AIC's moe rows read past their measured range or implausibly (moe_guard, in the order
MOE_GUARD_ORDER) and its summary in a kernel table's provenance (table_guard)."""

from __future__ import annotations

from typing import Any, Protocol

from dsim.errors import InputError
from dsim.profiling.aic_source import DATASHEET, NoTable, record_ints


class MoeTables(Protocol):
    """What the guard reads of dsim.profiling.aic_pricing.AicTables (which calls the guard: no import back)."""

    system: str

    def gemm(self, r: dict) -> Any: ...

    def _moe_table(
        self, t: int, h: int, inter: int, topk: int, e: int, ep: int, modes: tuple, table_dist: str
    ) -> tuple[Any, int, int]: ...


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


def moe_as_gemms(tables: MoeTables, rec: dict) -> float | None:
    """The routed experts of one EP rank priced per GPU, without the global routing AIC's moe rows
    carry: its E / ep experts, each a gate+up GEMM [rows, hidden] x [hidden, 2 inter] and a down
    GEMM [rows, inter] x [inter, hidden] at rows = tokens x top-k / experts (uniform routing; the
    composer's lockstep factor adds the slowest rank's excess), from the GEMM table, plus their
    SwiGLU, routing-weight and permute traffic at the roofline (as pricer.Pricer prices a one-expert
    rank). None where a GEMM has no row or the system no datasheet."""
    from dsim.profiling.kernel_tables import Roofline

    t, h, inter, topk, e, ep = record_ints(rec, "tokens", "hidden", "inter", "topk", "experts", "ep")
    hw = DATASHEET.get(tables.system)
    if hw is None or ep == 0 or e % ep:
        return None
    local, rows = e // ep, max(1, round(t * topk / e))
    try:
        g = sum(tables.gemm(dict(dtype=rec["dtype"], m=rows, n=n_, k=k_)).ms for n_, k_ in ((2 * inter, h), (h, inter)))
    except (NoTable, InputError):
        return None
    ew = dict(op="elementwise", bytes=int(local * rows * (2 * inter * 2 + inter * 2 + 4 * h * 2)))
    return local * g + Roofline(hardware=hw).ms(ew)


def moe_guard(
    tables: MoeTables, rec: dict, ms: float, measured: tuple[int, int], modes: tuple, table_dist: str
) -> dict | None:
    """None where AIC's price of a moe record is read inside its measured tokens and is not above
    MOE_GUARD_RATIO x the same routed rows per GPU at EP MOE_REF_EP; else what was found, the
    fallback prices and the one used (MOE_GUARD_ORDER): {"reasons", "table_ms", "per_gpu_ms",
    "bound_ms", "roofline_ms", "used", "ms"}."""
    t, h, inter, topk, e, ep = record_ints(rec, "tokens", "hidden", "inter", "topk", "experts", "ep")
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
        except NoTable:
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
