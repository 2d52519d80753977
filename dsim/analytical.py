"""Analytical (roofline) step-cost profiles for hardware and models that were not measured.

Every profile made here is labelled ``provenance.kind: analytical``. Per step of n tokens on a
replica of g GPUs (tensor parallel):

    t_weights = weight bytes touched / g / (BW x eff_bw)
    t_flops   = 2 x active params x n / g / (peak x eff_flops)
    t_comm    = 2 x layers x (allreduce latency + n x hidden x 2 B / link BW)      (g > 1)
    F(n)      = max(t_weights, t_flops) + t_comm + layers x launch floor

MoE: the routed experts touched by n tokens with top-k routing over E experts are
E x (1 - (1 - k/E)^n) per layer (uniform routing), so weight bytes grow with the batch until
every expert is read once. KV read cost: kv bytes per token / (BW x eff_bw) per token.

Hardware figures (vendor datasheets): H200 SXM 4.8 TB/s HBM3e, 989 TFLOP/s dense bf16,
1979 TFLOP/s dense fp8, NVLink 900 GB/s; B300: 8 TB/s, 2250 TFLOP/s dense bf16 (fp8 4500),
NVLink 1800 GB/s. Efficiency factors are stated defaults until fitted on measured profiles.
"""
from __future__ import annotations

import datetime as _dt
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from dsim.cost import Profile, Table, vllm_capture_sizes

HARDWARE = {
    "H200": dict(name="NVIDIA H200 SXM", hbm_gib=141 * 1e9 / 2**30, bw=4.8e12, bf16=989e12, fp8=1979e12,
                 link=900e9, source="NVIDIA H200 datasheet"),
    "B300": dict(name="NVIDIA B300", hbm_gib=288 * 1e9 / 2**30, bw=8.0e12, bf16=2250e12, fp8=4500e12,
                 link=1800e9, source="NVIDIA Blackwell Ultra datasheet"),
}


@dataclass(frozen=True)
class Efficiency:
    bw: float = 0.75            # achieved fraction of HBM bandwidth on weight/KV reads
    flops: float = 0.6          # achieved fraction of dense matrix peak
    launch_us_per_layer: float = 12.0   # per-layer kernel floor inside a CUDA graph
    allreduce_us: float = 12.0  # one-shot all-reduce latency over NVLink
    source: str = "stated defaults (not fitted)"


def model_shape(cfg: dict) -> dict:
    """Parameter counts (total, active per token, dense part, expert size) from an HF config."""
    h = cfg["hidden_size"]
    L = cfg["num_hidden_layers"]
    V = cfg["vocab_size"]
    if "kv_lora_rank" in cfg:          # DeepSeek MLA
        nh = cfg["num_attention_heads"]
        qk = cfg["qk_nope_head_dim"] + cfg["qk_rope_head_dim"]
        attn = (h * cfg["q_lora_rank"] + cfg["q_lora_rank"] * nh * qk
                + h * (cfg["kv_lora_rank"] + cfg["qk_rope_head_dim"])
                + cfg["kv_lora_rank"] * nh * (cfg["qk_nope_head_dim"] + cfg["v_head_dim"])
                + nh * cfg["v_head_dim"] * h)
        kv_per_tok_layer = cfg["kv_lora_rank"] + cfg["qk_rope_head_dim"]   # latent, not per head
    else:
        nh = cfg["num_attention_heads"]
        nkv = cfg.get("num_key_value_heads", nh)
        hd = cfg.get("head_dim") or h // nh
        attn = h * nh * hd * 2 + h * nkv * hd * 2
        kv_per_tok_layer = 2 * nkv * hd
    E = cfg.get("n_routed_experts", 0)
    if E:
        dense_layers = cfg.get("first_k_dense_replace", 0)
        moe_layers = L - dense_layers
        expert = 3 * h * cfg["moe_intermediate_size"]
        shared = cfg.get("n_shared_experts", 0) * expert
        mlp_dense = 3 * h * cfg["intermediate_size"]
        dense = L * attn + dense_layers * mlp_dense + moe_layers * shared + 2 * V * h
        topk = cfg["num_experts_per_tok"]
    else:
        moe_layers, expert, topk = 0, 0, 0
        dense = L * (attn + 3 * h * cfg["intermediate_size"]) + 2 * V * h
    return dict(hidden=h, layers=L, dense=dense, moe_layers=moe_layers, experts=E, expert=expert,
                topk=topk, total=dense + moe_layers * E * expert,
                active=dense + moe_layers * topk * expert, kv_elems_per_token=L * kv_per_tok_layer)


def forward_ms(shape: dict, n: np.ndarray, hw: dict, gpus: int, bytes_per_param: float,
               eff: Efficiency) -> np.ndarray:
    n = np.asarray(n, dtype=np.float64)
    weight_bytes = shape["dense"] * bytes_per_param
    if shape["experts"]:
        touched = shape["experts"] * (1 - (1 - shape["topk"] / shape["experts"]) ** n)
        weight_bytes = weight_bytes + shape["moe_layers"] * touched * shape["expert"] * bytes_per_param
    peak = hw["fp8"] if bytes_per_param <= 1 else hw["bf16"]
    t_w = weight_bytes / gpus / (hw["bw"] * eff.bw)
    t_f = 2 * shape["active"] * n / gpus / (peak * eff.flops)
    t = np.maximum(t_w, t_f) + shape["layers"] * eff.launch_us_per_layer * 1e-6
    if gpus > 1:
        t = t + 2 * shape["layers"] * (eff.allreduce_us * 1e-6 + n * shape["hidden"] * 2 / hw["link"])
    return t * 1e3


