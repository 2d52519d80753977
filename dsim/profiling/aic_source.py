"""AIConfigurator's silicon data as dsim reads it: the pinned package, its systems and engine backends
(versions), the model and quant-mode names of its tables, interpolation over a measured grid (GridTable), the
models' configs; a record's integer fields checked (record_ints); NoTable where the tables hold nothing."""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from dsim.errors import InputError

AIC_PACKAGE = "aiconfigurator-core"
AIC_VERSION = "0.12.0"
FALLBACK_BACKEND = ("sglang", "0.5.14")
# every AIC 0.12.0 system with per-kernel tables (systems/data/<system>/gemm/<backend>/<version>), AIC name ->
# the hardware's name; A30, A100 PCIe, H100 PCIe and L4 ship no kernel tables
SYSTEMS = {
    "a100_sxm": "NVIDIA A100 SXM",
    "b200_sxm": "NVIDIA B200 SXM",
    "b300_sxm": "NVIDIA B300 SXM",
    "b60": "Intel Arc Pro B60",
    "gb200": "NVIDIA GB200",
    "gb300": "NVIDIA GB300",
    "h100_sxm": "NVIDIA H100 SXM",
    "h200_sxm": "NVIDIA H200 SXM",
    "l40s": "NVIDIA L40S",
    "rtx_pro_6000_server": "NVIDIA RTX PRO 6000 Blackwell Server Edition",
}
# AIC system -> dsim.profiling.kernel_tables.HARDWARE key (its datasheet: the roofline fallback, the composer's --hardware)
DATASHEET = {
    "h100_sxm": "h100",
    "h200_sxm": "h200",
    "b200_sxm": "b200",
    "b300_sxm": "b300",
    "gb200": "gb200",
    "gb300": "gb300",
}
SYSTEM_OF = {hw: system for system, hw in DATASHEET.items()}  # dsim hardware -> AIC system
# serving engines whose kernels AIC measured (its directory names), with the name users know them by
BACKENDS = {"vllm": "vLLM", "sglang": "SGLang", "trtllm": "TensorRT-LLM"}


def version_key(v: str) -> tuple:
    """A version's sort key: '0.5.6.post2' < '0.5.14'; '1.3.0rc20' < '1.3.0rc23' < '1.3.0'; '2-29-2' as '2.29.2'."""
    import re

    parts = []
    for x in re.split(r"[.-]", v):
        m = re.fullmatch(r"(\d+)(?:(rc|post)(\d+))?", x)
        if m is None:
            parts.append((0, 0, 0))
            continue
        tag = {"rc": -1, None: 0, "post": 1}[m.group(2)]
        parts.append((int(m.group(1)), tag, int(m.group(3) or 0)))
    return tuple(parts)


def backend_versions(system: str, backend: str) -> list[str]:
    """The versions of ``backend`` whose GEMM tables AIC ships for ``system``, oldest first (needs AIC)."""
    d = aic_root() / "systems" / "data" / system / "gemm" / backend
    return sorted((x.name for x in d.iterdir() if x.is_dir()), key=version_key) if d.is_dir() else []


def default_version(system: str, backend: str) -> str:
    """The newest version of ``backend`` with tables for ``system``: an input error naming what there is
    where there is none."""
    if system not in SYSTEMS:
        raise InputError(f"--system: {system!r} is not one of {', '.join(SYSTEMS)} (AIC's systems with kernel tables)")
    if backend not in BACKENDS:
        raise InputError(f"--backend: {backend!r} is not one of {', '.join(BACKENDS)}")
    have = backend_versions(system, backend)
    if not have:
        others = [b for b in BACKENDS if backend_versions(system, b)]
        raise InputError(f"--backend {backend}: AIC has no {backend} tables for {system} (it has {', '.join(others)})")
    return have[-1]


# dsim model name -> (AIC model config file stem, name used in AIC's DeepSeek-V4 attention tables)
MODELS = {
    "deepseek-v4-flash": ("deepseek-ai--DeepSeek-V4-Flash", "DeepSeek-V4-Flash"),
    "deepseek-v4-pro": ("deepseek-ai--DeepSeek-V4-Pro", "DeepSeek-V4-Pro"),
    "deepseek-v3": ("deepseek-ai--DeepSeek-V3", "DeepSeek-V3"),
}
TOPOLOGIES = ("dp8-ep8", "tp8-ep8")

