"""A replica's decode windows: a decode-only batch with nothing to admit simulated as up to
max_window steps at once, up to the first possible completion, committed up to the first event."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from dsim.engine import compiled_window
from dsim.engine.compiled_bundles import COMP, END
from dsim.engine.general_step import GeneralSteps
from dsim.engine.records import DecodeOutcome
from dsim.engine.replica_state import LAST

if TYPE_CHECKING:
    from collections.abc import Generator

# Decode-window length. A window is at most max_window steps and WINDOW_SLOTS decode slots x
# steps (its draws' arrays); an open-loop window stops drawing at the next arrival only where it
# would draw more than CHEAP_WINDOW_SLOTS slots x steps: an arrival cuts short the window of the
# one replica it is routed to, and below that many slots the draws it wastes cost less than the
# extra windows (a few tens of microseconds of Python each) that stopping at every arrival in the
# fleet makes.
WINDOW_SLOTS = 8192
CHEAP_WINDOW_SLOTS = 256


class DecodeWindows(GeneralSteps):
    """A replica's decode windows (see dsim.engine.replica for the step paths)."""

    def _window_ok(self) -> bool:
        n = self.n
        if n == 0 or self.n_pre:
            return False
        if self.waiting and n < self.cfg.max_num_seqs:
            return False
        if not self._last_is_prev_end and self.live_floats[:, LAST].min() < self.prev_end:
            return False  # someone was skipped last step
        return n * (1 + self.K) <= self.cfg.max_num_batched_tokens

    def _window_pricing(self, fixed_ms: float) -> tuple:
        """What prices a window's steps and lays them out in self._window_ints / self._window_floats, after its draws
        (dsim.engine.compiled_bundles.WindowPricing, for window_steps, plan_window and commit_window)."""
        return (
            self.kv_dec,
            self.total_blocks - self.pre_blocks,
            self.lookahead,
            self._forward_table,
            float(self.cost.kv_ms_per_tok),
            fixed_ms,
            self._context_args,
            float(self.env.now),
            self._window_ints,
            self._window_floats,
        )

    def _decode_window(self) -> Generator[Any, Any, DecodeOutcome]:
        """A decode-only window of up to max_window steps, planned in one compiled call, waited
        on as one simpy wait (cut short at an arrival on this replica) and committed in one;
        returns what its committed steps produced (a general step's where even the first step
        needs a preemption)."""
        env, K, cfg = self.env, self.K, self.cfg
        n = self.n
        left_min = (
            int(self.left_lb) if self.left_lb > 0 else int((self.live_ints[:, END] - self.live_ints[:, COMP]).min())
        )
        # Steps until the first possible completion bound the window (one token a step at least;
        # the draws themselves stop at the first step where some slot may finish). A request
        # emits about 3 tokens a step at DSpark's acceptance: an adaptive window is bounded by a
        # third of it, about where the first completion lands (a longer bound measured no faster
        # on the default plan, and moves window boundaries, hence the times' last bits).
        k = min(cfg.max_window, WINDOW_SLOTS // n, left_min // 3 if self._adaptive else left_min)
        k = max(1, int(k))
        # Open loop: no draws past the next known arrival (each step takes at least the forward
        # of n tokens), where an arrival cutting the window short would waste many draws.
        dms = self._draft_ms(n)
        if k * n > CHEAP_WINDOW_SLOTS:
            t_next = self.next_arrival()
            if t_next is not None:
                floor_ms = self.cost.forward_ms(n) + dms + self.cpu_ms
                k_arr = (t_next - env.now) * 1000.0 // max(floor_ms, 1e-6) + 1
                k = int(min(k, max(k_arr, CHEAP_WINDOW_SLOTS // n, 1)))
        wi, wf = self._window_ints, self._window_floats
        fixed_ms = dms + self.cpu_ms
        comp0 = None
        pricing = self._window_pricing(fixed_ms)
        if K > 0 and self._script is None and self.shapes is None:
            # the draws and the window's shape in one compiled call (as _draft_and_verify, then
            # window_steps over the steps it planned)
            conf, lvc, args = self._plan_args(k, n, 0.0)
            lead, verified, cap = lvc[0], lvc[1], lvc[2]
            k, last, general, past = compiled_window.plan_window(*args, pricing)
        else:
            if K > 0:
                conf, lead, verified, cap, _, k = self._draft_and_verify(k)  # (k: up to a possible completion)
            else:
                conf = None
                lead = verified = cap = self._no_steps
            comp0 = self.live_ints[:, COMP].copy() if self.shapes is not None else None
            plan = (conf if K > 0 else self._no_conf, lead, verified, cap)
            last, general, past = compiled_window.window_steps(self._slot_ints, n, K, k, plan, pricing)
        if general:  # even one step needs a preemption: take the general path
            plan = self._plan_step()
            if not self._skip(plan.duration_ms / 1000.0):
                yield env.timeout(plan.duration_ms / 1000.0)
            return self._commit_step(plan)
        if past:  # steps past the dense table: the cost model prices them
            q = last + 1
            fwd, dur = wf[0, :q], wf[2, :q]
            fwd[:] = self.cost.step_ms(wi[0, :q], wi[2, :q])
            dur[:] = fwd + wf[1, :q] + fixed_ms
            wf[3, :q] = env.now + np.cumsum(dur) / 1000.0
            wf[4, :q] = np.maximum.accumulate(dur)
        # Run until the last step ends or an arrival wakes us; then commit the steps that ended
        # before the wake-up plus the one in flight. (The timeout triggers the wake event: one
        # event to wait on, cheaper than a condition over two.)
        t_last = float(wf[3, last])  # (a Python float: the clock stays one)
        if not self._skip(t_last - env.now):  # (no arrival can wake us before the window ends)
            self.wake = wake = env.event()
            env.timeout(t_last - env.now).callbacks.append(lambda _: None if wake.triggered else wake.succeed())
            yield wake
            if env.now < t_last - 1e-12:
                last = min(int(wf[3, : last + 1].searchsorted(env.now - 1e-12, side="left")), last)
                t_last = float(wf[3, last])
                if t_last > env.now:
                    yield env.timeout(t_last - env.now)
        m = last + 1
        if self.shapes is not None:
            cum = np.zeros(n, np.int64)
            for t in range(m):
                qv = (1 + verified[t]) if K > 0 else np.ones(n, np.int64)
                self.shapes.append(
                    (self.idx, float(wf[3, t]), qv.tolist(), (comp0 + cum).tolist(), float(wf[0, t] + wf[1, t]))
                )
                cum += (np.minimum(lead[t], cap[t]) + 1) if K > 0 else 1
        # the commit (as _commit_step's) and the window's step rows and ITL samples, one call
        self._grow_steps(m)
        v = self.itl_vals
        j = v.reserve(m)
        st = self.steps
        i = st.reserve(m)  # (before reading st.a: reserving may move it)
        vt, at, lt, et, min_left = compiled_window.commit_window(
            self._slots,
            n,
            m,
            K,
            (conf if K > 0 else self._no_conf, lead, verified, cap),
            self._no_cut,
            float(wf[4, last]),
            self._commit_out,
            self._policy,
            (st.a, i, self.idx, len(self.waiting), wi, wf, v.a, j),  # (a WindowRows)
        )
        self._account(m, conf, lead, vt, at, lt, et, min_left)
        self.n_steps += m
        self.batch_sum += m * n  # (each of the window's steps: n requests, as window_rows writes)
        self._last_is_prev_end = True  # (prev_end = t_last below)
        self.prev_end = float(t_last)
        self._finish_done()
        return DecodeOutcome(m, n, K, self._slot_out, self._step_out, vt, at, et, lt)
