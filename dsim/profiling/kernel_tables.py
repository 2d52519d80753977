"""Kernel tables: what one GPU kernel (an "op record") costs, from a measured or published table.

An op record is a dict naming the op and its shape (the vocabulary is in docs/dev/architecture.md,
"Kernel-op records"): ``gemm`` (dtype, m, n, k [, groups: that many independent products of that
shape in one launch, a batched GEMM]), ``moe`` (routed-expert FFN of one EP rank: dtype,
tokens over the EP group, hidden, inter, topk, experts, ep), ``attn`` (attention core: kind,
phase, batch, q, kv, heads), ``mhc``, ``comm`` (kind, gpus, bytes), ``elementwise`` (bytes).

A ``KernelSource`` answers ``ms(record) -> float | None``. Two kinds:
- ``KernelTable``: records with measured ``ms`` (profiles/kernels/*.json, each with provenance).
  An exact match answers; otherwise, among records equal in every other key, log-log linear
  interpolation along the op's size axis (m, tokens, batch, bytes), no extrapolation (None).
- ``Roofline``: max(FLOPs / (peak x eff), bytes / (HBM BW x eff)) + a per-kernel floor, for any
  record; the fallback for ops a table lacks (the composer counts and reports those).
"""

from __future__ import annotations

import gzip
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dsim.errors import InputError

KERNEL_DIR = Path(__file__).resolve().parents[2] / "profiles" / "kernels"

#: the size axis each op interpolates along
SIZE_AXIS = {"gemm": "m", "moe": "tokens", "attn": "batch", "mhc": "tokens", "comm": "bytes", "elementwise": "bytes"}
OPS = tuple(SIZE_AXIS)
#: further axes an op interpolates along (linearly) where no series along its size axis matches
SECOND_AXES = {"attn": ("kv", "q")}
_META = {"ms", "op", "includes", "backend", "note", "distribution", "guard"}
#: shape fields that are names, not sizes (every other shape field is an integer)
TEXT_FIELDS = {"dtype", "kind", "phase", "part", "model", "scope", "set"}


def record_key(rec: dict, drop: str | None = None) -> tuple:
    return tuple(sorted((k, v) for k, v in rec.items() if k not in _META and k != drop))


#: weight bytes per parameter and the math each dtype runs on. fp4: NVFP4/MXFP4 (4-bit values +
#: block scales, ~0.53 byte), native on Blackwell; w4a16: 4-bit weights dequantized to bf16 math
#: (Marlin-style kernels, how Hopper serves FP4 checkpoints).
WEIGHT_BYTES = {"bf16": 2.0, "fp8": 1.0, "fp4": 0.53, "w4a16": 0.53}
MATH_DTYPE = {"bf16": "bf16", "fp8": "fp8", "fp4": "fp4", "w4a16": "bf16"}

