"""The scheduler's compiled kernels (dsim.engine.compiled_sched) against the request-at-a-time definition
(tests/reference_sched.py) on random replica states: the same chunks, KV blocks, admissions,
preemption signals, new decode slots and resumed-request gaps."""

import copy
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import reference_sched as RS
from dsim.engine import compiled_bundles, compiled_sched
from dsim.engine.compiled_bundles import COMP, NCOL

INT_ROWS = {
    "prompt": compiled_sched.PROMPT,
    "generated": compiled_sched.GENERATED,
    "computed": compiled_sched.COMPUTED,
    "blocks": compiled_sched.BLOCKS,
    "seq": compiled_sched.SEQ,
    "cached": compiled_sched.CACHED,
    "emits": compiled_sched.EMITTED,
}
FLOAT_ROWS = {"admit": compiled_sched.ADMIT, "itl_max": compiled_sched.ITL_MAX, "last_emit": compiled_sched.LAST_EMIT}


@st.composite
def replica_states(draw):
    n_pre, n_wait, n_dec = draw(st.integers(0, 4)), draw(st.integers(0, 6)), draw(st.integers(0, 6))
    n = n_pre + n_wait
    s = {
        "prompt": [draw(st.integers(1, 3000)) for _ in range(n)],
        "generated": [draw(st.sampled_from([0, 0, 0, 1, 7])) for _ in range(n)],
        "seq": [0] * n,
        "cached": [0] * n,
        "emits": [draw(st.integers(0, 5)) for _ in range(n)],
        "admit": [draw(st.sampled_from([math.nan, 0.25])) for _ in range(n)],
        "itl_max": [draw(st.sampled_from([math.nan, 3.0, 40.0])) for _ in range(n)],
        "last_emit": [draw(st.floats(0.0, 1.0)) for _ in range(n)],
        "held": [tuple(draw(st.integers(0, 9)) for _ in range(3)) for _ in range(n)],
    }
    # a running prefill has computed fewer tokens than its prompt + outputs so far, and holds the
    # blocks of what it computed; a waiting request holds none
    s["computed"] = [draw(st.integers(0, s["prompt"][r] + s["generated"][r] - 1)) if r < n_pre else 0 for r in range(n)]
    s["blocks"] = [-(-s["computed"][r] // RS.BT) if r < n_pre else 0 for r in range(n)]
    s["pre"] = list(range(n_pre))
    s["waiting"] = list(range(n_pre, n))
    s["pre_blocks"] = sum(s["blocks"])
    s["admit_seq"] = draw(st.integers(0, 3))
    K = draw(st.integers(0, 3))
    cfg = {
        "slot_kv": [draw(st.integers(1, 4000)) for _ in range(n_dec)],
        "K": K,
        "lookahead": 1 + K,
        "total_blocks": 0,
        "budget": draw(st.integers(1, 4096)),
        "thr": draw(st.sampled_from([0, 0, 64, 512, 2048])),
        "max_seqs": n_dec + n_pre + draw(st.integers(0, 6)) or 1,
        "admit": draw(st.booleans()),
        "consumer": draw(st.booleans()),
        "hits": {r: draw(st.integers(0, s["prompt"][r] - 1)) for r in s["waiting"]} if draw(st.booleans()) else None,
        "now": 1.5,
    }
    # a cache that is tight as often as not: its size near what the slots and prefills hold
    held = RS._dec_blocks(cfg["slot_kv"], cfg["lookahead"], True) + s["pre_blocks"]
    cfg["total_blocks"] = max(1, held + draw(st.integers(-4, 80)))
    return s, cfg


def _arrays(s):
    n = len(s["prompt"])
    req_i = np.zeros((compiled_sched.REQ_I_ROWS, n), dtype=np.int64)
    req_f = np.zeros((compiled_sched.REQ_F_ROWS, n))
    for name, row in INT_ROWS.items():
        req_i[row] = s[name]
    for name, row in FLOAT_ROWS.items():
        req_f[row] = s[name]
    if n:
        req_i[compiled_sched.HELD_ROUNDS : compiled_sched.HELD_VERIFIED + 1] = np.array(s["held"]).T
    return req_i, req_f


def _state_of(req_i, req_f):
    s = {name: req_i[row].tolist() for name, row in INT_ROWS.items()}
    s.update({name: req_f[row].tolist() for name, row in FLOAT_ROWS.items()})
    s["held"] = [tuple(c) for c in req_i[compiled_sched.HELD_ROUNDS : compiled_sched.HELD_VERIFIED + 1].T.tolist()]
    return s


def _same(a, b):
    """Per-request lists equal, NaN equal to NaN."""
    return all(x == y or (x != x and y != y) for x, y in zip(a, b, strict=True))


def _run_kernel(s, cfg):
    req_i, req_f = _arrays(s)
    n = len(s["prompt"])
    cap = cfg["max_seqs"] + n + 1
    pre, chunks = np.zeros(cap, np.int64), np.zeros(cap, np.int64)
    pre[: len(s["pre"])] = s["pre"]
    head = 3  # (the queue does not start at its buffer's first entry)
    waitq = np.full(head + len(s["waiting"]) + 2, -1, np.int64)
    waitq[head : head + len(s["waiting"])] = s["waiting"]
    I = np.zeros((max(1, len(cfg["slot_kv"])), NCOL), np.int64)
    I[: len(cfg["slot_kv"]), COMP] = cfg["slot_kv"]
    hits = cfg["hits"]
    hit_arr = np.array([hits[r] for r in s["waiting"]] if hits else [], np.int64)
    requests = tuple(compiled_sched.RequestTable(req_i, req_f, np.zeros((1, 1), np.float32)))
    queues = tuple(compiled_sched.Queues(pre, chunks, waitq))
    slots = tuple(compiled_bundles.SlotTable(I, np.zeros((len(I), 2)), np.zeros((0, len(I)), np.float32)))
    limits = tuple(
        compiled_sched.SchedLimits(
            cfg["K"], cfg["lookahead"], cfg["total_blocks"], cfg["budget"], cfg["thr"], cfg["max_seqs"], cfg["consumer"]
        )
    )
    step = tuple(
        compiled_sched.SchedStep(
            len(s["pre"]), head, head + len(s["waiting"]), len(cfg["slot_kv"]), sum(cfg["slot_kv"]), s["pre_blocks"],
            s["admit_seq"], cfg["now"], cfg["admit"], hit_arr, len(hit_arr) if hits else -1,
        )
    )  # fmt: skip
    out = compiled_sched.schedule_step(requests, queues, slots, limits, step)
    return out, req_i, req_f, pre, chunks, waitq, head


@pytest.mark.slow
@settings(max_examples=300, deadline=None)
@given(replica_states())
def test_schedule_step_is_the_request_by_request_definition(state):
    s, cfg = state
    ref = copy.deepcopy(s)
    expect = RS.schedule(
        ref, cfg["slot_kv"], cfg["K"], cfg["lookahead"], cfg["total_blocks"], cfg["budget"], cfg["thr"],
        cfg["max_seqs"], cfg["admit"], cfg["consumer"], cfg["hits"] or {}, cfg["now"],
    )  # fmt: skip
    (
        (status, run_tokens, n_pre, w_head, pre_blocks, admit_seq, pre_tokens, n_sample, kv_pre, seen),
        req_i,
        req_f,
        pre,
        chunks,
        waitq,
        head,
    ) = _run_kernel(s, cfg)
    got = _state_of(req_i, req_f)
    if expect is None:  # the running prefills' KV does not fit: nothing written
        assert status == compiled_sched.PREEMPT
        for name in INT_ROWS:
            assert got[name] == s[name], name
        return
    e_chunks, e_run, e_sample, e_kv, e_seen = expect
    assert status == compiled_sched.SCHEDULED
    assert pre[:n_pre].tolist() == ref["pre"] and chunks[:n_pre].tolist() == e_chunks
    assert (run_tokens, pre_tokens, n_sample, kv_pre, seen) == (e_run, sum(e_chunks), e_sample, e_kv, e_seen)
    assert waitq[w_head : head + len(s["waiting"])].tolist() == ref["waiting"]
    assert (pre_blocks, admit_seq) == (ref["pre_blocks"], ref["admit_seq"])
    for name in (*INT_ROWS, *FLOAT_ROWS):
        assert _same(got[name], ref[name]), name


@pytest.mark.slow
@settings(max_examples=300, deadline=None)
@given(replica_states(), st.floats(1.0, 3.0))
def test_commit_prefills_is_the_request_by_request_definition(state, t_now):
    s, cfg = state
    cfg["admit"] = True
    ref = copy.deepcopy(s)
    expect = RS.schedule(
        ref, cfg["slot_kv"], cfg["K"], cfg["lookahead"], cfg["total_blocks"], cfg["budget"], cfg["thr"],
        cfg["max_seqs"], cfg["admit"], cfg["consumer"], cfg["hits"] or {}, cfg["now"],
    )  # fmt: skip
    out, req_i, req_f, pre, chunks, _, _ = _run_kernel(s, cfg)
    if expect is None:
        return
    n_pre = out[2]
    moved_ref, freed_ref, kv_ref, late_ref = RS.commit_prefills(ref, expect[0], t_now)
    moved, late = np.zeros(6 * len(pre), np.int64), np.zeros(len(pre))
    m, freed, kv, w, k = compiled_sched.commit_prefills(req_i, req_f, pre, n_pre, chunks, t_now, moved, late)
    assert moved.reshape(-1, 6)[:m].tolist() == [list(r) for r in moved_ref]
    assert (freed, kv, late[:k].tolist()) == (freed_ref, kv_ref, late_ref)
    assert pre[:w].tolist() == ref["pre"]
    got = _state_of(req_i, req_f)
    for name in (*INT_ROWS, *FLOAT_ROWS, "held"):
        assert _same(got[name], ref[name]), name


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["append", "extend", "appendleft", "pop"]), st.integers(0, 40)), max_size=80))
def test_wait_queue_is_a_deque(ops):
    # The replica's waiting queue: appends, a range of successors, a preempted request back at
    # the head, and the scheduler consuming from the head (as schedule_step's returned head does).
    from collections import deque

    from dsim.engine.buffers import WaitQueue

    q, ref, nxt = WaitQueue(cap=4), deque(), 0
    for op, k in ops:
        if op == "append":
            q.append(nxt)
            ref.append(nxt)
            nxt += 1
        elif op == "extend":
            ids = range(nxt, nxt + k) if k % 2 else list(range(nxt, nxt + k))
            q.extend(ids)
            ref.extend(ids)
            nxt += k
        elif op == "appendleft":
            q.appendleft(nxt)
            ref.appendleft(nxt)
            nxt += 1
        else:
            take = min(k, len(ref))
            q.head += take
            for _ in range(take):
                ref.popleft()
        assert len(q) == len(ref) and bool(q) == bool(ref) and q.ids() == list(ref)
