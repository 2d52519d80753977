"""The vocabulary-wide pieces of a speculative step that dsim's composed profiles do not price as kernels,
timed on one GPU: the verify step's rejection sampler, DSpark's sequential (Markov) head, and the LM head
over a draft block's positions (a cross-check of the kernel table's GEMM record).

    python3 validator/gpu/scripts/dspark_heads.py --out dspark-heads.json [--dry-run]

- sampler: the lossless rejection test over n verify tokens as an engine with materialized draft
  probabilities runs it (vLLM's rejection sampler does the same work): softmax of the target's logits
  (fp32), the target and draft probabilities of each drafted token, the accept test against a uniform
  draw, the residual max(0, p_target - p_draft) and one token drawn from it per position (the
  exponential race: argmax of p / Exp(1), graph-safe), for every position at once;
- markov: DSpark's sequential stage over R requests x block positions (the DSpark paper, Sec. 3.1 and
  5.1: a Markov head with a rank-256 factorized transition bias B = W1[x_prev] W2 added to the parallel
  backbone's base logits, positions sampled left to right; the confidence head is a linear projection
  and a sigmoid): per position a [R, 256] x [256, V] bf16 GEMM, the add, the softmax, the draw, the
  draft probabilities kept for the verify step, the confidence; `block` positions in sequence;
- lm_head: the [R x block, hidden] x [hidden, V] bf16 GEMM of the block's logits.

CUDA-graph replay over rotating instances (validator.gpu.moe_timing.time_instances), median of 7
intervals. Writes every record after it is timed and prints one HEADS line per record.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

MODELS = {"deepseek-v4-flash": 4096, "deepseek-v4-pro": 7168}  # hidden_size (public config.json files)
VOCAB = 129280  # vocab_size, both models
RANK = 256  # the Markov head's factorization rank (DSpark paper, Sec. 3.1)
BLOCK = 5  # DSpark-5, the production block (Sec. 5.1)
VERIFY_TOKENS = (64, 200, 400, 800, 1600)
REQUESTS = (25, 50, 100, 200, 400)


def sampler_op(torch, dev, n: int, vocab: int):
    def make(_i):
        logits = torch.randn(n, vocab, device=dev, dtype=torch.bfloat16)
        draft = torch.softmax(torch.randn(n, vocab, device=dev), dim=-1)
        ids = torch.randint(0, vocab, (n,), device=dev)

        def run():
            p = torch.softmax(logits.float(), dim=-1)
            pt = p.gather(1, ids[:, None])
            pd = draft.gather(1, ids[:, None])
            accept = torch.rand(n, 1, device=dev) * pd < pt
            resid = (p - draft).clamp_min_(0.0)
            q = torch.empty_like(resid).exponential_()
            rec = (resid / q).argmax(dim=-1)
            return accept, rec

        return run

    return make


def markov_op(torch, dev, R: int, hidden: int, vocab: int, block: int):
    def make(_i):
        base = torch.randn(R, block, vocab, device=dev, dtype=torch.bfloat16)
        h = torch.randn(R, block, hidden, device=dev, dtype=torch.bfloat16)
        w1 = torch.randn(vocab, RANK, device=dev, dtype=torch.bfloat16) * 0.02
        w2 = torch.randn(RANK, vocab, device=dev, dtype=torch.bfloat16) * 0.02
        wc = torch.randn(hidden, 1, device=dev, dtype=torch.bfloat16) * 0.02
        probs = torch.empty(R, block, vocab, device=dev)
        anchor = torch.randint(0, vocab, (R,), device=dev)

        def run():
            x = anchor
            toks, confs = [], []
            for k in range(block):
                logits = base[:, k].float() + (w1[x] @ w2).float()
                p = torch.softmax(logits, dim=-1)
                probs[:, k] = p
                x = (p / torch.empty_like(p).exponential_()).argmax(dim=-1)
                toks.append(x)
                confs.append(torch.sigmoid((h[:, k] @ wc).float()))
            return toks, confs

        return run

    return make


def lm_head_op(torch, dev, m: int, hidden: int, vocab: int):
    def make(_i):
        a = torch.randn(m, hidden, device=dev, dtype=torch.bfloat16)
        w = torch.randn(hidden, vocab, device=dev, dtype=torch.bfloat16) * 0.02

        def run():
            return a @ w

        return run

    return make


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--dry-run", action="store_true", help="tiny sizes on whatever device is there")
    a = ap.parse_args(argv)
    import torch

    from validator.gpu.moe_timing import time_instances

    dev = torch.device("cuda" if torch.cuda.is_available() and not a.dry_run else "cpu")
    vocab = 4096 if a.dry_run else VOCAB
    models = {"deepseek-v4-flash": 256} if a.dry_run else MODELS
    verify = (8, 16) if a.dry_run else VERIFY_TOKENS
    requests = (2, 4) if a.dry_run else REQUESTS
    gpu = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__} if dev.type == "cuda" else {"gpu": "cpu"}
    out: dict = {
        "provenance": {
            "kind": "measured",
            "method": "CUDA-graph replay over rotating instances (validator.gpu.moe_timing.time_instances), median of 7",
            "command": "python3 validator/gpu/scripts/dspark_heads.py --out " + Path(a.out).name,
            "gpu": gpu,
            "vocab": vocab,
            "rank": RANK,
            "block": BLOCK,
        },
        "records": [],
    }

    def emit(rec: dict) -> None:
        out["records"].append(rec)
        from dsim.outputs import write_file  # (dsim is on sys.path by now)

        write_file(a.out, json.dumps(out, indent=1), "output")
        print("HEADS " + " ".join(f"{k}={v}" for k, v in rec.items()), flush=True)

    for n in verify:
        ms, _ = time_instances(sampler_op(torch, dev, n, vocab), dev, 2)
        emit({"part": "sampler", "tokens": n, "vocab": vocab, "ms": round(ms, 5)})
    for model, hidden in models.items():
        for R in requests:
            ms, _ = time_instances(markov_op(torch, dev, R, hidden, vocab, BLOCK), dev, 2)
            emit({"part": "markov", "model": model, "requests": R, "block": BLOCK, "ms": round(ms, 5)})
            ms, _ = time_instances(lm_head_op(torch, dev, R * BLOCK, hidden, vocab), dev, 2)
            emit(
                {
                    "part": "lm_head",
                    "model": model,
                    "m": R * BLOCK,
                    "hidden": hidden,
                    "vocab": vocab,
                    "ms": round(ms, 5),
                }
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
