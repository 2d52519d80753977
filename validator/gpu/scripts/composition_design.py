"""A design set around one logged large step: the same decode/verify requests beside their step's
prompt chunks rearranged (one chunk, the step's own, more and fewer of the same total, a continued
chunk's cached prefix dropped), the decodes alone, the chunks alone, and more decode requests in
place of prompt tokens, so that what each step term charges for a change can be set against what the
executor measures for it (a design set for diagnosis, not a replay of dsim's steps).

    python3 validator/gpu/scripts/composition_design.py STEPLOG STEP OUT.jsonl
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

PREFILL_MIN_Q = 17  # the replayer's prefill view: a request of 17 or more new tokens is a chunk


def design(step: dict) -> list[dict]:
    q, c = step["q"], step["ctx"]
    dec = [(a, b) for a, b in zip(q, c) if a < PREFILL_MIN_Q]
    ch = [(a, b) for a, b in zip(q, c) if a >= PREFILL_MIN_Q]
    total = sum(a for a, _ in ch)

    def split(n: int) -> list[tuple[int, int]]:
        return [(total // n + (1 if i < total % n else 0), 0) for i in range(n)]

    extra = [(4, 1500 + 37 * i) for i in range(24)]  # 24 more verify requests of 4 tokens
    big = max(range(len(ch)), key=lambda i: ch[i][0]) if ch else 0  # their 96 tokens come off the largest chunk
    shapes = [
        ("decodes", dec, []),
        ("decodes+own", dec, ch),
        ("decodes+own-uncached", dec, [(a, 0) for a, _ in ch]),
        ("decodes+1", dec, split(1)),
        ("decodes+3", dec, split(3)),
        ("decodes+8", dec, split(8)),
        ("decodes+24x4+own-96", dec + extra, [(a - (96 if i == big else 0), b) for i, (a, b) in enumerate(ch)]),
        ("chunks-own", [], ch),
        ("chunks-1", [], split(1)),
    ]
    return [
        dict(step=i, shape=name, q=[a for a, _ in d + x], ctx=[b for _, b in d + x], concurrency=len(d) or None)
        for i, (name, d, x) in enumerate(shapes)
    ]


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    src, step_no, out = argv
    rows = [json.loads(x) for x in Path(src).read_text().splitlines()]
    hit = [r for r in rows if r["step"] == int(step_no)]
    if not hit:
        print(f"error: {src}: no step {step_no}", file=sys.stderr)
        return 2
    steps = design(hit[0])
    Path(out).write_text("".join(json.dumps(s) + "\n" for s in steps))
    print(out, len(steps), "steps")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