#: public hardware figures (vendor datasheets): HBM bandwidth, dense matrix peaks, NVLink per GPU
HARDWARE: dict[str, dict[str, Any]] = {
    "h200": dict(
        name="NVIDIA H200 SXM",
        hbm_gb=141.0,
        bw=4.8e12,
        bf16=989e12,
        fp8=1979e12,
        fp4=None,
        link=450e9,
        net=50e9,
        source="NVIDIA H200 datasheet (4.8 TB/s, 989/1979 TFLOP/s dense bf16/fp8, "
        "NVLink 900 GB/s bidirectional; 400 Gb/s InfiniBand per GPU between nodes)",
    ),
    "h100": dict(
        name="NVIDIA H100 SXM",
        hbm_gb=80.0,
        bw=3.35e12,
        bf16=989e12,
        fp8=1979e12,
        fp4=None,
        link=450e9,
        net=50e9,
        source="NVIDIA H100 SXM datasheet (80 GB HBM3 at 3.35 TB/s, 989/1979 TFLOP/s dense bf16/fp8, "
        "NVLink 900 GB/s bidirectional; 400 Gb/s InfiniBand per GPU between nodes)",
    ),
    "h800": dict(
        name="NVIDIA H800 SXM",
        hbm_gb=80.0,
        bw=3.35e12,
        bf16=989e12,
        fp8=1979e12,
        fp4=None,
        link=200e9,
        net=50e9,
        source="NVIDIA H800 SXM (the H100 SXM's HBM3 at 3.35 TB/s and 989/1979 TFLOP/s dense bf16/fp8; NVLink "
        "400 GB/s bidirectional against the H100's 900: 'Insights into DeepSeek-V3', ISCA 2025 (arXiv 2505.09343), Sec. 4.1; "
        "DeepSeek-V3 technical report Sec. 3.1-3.2: one 400 Gb/s InfiniBand NIC per GPU between nodes, "
        "about 160 GB/s achieved over NVLink, 50 GB/s over IB)",
    ),
    "b200": dict(
        name="NVIDIA B200 SXM",
        hbm_gb=180.0,
        bw=7.7e12,
        bf16=2250e12,
        fp8=4500e12,
        fp4=9000e12,
        link=900e9,
        net=50e9,
        source="NVIDIA HGX B200 datasheet, per GPU (180 GB HBM3e at 7.7 TB/s, 2.25/4.5/9 PFLOP/s dense "
        "bf16/fp8/fp4, NVLink 5 1.8 TB/s bidirectional; 400 Gb/s per GPU between nodes)",
    ),
    "gb200": dict(
        name="NVIDIA GB200 (NVL72)",
        hbm_gb=186.0,
        bw=8.0e12,
        bf16=2500e12,
        fp8=5000e12,
        fp4=10000e12,
        link=900e9,
        net=100e9,
        source="NVIDIA GB200 NVL72 datasheet divided by its 72 GPUs (13.4 TB HBM3e at 576 TB/s; 360/720/1440 "
        "PFLOP/s bf16/fp8/fp4 with sparsity, halved for dense), NVLink 5 1.8 TB/s bidirectional within the "
        "72-GPU domain; 800 Gb/s per GPU beyond it",
    ),
    "gb300": dict(
        name="NVIDIA GB300 (NVL72)",
        hbm_gb=288.0,
        bw=8.0e12,
        bf16=2500e12,
        fp8=5000e12,
        fp4=15000e12,
        link=900e9,
        net=100e9,
        source="NVIDIA GB300 NVL72 datasheet divided by its 72 GPUs (288 GB HBM3e at 8 TB/s; 1080 PFLOP/s dense "
        "fp4, bf16/fp8 as GB200), NVLink 5 1.8 TB/s bidirectional within the 72-GPU domain; 800 Gb/s per GPU "
        "beyond it",
    ),
    "b300": dict(
        name="NVIDIA B300 SXM",
        hbm_gb=288.0,
        bw=8.0e12,
        bf16=2250e12,
        fp8=4500e12,
        fp4=13500e12,
        link=900e9,
        net=100e9,
        source="NVIDIA Blackwell Ultra datasheet (8 TB/s, 2.25/4.5 PFLOP/s dense "
        "bf16/fp8, 13.5 dense fp4 (NVFP4), NVLink 5 1.8 TB/s bidirectional; 800 Gb/s per GPU between nodes)",
    ),
}


