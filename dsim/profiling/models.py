"""Model architectures the step-cost composer understands: what one decoder layer computes.

A ``MoEModel`` is read from a public Hugging Face ``config.json`` (the copies in
``profiles/models/`` keep the architecture keys, with their source). Two families:

- ``deepseek_v3`` (DeepSeek-V3 / R1): multi-head latent attention (MLA, kv_lora_rank 512 +
  rope 64 per token and layer, read whole by every decode step), ``first_k_dense_replace`` dense
  MLP layers, then MoE layers (256 routed experts, top-8, one shared expert). Source: DeepSeek-V3
  technical report (arXiv 2412.19437) and its config.json.
- ``deepseek_v4`` (DeepSeek-V4-Flash / -Pro): one 512-wide KV head shared by all query heads,
  a sliding window of ``sliding_window`` tokens in every layer, and per layer a compression ratio
  (``compress_ratios``: 0 = window only, 4 = compressed sparse attention where a lightning
  indexer picks ``index_topk`` compressed entries per query token, 128 = heavily compressed
  attention over every 128-token summary); grouped low-rank output projection (``o_groups``,
  ``o_lora_rank``); manifold-constrained hyper-connections (``hc_mult`` residual streams); every
  layer MoE (top-6, one shared expert), the first ``num_hash_layers`` routed by a token hash
  instead of a learned router. Source: the config.json files of deepseek-ai/DeepSeek-V4-Flash and
  -Pro on Hugging Face.

KV cache per token of context (what decides how many requests a GPU holds):
- MLA: layers x (kv_lora_rank + rope) elements, bf16 (2 bytes).
- V4: a compressed entry of ``head_dim`` elements every ``ratio`` tokens per compressed layer,
  plus (ratio-4 layers) the indexer's key of ``index_head_dim`` elements per compressed entry;
  entries stored as FP8 with the rope part in bf16 (DeepSeek's FP8 KV layout; an assumption for
  V4 stated in the profile). The sliding window adds a constant ``sliding_window`` raw entries per
  request and layer, independent of context.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dsim.errors import InputError

MODEL_DIR = Path(__file__).resolve().parents[2] / "profiles" / "models"

#: attention kinds of one layer (the composer's attn op kinds)
ATTN_KINDS = ("mla", "v4_swa", "v4_csa", "v4_hca")


@dataclass(frozen=True)
class MoEModel:
    name: str
    family: str  # deepseek_v3 | deepseek_v4
    hidden: int
    layers: int
    vocab: int
    heads: int  # query heads
    head_dim: int  # V4: the shared KV head's width; V3: qk nope + rope
    q_lora_rank: int
    attn_kinds: tuple[str, ...]  # per decoder layer
    moe_layer: tuple[bool, ...]  # per decoder layer: MoE (True) or dense MLP
    experts: int
    topk: int
    moe_inter: int
    shared_experts: int
    dense_inter: int  # dense-MLP layers' intermediate size (V3's first layers)
    expert_dtype: str  # fp8 | fp4 as released
    mtp_layers: int
    source: str
    # V3 MLA
    kv_lora_rank: int = 0
    rope_dim: int = 64
    nope_dim: int = 0
    v_head_dim: int = 0
    # V4
    o_groups: int = 0
    o_lora_rank: int = 0
    sliding_window: int = 0
    index_heads: int = 0
    index_dim: int = 0
    index_topk: int = 0
    compress_ratios: tuple[int, ...] = ()
    hc_mult: int = 1
    hash_layers: int = 0
    mtp_attn_kind: str = "mla"

    # ------------------------------------------------------------------ sizes
    def attn_params(self, kind: str) -> int:
        """Parameters of one layer's attention block (all heads)."""
        h = self.hidden
        if self.family == "deepseek_v3":
            qk = self.nope_dim + self.rope_dim
            return (
                h * self.q_lora_rank
                + self.q_lora_rank * self.heads * qk
                + h * (self.kv_lora_rank + self.rope_dim)
                + self.kv_lora_rank * self.heads * (self.nope_dim + self.v_head_dim)
                + self.heads * self.v_head_dim * h
            )
        # q: h -> q_lora -> heads x head_dim; one shared KV head; output: each of o_groups groups of
        # heads projects its heads x head_dim / o_groups inputs to o_lora_rank, then o_groups x
        # o_lora_rank -> h
        p = (
            h * self.q_lora_rank
            + self.q_lora_rank * self.heads * self.head_dim
            + h * self.head_dim
            + self.heads * self.head_dim * self.o_lora_rank
            + self.o_groups * self.o_lora_rank * h
        )
        if kind in ("v4_csa", "v4_hca"):
            # the compressor's KV and gate projections, each coff x head_dim wide: coff = 2 at ratio 4
            # (overlapping blocks), 1 at ratio 128
            p += h * 2 * (2 if kind == "v4_csa" else 1) * self.head_dim
        if kind == "v4_csa":
            # the lightning indexer: query projection, per-head weights, its own ratio-4 compressor
            p += self.q_lora_rank * self.index_heads * self.index_dim + h * self.index_heads + h * 4 * self.index_dim
        return p

    @property
    def expert_params(self) -> int:
        return 3 * self.hidden * self.moe_inter

    def param_count(self) -> dict:
        """Parameters by part (decoder layers, MTP module(s), embeddings + LM head); 'active' is per
        token (top-k + shared experts)."""
        attn = sum(self.attn_params(k) for k in self.attn_kinds)
        n_moe = sum(self.moe_layer)
        dense = (self.layers - n_moe) * 3 * self.hidden * self.dense_inter
        shared = n_moe * self.shared_experts * self.expert_params
        routed = n_moe * self.experts * self.expert_params
        router = n_moe * self.hidden * self.experts
        embed = 2 * self.vocab * self.hidden
        mtp = self.mtp_layers * (
            self.attn_params(self.mtp_attn_kind)
            + (self.experts + self.shared_experts) * self.expert_params
            + 2 * self.hidden * self.hidden
        )
        total = attn + dense + shared + routed + router + embed + mtp
        active = attn + dense + shared + router + embed + n_moe * self.topk * self.expert_params
        return dict(total=total, active=active, routed_experts=routed, mtp=mtp)

    def param_bytes(self) -> dict:
        """Weight bytes by part, as released: non-expert weights FP8 (1 byte), experts per
        expert_dtype (fp4: 0.5 byte + block scales, counted as 0.53), embeddings/LM head bf16."""
        e_bytes = 0.53 if self.expert_dtype in ("fp4", "w4a16") else 1.0
        attn = sum(self.attn_params(k) for k in self.attn_kinds)
        n_moe = sum(self.moe_layer)
        n_dense = self.layers - n_moe
        shared = n_moe * self.shared_experts * self.expert_params
        dense_mlp = n_dense * 3 * self.hidden * self.dense_inter
        routed = n_moe * self.experts * self.expert_params
        router = n_moe * self.hidden * self.experts
        embed = 2 * self.vocab * self.hidden
        mtp = self.mtp_layers * (
            self.attn_params(self.mtp_attn_kind)
            + self.experts * self.expert_params
            + self.shared_experts * self.expert_params
            + 2 * self.hidden * self.hidden
        )
        return dict(
            attention=attn * 1.0,
            shared_and_dense=(shared + dense_mlp) * 1.0,
            router=router * 2.0,
            routed_experts=routed * e_bytes,
            embeddings=embed * 2.0,
            mtp=mtp * 1.0,
        )

    def kv_bytes_per_token(self) -> float:
        """KV-cache bytes per token of context, summed over the decoder layers."""
        if self.family == "deepseek_v3":
            return self.layers * (self.kv_lora_rank + self.rope_dim) * 2.0
        entry = (self.head_dim - self.rope_dim) * 1.0 + self.rope_dim * 2.0  # FP8 + bf16 rope
        total = 0.0
        for r in self.compress_ratios[: self.layers]:
            if r:
                total += entry / r
                if r == 4:
                    total += self.index_dim * 1.0 / r  # FP8 indexer keys
        return total

    def kv_bytes_per_request(self) -> float:
        """Constant KV bytes per request: V4's sliding window (raw entries) in every layer."""
        if self.family == "deepseek_v3":
            return 0.0
        entry = (self.head_dim - self.rope_dim) * 1.0 + self.rope_dim * 2.0
        return float(self.layers * self.sliding_window * entry)

    def attended_keys(self, kind: str, context: int) -> float:
        """Keys one query token attends to over `context` tokens of KV (V4 sparse attention)."""
        if kind == "mla":
            return float(context)
        w = min(context, self.sliding_window)
        if kind == "v4_swa":
            return float(w)
        if kind == "v4_hca":
            return w + context / 128.0
        return w + min(self.index_topk, context / 4.0)