def analytical_profile(model_config: str | Path, hardware: str = "H200", gpus: int = 1,
                       bytes_per_param: float = 2.0, kv_bytes_per_elem: float = 2.0,
                       mem_util: float = 0.9, max_batched_tokens: int = 8192,
                       cpu_overhead_ms: float = 2.0, eff: Efficiency = Efficiency(),
                       name: str | None = None, kv_replicated: bool = False) -> Profile:
    """A roofline profile for `model_config` (HF config.json) on `gpus` x `hardware`.

    kv_replicated: MLA's latent KV is replicated on every tensor-parallel rank in vLLM, so the
    per-replica KV capacity is one GPU's free memory, not g of them.
    """
    cfg = json.loads(Path(model_config).read_text())
    hw = HARDWARE[hardware]
    shape = model_shape(cfg)
    caps = vllm_capture_sizes(512)
    tail = [768] + [x for x in (1024, 2048, 4096, 8192, 16384) if x <= max_batched_tokens]
    tokens = np.array(caps + [t for t in tail if t > caps[-1]])
    fwd = forward_ms(shape, tokens, hw, gpus, bytes_per_param, eff)
    kv_bpt = shape["kv_elems_per_token"] * kv_bytes_per_elem
    kv_read_bpt = kv_bpt / (1 if kv_replicated else gpus)
    kv_ms_per_ktok = 1000 * kv_read_bpt / (hw["bw"] * eff.bw) * 1e3
    weights_gib = shape["total"] * bytes_per_param / 2**30
    if kv_replicated:
        kv_gib = hw["hbm_gib"] * mem_util - weights_gib / gpus
    else:
        kv_gib = gpus * hw["hbm_gib"] * mem_util - weights_gib
    if kv_gib <= 0:
        raise ValueError(f"{model_config}: weights do not fit on {gpus} x {hardware}")
    # Draft passes, relative to the target (documented per-method shapes, not measured):
    # one MTP layer is ~1/layers of the target step; an EAGLE-3 head step is one decoder layer
    # plus the LM head; the block drafter is a few layers over n x K tokens.
    reqs = np.array([1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024])
    per_layer = forward_ms(shape, reqs, hw, gpus, bytes_per_param, eff) / shape["layers"]
    lm_head = 2 * cfg["vocab_size"] * shape["hidden"] * bytes_per_param / gpus / (hw["bw"] * eff.bw) * 1e3
    draft = {
        "mtp": Table(reqs, per_layer * 1.0 + lm_head),
        "eagle3": Table(reqs, per_layer * 1.0 + lm_head),
        "block": Table(reqs, forward_ms(shape, reqs * 8, hw, gpus, bytes_per_param, eff) / shape["layers"] * 3 + lm_head),
    }
    draft["dspark"] = Table(reqs, draft["block"].ms * 1.01)
    model_name = cfg.get("_name") or Path(model_config).stem
    return Profile(
        name=name or f"analytical-{model_name}-{hardware.lower()}x{gpus}",
        provenance=dict(kind="analytical", hardware=f"{gpus} x {hw['name']}", gpus_per_replica=gpus,
                        model=model_name, engine="vLLM-like (CUDA graphs, chunked prefill)",
                        engine_version="n/a", date=str(_dt.date(2026, 11, 29)),
                        method=("roofline from the model config: weight/KV bytes over HBM bandwidth, "
                                "FLOPs over matrix peak, NVLink all-reduce; efficiencies: " + eff.source),
                        command=(f"python -m dsim.analytical {model_config} --hardware {hardware} --gpus {gpus} "
                                 f"--bytes-per-param {bytes_per_param:g}"
                                 + (" --kv-replicated" if kv_replicated else "")
                                 + f" --launch-us-per-layer {eff.launch_us_per_layer:g}"),
                        hardware_source=hw["source"],
                        assumptions=dict(bytes_per_param=bytes_per_param, kv_bytes_per_elem=kv_bytes_per_elem,
                                         mem_util=mem_util, kv_replicated=kv_replicated,
                                         eff_bw=eff.bw, eff_flops=eff.flops)),
        kv_cache_gib=round(float(kv_gib), 2), kv_bytes_per_token=float(kv_bpt),
        cpu_overhead_ms=cpu_overhead_ms, capture_sizes=tuple(caps),
        forward=Table(tokens, fwd), kv_ms_per_ktok=float(kv_ms_per_ktok), draft=draft)


def main():  # pragma: no cover - thin wrapper
    import argparse
    from dsim.cost import save_profile
    ap = argparse.ArgumentParser(description="Write an analytical (roofline) profile")
    ap.add_argument("config")
    ap.add_argument("--hardware", default="H200", choices=sorted(HARDWARE))
    ap.add_argument("--gpus", type=int, default=1)
    ap.add_argument("--bytes-per-param", type=float, default=2.0)
    ap.add_argument("--kv-replicated", action="store_true")
    ap.add_argument("--name")
    ap.add_argument("--launch-us-per-layer", type=float, default=Efficiency.launch_us_per_layer)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    eff = Efficiency(launch_us_per_layer=a.launch_us_per_layer,
                     source=f"stated defaults (not fitted), per-layer floor {a.launch_us_per_layer:g} us")
    p = analytical_profile(a.config, a.hardware, a.gpus, a.bytes_per_param, name=a.name,
                           kv_replicated=a.kv_replicated, eff=eff)
    save_profile(p, a.out)


if __name__ == "__main__":
    main()
