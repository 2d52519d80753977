"""AIConfigurator's own end-to-end step estimates at the public anchor points (`dsim profile aic anchors`)."""

from __future__ import annotations

from dataclasses import dataclass

from dsim.profiling.aic_source import FALLBACK_BACKEND, MODELS, aic_package, model_config

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
    aic_package()
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