def model_name(cfg: dict, path: str | Path) -> str:
    """The model a config.json describes, as profiles and titles name it: dsim's ``_name``, else
    the last part of Hugging Face's ``name_or_path`` / ``_name_or_path`` ('meta-llama/Llama-3.1-8B'
    -> 'llama-3.1-8b'), else the folder of a file called config.json (a downloaded model's folder
    is its name), else the file's stem; lower case like dsim's model ids (profiles/models/, a
    preset's ``models:``), so 'DeepSeek-V4-Flash' is the shipped deepseek-v4-flash."""
    given = cfg.get("_name")
    if isinstance(given, str) and given.strip():
        return given.strip()
    for key in ("name_or_path", "_name_or_path"):
        v = cfg.get(key)
        if isinstance(v, str) and Path(v.strip().rstrip("/")).name not in ("", ".", ".."):
            return Path(v.strip().rstrip("/")).name.lower()
    p = Path(path)
    if p.stem.lower() == "config":
        folder = p.resolve().parent.name
        if folder:
            return folder.lower()
    return p.stem.lower()


def load_model(name_or_path: str) -> MoEModel:
    """A model by name (profiles/models/<name>.json) or a config.json path."""
    p = Path(name_or_path)
    if not p.suffix:
        p = MODEL_DIR / f"{name_or_path}.json"
    if not p.is_file():
        known = sorted(q.stem for q in MODEL_DIR.glob("deepseek-*.json"))
        raise InputError(f"{name_or_path}: model config not found (a config.json path or one of: {', '.join(known)})")
    from dsim.schema import read_json

    cfg = read_json(p, max_bytes=16 << 20)
    if not isinstance(cfg, dict):
        raise InputError(f"{p}: a model config is a JSON object")
    return model_from_config(cfg, name=model_name(cfg, p), where=str(p))