# record dtype -> AIC quant mode
GEMM_MODES = {"bf16": "bfloat16", "fp8": "fp8_block", "fp4": "nvfp4"}
MOE_MODES = {
    "bf16": ("bfloat16",),
    "fp8": ("fp8_block",),
    # MXFP4 weights / MXFP8 activations is the released DeepSeek-V4 expert format; NVFP4 otherwise
    "fp4": ("w4a8_mxfp4_mxfp8", "nvfp4"),
    "w4a16": ("w4a16_mxfp4", "w4a16_nvfp4"),
}
# what AIC's attention modules include beyond the attention core, in the composer's part names (dsim.profiling.kernel_ops
# layer_ops): the composer does not price these parts again when a table's attention records include them
ATTN_INCLUDES = ["q_proj", "kv_proj", "o_proj", "compressor", "indexer_proj"]
MLA_INCLUDES = ["q_proj", "kv_proj", "mla_absorb", "o_proj"]
# bytes per token of the composer's a2a records: FP8 dispatch, BF16 combine
A2A_BYTES_PER_ELEMENT = {"a2a_dispatch": 1, "a2a_combine": 2}


# ---- the optional dependency ---------------------------------------------------------------------------------


def aic_package():
    """Import aiconfigurator-core lazily; a missing or different version is an input error."""
    try:
        from importlib.metadata import version

        import aiconfigurator_core
    except ImportError:
        raise InputError(f"{AIC_PACKAGE}=={AIC_VERSION} is not installed (pip install 'dsim[aic]')") from None
    got = version(AIC_PACKAGE)
    if got != AIC_VERSION:
        raise InputError(f"{AIC_PACKAGE}: version {got} installed, tables are pinned to {AIC_VERSION}")
    return aiconfigurator_core


def aic_root() -> Path:
    return Path(aic_package().__file__).parent


# ---- interpolation over a measured grid ----------------------------------------------------------------------


@dataclass
class GridTable:
    """Latency over measured points in log-space axes: linear inside the convex hull, clamped outside.

    Axes are log2(x) (or log2(1 + x) for context lengths that may be 0). A query outside the measured range on
    an axis is clamped to that range; the record then carries "clamped" with the axis names."""

    names: tuple[str, ...]
    points: np.ndarray  # [n, d] raw axis values
    ms: np.ndarray  # [n]
    plus_one: tuple[bool, ...]  # axis uses log2(1 + x)
    _lin: Any = None
    _near: Any = None

    def _tx(self, x: np.ndarray) -> np.ndarray:
        out = np.empty_like(x, dtype=float)
        for j, p1 in enumerate(self.plus_one):
            out[..., j] = np.log2(x[..., j] + (1.0 if p1 else 0.0))
        return out

    def __call__(self, query: Iterable[float]) -> tuple[float, list[str]]:
        q = np.asarray(list(query), dtype=float)
        lo, hi = self.points.min(axis=0), self.points.max(axis=0)
        clamped = [self.names[j] for j in range(len(q)) if q[j] < lo[j] or q[j] > hi[j]]
        q = np.clip(q, lo, hi)
        x = self._tx(self.points)
        live = [j for j in range(x.shape[1]) if np.ptp(x[:, j]) > 0]
        xq = self._tx(q[None, :])[:, live]
        x = x[:, live]
        if len(live) == 0:
            return float(self.ms.mean()), clamped
        if len(live) == 1:
            order = np.argsort(x[:, 0])
            return float(np.interp(xq[0, 0], x[order, 0], self.ms[order])), clamped
        from scipy.interpolate import LinearNDInterpolator, NearestNDInterpolator

        if self._lin is None:
            self._lin = LinearNDInterpolator(x, self.ms)
            self._near = NearestNDInterpolator(x, self.ms)
        v = float(self._lin(xq)[0])
        if not math.isfinite(v):  # inside the box but outside the hull (a corner not measured, e.g. OOM)
            v = float(self._near(xq)[0])
            clamped.append("hull")
        return v, clamped


class NoTable(Exception):
    """The tables hold nothing for this record (it goes to "unpriced", with the reason)."""


def record_ints(r: dict, *keys: str) -> list[int]:
    out = []
    for k in keys:
        v = r.get(k)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0 or int(v) != v:
            raise InputError(f"{r.get('op')} record: {k} must be a non-negative integer, got {v!r}")
        out.append(int(v))
    return out


def model_config(model: str) -> dict:
    """The model's public Hugging Face config: the repository's profiles/models copy, else AIC's packaged one."""
    if model not in MODELS:
        raise InputError(f"--model: {model!r} is not one of {', '.join(MODELS)}")
    ours = Path(__file__).resolve().parents[2] / "profiles" / "models" / f"{model}.json"
    if ours.is_file():
        return json.loads(ours.read_text())
    path = aic_root() / "model_configs" / f"{MODELS[model][0]}_config.json"
    return json.loads(path.read_text())
