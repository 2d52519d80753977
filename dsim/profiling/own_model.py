"""A step-cost profile for the user's own model, from its Hugging Face style config.json, in one call.

``own_profile(config, hardware, gpus=None, topology=None) -> Profile`` dispatches, and computes
nothing itself: a dense model goes through the analytical roofline (``dsim.profiling.analytical``, with the
efficiency fit of the measured H200 profiles where it ships), a MoE model through the kernel-op
composer, priced first from the silicon tables of the hardware x serving backend
(``dsim.profiling.aic_tables.compose_for``: AIConfigurator's table where one ships for the topology, or on
demand with the aic extra), else from the tables that ship for the GPU, and by the roofline for
any op no table holds (the fallback and its reason stated in the provenance). ``hardware_kinds()`` lists the hardware either path has figures for
(their ``HARDWARE`` tables), so a GPU added there is offered here with no change to this module.

Every profile leaves with ``provenance.basis``: what is measured (kernel tables, a fit on
measured profiles), what is stated by a vendor (datasheet peaks) and what is assumed (the
roofline's shape, weight bytes, the GPUs per replica chosen, drafter costs, a fit carried to
other hardware).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from dsim.errors import InputError

if TYPE_CHECKING:
    from dsim.cost import Profile

#: the GPUs per replica tried for a dense model, fewest first (tensor parallelism within a node)
DENSE_GPUS = (1, 2, 4, 8)
#: the composer's default topology: the default scenario's (DeepSeek-V4-Flash on 8-GPU nodes)
MOE_TOPOLOGY = "dp8-ep8"
_MOE_KEYS = ("n_routed_experts", "num_experts", "num_local_experts")
#: the architecture keys the analytical path and the composer read, each an integer where given
#: (None is Hugging Face's "not used", e.g. sliding_window, q_lora_rank); sizes at least 1
_POSITIVE_KEYS = (
    "hidden_size",
    "num_hidden_layers",
    "vocab_size",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "intermediate_size",
)
_COUNT_KEYS = (
    *_MOE_KEYS,
    "num_experts_per_tok",
    "moe_intermediate_size",
    "n_shared_experts",
    "first_k_dense_replace",
    "q_lora_rank",
    "kv_lora_rank",
    "qk_nope_head_dim",
    "qk_rope_head_dim",
    "v_head_dim",
    "num_nextn_predict_layers",
    "o_groups",
    "o_lora_rank",
    "sliding_window",
    "index_n_heads",
    "index_head_dim",
    "index_topk",
    "hc_mult",
    "num_hash_layers",
)


def hardware_kinds() -> list[str]:
    """The hardware either path has figures for, as the user names it (H200, B300, ...)."""
    from dsim.profiling.analytical import HARDWARE as A
    from dsim.profiling.kernel_tables import HARDWARE as K

    return sorted({k.upper() for k in A} | {k.upper() for k in K})


def read_config(path: str | Path) -> dict:
    """The config.json as a dict, every architecture key dsim reads checked for its type (a bad
    one is an InputError naming the file and the key)."""
    from dsim import schema

    p = Path(path)
    if not p.is_file():
        raise InputError(f"{path}: model config not found (a Hugging Face style config.json)")
    cfg, doc = schema.read_document(p, kind="json")
    if not isinstance(cfg, dict):
        raise InputError(f"{p}: expected a JSON object (a config.json)")
    for keys, lo in ((_POSITIVE_KEYS, 1), (_COUNT_KEYS, 0)):
        for k in keys:
            if cfg.get(k) is not None:
                schema.integer(cfg[k], doc, k, lo=lo)
    if "compress_ratios" in cfg:
        schema.number_list(cfg["compress_ratios"], doc, "compress_ratios", lo=0, ints=True)
    return cfg


def is_moe(cfg: dict) -> bool:
    """A mixture-of-experts config: it names routed experts (DeepSeek, Qwen-MoE, Mixtral keys)."""
    return any(int(cfg.get(k) or 0) > 0 for k in _MOE_KEYS)


#: bits per weight of quantization methods whose config carries no ``bits`` (MXFP4: 4-bit values
#: and one 8-bit scale per block of 32, per the OCP Microscaling Formats specification v1.0)
_METHOD_BITS = {"fp8": 8.0, "mxfp4": 4.25}


def _quant_bits(q: dict, where: str) -> float | None:
    """Bits per weight a Hugging Face quantization_config states (None: it states none)."""
    method = str(q.get("quant_method", "")).lower()
    if method == "fp8" or str(q.get("fmt", "")).lower().startswith("e4m3"):
        return 8.0
    if method in _METHOD_BITS:
        return _METHOD_BITS[method]
    if method == "bitsandbytes":
        return 4.0 if q.get("load_in_4bit") else 8.0 if q.get("load_in_8bit") else None
    if method == "compressed-tensors":
        groups = q.get("config_groups")
        found = {
            (g.get("weights") or {}).get("num_bits")
            for g in (groups.values() if isinstance(groups, dict) else [])
            if isinstance(g, dict) and isinstance(g.get("weights"), dict)
        }
        if len(found) > 1:
            raise InputError(
                f"{where}: quantization_config.config_groups: weights of {len(found)} bit widths "
                f"({', '.join(map(str, sorted(found, key=str)))}); dsim prices one width for all weights"
            )
        bits = found.pop() if found else None
    else:  # awq, gptq and the like name their width 'bits' ('w_bit' in older AWQ files)
        bits = q.get("bits", q.get("w_bit"))
    if bits is None:
        return None
    if isinstance(bits, bool) or not isinstance(bits, (int, float)) or not 1 <= bits <= 16:
        raise InputError(f"{where}: quantization_config: bits must be a number from 1 to 16, got {bits!r}")
    return float(bits)


def _bytes_per_param(cfg: dict, where: str = "<config>") -> tuple[float, str]:
    q = cfg.get("quantization_config")
    if q:
        if not isinstance(q, dict):
            raise InputError(f"{where}: quantization_config: expected an object, got {type(q).__name__}")
        method = str(q.get("quant_method", "")) or "(none named)"
        bits = _quant_bits(q, where)
        if bits is None:
            raise InputError(
                f"{where}: quantization_config.quant_method {method}: unsupported (dsim reads fp8, mxfp4, "
                "bitsandbytes, compressed-tensors' num_bits, or a 'bits' field as AWQ and GPTQ write)"
            )
        return bits / 8, (
            f"weights {bits / 8:g} bytes per parameter (the config's {method} quantization_config, "
            f"{bits:g} bits; group scales and modules it leaves unquantized priced the same)"
            + ("; matrix peak taken as fp8's, as for any weights of 1 byte or less" if bits < 8 else "")
        )
    dt = str(cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16")
    return 2.0, f"weights 2 bytes per parameter (torch_dtype {dt}; served unquantized)"


def _fit_path() -> Path | None:
    from dsim.cost import PROFILE_DIR

    p = PROFILE_DIR / "analytical" / "h200-fit.json"
    return p if p.is_file() else None


def _rel(p: Path) -> str:
    """A path under the checkout, as the repository names it."""
    root = Path(__file__).resolve().parents[2]
    try:
        return str(p.resolve().relative_to(root))
    except ValueError:
        return str(p)


def _check_hardware(hardware: str, table: dict, path: str) -> str:
    for k in table:
        if k.lower() == hardware.lower():
            return k
    raise InputError(
        f"--hardware {hardware}: the {path} has no figures for it (known: {', '.join(sorted(k.upper() for k in table))})"
    )


def tensor_parallel_problem(cfg: dict, gpus: int) -> str | None:
    """Why vLLM cannot split this model over `gpus` GPUs by tensor parallelism (None: it can).
    vLLM's rule (ModelConfig.verify_with_parallel_config, QKVParallelLinear): the attention heads
    divide evenly over the GPUs, and the KV heads do too, or (fewer KV heads than GPUs) each is
    replicated on a whole number of GPUs."""
    heads = int(cfg["num_attention_heads"])
    kv = int(cfg.get("num_key_value_heads") or heads)
    if heads % gpus:
        return f"{heads} attention heads do not divide over {gpus} GPUs (tensor parallelism)"
    if (kv % gpus) if kv >= gpus else (gpus % kv):
        return f"{kv} KV heads neither divide over {gpus} GPUs nor replicate evenly on them"
    return None


def dense_profile(config: str | Path, cfg: dict, hardware: str, gpus: int | None, name: str | None) -> Profile:
    from dsim.profiling import analytical as A

    hw = _check_hardware(hardware, A.HARDWARE, "analytical path")
    if gpus:
        problem = tensor_parallel_problem(cfg, gpus)
        if problem:
            raise InputError(f"--gpus {gpus}: {config}: {problem}; vLLM cannot serve it so")
    bpp, bpp_why = _bytes_per_param(cfg, str(config))
    fit = _fit_path()
    if fit is not None:
        eff, fit_info = A.load_fit(fit)
    else:  # pragma: no cover - the fit ships with dsim
        eff, fit_info = A.Efficiency(), None
    tried = [gpus] if gpus else [g for g in DENSE_GPUS if tensor_parallel_problem(cfg, g) is None]
    if not tried:
        raise InputError(f"{config}: {tensor_parallel_problem(cfg, 2)}: no GPU count of 1, 2, 4, 8 splits it")
    last = ""
    for g in tried:
        try:
            prof = A.analytical_profile(
                config, hw, g, bpp, eff=eff, name=name, fit_info=fit_info, fit_path=str(fit) if fit else None
            )
            break
        except ValueError as e:  # weights do not fit these GPUs
            last = str(e)
    else:
        raise InputError(f"{config}: {last}" if gpus else f"{config}: weights do not fit 8 x {hw} (one node)")
    measured: list[str] = []
    # datasheet peaks are the vendor's stated figures, not measured on the hardware
    stated = [f"hardware figures: {prof.provenance.get('hardware_source')}"]
    assumed = [
        "roofline step cost: weight and KV bytes over HBM bandwidth, FLOPs over matrix peak, NVLink all-reduce",
        bpp_why,
        "drafter costs (MTP, EAGLE-3, block, DSpark): per-method shapes relative to the target, not measured",
        (
            f"{g} GPU(s) per replica: given"
            if gpus
            else f"{g} GPU(s) per replica: the fewest of 1, 2, 4, 8 the weights fit"
        ),
    ]
    if fit_info and fit is not None:
        measured.insert(0, f"efficiencies fitted on the measured dense H200 profiles ({_rel(fit)})")
        if hw != "H200":
            assumed.append(f"the H200 efficiency fit carried to {hw} (no measured {hw} profile)")
    else:  # pragma: no cover
        assumed.append("efficiencies: stated defaults, not fitted")
    prof.provenance["basis"] = {
        "path": "analytical (dense)",
        "measured": measured,
        "stated": stated,
        "assumed": assumed,
    }
    prof.provenance["command"] = _command(config, hw, gpus, None)
    return prof


def kernel_tables_for(hardware: str) -> list[str]:
    """The shipped kernel tables for a hardware, in order of preference: AIConfigurator's silicon
    table for vLLM (else for another backend, the first by name), then our own measured (torch)
    table where one ships."""
    from dsim.profiling.kernel_tables import KERNEL_DIR

    h = hardware.lower()
    shipped = {q.name.split(".")[0] for q in KERNEL_DIR.glob(f"{h}-*.json*")} if KERNEL_DIR.is_dir() else set()
    aic = sorted(n for n in shipped if n.startswith(f"{h}-aic-") and not n.endswith("-error"))
    first = [f"{h}-aic-vllm"] if f"{h}-aic-vllm" in aic else aic[:1]
    return first + ([f"{h}-torch"] if f"{h}-torch" in shipped else [])


#: a GPU without a MoE silicon table of its own, and the GPU of the same generation whose table is carried to
#: it (dsim.profiling.kernel_tables.carried_table: same matrix peaks, the HBM and NVLink differences by the roofline)
CARRIED_FROM = {"h100": "h200", "h800": "h200"}


def moe_profile(
    config: str | Path, cfg: dict, hardware: str, topology: str | None, name: str | None, backend: str = "vllm"
) -> Profile:
    """The composer's profile, priced first from the silicon tables (dsim.profiling.aic_tables.compose_for: AIC's
    table for this hardware x backend where one ships for the topology, or priced on demand with the aic
    extra), our own measured table of that GPU after it; where there is none, from the tables that ship
    for the GPU (kernel_tables_for) and the roofline for what they lack, the reason stated."""
    from dsim.profiling import aic_tables as KA
    from dsim.profiling.compose import compose_profile
    from dsim.profiling.kernel_tables import HARDWARE, kernel_table_path, load_kernel_table
    from dsim.profiling.models import model_from_config, model_name
    from dsim.profiling.pricer import load_table_spec
    from dsim.profiling.topology import parse_topology

    hw = _check_hardware(hardware, HARDWARE, "composer")
    if backend not in KA.BACKENDS:
        raise InputError(f"--backend {backend!r}: one of {', '.join(KA.BACKENDS)}")
    model = model_from_config(cfg, name=model_name(cfg, config), where=str(config))
    topo = parse_topology(topology or MOE_TOPOLOGY)
    cmd = _command(config, hw.upper(), None, topology, backend)
    own = [t for t in kernel_tables_for(hw) if not t.startswith(f"{hw}-aic-")]
    try:
        prof = KA.compose_for(
            model, hw, backend, topo.name, name=name, after=[load_kernel_table(t) for t in own], command=cmd
        )
        tables, no_silicon = [f"{hw}-aic-{backend}", *own], ""
    except InputError as e:  # no silicon table for this GPU x backend x topology here: the stated fallback
        tables, no_silicon = kernel_tables_for(hw), str(e)
        donor = CARRIED_FROM.get(hw)
        if donor and kernel_table_path(f"{donor}-aic-{backend}").is_file():
            tables.append(f"{donor}-aic-{backend}@{hw}")
        prof = compose_profile(model, topo, hw, [load_table_spec(t) for t in tables] or None, name=name, command=cmd)
    measured = (
        [f"kernel times from the tables {', '.join(tables)} (their provenance in profiles/kernels/)"] if tables else []
    )
    assumed = [
        "a step is the sum of its kernel ops (dsim.profiling.compose), each op priced from the tables; ops they hold no "
        "record for from the roofline (counted in provenance.method)",
        f"topology {topo.describe()}" + ("" if topology else f" (the default, {MOE_TOPOLOGY})"),
        "drafter costs composed from the same kernel ops",
    ]
    if no_silicon:
        assumed.insert(
            0,
            f"no silicon table for {hw.upper()} x {backend} at {topo.name} ({no_silicon}): "
            + (
                f"ops priced from {', '.join(tables)} where they hold a record, else by the roofline"
                + (
                    " (NAME@GPU: a table of another GPU of the same generation carried to this one by each op's "
                    "roofline ratio, dsim.profiling.kernel_tables.carried_table)"
                    if any("@" in t for t in tables)
                    else ""
                )
                if tables
                else "every op priced by the roofline"
            ),
        )
    prof.provenance["basis"] = {"path": "composer (MoE)", "measured": measured, "assumed": assumed}
    return prof


def _command(config, hardware: str, gpus: int | None, topology: str | None, backend: str = "vllm") -> str:
    return (
        f"dsim profile model {config} --hardware {hardware}"
        + (f" --gpus {gpus}" if gpus else "")
        + (f" --topology {topology}" if topology else "")
        + (f" --backend {backend}" if backend != "vllm" else "")
    )


def own_profile(
    config: str | Path,
    hardware: str = "H200",
    *,
    gpus: int | None = None,
    topology: str | None = None,
    name: str | None = None,
    backend: str = "vllm",
) -> Profile:
    """The profile of the model in `config` on `hardware`: dense -> dsim.profiling.analytical, MoE -> dsim.profiling.compose
    (priced from `backend`'s silicon tables where they ship for the hardware)."""
    from dsim.spec.capability import heads_from_config

    cfg = read_config(config)
    if not is_moe(cfg):
        if topology:
            raise InputError(f"--topology {topology}: a dense model runs one replica per --gpus GPUs (no experts)")
        prof = dense_profile(config, cfg, hardware, gpus, name)
    else:
        if gpus:
            raise InputError(f"--gpus {gpus}: a MoE model's GPUs come from --topology (e.g. {MOE_TOPOLOGY})")
        prof = moe_profile(config, cfg, hardware, topology, name, backend)
    # the model's own heads, read from its config: the method check needs no profiles/models copy
    prof.provenance["heads"] = sorted(heads_from_config(cfg))
    return prof


def describe(prof: Profile) -> list[str]:
    """Printed lines: the profile and what of it is measured and what assumed."""
    b: dict[str, Any] = prof.provenance.get("basis", {})
    out = [f"profile  : {prof.label}", f"path     : {b.get('path', '?')}"]
    out += [f"measured : {m}" for m in b.get("measured", [])] or ["measured : nothing (every figure assumed)"]
    out += [f"stated   : {s}" for s in b.get("stated", [])]
    out += [f"assumed  : {a}" for a in b.get("assumed", [])]
    return out
