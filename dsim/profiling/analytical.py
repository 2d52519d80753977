"""Analytical (roofline) step-cost profiles for hardware and models that were not measured.

Every profile made here is labelled ``provenance.kind: analytical``. Per step of n tokens on a
replica of g GPUs (tensor parallel):

    t_weights = weight bytes touched / g / (BW x eff_bw)
    t_flops   = 2 x active params x n / g / (peak x eff_flops)
    t_comm    = 2 x layers x (allreduce latency + n x hidden x 2 B / link BW)      (g > 1)
    t_act     = activation x n x layers x hidden                                    (fitted profiles)
    F(n)      = max(t_weights, t_flops) + t_act + t_comm + layers x launch floor
    (fitted profiles: the smooth maximum (t_weights^k + t_flops^k)^(1/k), k = ``knee``)

The embedding is a gather of n rows: it is neither read whole nor multiplied, so its V x h
parameters count in neither term (the LM head's do). t_act is the per-token work that is not a
GEMM (norms, RoPE, activations, residuals: it grows with layers x hidden, not with parameters),
which is what sets a narrow deep model (Qwen3-8B: 36 x 4096) apart from a wide one at the same
FLOPs. Fitting it with the compute efficiency on three models is degenerate (the held-out model's
error swings with the split between the two), so fits keep the compute efficiency at its stated
0.6 of the dense peak and fit the weight bandwidth, the launch floor, t_act and the knee k.
A GEMM does not switch from reading weights to multiplying at one batch size: its tiles' loads
and math overlap only partly, and near the ridge point (a few hundred tokens on an H200) both
cost, so the measured step bends where the hard maximum kinks. The p-norm smooth maximum with
one fitted exponent (k ~ 2.3 on the measured H200 profiles) follows that bend; k -> infinity is
the hard maximum, which stated-default profiles keep.

Fitted profiles (H200, from the measured ones) are format 2 and carry prefill terms and the
per-request attention terms (dsim.cost): a prompt token costs ``decode_row_ns`` x layers x hidden
less than a decode token (its LM-head row and per-row decode work), a million wave-counted prefill
pairs cost 4 x heads x head_dim x layers x 1e6 FLOPs at ``attn_flops`` of the matrix peak, KV
reads cost their bytes at ``kv_bw`` of the bandwidth (as the wave term: a lone long context is
priced by its critical path), the split-KV merge ``merge_ns`` x layers x head_dim per grid
cell, the schedule tail (the longest chunk over every slot) ``tail_frac`` of a KV token's
cost per token, and a step with decode requests ``decode_step_us_per_layer`` x layers for the
split-KV path's per-step kernels; occupancies and split settings are the measured executor's.

MoE: the routed experts touched by n tokens with top-k routing over E experts are
E x (1 - (1 - k/E)^n) per layer (uniform routing), so weight bytes grow with the batch until
every expert is read once. KV read cost: kv bytes per token / (BW x eff_bw) per token.

Hardware figures (vendor datasheets): H200 SXM 4.8 TB/s HBM3e, 989 TFLOP/s dense bf16,
1979 TFLOP/s dense fp8, NVLink 900 GB/s; B300: 8 TB/s, 2250 TFLOP/s dense bf16 (fp8 4500),
NVLink 1800 GB/s. Efficiency factors are stated defaults until fitted on measured profiles.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from dsim.cost import Profile, Table, drafter_request_sizes, vllm_capture_sizes
from dsim.outputs import write_file
from dsim.profiling.kernel_tables import HARDWARE as _DATASHEETS

# The GPUs' public figures come from one place, dsim.profiling.kernel_tables.HARDWARE (vendor datasheets), here in
# the roofline's units and keys: HBM in GiB, and ``link`` the bidirectional NVLink figure per GPU
# (the datasheet's headline number, twice the per-direction bandwidth kernels.HARDWARE gives), as
# the all-reduce term was written with.
HARDWARE: dict[str, dict[str, Any]] = {
    key.upper(): dict(
        name=hw["name"],
        hbm_gib=hw["hbm_gb"] * 1e9 / 2**30,
        bw=hw["bw"],
        bf16=hw["bf16"],
        fp8=hw["fp8"],
        link=2 * hw["link"],
        source=hw["source"],
    )
    for key, hw in _DATASHEETS.items()
}


@dataclass(frozen=True)
class Efficiency:
    bw: float = 0.75  # achieved fraction of HBM bandwidth on weight/KV reads
    flops: float = 0.6  # achieved fraction of dense matrix peak
    launch_us_per_layer: float = 12.0  # per-layer kernel floor inside a CUDA graph
    activation_ps: float = 0.0  # non-GEMM work per token x layer x hidden unit, ps
    allreduce_us: float = 12.0  # one-shot all-reduce latency over NVLink
    source: str = "stated defaults (not fitted)"
    kv_bw: float | None = None  # achieved fraction of HBM bandwidth on KV reads (None: same as bw)
    # format-2 terms (None: a format-1 profile without prefill or attention terms)
    decode_row_ns: float | None = None  # a decode token's extra cost per (layer x hidden unit), ns
    attn_flops: float | None = None  # fraction of matrix peak on prefill attention
    merge_ns: float | None = None  # split-KV merge per grid cell per (layer x head_dim), ns
    tail_frac: float | None = None  # the schedule tail's cost per token, relative to the KV read's
    decode_step_us_per_layer: float | None = None  # the split-KV path's per-step work, us per layer
    knee: float | None = None  # smooth-roofline exponent k (None: the hard maximum; module doc)


def model_shape(cfg: dict) -> dict:
    """Parameter counts (total, active per token, dense part, expert size) from an HF config."""
    h = cfg["hidden_size"]
    L = cfg["num_hidden_layers"]
    V = cfg["vocab_size"]
    if "kv_lora_rank" in cfg:  # DeepSeek MLA
        nh = cfg["num_attention_heads"]
        qk = cfg["qk_nope_head_dim"] + cfg["qk_rope_head_dim"]
        attn = (
            h * cfg["q_lora_rank"]
            + cfg["q_lora_rank"] * nh * qk
            + h * (cfg["kv_lora_rank"] + cfg["qk_rope_head_dim"])
            + cfg["kv_lora_rank"] * nh * (cfg["qk_nope_head_dim"] + cfg["v_head_dim"])
            + nh * cfg["v_head_dim"] * h
        )
        kv_per_tok_layer = cfg["kv_lora_rank"] + cfg["qk_rope_head_dim"]  # latent, not per head
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
    return dict(
        hidden=h,
        layers=L,
        dense=dense,
        moe_layers=moe_layers,
        experts=E,
        expert=expert,
        topk=topk,
        total=dense + moe_layers * E * expert,
        active=dense + moe_layers * topk * expert,
        kv_elems_per_token=L * kv_per_tok_layer,
        embedding=V * h,
    )


def forward_ms(shape: dict, n: np.ndarray, hw: dict, gpus: int, bytes_per_param: float, eff: Efficiency) -> np.ndarray:
    n = np.asarray(n, dtype=np.float64)
    weight_bytes = (shape["dense"] - shape.get("embedding", 0)) * bytes_per_param
    if shape["experts"]:
        touched = shape["experts"] * (1 - (1 - shape["topk"] / shape["experts"]) ** n)
        weight_bytes = weight_bytes + shape["moe_layers"] * touched * shape["expert"] * bytes_per_param
    peak = hw["fp8"] if bytes_per_param <= 1 else hw["bf16"]
    t_w = weight_bytes / gpus / (hw["bw"] * eff.bw)
    t_f = 2 * (shape["active"] - shape.get("embedding", 0)) * n / gpus / (peak * eff.flops)
    t = np.maximum(t_w, t_f) if eff.knee is None else (t_w**eff.knee + t_f**eff.knee) ** (1.0 / eff.knee)
    t = t + shape["layers"] * eff.launch_us_per_layer * 1e-6
    t = t + eff.activation_ps * 1e-12 * n * shape["layers"] * shape["hidden"]
    if gpus > 1:
        t = t + 2 * shape["layers"] * (eff.allreduce_us * 1e-6 + n * shape["hidden"] * 2 / hw["link"])
    return t * 1e3


def analytical_profile(
    model_config: str | Path,
    hardware: str = "H200",
    gpus: int = 1,
    bytes_per_param: float = 2.0,
    kv_bytes_per_elem: float = 2.0,
    mem_util: float = 0.9,
    max_batched_tokens: int = 8192,
    cpu_overhead_ms: float = 2.0,
    eff: Efficiency = Efficiency(),
    name: str | None = None,
    kv_replicated: bool = False,
    fit_info: dict | None = None,
    fit_path: str | None = None,
) -> Profile:
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
    kv_ms_per_ktok = 1000 * kv_read_bpt / (hw["bw"] * (eff.kv_bw or eff.bw)) * 1e3
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
    # at the drafter's CUDA-graph batch sizes (vLLM's capture sizes, then every 128 to 1024): the
    # engine reads the next size at or above, so a drafter pays its padded batch
    reqs = np.array(drafter_request_sizes(512, 1024))
    per_layer = forward_ms(shape, reqs, hw, gpus, bytes_per_param, eff) / shape["layers"]
    lm_head = 2 * cfg["vocab_size"] * shape["hidden"] * bytes_per_param / gpus / (hw["bw"] * eff.bw) * 1e3
    draft = {
        "mtp": Table(reqs, per_layer * 1.0 + lm_head),
        "eagle3": Table(reqs, per_layer * 1.0 + lm_head),
        "block": Table(
            reqs, forward_ms(shape, reqs * 8, hw, gpus, bytes_per_param, eff) / shape["layers"] * 3 + lm_head
        ),
    }
    draft["dspark"] = Table(reqs, draft["block"].ms * 1.01)
    from dsim.profiling.models import model_name as _model_name

    model_name = _model_name(cfg, model_config)
    fmt2: dict[str, Any] = {}
    if eff.decode_row_ns is not None and gpus == 1 and "kv_lora_rank" not in cfg:
        fmt2 = _format2_terms(cfg, shape, hw, eff, kv_read_bpt)
        kv_ms_per_ktok = 0.0  # the KV read is the attention section's wave term
        # F(n) is a decode step's; the split-KV path's per-step work is priced by the attention
        # section (decode steps only), so the table carries the rest
        fwd = fwd - fmt2["attention"].decode_step_ms
    return Profile(
        name=name or f"analytical-{model_name}-{hardware.lower()}x{gpus}",
        provenance=dict(
            kind="analytical",
            hardware=f"{gpus} x {hw['name']}",
            gpus_per_replica=gpus,
            model=model_name,
            engine="vLLM-like (CUDA graphs, chunked prefill)",
            engine_version="n/a",
            date=str(_dt.date(2026, 11, 29)),
            method=(
                "roofline from the model config: weight/KV bytes over HBM bandwidth, "
                "FLOPs over matrix peak, NVLink all-reduce; efficiencies: " + eff.source
            ),
            command=(
                f"python -m dsim.profiling.analytical {model_config} --hardware {hardware} --gpus {gpus} "
                f"--bytes-per-param {bytes_per_param:g}"
                + (" --kv-replicated" if kv_replicated else "")
                + (f" --fit {fit_path}" if fit_path else "")
                + (f" --name {name}" if name else "")
                + f" --launch-us-per-layer {eff.launch_us_per_layer:g}"
            ),
            hardware_source=hw["source"],
            assumptions=dict(
                bytes_per_param=bytes_per_param,
                kv_bytes_per_elem=kv_bytes_per_elem,
                mem_util=mem_util,
                kv_replicated=kv_replicated,
                eff_bw=eff.bw,
                eff_flops=eff.flops,
                eff_kv_bw=eff.kv_bw or eff.bw,
                launch_us_per_layer=eff.launch_us_per_layer,
                **({"activation_ps": eff.activation_ps} if eff.activation_ps else {}),
                **({"knee": eff.knee} if eff.knee is not None else {}),
            ),
            **({"fit": fit_info} if fit_info else {}),
        ),
        kv_cache_gib=round(float(kv_gib), 2),
        kv_bytes_per_token=float(kv_bpt),
        cpu_overhead_ms=cpu_overhead_ms,
        capture_sizes=tuple(caps),
        forward=Table(tokens, fwd),
        kv_ms_per_ktok=float(kv_ms_per_ktok),
        draft=draft,
        **fmt2,
    )


# The split-KV settings and occupancies of the measured executor (validator/gpu, docs/user/gpu-profiling.md)
EXECUTOR_SPLIT: dict[str, Any] = dict(
    fill=2.0, balance=2.0, min_chunk=64, block_rows=128, decode_ctas_per_sm=1, prefill_ctas_per_sm=1
)
H200_SMS = 132


def _format2_terms(cfg: dict, shape: dict, hw: dict, eff: Efficiency, kv_read_bpt: float) -> dict:
    """Prefill terms and the attention section of a one-GPU profile (module doc)."""
    from dsim.cost import AttentionTerms

    H = int(cfg["num_attention_heads"])
    kvh = int(cfg.get("num_key_value_heads", H))
    d = int(cfg.get("head_dim") or cfg["hidden_size"] // H)
    L = shape["layers"]
    assert eff.decode_row_ns is not None and eff.attn_flops is not None and eff.merge_ns is not None
    attn = AttentionTerms(
        query_heads=H,
        kv_heads=kvh,
        sms=H200_SMS,
        wave_ms_per_ktok=float(1000 * kv_read_bpt / (hw["bw"] * (eff.kv_bw or eff.bw)) * 1e3),
        chunk_ms_per_kcta=0.0,
        merge_ms_per_mcell=float(eff.merge_ns * L * d * 1e6 / 1e6),
        tail_ms_per_ktok=float((eff.tail_frac or 0.0) * 1000 * kv_read_bpt / (hw["bw"] * (eff.kv_bw or eff.bw)) * 1e3),
        decode_step_ms=float((eff.decode_step_us_per_layer or 0.0) * L / 1000),
        prefill_ms_per_mpair=float(4 * H * d * L * 1e6 / (hw["bf16"] * eff.attn_flops) * 1e3),
        **EXECUTOR_SPLIT,
    )
    return dict(
        format_version=2,
        attention=attn,
        prefill_discount_ms_per_ktok=float(eff.decode_row_ns * L * shape["hidden"] * 1000 / 1e6),
    )


# ---------------------------------------------------------------- fitting on measured profiles
def _measured_points(profile: Profile) -> tuple[np.ndarray, np.ndarray]:
    """(n, F_ms) of a measured profile's forward table as a decode step pays it: with the
    attention section's per-step term (decode_step_ms, priced outside the table)."""
    a = profile.attention
    d = a.decode_step_ms if a is not None else 0.0
    return np.asarray(profile.forward.x, dtype=float), np.asarray(profile.forward.ms, dtype=float) + d