def model_from_config(cfg: dict, name: str, where: str = "<config>") -> MoEModel:
    fam = cfg.get("model_type")
    try:
        L = int(cfg["num_hidden_layers"])
        common: dict[str, Any] = dict(
            name=name,
            hidden=int(cfg["hidden_size"]),
            layers=L,
            vocab=int(cfg["vocab_size"]),
            heads=int(cfg["num_attention_heads"]),
            q_lora_rank=int(cfg["q_lora_rank"]),
            experts=int(cfg["n_routed_experts"]),
            topk=int(cfg["num_experts_per_tok"]),
            moe_inter=int(cfg["moe_intermediate_size"]),
            shared_experts=int(cfg.get("n_shared_experts", 0)),
            mtp_layers=int(cfg.get("num_nextn_predict_layers", 0)),
            source=str(cfg.get("source") or cfg.get("_source") or where),
        )
        if fam == "deepseek_v3":
            k_dense = int(cfg.get("first_k_dense_replace", 0))
            return MoEModel(
                family=fam,
                head_dim=int(cfg["qk_nope_head_dim"]) + int(cfg["qk_rope_head_dim"]),
                attn_kinds=("mla",) * L,
                moe_layer=tuple(i >= k_dense for i in range(L)),
                dense_inter=int(cfg["intermediate_size"]),
                expert_dtype="fp8",
                kv_lora_rank=int(cfg["kv_lora_rank"]),
                rope_dim=int(cfg["qk_rope_head_dim"]),
                nope_dim=int(cfg["qk_nope_head_dim"]),
                v_head_dim=int(cfg["v_head_dim"]),
                mtp_attn_kind="mla",
                **common,
            )
        if fam == "deepseek_v4":
            ratios = tuple(int(r) for r in cfg["compress_ratios"])
            if len(ratios) < L:
                raise InputError(f"{where}: compress_ratios: {len(ratios)} entries for {L} layers")
            kind = {0: "v4_swa", 4: "v4_csa", 128: "v4_hca"}
            bad = sorted(set(ratios) - set(kind))
            if bad:
                raise InputError(f"{where}: compress_ratios: unknown ratio {bad[0]} (known: 0, 4, 128)")
            mtp_kind = kind[ratios[L]] if len(ratios) > L else "v4_swa"
            return MoEModel(
                family=fam,
                head_dim=int(cfg["head_dim"]),
                attn_kinds=tuple(kind[r] for r in ratios[:L]),
                moe_layer=(True,) * L,
                dense_inter=0,
                expert_dtype=str(cfg.get("expert_dtype", "fp8")),
                rope_dim=int(cfg["qk_rope_head_dim"]),
                o_groups=int(cfg["o_groups"]),
                o_lora_rank=int(cfg["o_lora_rank"]),
                sliding_window=int(cfg["sliding_window"]),
                index_heads=int(cfg["index_n_heads"]),
                index_dim=int(cfg["index_head_dim"]),
                index_topk=int(cfg["index_topk"]),
                compress_ratios=ratios,
                hc_mult=int(cfg.get("hc_mult", 1)),
                hash_layers=int(cfg.get("num_hash_layers", 0)),
                mtp_attn_kind=mtp_kind,
                **common,
            )
    except KeyError as e:
        raise InputError(f"{where}: missing key {e.args[0]!r}") from None
    except (TypeError, ValueError):
        raise InputError(f"{where}: architecture keys must be integers") from None
    raise InputError(f"{where}: model_type {fam!r}: the composer knows deepseek_v3 and deepseek_v4")


def infer_model(kind: str, heads: int) -> str | None:
    """The shipped model an attention record belongs to, from its kind and heads per GPU (TP 1 or 8)."""
    if kind == "mla":
        return "deepseek-v3"
    for name, total in (("deepseek-v4-flash", 64), ("deepseek-v4-pro", 128)):
        if heads in (total, total // 8):
            return name
    return None
