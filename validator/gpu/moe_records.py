"""The op records of the kernel-op benchmarks (validator.gpu.moe_ops): model configs, topologies, the
per-layer GEMM shapes of DeepSeek-V4 / V3 shards and the fallback grid of records to price. Torch-free."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
MODELS_DIR = REPO / "profiles" / "models"

# Fallback grid (the kernel-table interface's list, used until the composer prints its own)
GRID_M = [1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048, 4096, 8192, 16384]
ATTN_BATCH = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512]
ATTN_Q_DECODE = [1, 2, 4, 6, 8]
ATTN_Q_PREFILL = [256, 1024, 2048, 8192]
ATTN_KV = [512, 2048, 8192, 32768, 131072]


# ------------------------------------------------------------------ model facts
def load_config(name_or_path: str) -> dict:
    p = Path(name_or_path)
    if not p.exists():
        p = MODELS_DIR / f"{name_or_path}.json"
    if not p.exists():
        raise SystemExit(f"error: model config {name_or_path!r} not found (profiles/models/<name>.json)")
    return json.loads(p.read_text())


@dataclass(frozen=True)
class Topology:
    """One GPU of a node: attention data-parallel (dp) or tensor-parallel (tp) over `gpus`, experts over `ep`."""

    attn: str  # "dp" | "tp"
    gpus: int
    ep: int

    @staticmethod
    def parse(s: str) -> Topology:
        parts = {p[:2]: int(p[2:]) for p in s.split("-")}
        if "ep" not in parts or not ({"dp", "tp"} & set(parts)):
            raise SystemExit(f"error: topology {s!r}: expected dp<N>-ep<M> or tp<N>-ep<M>")
        attn = "dp" if "dp" in parts else "tp"
        return Topology(attn, parts[attn], parts["ep"])

    @property
    def attn_tp(self) -> int:
        return self.gpus if self.attn == "tp" else 1


def is_v4(cfg: dict) -> bool:
    return "compress_ratios" in cfg


def v4_dims(cfg: dict, tp: int = 1) -> dict:
    return dict(
        hidden=cfg["hidden_size"],
        heads=cfg["num_attention_heads"] // tp,
        head_dim=cfg["head_dim"],
        rope_dim=cfg["qk_rope_head_dim"],
        window=cfg["sliding_window"],
        index_heads=cfg["index_n_heads"],
        index_dim=cfg["index_head_dim"],
        topk=cfg["index_topk"],
        q_lora=cfg["q_lora_rank"],
        o_lora=cfg["o_lora_rank"],
        o_groups=max(1, cfg["o_groups"] // tp),
        hc_mult=cfg["hc_mult"],
        hc_iters=cfg["hc_sinkhorn_iters"],
        inter=cfg["moe_intermediate_size"],
        experts=cfg["n_routed_experts"],
        topk_experts=cfg["num_experts_per_tok"],
        shared=cfg.get("n_shared_experts", 0),
        vocab=cfg["vocab_size"],
        layers=cfg["num_hidden_layers"],
        ratios=list(cfg["compress_ratios"][: cfg["num_hidden_layers"]]),
        swiglu_limit=cfg.get("swiglu_limit", 0.0),
    )


def mla_dims(cfg: dict, tp: int = 1) -> dict:
    return dict(
        hidden=cfg["hidden_size"],
        heads=cfg["num_attention_heads"] // tp,
        kv_lora=cfg["kv_lora_rank"],
        rope_dim=cfg["qk_rope_head_dim"],
        nope_dim=cfg["qk_nope_head_dim"],
        v_dim=cfg["v_head_dim"],
        q_lora=cfg["q_lora_rank"],
        inter=cfg["moe_intermediate_size"],
        dense_inter=cfg["intermediate_size"],
        experts=cfg["n_routed_experts"],
        topk_experts=cfg["num_experts_per_tok"],
        shared=cfg.get("n_shared_experts", 0),
        vocab=cfg["vocab_size"],
        layers=cfg["num_hidden_layers"],
        dense_layers=cfg.get("first_k_dense_replace", 0),
    )


def compressor_width(ratio: int) -> int:
    """Per-token projected state width factor: ratio-4 compression pools overlapping blocks (2 halves)."""
    return 2 if ratio == 4 else 1


def layer_gemms(cfg: dict, topo: Topology) -> list[tuple[str, int, int]]:
    """(name, n, k) of the projection GEMMs of one layer on one GPU (the attention cores exclude them).
    The V4 output projection is grouped (o_groups blocks of heads/o_groups x head_dim -> o_lora): priced as
    o_groups GEMMs of (o_lora, heads/o_groups x head_dim) on the same tokens (name wo_a, count in the name)."""
    tp = topo.attn_tp
    out: list[tuple[str, int, int]] = []
    if is_v4(cfg):
        d = v4_dims(cfg, tp)
        h, D = d["hidden"], d["head_dim"]
        out += [
            ("wq_a", d["q_lora"], h),
            ("wq_b", d["heads"] * D, d["q_lora"]),
            ("wkv", D, h),
            (f"wo_a_x{d['o_groups']}", d["o_lora"], d["heads"] * D // d["o_groups"]),
            ("wo_b", h, d["o_groups"] * d["o_lora"]),
            ("compressor_r4", 2 * compressor_width(4) * D, h),
            ("compressor_r128", 2 * D, h),
            ("indexer_wq", d["index_heads"] * d["index_dim"], d["q_lora"]),
            ("indexer_weights", d["index_heads"], h),
            ("indexer_compressor", 2 * compressor_width(4) * d["index_dim"], h),
            ("router", d["experts"], h),
            ("shared_gate_up", 2 * d["inter"] * d["shared"] // tp, h),
            ("shared_down", h, d["inter"] * d["shared"] // tp),
            ("mhc_mix", 2 * d["hc_mult"] + d["hc_mult"] ** 2, d["hc_mult"] * h),
            ("lm_head", d["vocab"] // tp, h),
        ]
    else:
        d = mla_dims(cfg, tp)
        h = d["hidden"]
        out += [
            ("q_a", d["q_lora"], h),
            ("q_b", d["heads"] * (d["nope_dim"] + d["rope_dim"]), d["q_lora"]),
            ("kv_a", d["kv_lora"] + d["rope_dim"], h),
            (f"w_uk_x{d['heads']}", d["kv_lora"], d["nope_dim"]),
            (f"w_uv_x{d['heads']}", d["v_dim"], d["kv_lora"]),
            ("o_proj", h, d["heads"] * d["v_dim"]),
            ("router", d["experts"], h),
            ("shared_gate_up", 2 * d["inter"] * d["shared"] // tp, h),
            ("shared_down", h, d["inter"] * d["shared"] // tp),
            ("dense_gate_up", 2 * d["dense_inter"] // tp, h),
            ("dense_down", h, d["dense_inter"] // tp),
            ("lm_head", d["vocab"] // tp, h),
        ]
    return out


def fallback_grid(specs: list[tuple[str, str]], quick: bool = False) -> list[dict]:
    """The kernel-table interface's fallback grid for (model, topology) pairs. quick: a thinned grid."""
    recs: list[dict] = []
    seen: set[str] = set()

    def add(r: dict) -> None:
        k = json.dumps(r, sort_keys=True)
        if k not in seen:
            seen.add(k)
            recs.append(r)

    ms = GRID_M[::2] + [GRID_M[-1]] if quick else GRID_M
    for model, topo_s in specs:
        cfg = load_config(model)
        topo = Topology.parse(topo_s)
        for name, n, k in layer_gemms(cfg, topo):
            dtypes = ["bf16"] if name in ("router", "mhc_mix", "lm_head") else ["bf16", "fp8"]
            for dt in dtypes:
                for m in ms:
                    add(dict(op="gemm", dtype=dt, m=m, n=n, k=k))
        if is_v4(cfg):
            d = v4_dims(cfg, topo.attn_tp)
            kinds = sorted({{0: "v4_swa", 4: "v4_csa", 128: "v4_hca"}[r] for r in d["ratios"]})
            moe_dt = ["fp8"]
            hidden, inter = d["hidden"], d["inter"]
        else:
            d = mla_dims(cfg, topo.attn_tp)
            kinds = ["mla"]
            moe_dt = ["fp8"]
            hidden, inter = d["hidden"], d["inter"]
        for dt in moe_dt + (["bf16"] if not quick else []):
            for t in ms:
                tokens = t * topo.gpus if topo.attn == "dp" else t  # DP: every rank sends its own tokens
                add(
                    dict(
                        op="moe",
                        dtype=dt,
                        tokens=tokens,
                        hidden=hidden,
                        inter=inter,
                        topk=d["topk_experts"],
                        experts=d["experts"],
                        ep=topo.ep,
                        distribution="uniform",
                    )
                )
        heads = d["heads"]
        batches = ATTN_BATCH[::2] + [ATTN_BATCH[-1]] if quick else ATTN_BATCH
        qd = [1, 2, 4, 8] if quick else ATTN_Q_DECODE
        for kind in kinds:
            for b in batches:
                for q in qd:
                    for kv in ATTN_KV:
                        add(dict(op="attn", kind=kind, phase="decode", batch=b, q=q, kv=kv, heads=heads))
            for b in (1, 2, 4):
                for q in ATTN_Q_PREFILL:
                    for kv in [0] + ATTN_KV:
                        add(dict(op="attn", kind=kind, phase="prefill", batch=b, q=q, kv=kv, heads=heads))
        if is_v4(cfg):
            for t in ms:
                add(dict(op="mhc", tokens=t, hidden=d["hidden"], hc_mult=d["hc_mult"]))
        for t in ms:
            add(dict(op="elementwise", bytes=int(t * hidden * 2 * 2)))
    return recs


def dry_cfg(kind: str) -> dict:
    """A shrunken config (same structure, small dims) for CPU dry runs."""
    base = load_config("deepseek-v3" if kind == "mla" else "deepseek-v4-flash")
    if kind == "mla":
        return dict(
            base, num_attention_heads=4, kv_lora_rank=64, qk_rope_head_dim=16, qk_nope_head_dim=16, v_head_dim=16
        )
    return dict(
        base,
        num_attention_heads=16,
        head_dim=64,
        qk_rope_head_dim=16,
        sliding_window=8,
        index_n_heads=16,
        index_head_dim=32,
        index_topk=8,
    )