@dataclass(frozen=True)
class Roofline:
    """Roofline kernel times. Efficiencies default to the fit on the measured dense H200
    profiles (profiles/analytical/h200-fit.json: HBM 0.915, matrix 0.51); the per-kernel floor
    (launch and tail inside a CUDA graph) and the communication latency are stated defaults."""

    hardware: str = "h200"
    eff_bw: float = 0.915
    eff_flops: float = 0.51
    kernel_floor_us: float = 3.0
    comm_latency_us: float = 12.0
    comm_eff: float = 0.7
    name: str = "roofline"

    @property
    def hw(self) -> dict:
        return HARDWARE[self.hardware]

    @property
    def provenance(self) -> dict:
        return dict(
            kind="analytical",
            hardware=self.hw["name"],
            source=self.hw["source"],
            method=(
                f"roofline: HBM x {self.eff_bw}, matrix peak x {self.eff_flops} (fitted on the "
                f"measured dense H200 profiles), {self.kernel_floor_us} us per kernel, "
                f"{self.comm_latency_us} us + bytes / (NVLink x {self.comm_eff}) per collective"
            ),
        )

    def _peak(self, dtype: str) -> float:
        hw = self.hw
        math_ = MATH_DTYPE.get(dtype, "bf16")
        if math_ == "fp4":
            return hw["fp4"] or hw["fp8"]
        return hw["fp8"] if math_ == "fp8" else hw["bf16"]

    def _t(self, flops: float, nbytes: float, dtype: str = "bf16") -> float:
        t = max(flops / (self._peak(dtype) * self.eff_flops), nbytes / (self.hw["bw"] * self.eff_bw))
        return t * 1e3 + self.kernel_floor_us * 1e-3

    def ms(self, r: dict) -> float:
        op = r["op"]
        if op == "gemm":
            wb = WEIGHT_BYTES.get(r["dtype"], 2.0)
            ab = 1.0 if MATH_DTYPE.get(r["dtype"]) in ("fp8", "fp4") else 2.0
            m, n, k, g = r["m"], r["n"], r["k"], r.get("groups", 1)
            return self._t(2.0 * g * m * n * k, g * (m * k * ab + k * n * wb + m * n * 2.0), r["dtype"])
        if op == "moe":
            T, H, inter, k, E, P = (r[x] for x in ("tokens", "hidden", "inter", "topk", "experts", "ep"))
            local = E / P
            active = local * (1.0 - (1.0 - k / E) ** T)  # distinct local experts touched
            assigned = T * k / P  # (token, expert) rows on this rank
            wb = WEIGHT_BYTES.get(r["dtype"], 2.0)
            nbytes = active * 3 * H * inter * wb + assigned * (H * 3 + inter * 2)
            return self._t(2.0 * assigned * 3 * H * inter, nbytes, r["dtype"]) + 2 * self.kernel_floor_us * 1e-3
        if op == "attn":
            return self._attn(r)
        if op == "mhc":
            T, H, M = r["tokens"], r["hidden"], r["hc_mult"]
            return self._t(2.0 * T * H * M * (2 * M + M * M), T * H * M * 2.0 * 4)
        if op == "elementwise":
            return self._t(0.0, float(r["bytes"]))
        if op == "comm":
            G, nbytes = r["gpus"], float(r["bytes"])
            if G <= 1:
                return 0.0
            link = (self.hw["net"] if r.get("scope") == "inter_node" else self.hw["link"]) * self.comm_eff
            if r["kind"] == "all_reduce":
                moved = 2.0 * (G - 1) / G * nbytes
            elif r["kind"] in ("all_gather", "reduce_scatter"):
                moved = (G - 1) * nbytes
            else:  # a2a: top-k copies, deduplicated per rank
                moved = nbytes * G * (1.0 - (1.0 - 1.0 / G) ** r.get("topk", 6)) * (G - 1) / G
            return (self.comm_latency_us * 1e-6 + moved / link) * 1e3
        raise InputError(f"kernel op: unknown op {op!r} (known: {', '.join(OPS)})")

    def _attn(self, r: dict) -> float:
        B, q, L, Hq, kind = r["batch"], r["q"], r["kv"], r["heads"], r["kind"]
        hd = r.get("head_dim", 512)
        if kind == "mla":
            # absorbed MLA: every query token reads the request's latent cache (576 wide, bf16)
            nbytes = B * L * 576 * 2.0
            flops = 2.0 * B * q * Hq * L * (576 + 512)
            return self._t(flops, nbytes) + self.kernel_floor_us * 1e-3
        window = min(L + q, r.get("window", 128))
        if kind == "v4_swa":
            keys = window
            idx_flops, idx_bytes = 0.0, 0.0
        elif kind == "v4_hca":
            keys = window + (L + q) / 128.0
            idx_flops, idx_bytes = 0.0, 0.0
        else:
            keys = window + min(r.get("topk", 512), (L + q) / 4.0)
            comp = (L + q) / 4.0
            idx_flops = 2.0 * B * q * r.get("index_heads", 64) * r.get("index_dim", 128) * comp
            idx_bytes = B * comp * r.get("index_dim", 128) * 1.0
        entry = (hd - 64) * 1.0 + 64 * 2.0
        # one shared KV head: a request's selected entries are read once per query token's set
        nbytes = B * q * keys * entry + idx_bytes
        flops = 2.0 * 2.0 * B * q * Hq * hd * keys + idx_flops
        return self._t(flops, nbytes, "fp8") + 3 * self.kernel_floor_us * 1e-3


