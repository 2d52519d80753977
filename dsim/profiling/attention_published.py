"""Attention kernels priced from their authors' published rates: a kernel source beside the tables.

``flashmla-published``: DeepSeek's FlashMLA dense MLA decoding kernel, the one DeepSeek's own V3/R1
serving runs (github.com/deepseek-ai/FlashMLA, README, "Performance"): "up to 3000 GB/s in memory-bound
configuration and 660 TFLOPS in computation-bound configuration on H800 SXM5 with CUDA 12.8" (580 TFLOPS
at its February 2025 release; 660 since the 2025-04-22 update). It runs MLA in MQA mode (one latent KV
head, head_dim_k 576 = 512 latent + 64 rope, head_dim_v 512) over a BF16 paged cache, on SM90 only.
No per-shape table is published, so a decode of B requests x s_q query tokens x h_q heads over L keys
each is priced as its FLOPs and bytes at those two rates, whichever takes longer, counted as FlashMLA's
own benchmark counts them (tests/test_flash_mla.py):

    FLOPs = 2 x B x s_q x L x h_q x (576 + 512)
    bytes = 2 x (B x L x 576 + B x s_q x h_q x (576 + 512))      (KV read, q read, output written; bf16)

plus two of the roofline's per-kernel floors (the split-KV kernel and its combine). These are the
kernel's best published rates ("up to"), used at every shape: an upper bound on its speed where a shape
is neither clearly compute- nor memory-bound, and for short contexts whose split-KV tiles are few.
Other Hopper GPUs: the compute rate as on the H800 (the same SMs, clocks and bf16 peak), the memory rate
as the same fraction of HBM bandwidth (3000 / 3350 GB/s, 89.6%: on an H200 4.8 TB/s x 0.896 = 4.3 TB/s).
Only ``op: attn, kind: mla`` decode records are answered (FlashMLA has no dense MLA prefill on SM90);
everything else, the projections included, stays with the kernel tables (dsim.profiling.pricer.Pricer).
"""

from __future__ import annotations

from dataclasses import dataclass

from dsim.errors import InputError
from dsim.profiling.kernel_tables import HARDWARE, Roofline

#: FlashMLA README (github.com/deepseek-ai/FlashMLA), dense MLA decoding on H800 SXM5, CUDA 12.8
FLASHMLA_H800_TFLOPS = 660.0
FLASHMLA_H800_GBPS = 3000.0
FLASHMLA_H800_TFLOPS_FEB_2025 = 580.0  # the release of 2025-02-24, the weeks of DeepSeek's published figures
FLASHMLA_SOURCE = (
    "deepseek-ai/FlashMLA README (dense MLA decoding, BF16 KV, H800 SXM5, CUDA 12.8): up to 3000 GB/s "
    "memory-bound, 660 TFLOP/s compute-bound (580 at the 2025-02 release); FLOPs and bytes as its "
    "tests/test_flash_mla.py counts them"
)
#: MLA in MQA mode: one latent KV head of 576 (512 latent + 64 rope), values 512 wide
D_QK, D_V = 576, 512
HOPPER = ("h100", "h800", "h200")
ATTENTION_KERNELS = ("flashmla-published",)


@dataclass(frozen=True)
class PublishedAttention:
    """A kernel source for MLA decode cores at FlashMLA's published rates on `hardware` (module doc).
    ``ms(rec)`` answers ``op: attn, kind: mla, phase: decode`` records and None for anything else."""

    hardware: str
    tflops: float = FLASHMLA_H800_TFLOPS
    name: str = "flashmla-published"

    def __post_init__(self):
        if self.hardware not in HOPPER:
            raise InputError(
                f"--attention-kernels {self.name}: FlashMLA's dense decoding kernel runs on Hopper (SM90) only "
                f"({', '.join(HOPPER)}), not {self.hardware}"
            )

    @property
    def gbps(self) -> float:
        """The memory-bound rate on this GPU: the H800's published rate as a fraction of its HBM bandwidth."""
        return FLASHMLA_H800_GBPS * HARDWARE[self.hardware]["bw"] / HARDWARE["h800"]["bw"]

    @property
    def provenance(self) -> dict:
        return dict(
            kind="published",
            method=f"MLA decode core at max(FLOPs / {self.tflops:g} TFLOP/s, bytes / {self.gbps:.0f} GB/s) + 2 kernel "
            f"floors on {HARDWARE[self.hardware]['name']} (the H800's published rates; memory rate in proportion "
            "to HBM bandwidth on other Hopper GPUs)",
            source=FLASHMLA_SOURCE,
            hardware=HARDWARE[self.hardware]["name"],
        )

    def flops_bytes(self, rec: dict) -> tuple[float, float]:
        B, q, L, h = (int(rec[x]) for x in ("batch", "q", "kv", "heads"))
        return 2.0 * B * q * L * h * (D_QK + D_V), 2.0 * (B * L * D_QK + B * q * h * (D_QK + D_V))

    def ms(self, rec: dict) -> float | None:
        if rec.get("op") != "attn" or rec.get("kind") != "mla" or rec.get("phase") != "decode":
            return None
        flops, nbytes = self.flops_bytes(rec)
        t_s = max(flops / (self.tflops * 1e12), nbytes / (self.gbps * 1e9))
        return t_s * 1e3 + 2 * Roofline.kernel_floor_us * 1e-3


def attention_source(spec: str | None, hardware: str) -> PublishedAttention | None:
    """The source an ``--attention-kernels`` value names (None: the kernel tables' attention, as before)."""
    if not spec:
        return None
    if spec not in ATTENTION_KERNELS:
        raise InputError(f"--attention-kernels {spec!r}: expected one of {', '.join(ATTENTION_KERNELS)}")
    return PublishedAttention(hardware)
