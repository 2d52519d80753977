"""Op records for the wide expert-parallel paper scenario, to be priced on one H200 by validator.gpu.moe_ops.

    python3 validator/gpu/scripts/wide_ep_ops.py > wide-ep-ops.json
    python3 -m validator.gpu.moe_ops price --ops wide-ep-ops.json --out h200-torch-wideep.json

- moe: the routed experts of one EP rank holding ONE expert (EP = the model's routed experts: V4-Flash
  EP256, V4-Pro EP384; DeepSeek-V3 report Sec. 3.4: in decoding each GPU hosts one routed expert), FP8
  (e4m3) weights and math, for 1..256 tokens per rank entering the group (the MoE block runs in chunks
  of at most 256 tokens per rank, DeepEP's low-latency buffer size).
- attn: V4-Pro's attention cores at 128 local heads (data-parallel attention), verify windows of q
  tokens against the same number of tokens as one-token decodes (q = 1, 2, 4, 8), to check how a
  window is priced against q one-token decodes.
"""

from __future__ import annotations

import json
import sys

TOKENS_PER_RANK = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 160, 192, 224, 256)
MODELS = {  # hidden, moe_inter, topk, routed experts (public config.json files)
    "deepseek-v4-flash": (4096, 2048, 6, 256),
    "deepseek-v4-pro": (7168, 3072, 6, 384),
}


def records() -> list[dict]:
    out: list[dict] = []
    for h, inter, k, e in MODELS.values():
        for n in TOKENS_PER_RANK:
            out.append(dict(op="moe", dtype="fp8", tokens=n * e, hidden=h, inter=inter, topk=k, experts=e, ep=e))
    for kind in ("v4_csa", "v4_hca"):
        for total in (64, 256):
            for q in (1, 2, 4, 8):
                for kv in (2048, 8192):
                    out.append(dict(op="attn", kind=kind, phase="decode", batch=total // q, q=q, kv=kv, heads=128))
    return out


if __name__ == "__main__":
    json.dump(records(), sys.stdout, indent=1)
    sys.stdout.write("\n")
