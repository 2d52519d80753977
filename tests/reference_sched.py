"""The scheduler's bookkeeping one request at a time, in plain Python: the definition the
compiled kernels of dsim.engine.compiled_sched are checked against (tests/test_sched.py).

State is a dict of per-request lists (prompt, generated, computed, blocks, seq, cached, admit,
emits, itl_max, last_emit, held: (rounds, accepted, verified)), the running prefills ``pre`` and
the waiting queue ``waiting`` (lists of request ids, queue order), and the replica's counters
``pre_blocks`` and ``admit_seq``. The decode slots enter as their KV tokens ``slot_kv``.
"""

from __future__ import annotations

import math

BT = 16  # KV block tokens


def _dec_blocks(slot_kv, lookahead, exact):
    """The decode slots' blocks: exact, or the bound sum ceil(x / 16) <= (sum x + 15 n) / 16."""
    if exact:
        return sum((c + lookahead + BT - 1) // BT for c in slot_kv)
    return (sum(slot_kv) + len(slot_kv) * (lookahead + BT - 1)) // BT


def schedule(s, slot_kv, K, lookahead, total_blocks, budget, thr, max_seqs, admit, consumer, hits, now):
    """One step's prefill schedule (vLLM V1 order): the running prefills' chunks from the budget
    the decodes' 1 + K reservations leave, their KV growth (None, nothing changed, where the
    cache cannot hold it: the engine preempts), then FCFS admission (when admit) while budget,
    max_num_seqs and blocks allow; hits[rid]: rid's prefix-cache hit tokens. Mutates s; returns
    (chunks, the running prefills' tokens, prefills sampling a token, KV tokens read, waiting
    requests whose hits admission looked up: the admitted and a refused one)."""
    prompt, generated, computed, blocks = s["prompt"], s["generated"], s["computed"], s["blocks"]
    n_dec = len(slot_kv)
    left = max(budget - n_dec * (1 + K), 0)
    chunks = []
    n_sample = kv_pre = 0
    for r in s["pre"]:
        todo = prompt[r] + generated[r] - computed[r]
        c = min(todo, left, thr) if thr > 0 else min(todo, left)
        chunks.append(c)
        n_sample += c > 0 and c == todo
        left -= c
        kv_pre += computed[r] + c
    run_tokens = sum(chunks)
    grow_r = [max(0, -(-(computed[r] + c) // BT) - blocks[r]) for r, c in zip(s["pre"], chunks)]
    grow = sum(grow_r)

    def fits(b):
        free = total_blocks - s["pre_blocks"]
        return free - _dec_blocks(slot_kv, lookahead, False) >= b or free - _dec_blocks(slot_kv, lookahead, True) >= b

    if not fits(grow):
        return None
    for r, g in zip(s["pre"], grow_r):
        blocks[r] += g
    s["pre_blocks"] += grow
    waiting = s["waiting"]
    n_run = n_dec + len(s["pre"])
    considered = 0
    while admit and waiting and left > 0 and n_run < max_seqs:
        rid = waiting[0]
        considered += 1
        comp = hit = hits.get(rid, 0)
        if consumer and generated[rid] == 0:
            comp = max(comp, prompt[rid] - 1)
        todo = prompt[rid] + generated[rid] - comp
        c = min(todo, left)
        if 0 < thr < c:
            c = thr
        b = -(-(comp + c) // BT)
        if not fits(b):
            break
        s["cached"][rid] = hit
        computed[rid] = comp
        waiting.pop(0)
        s["pre_blocks"] += b
        blocks[rid] = b
        if math.isnan(s["admit"][rid]):
            s["admit"][rid] = now
        s["admit_seq"] += 1
        s["seq"][rid] = s["admit_seq"]
        s["pre"].append(rid)
        chunks.append(c)
        n_sample += c == todo
        left -= c
        kv_pre += comp + c
        n_run += 1
    return chunks, run_tokens, n_sample, kv_pre, considered


def commit_prefills(s, chunks, t_now):
    """After the step: chunks computed; a prefill whose computed tokens reach prompt + generated
    samples a token and becomes a decode slot (its (rid, KV tokens, generated before, held
    counters) row; a resumed one's gap since its last emission noted). Mutates s; returns
    (new slot rows, blocks released, their KV tokens, resumed gaps)."""
    prompt, generated, computed, blocks = s["prompt"], s["generated"], s["computed"], s["blocks"]
    moved, late = [], []
    freed = kv = 0
    for rid, c in zip(list(s["pre"]), chunks):
        if c == 0:
            continue
        cp = computed[rid] + c
        computed[rid] = cp
        g = generated[rid]
        if cp != prompt[rid] + g:
            continue
        if g:
            gap = (t_now - s["last_emit"][rid]) * 1000.0
            late.append(gap)
            s["itl_max"][rid] = max(s["itl_max"][rid], gap)
            s["emits"][rid] += 1
        generated[rid] = g + 1
        moved.append((rid, cp, g, *s["held"][rid]))
        s["held"][rid] = (0, 0, 0)
        freed += blocks[rid]
        blocks[rid] = 0
        kv += cp
    done = {row[0] for row in moved}
    s["pre"] = [r for r in s["pre"] if r not in done]
    return moved, freed, kv, late
