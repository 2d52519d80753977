"""What verifying costs after the forward: the target-side sampling of a speculative step over its verify
tokens' logits, on one GPU, as vLLM's rejection sampler runs it (outside the forward's CUDA graph).

    python3 -m validator.gpu.moe_sampler --out sampler.json [--tokens 256,512,1024,2048 --vocab 129280]

Per step of T verify tokens (logits [T, vocab] from the LM head, which the forward tables price):
- greedy: argmax over the vocabulary per token (vLLM's greedy rejection path: target argmax, then the
  per-request comparison with the drafts);
- random: logits to float32, divided by the temperature, softmax to target probabilities, the draft
  token's probability gathered, one uniform per token compared, and a recovered-token draw (argmax of
  probs / exponential noise): the passes over [T, vocab] vLLM's rejection sampler makes per verify token.
Median ms of reps (CUDA events), and microseconds per verify token. torch eager ops, not vLLM's Triton
kernels: the same passes over the same bytes.
"""

from __future__ import annotations

import argparse
import json
import sys

import numpy as np

from validator.gpu import moe_timing


def main(argv=None) -> int:
    import torch

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--tokens", default="64,256,512,1024,2048,4096")
    ap.add_argument("--vocab", type=int, default=129280)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--dry-run", action="store_true")
    a = ap.parse_args(argv)
    dev = torch.device("cpu" if a.dry_run else "cuda")
    V = 512 if a.dry_run else a.vocab
    info = moe_timing.gpu_line(dev)
    info.update(vocab=V, reps=a.reps)
    print(json.dumps(info), flush=True)
    rows: list[dict] = []
    out = dict(info=info, rows=rows)
    for T in (int(x) for x in a.tokens.split(",")):
        if a.dry_run:
            T = min(T, 16)
        logits = torch.randn(T, V, device=dev, dtype=torch.bfloat16)
        drafts = torch.randint(0, V, (T,), device=dev)
        temp = torch.full((T, 1), 0.7, device=dev)

        def greedy(logits=logits, drafts=drafts):
            return logits.argmax(dim=-1).eq(drafts)

        def random(logits=logits, drafts=drafts, temp=temp, T=T):
            p = torch.softmax(logits.float() / temp, dim=-1)
            pd = p.gather(1, drafts[:, None]).squeeze(1)
            acc = torch.rand(T, device=dev) < pd
            q = torch.empty_like(p).exponential_()
            rec = (p / q).argmax(dim=-1)
            return acc, rec

        row: dict[str, float] = dict(tokens=T)
        for name, fn in (("greedy", greedy), ("random", random)):
            for _ in range(2):
                fn()
            ts = []
            for _ in range(a.reps):
                if dev.type == "cuda":
                    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    torch.cuda.synchronize()
                    s.record()
                    fn()
                    e.record()
                    e.synchronize()
                    ts.append(s.elapsed_time(e))
                else:
                    import time

                    t0 = time.perf_counter()
                    fn()
                    ts.append((time.perf_counter() - t0) * 1e3)
            ms = float(np.median(ts))
            row[f"{name}_ms"] = round(ms, 4)
            row[f"{name}_us_per_token"] = round(ms * 1e3 / T, 3)
        rows.append(row)
        moe_timing.write_json_atomic(a.out, out)
        print(
            f"SAMPLER T={T} greedy={row['greedy_ms']:.3f}ms ({row['greedy_us_per_token']:.2f}us/tok) "
            f"random={row['random_ms']:.3f}ms ({row['random_us_per_token']:.2f}us/tok)",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