def _fwd_err(params, items, hw_name="H200"):
    bw, fl, launch, act, knee = params
    eff = Efficiency(bw=bw, flops=fl, launch_us_per_layer=launch, activation_ps=act, knee=knee)
    errs = []
    for cfg, prof in items:
        shape = model_shape(json.loads(Path(cfg).read_text()))
        n, ms = _measured_points(prof)
        pred = forward_ms(shape, n, HARDWARE[hw_name], 1, 2.0, eff)
        errs.append((pred - ms) / ms)
    return np.concatenate(errs)


def _kv_eff(cfg, prof, hw_name="H200"):
    shape = model_shape(json.loads(Path(cfg).read_text()))
    kv_bpt = shape["kv_elems_per_token"] * 2.0
    a = prof.attention
    kv_ms = prof.kv_ms_per_ktok + (a.wave_ms_per_ktok if a is not None else 0.0)
    return 1e6 * kv_bpt / (HARDWARE[hw_name]["bw"] * kv_ms)


def _format2_eff(items: list[tuple[str, Profile]], hw_name: str = "H200") -> dict:
    """decode_row_ns, attn_flops, merge_ns, tail_frac, decode_step_us_per_layer: means over the measured format-2 profiles of the
    ratio of each fitted coefficient to its model-size factor (module doc); {} if none has them."""
    rows, fl, mg, tl, ds = [], [], [], [], []
    for c, prof in items:
        a = prof.attention
        if a is None:
            continue
        cfg = json.loads(Path(c).read_text())
        sh = model_shape(cfg)
        L, h = sh["layers"], sh["hidden"]
        d = int(cfg.get("head_dim") or h // cfg["num_attention_heads"])
        rows.append(prof.prefill_discount_ms_per_ktok * 1e6 / 1000 / (L * h))
        if a.prefill_ms_per_mpair > 0:
            fl.append(4 * a.query_heads * d * L * 1e6 / (HARDWARE[hw_name]["bf16"] * a.prefill_ms_per_mpair * 1e-3))
        mg.append(a.merge_ms_per_mcell / (L * d))
        kv_ms = prof.kv_ms_per_ktok + a.wave_ms_per_ktok
        if kv_ms > 0:
            tl.append(a.tail_ms_per_ktok / kv_ms)
        ds.append(a.decode_step_ms * 1000 / L)
    if not rows:
        return {}
    return dict(
        decode_row_ns=float(np.mean(rows)),
        attn_flops=float(np.mean(fl)),
        merge_ns=float(np.mean(mg)),
        tail_frac=float(np.mean(tl)) if tl else 0.0,
        decode_step_us_per_layer=float(np.mean(ds)),
    )


def fit_efficiency(items: list[tuple[str, Profile]], hw_name: str = "H200") -> dict:
    """Fit eff.bw, the per-layer launch floor, the activation term and the knee (relative least
    squares on the forward tables; eff.flops stays at its stated value, module doc) and the KV-read
    bandwidth fraction (mean over profiles) to measured single-GPU profiles.

    items: [(model config path, measured Profile)]. Returns the fitted values and their errors.
    """
    from scipy.optimize import least_squares

    fl = Efficiency.flops  # stated, not fitted (module doc)
    r = least_squares(
        lambda p: _fwd_err([p[0], fl, p[1], p[2], p[3]], items, hw_name),
        x0=[0.8, 40.0, 10.0, 2.0],
        bounds=([0.05, 0.0, 0.0, 1.0], [1.0, 500.0, 1e4, 20.0]),
    )
    params = [r.x[0], fl, r.x[1], r.x[2], r.x[3]]
    e = np.abs(_fwd_err(params, items, hw_name)) * 100
    kv = [_kv_eff(c, p, hw_name) for c, p in items]
    return dict(
        **_format2_eff(items, hw_name),
        bw=float(params[0]),
        flops=float(params[1]),
        launch_us_per_layer=float(params[2]),
        activation_ps=float(params[3]),
        knee=float(params[4]),
        kv_bw=float(np.mean(kv)),
        forward_median_abs_pct=float(np.median(e)),
        forward_p90_abs_pct=float(np.percentile(e, 90)),
        forward_max_abs_pct=float(e.max()),
    )


def evaluate_efficiency(fit: dict, items: list[tuple[str, Profile]], hw_name: str = "H200") -> dict:
    """Errors of fitted efficiencies on (held-out) measured profiles: forward table and KV slope."""
    params = [fit["bw"], fit["flops"], fit["launch_us_per_layer"], fit.get("activation_ps", 0.0), fit.get("knee")]
    e = np.abs(_fwd_err(params, items, hw_name)) * 100
    kv = [abs(fit["kv_bw"] / _kv_eff(c, p, hw_name) - 1) * 100 for c, p in items]
    return dict(
        forward_median_abs_pct=float(np.median(e)),
        forward_p90_abs_pct=float(np.percentile(e, 90)),
        forward_max_abs_pct=float(e.max()),
        kv_slope_abs_pct=[round(float(x), 2) for x in kv],
    )


def fit_cli(argv: list[str] | None = None) -> None:  # pragma: no cover - thin wrapper
    """python -m dsim.profiling.analytical fit --pair CONFIG PROFILE ... --out FIT.json: fit on all pairs and
    report leave-one-out held-out errors."""
    import argparse

    from dsim.cost import load_profile

    ap = argparse.ArgumentParser(description="Fit analytical efficiencies on measured profiles")
    ap.add_argument("--pair", nargs=2, action="append", required=True, metavar=("CONFIG", "PROFILE"))
    ap.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    items = [(c, load_profile(p)) for c, p in a.pair]
    full = fit_efficiency(items)
    held = {}
    for i, (c, p) in enumerate(items):
        rest = items[:i] + items[i + 1 :]
        f = fit_efficiency(rest)
        held[p.provenance.get("model", c)] = dict(
            trained_on=[q.provenance.get("model") for _, q in rest],
            fitted=dict(
                (k, round(f[k], 4))
                for k in (
                    "bw",
                    "flops",
                    "launch_us_per_layer",
                    "activation_ps",
                    "knee",
                    "kv_bw",
                    "decode_row_ns",
                    "attn_flops",
                    "merge_ns",
                    "tail_frac",
                    "decode_step_us_per_layer",
                )
                if k in f
            ),
            train=dict((k, round(f[k], 3)) for k in ("forward_median_abs_pct", "forward_p90_abs_pct")),
            held_out=evaluate_efficiency(f, [(c, p)]),
        )
    out = dict(
        hardware="H200",
        fitted_on=[p.source_path for _, p in items],
        configs=[c for c, _ in items],
        efficiency=full,
        leave_one_out=held,
        note="forward: relative error of the analytical F(n) against the measured forward table "
        "(all capture sizes and tails); kv: KV-read bandwidth fraction from kv_ms_per_ktok",
    )
    write_file(a.out, json.dumps(out, indent=1), "output")
    print(json.dumps(out, indent=1))


def load_fit(path: str | Path) -> tuple[Efficiency, dict]:
    """The efficiencies of a fit file (python -m dsim.profiling.analytical fit) and what it says about itself."""
    d = json.loads(Path(path).read_text())
    f = d["efficiency"]
    held = {k: v["held_out"]["forward_median_abs_pct"] for k, v in d.get("leave_one_out", {}).items()}
    src = (
        f"fitted on measured H200 profiles ({', '.join(Path(p).stem for p in d['fitted_on'])}): "
        f"forward median |err| {f['forward_median_abs_pct']:.1f}% (p90 {f['forward_p90_abs_pct']:.1f}%), "
        f"leave-one-out held-out median |err| " + ", ".join(f"{k} {v:.1f}%" for k, v in held.items())
    )
    eff = Efficiency(
        bw=f["bw"],
        flops=f["flops"],
        launch_us_per_layer=f["launch_us_per_layer"],
        activation_ps=f.get("activation_ps", 0.0),
        knee=f.get("knee"),
        kv_bw=f["kv_bw"],
        source=src,
        decode_row_ns=f.get("decode_row_ns"),
        attn_flops=f.get("attn_flops"),
        merge_ns=f.get("merge_ns"),
        tail_frac=f.get("tail_frac"),
        decode_step_us_per_layer=f.get("decode_step_us_per_layer"),
    )
    info = dict(
        file=str(path),
        bw=round(f["bw"], 4),
        flops=round(f["flops"], 4),
        launch_us_per_layer=round(f["launch_us_per_layer"], 2),
        activation_ps=round(f.get("activation_ps", 0.0), 3),
        **({"knee": round(f["knee"], 3)} if f.get("knee") is not None else {}),
        kv_bw=round(f["kv_bw"], 4),
        train_forward_median_abs_pct=round(f["forward_median_abs_pct"], 2),
        train_forward_p90_abs_pct=round(f["forward_p90_abs_pct"], 2),
        held_out_forward_median_abs_pct={k: round(v, 2) for k, v in held.items()},
    )
    return eff, info


def main() -> None:  # pragma: no cover - thin wrapper
    import argparse
    import sys

    from dsim.cost import save_profile

    if len(sys.argv) > 1 and sys.argv[1] == "fit":
        return fit_cli(sys.argv[2:])
    ap = argparse.ArgumentParser(description="Write an analytical (roofline) profile")
    ap.add_argument("config")
    ap.add_argument("--hardware", default="H200", choices=sorted(HARDWARE))
    ap.add_argument("--gpus", type=int, default=1)
    ap.add_argument("--bytes-per-param", type=float, default=2.0)
    ap.add_argument("--kv-replicated", action="store_true")
    ap.add_argument("--name")
    ap.add_argument(
        "--launch-us-per-layer", type=float, default=None, help="per-layer floor in us (overrides a fitted value)"
    )
    ap.add_argument("--fit", help="efficiency fit JSON (python -m dsim.profiling.analytical fit ...)")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    fit_info = None
    if a.fit:
        eff, fit_info = load_fit(a.fit)
        if a.launch_us_per_layer is not None:
            eff = dataclasses.replace(
                eff,
                launch_us_per_layer=a.launch_us_per_layer,
                source=eff.source + f"; per-layer floor overridden: {a.launch_us_per_layer:g} us",
            )
    else:
        lu = a.launch_us_per_layer if a.launch_us_per_layer is not None else Efficiency.launch_us_per_layer
        eff = Efficiency(launch_us_per_layer=lu, source=f"stated defaults (not fitted), per-layer floor {lu:g} us")
    p = analytical_profile(
        a.config,
        a.hardware,
        a.gpus,
        a.bytes_per_param,
        name=a.name,
        kv_replicated=a.kv_replicated,
        eff=eff,
        fit_info=fit_info,
        fit_path=a.fit,
    )
    save_profile(p, a.out)


if __name__ == "__main__":
    main()