@dataclass
class KernelTable:
    """Measured op records with provenance (a profiles/kernels/*.json file)."""

    name: str
    provenance: dict
    records: list
    source_path: str = ""
    _exact: dict = field(default_factory=dict, repr=False)
    _series: dict = field(default_factory=dict, repr=False)
    _axis_values: dict = field(default_factory=dict, repr=False)

    def __post_init__(self):
        for r in self.records:
            self._exact[(r["op"],) + record_key(r)] = float(r["ms"])
            ax = SIZE_AXIS[r["op"]]
            self._series.setdefault((r["op"],) + record_key(r, drop=ax), []).append((float(r[ax]), float(r["ms"])))
            for ax in SECOND_AXES.get(r["op"], ()):
                # values of a second axis present for records equal in every key but it and the size axis
                k = {kk: vv for kk, vv in r.items() if kk != SIZE_AXIS[r["op"]] and kk not in SECOND_AXES[r["op"]]}
                self._axis_values.setdefault((r["op"], ax) + record_key(k), set()).add(float(r[ax]))
        for v in self._series.values():
            v.sort()

    def ms(self, r: dict) -> float | None:
        return self._resolve(r, SECOND_AXES.get(r["op"], ()))

    def _resolve(self, r: dict, axes: tuple) -> float | None:
        v = self._along_size(r)
        if v is not None or not axes:
            return v
        # an attention core at a context (or query length) the table has no series for: linear in
        # that axis between the two nearest values that it has (attention cost is affine in the keys
        # read), each of them resolved the same way along the remaining axes
        for i, ax in enumerate(axes):
            kr = {kk: vv for kk, vv in r.items() if kk != SIZE_AXIS[r["op"]] and kk not in SECOND_AXES[r["op"]]}
            vals = self._axis_values.get((r["op"], ax) + record_key(kr), ())
            x = float(r[ax])
            rest = axes[:i] + axes[i + 1 :]
            below = ((v_, self._resolve({**r, ax: int(v_)}, rest)) for v_ in sorted(vals, reverse=True) if v_ < x)
            lo = next(((v_, y) for v_, y in below if y is not None), None)
            above = ((v_, self._resolve({**r, ax: int(v_)}, rest)) for v_ in sorted(vals) if v_ > x)
            hi = next(((v_, y) for v_, y in above if y is not None), None) if lo else None
            if lo and hi:
                (x0, y0), (x1, y1) = lo, hi
                return y0 + (y1 - y0) * (x - x0) / (x1 - x0)
        return None

    def _along_size(self, r: dict) -> float | None:
        hit = self._exact.get((r["op"],) + record_key(r))
        if hit is not None:
            return hit
        ax = SIZE_AXIS[r["op"]]
        pts = self._series.get((r["op"],) + record_key(r, drop=ax))
        if not pts:
            return None
        x = float(r[ax])
        if x < pts[0][0] or x > pts[-1][0] or len(pts) < 2:
            return None
        for (x0, y0), (x1, y1) in zip(pts, pts[1:]):
            if x0 <= x <= x1:
                if min(x0, x1, y0, y1) <= 0:
                    return y0 + (y1 - y0) * (x - x0) / (x1 - x0)
                f = (math.log(x) - math.log(x0)) / (math.log(x1) - math.log(x0))
                return math.exp(math.log(y0) + f * (math.log(y1) - math.log(y0)))
        return None

    def includes(self, op: str) -> set:
        """Parts of a layer that this table's records of `op` already include (e.g. an attention
        module table that includes the q/kv projections): the composer does not price them again."""
        out: set = set()
        for r in self.records:
            if r["op"] == op:
                out.update(r.get("includes", ()))
        return out


