"""A replica's general step (any mix of decodes and prefills), planned and committed from Python:
vLLM V1's schedule (decodes first, running prefills, FCFS admission, preemption from the tail)
with prefix caching, the pricing of the step, the decodes' draws and verify windows, the commit
and the accounting every path ends in (_account), and the finished requests' results (flush)."""

from __future__ import annotations

import numpy as np

from dsim.cost import KV_BLOCK_TOKENS
from dsim.engine import compiled_decode, compiled_sched, compiled_window
from dsim.engine.compiled_bundles import ASUM, CLS, COMP, EMITS, END, ID, NCOL, ROUNDS, VSUM
from dsim.engine.config import apply_draft_script
from dsim.engine.records import DecodeOutcome, StepPlan
from dsim.engine.replica_state import ITLMAX, LAST, ReplicaState

# Prefix caching: admission looks up this many waiting requests' cached blocks at a time.
_HIT_BATCH = 16


class GeneralSteps(ReplicaState):
    """A replica's general steps (see dsim.engine.replica for the step paths)."""

    # ---- prefix caching ---------------------------------------------------------------------
    def _prefix_hit_blocks(self, rid: int) -> int:
        """Leading full blocks of rid's prompt whose hashes some request has already computed on
        this replica (a look-up only: the LRU order is _prefix_touch's). Only full blocks can be
        shared: the last hash may cover a partial block."""
        cache = self.prefix_cache
        hit = 0
        for h in self.prefix_hashes[rid][: self.requests.prompt_l[rid] // self.prefix_block_tokens]:
            if int(h) not in cache:
                break
            hit += 1
        return hit

    def _prefix_hits(self, start: int, k: int) -> tuple:
        """The cached prompt tokens of the waiting queue's entries start..start + k - 1, for
        admission (vLLM never serves the whole prompt from cache: the last token is recomputed),
        and their hit blocks."""
        R, bt = self.requests, self.prefix_block_tokens
        ids = self.waiting.buf[start : start + k].tolist()
        hb = [self._prefix_hit_blocks(r) for r in ids]
        return np.array([min(h * bt, R.prompt_l[r] - 1) for r, h in zip(ids, hb)], dtype=np.int64), hb

    def _prefix_touch(self, rid: int, hit_blocks: int) -> None:
        """The LRU's move to the end of rid's hit blocks (admission looked it up)."""
        cache = self.prefix_cache
        for h in self.prefix_hashes[rid][:hit_blocks]:
            cache.move_to_end(int(h))

    def _prefix_insert(self, rid: int, computed: int):
        """Register rid's prompt blocks that are now fully computed (and only those)."""
        hashes = self.prefix_hashes[rid]
        full = min(computed, int(self.requests.prompt_l[rid])) // self.prefix_block_tokens
        for h in hashes[:full]:
            h = int(h)
            if h in self.prefix_cache:
                self.prefix_cache.move_to_end(h)
            else:
                self.prefix_cache[h] = True
        while len(self.prefix_cache) > self.prefix_cap:
            self.prefix_cache.popitem(last=False)

    # ---- planning ---------------------------------------------------------------------------
    def _preempt_tail(self):
        """Preempt the request at the tail of the running queue, i.e. the most recently admitted
        one (recompute later). Prefilling requests are in admission order; with
        long_prefill_token_threshold a newer short prompt can be decoding while an older long one
        still prefills, so the decode slots are compared too."""
        R = self.requests
        j = None
        if self.n:
            seqs = R.seq[self._slot_ints[: self.n, ID]]
            j = int(np.argmax(seqs))
        if self.n_pre and (j is None or R.seq[self.pre_ids[self.n_pre - 1]] > seqs[j]):
            self.n_pre -= 1
            rid = int(self.pre_ids[self.n_pre])
            self.pre_blocks -= int(R.blocks[rid])
        else:
            row, frow = self._slot_ints[j].copy(), self._slot_floats[j].copy()
            rid = int(row[ID])
            R.generated[rid] = R.output_l[rid] - int(row[END] - row[COMP])
            R.emits[rid] = row[EMITS]
            R.held_spec[:, rid] = row[ROUNDS : VSUM + 1]
            R.last_emit[rid] = self.prev_end if self._last_is_prev_end else frow[LAST]
            R.itl_max[rid] = frow[ITLMAX]
            self.kv_dec -= int(row[COMP])
            if self.K:
                R.slot_rows[rid] = self._slot_rows[:, j]  # its confidences, kept for its resumption
            self._remove_slot(j)
        R.blocks[rid] = 0
        R.computed[rid] = 0
        R.preemptions[rid] += 1
        self.waiting.appendleft(rid)

    def _dec_blocks_bound(self) -> int:
        """An upper bound on the decode slots' KV blocks from kv_dec alone (sum of ceil(x_i / 16)
        <= (sum x_i + 15 n) / 16; the exact count is the scheduler kernels')."""
        return (self.kv_dec + self.n * (self.lookahead + KV_BLOCK_TOKENS - 1)) // KV_BLOCK_TOKENS

    def _plan_step(self) -> StepPlan | None:
        """Schedule one step (vLLM V1 order), or None if nothing runs.

        vLLM schedules decodes first, each reserving 1 + K tokens (drafts the verify budget trims
        do not return theirs); the running prefills take what is left in queue order, their KV
        blocks grow (a preemption from the tail where the cache cannot hold them, then the step
        is scheduled again without admission), and FCFS admission fills the rest while budget,
        max_num_seqs and blocks allow (dsim.engine.compiled_sched.schedule_step). The decodes' draws and
        verify budgets are priced with the running prefills' chunks only (those admitted this
        step are not in the price)."""
        cfg, K = self.cfg, self.K
        budget = cfg.max_num_batched_tokens
        wq = self.waiting
        prefix = self._prefix_on
        hits, n_hits, hit_blocks = self._no_hits, -1, None
        admit = True
        fused = drawn = False
        while True:
            n_dec, n_run = self.n, self.n_pre
            fused = self._plan_fused and n_dec > 0
            head = wq.head
            room = cfg.max_num_seqs - n_dec - n_run  # (admission's bounds, known before the kernel)
            if prefix and admit and wq and room > 0 and budget > n_dec * (1 + K):
                hits, hit_blocks = self._prefix_hits(head, min(len(wq), _HIT_BATCH, room + 1))
                n_hits = len(hits)
            if fused:
                # the schedule and the decodes' draws and verify windows in one call
                conf = np.empty((1, K, n_dec), dtype=np.float32)
                lvc = np.empty((3, 1, n_dec), dtype=np.int64)
                lead, verified, cap = lvc[0], lvc[1], lvc[2]
            # a SchedStep (a plain tuple: see dsim.engine.compiled_bundles; simpy's clock starts as int 0: one
            # type, one compile)
            step = (n_run, head, wq.tail, n_dec, self.kv_dec, self.pre_blocks, self.admit_seq, float(self.env.now),
                    admit, hits, n_hits)  # fmt: skip
            if fused:
                st, run_tokens, n_pre, w_head, pre_blocks, admit_seq, pre_tokens, n_sampling, kv_pre, seen, drawn, v0 = (
                    compiled_sched.plan_general(
                        self._request_table, self._queues(), self._slots, self._limits, step, self._draws,
                        self._policy, self._pricing, self.cpu_ms + self._draft_ms(n_dec), (conf, lead, verified, cap),
                    )
                )  # fmt: skip
            else:
                st, run_tokens, n_pre, w_head, pre_blocks, admit_seq, pre_tokens, n_sampling, kv_pre, seen = (
                    compiled_sched.schedule_step(self._request_table, self._queues(), self._slots, self._limits, step)
                )
            if st != compiled_sched.PREEMPT:
                break
            # (a lone request always fits: submit() checked its whole life against the cache)
            assert n_dec + n_run > 1, "KV accounting: a lone request does not fit"
            self._preempt_tail()
            admit = False
        if prefix and seen:
            pre_tokens, n_sampling, kv_pre = self._admit_prefix_hits(
                st, head, seen, hit_blocks, pre_tokens, n_sampling, kv_pre, n_pre, w_head, pre_blocks, admit_seq
            )
            n_pre, w_head, pre_blocks, admit_seq = self.n_pre, wq.head, self.pre_blocks, self.admit_seq
        self.n_pre, wq.head, self.pre_blocks, self.admit_seq = n_pre, w_head, pre_blocks, admit_seq
        if not fused:
            conf = lead = verified = cap = None
        given = None
        dec_tokens = 0
        if n_dec:
            if K:
                if not drawn:  # the verify budget, priced with the running prefills' chunks
                    conf, lead, verified, cap, v0, _ = self._draft_and_verify(1, run_tokens, self._prefill_ms(n_run))
                elif self._script is not None:
                    apply_draft_script(self._script, self._slot_ints[:n_dec, ROUNDS], lead, verified, cap)
                    v0 = int(verified[0].sum())
                dec_tokens = n_dec + v0
            else:
                dec_tokens = n_dec
            if dec_tokens > budget:  # the budget cuts the decode queue (rare)
                qq = 1 + verified[0] if K else np.ones(n_dec, dtype=np.int64)
                cum = np.cumsum(qq)
                given = np.minimum(qq, np.maximum(budget - (cum - qq), 0))
                dec_tokens = budget
        n_tokens = dec_tokens + pre_tokens
        if n_tokens == 0:
            return None
        kv = self.kv_dec + dec_tokens + kv_pre
        n_sample = (n_dec if given is None else int(np.count_nonzero(given))) + n_sampling
        fwd = self.cost.step_ms_one(n_tokens, kv)
        if self._step_terms:  # (profiles with prefill or per-request attention terms)
            fwd = fwd + self._prefill_ms(n_pre) + self._context_ms(given, verified, n_pre)
        dur = fwd + self._draft_ms(n_sample) + self.cpu_ms
        ids, chunks = self.pre_ids[:n_pre], self.chunks[:n_pre]
        n_chunked = n_pre if not n_run or chunks[n_run - 1] else int(np.count_nonzero(chunks))
        return StepPlan(
            n_dec, given, conf, lead, verified, cap, ids, chunks, n_chunked, n_tokens, pre_tokens, kv, fwd, dur
        )

    def _admit_prefix_hits(
        self, st, head, seen, hit_blocks, pre_tokens, n_sampling, kv_pre, n_pre, w_head, pre_blocks, admit_seq
    ) -> tuple:
        """Admission with prefix caching, after schedule_step's first batch of looked-up hits:
        the next batches while it asks for more (MORE_HITS), then the LRU's move to the end of
        every considered candidate's hit blocks, in queue order (as looking each up in turn
        would: admission never changes which blocks are cached). Leaves the queue, pre_ids and
        counters updated; returns (prefill tokens, prefills sampling a token, KV tokens read)."""
        cfg, wq = self.cfg, self.waiting
        touched = hit_blocks[:seen]
        left0 = max(cfg.max_num_batched_tokens - self.n * (1 + self.K), 0)
        while st == compiled_sched.MORE_HITS:
            hits, hb = self._prefix_hits(w_head, min(wq.tail - w_head, _HIT_BATCH))
            dec_bound = self.total_blocks - self._dec_blocks_bound()
            step = (n_pre, w_head, wq.tail, self.n, self.kv_dec, pre_blocks, admit_seq, float(self.env.now), True, hits,
                    len(hits))  # (a SchedStep)  # fmt: skip
            st, n_pre, w_head, pre_blocks, admit_seq, left, n_sampling, kv_pre, seen = compiled_sched.admit_waiting(
                self._request_table, self._queues(), self._slots, self._limits, step, dec_bound, left0 - pre_tokens,
                self.n + n_pre, n_sampling, kv_pre,
            )  # fmt: skip
            pre_tokens = left0 - left
            touched += hb[:seen]
        for rid, h in zip(wq.buf[head : head + len(touched)].tolist(), touched):
            self._prefix_touch(rid, h)
        self.n_pre, wq.head, self.pre_blocks, self.admit_seq = n_pre, w_head, pre_blocks, admit_seq
        return pre_tokens, n_sampling, kv_pre

    def _prefill_ms(self, k: int) -> float:
        """The cost correction (CostModel.prefill_ms) of the first k prefills' chunks this step."""
        if not self.cost.has_prefill_terms or not k:
            return 0.0
        R = self.requests
        return self.cost.prefill_ms(
            (c, comp) for c, comp in zip(self.chunks[:k].tolist(), R.computed[self.pre_ids[:k]].tolist()) if c
        )

    def _context_ms(self, given, verified, k: int = 0) -> float:
        """CostModel.context_ms of the decode slots this step (their windows: the budget's cut
        `given`, else 1 + verified[0]) with the first k prefills' chunks this step; 0 for
        profiles without per-request attention terms."""
        if not self.cost.has_context_terms or not self.n:
            return 0.0
        reads_chunks = self.cost.context_reads_chunks and k and self.chunks[:k].any()
        if given is None and self._context_packed and not reads_chunks:
            # (the compiled call CostModel.context_ms makes here, on the same values)
            return compiled_window.slots_context_ms(
                self._slot_ints, self.n, self.K, verified if self.K else self._no_steps, self._context_args
            )
        ctx = self.live_ints[:, COMP]
        pre = (
            [
                (c, comp)
                for c, comp in zip(self.chunks[:k].tolist(), self.requests.computed[self.pre_ids[:k]].tolist())
                if c
            ]
            if reads_chunks
            else ()
        )
        if given is not None:
            run = given > 0
            return self.cost.context_ms(given[run], ctx[run], pre)
        return self.cost.context_ms(1 + verified[0] if self.K else np.ones(self.n, np.int64), ctx, pre)

    def _cost_row(self, N: int, limit: int):
        """The adaptive budget policies' cost row of a step of N non-draft tokens (n decode slots
        and the step's prefill tokens) at the slots' KV context, drafter and CPU overhead
        included."""
        n = self.n
        M = min(max(limit - N, 0), n * self.K)
        row = self.cost.step_cost_row(N, N + M + 1, self.kv_dec + n, self.cpu_ms + self._draft_ms(n))
        return self.spec.policy.cost_row(n, N, N + M + 1, row)

    def _plan_args(self, steps: int, tokens: int, extra_ms: float):
        """The output buffers and the arguments of dsim.engine.compiled_decode.plan_decodes for up to
        `steps` steps of the decode slots, the budget priced for a step of `tokens` tokens with
        `extra_ms` beside the forward (its prefill chunks): (conf [steps, K, n], lead / verified /
        cap as one [3, steps, n] block, the argument tuple; plan_window takes the same first)."""
        n, K = self.n, self.K
        conf = np.empty((steps, K, n), dtype=np.float32)
        lvc = np.empty((3, steps, n), dtype=np.int64)  # (indexed: cheaper than unpacking)
        limit = self.cfg.max_num_batched_tokens
        row = self._cost_row(tokens, limit) if self._adaptive else self._no_row
        budget = (row, float(extra_ms), tokens, limit)  # (a BudgetRow)
        plan = (conf, lvc[0], lvc[1], lvc[2])  # (a DecodePlan)
        return conf, lvc, (self._slots, n, K, steps, self._draws, self._policy, budget, plan)

    def _draft_and_verify(self, steps: int, prefill_tokens: int = 0, prefill_ms: float = 0.0):
        """Draws and verify windows of the decode slots over ``steps`` steps (the compiled
        dsim.engine.compiled_decode.plan_decodes). Adaptive: each step's budgets priced by one cost row,
        the cost of n + prefill_tokens + b tokens at the slots' KV context, drafter and CPU
        overhead included, plus prefill_ms (the step's prefill correction). Returns
        (conf [steps, K, n], lead, verified, commit cap [steps, n], drafts verified in the first
        step, steps planned: up to the first step where some slot may finish)."""
        conf, lvc, args = self._plan_args(steps, self.n + prefill_tokens, prefill_ms)
        lead, verified, cap = lvc[0], lvc[1], lvc[2]
        v0, done = compiled_decode.plan_decodes(*args)
        if self._script is not None:
            apply_draft_script(self._script, self._slot_ints[: self.n, ROUNDS], lead, verified, cap)
            v0 = int(verified[0].sum())
        return conf, lead, verified, cap, v0, done

    # ---- commit: one path for single steps and decode windows ---------------------------------
    def _grow_steps(self, m: int) -> None:
        """The commit kernels' per-step output buffer, grown to m steps."""
        if self._step_out.shape[1] < m:
            self._step_out = np.empty((3, m), dtype=np.int64)
            self._bundle_buffers()

    def _account(self, m: int, conf, lead, vt: int, at: int, lt: int, et: int, min_left: int) -> None:
        """After a commit of m steps: the speculative counters, the head's samples, the slots' KV
        tokens and the bound on the smallest remaining output (the confidence history is the
        commit kernels')."""
        n, K = self.n, self.K
        st = self.stats
        if K:
            st.num_drafts += m * n
            st.num_draft_tokens += m * n * K
            st.verified_draft_tokens += vt
            if self._adaptive:
                st.accepted_in_window += at
                st.accepted_full_block += lt
            if self._has_head and self.head_n < st.replica_cap:
                # this replica's first draft rounds up to its share of the cap, in step order:
                # the same samples whether the steps ran one by one or as windows
                q = min(m * n, -(-(st.replica_cap - self.head_n) // K)) * K
                self.head_conf.append(conf[:m].transpose(0, 2, 1).reshape(-1)[:q])
                self.head_acc.append((np.arange(K)[None, None, :] < lead[:m, :, None]).reshape(-1)[:q])
                self.head_n += q
        self.kv_dec += et
        self.left_lb = int(min_left)

    def _commit_step(self, plan: StepPlan) -> DecodeOutcome:
        """A general step's commit, one compiled call (dsim.engine.compiled_sched.commit_step): its
        prefills' chunks (those that reach the end of their prompt sample a token and become
        decode slots, their KV holding prompt + generated - 1 tokens), its decode slots
        (commit_decodes: tokens, speculative counters, the confidence history), their ITL samples
        where some gap is not the step's duration, the new slots and the removal of finished
        slots; then the prefix cache's new blocks, a resumed request's ITL sample (after the
        decodes'), the speculative counters and the head's samples (_account) and the step's
        row. Where every slot emitted at the previous step's end and the budget cut nothing,
        every gap is the step's duration: one run-length ITL sample (the kernel's itl_ms). The
        removed requests' rows follow the earlier ones in self._done_ints (flush writes them)."""
        R, t = self.requests, self.env.now
        n, K = self.n, self.K
        given = plan.decode_given
        chunks = plan.prefill_chunks
        n_pre = len(chunks)
        if self.shapes is not None:
            qd = given if given is not None else (1 + plan.verified[0] if K and n else None)
            qs = ([] if not n else (qd.tolist() if qd is not None else [1] * n)) + chunks.tolist()
            ctxs = self.live_ints[:, COMP].tolist() + R.computed[plan.prefill_ids].tolist()
            self.shapes.append((self.idx, t, [x for x in qs if x], [c for x, c in zip(qs, ctxs) if x], plan.forward_ms))
        if K and n:
            verified, cap, lead, conf = plan.verified, plan.commit_cap, plan.lead, plan.conf
        else:
            verified = cap = lead = self._no_steps  # (the kernel reads none without drafts)
            conf = self._no_conf
        itl_mode, j, itl_ms = 0, 0, -1.0
        v = self.itl_vals
        n_run = n
        if n:
            if given is None and self._last_is_prev_end:
                itl_ms = plan.duration_ms
                v.append((itl_ms, n))
            else:
                n_run = n if given is None else int(np.count_nonzero(given))
                itl_mode = 2 if self._last_is_prev_end else 1
                j = v.reserve(n_run)
                self._last_is_prev_end = given is None
        if given is None:
            given = self._no_cut
        if n_pre and n + n_pre > len(self._slot_ints):
            self._grow_slots(n + n_pre)
        d0 = self._done_n
        if d0 + n + n_pre > len(self._done_ints):
            self._grow_done(d0 + n + n_pre)
        if n_pre and self._prefix_on:
            done_ids, done_chunks = plan.prefill_ids.tolist(), chunks.tolist()  # (before the kernel moves them)
        step = (n_pre, itl_mode, itl_ms, float(t), float(self.prev_end), v.a, j, self.left_lb, self._moved, self._late,
                self._done_ints, self._done_floats, d0)  # (a CommitStep)  # fmt: skip
        vt, at, lt, et, w, d, ml, done_kv, m, freed, kv_new, self.n_pre, n_late = compiled_sched.commit_step(
            self._slots, n, K, (conf, lead, verified, cap), given, self._commit_out, self._policy,
            self._request_table, self._queues(), step,
        )  # fmt: skip
        if n_pre:
            if self._prefix_on:
                computed = R.computed
                for rid, c in zip(done_ids, done_chunks):
                    if c:
                        self._prefix_insert(rid, int(computed[rid]))
            self.pre_blocks -= freed
            self.kv_dec += kv_new
            for gap in self._late[:n_late].tolist():
                self.itl_vals.append((gap, 1))
        if n:
            self._account(1, conf, lead, vt, at, lt, et, ml)
        self.left_lb = int(ml)
        self.kv_dec -= done_kv
        self.n = w
        self._done_n = d0 + d
        self.prev_end = t
        n_req = n_run + plan.n_prefill
        self.n_steps += 1
        self.batch_sum += n_req
        self.steps.append(
            (
                self.idx,
                t,
                plan.duration_ms,
                n_req,
                n_run,
                plan.n_tokens,
                plan.prefill_tokens,
                vt,
                at,
                et + m,
                plan.kv_tokens,
                len(self.waiting),
            )
        )
        if d:
            # Per-request results are written to the request table once, at the end (flush).
            self.on_finish(self._done_ints[d0 : d0 + d, ID].tolist())
        if not n:  # (no decodes: the commit wrote no per-step totals)
            self._step_out[:, 0] = 0
        return DecodeOutcome(1, n, K, self._slot_out, self._step_out, vt, at, et, lt)

    def _finish_done(self):
        if not self.n or self.left_lb > 0:
            return
        n, d0 = self.n, self._done_n
        self._grow_done(d0 + n)
        w, d, min_left, done_kv = compiled_decode.remove_done(
            self._slots, n, self._done_ints, self._done_floats, d0, float(self.env.now)
        )
        self.n = w
        self.left_lb = int(min_left)
        if d:
            # Per-request results are written to the request table once, at the end (flush).
            self._done_n = d0 + d
            self.kv_dec -= done_kv
            self.on_finish(self._done_ints[d0 : d0 + d, ID].tolist())

    def flush(self) -> None:
        """Write the finished requests' results into the shared request table; add every
        request's speculative counters (finished and still running) to the per-class totals."""
        R = self.requests
        st = self.stats
        if self.K:
            parts = [self._done_ints[: self._done_n], self.live_ints]
            held = np.flatnonzero(R.held_spec.any(axis=0))  # preempted and not resumed (any replica's)
            if len(held):
                rows = np.zeros((len(held), NCOL), dtype=np.int64)
                rows[:, CLS] = R.cls[held]
                rows[:, ROUNDS : VSUM + 1] = R.held_spec[:, held].T
                parts.append(rows)
                R.held_spec[:, held] = 0  # counted now
            allr = np.concatenate(parts)
            nc = len(st.cls_rounds)
            cls = allr[:, CLS]
            rounds = allr[:, ROUNDS].astype(np.float64)
            st.cls_rounds += np.bincount(cls, weights=rounds, minlength=nc)
            st.cls_emitted += np.bincount(cls, weights=rounds + allr[:, ASUM], minlength=nc)
            st.cls_verify += np.bincount(cls, weights=rounds + allr[:, VSUM], minlength=nc)
            self.live_ints[:, ROUNDS : VSUM + 1] = 0  # counted now
        rows, frows = self._done_ints[: self._done_n], self._done_floats[: self._done_n]
        ids = rows[:, ID]
        R.finish[ids] = frows[:, 2]
        R.emits[ids] = rows[:, EMITS]
        R.itl_max[ids] = frows[:, ITLMAX]
        self._done_n = 0