def carried_table(
    table: KernelTable, source_hardware: str, hardware: str, included: Callable[[dict], list[dict]] | None = None
) -> KernelTable:
    """``table`` (measured on ``source_hardware``) carried to ``hardware``: each record's time x the
    ratio of the two machines' roofline times for that record (``Roofline.ms``: matrix peak, HBM and
    link bandwidth, the same per-kernel floor), i.e. each op keeps the fraction of the roofline it was
    measured at. A stated assumption for hardware no table was measured on (e.g. H800 from H200: a
    compute-bound op keeps its time, an HBM-bound one takes 4.8 / 3.35 x longer). ``included``: the op
    records of the parts a record includes (an attention module's projections, dsim.profiling.kernel_ops
    .included_part_records), whose rooflines join the record's own in the ratio."""
    src, dst = Roofline(hardware=source_hardware), Roofline(hardware=hardware)
    recs = []
    for r in table.records:
        parts = [r, *(included(r) if included and r.get("includes") else [])]
        a = sum(src.ms(p) for p in parts)
        recs.append({**r, "ms": float(r["ms"]) * (sum(dst.ms(p) for p in parts) / a if a > 0 else 1.0)})
    prov = dict(table.provenance)
    prov.update(
        hardware=f"{HARDWARE[hardware]['name']} (carried from {table.provenance.get('hardware', source_hardware)})",
        carried=(
            f"{table.name}, measured on {HARDWARE[source_hardware]['name']}, carried to {HARDWARE[hardware]['name']}: "
            "each record x roofline(target) / roofline(source) for it (dsim.profiling.kernel_tables.carried_table; assumed: every op "
            "keeps the fraction of its roofline it was measured at)"
        ),
    )
    return KernelTable(name=f"{table.name}@{hardware}", provenance=prov, records=recs, source_path=table.source_path)


def read_json_text(path: Path) -> str:
    """A JSON file's text; ``.json.gz`` files are gzip-compressed (the largest kernel tables ship so)."""
    return gzip.decompress(path.read_bytes()).decode() if path.name.endswith(".gz") else path.read_text()


def kernel_table_path(name_or_path: str) -> Path:
    """A table's file: a .json / .json.gz path as given, else NAME.json or NAME.json.gz in KERNEL_DIR."""
    p = Path(name_or_path)
    if p.name.endswith((".json", ".json.gz")):
        return p
    for suffix in (".json", ".json.gz"):
        if (KERNEL_DIR / f"{name_or_path}{suffix}").is_file():
            return KERNEL_DIR / f"{name_or_path}{suffix}"
    return KERNEL_DIR / f"{name_or_path}.json"


def load_kernel_table(name_or_path: str) -> KernelTable:
    p = kernel_table_path(name_or_path)
    if not p.is_file():
        known = sorted({q.name.split(".")[0] for q in KERNEL_DIR.glob("*.json*")}) if KERNEL_DIR.is_dir() else []
        raise InputError(f"{name_or_path}: kernel table not found (a .json path or one of: {', '.join(known)})")
    from dsim import schema as S

    d = S.read_json(p)  # bounded; a corrupt or truncated .gz is an InputError
    S.kernel_table(d, str(p), SIZE_AXIS, _META, TEXT_FIELDS)
    return KernelTable(
        name=str(d.get("name", p.name.split(".")[0])),
        provenance=d["provenance"],
        records=d["records"],
        source_path=str(p),
    )
