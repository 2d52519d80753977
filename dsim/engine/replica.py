"""One engine replica: a continuous-batching scheduler with vLLM V1 semantics (docs/user/semantics.md §7).

Each step:
1. running requests first: a decode reserves 1 + K tokens and verifies 1 + its window, a prefill
   takes what is left of the token budget (chunked prefill), capped by long_prefill_token_threshold;
2. KV blocks (16 tokens) are allocated for the scheduled tokens; when they run out the engine
   preempts the most recently admitted request (recompute later) and admits nobody this step;
3. waiting requests are admitted FCFS while the budget, the sequence cap and the KV cache allow;
   prefix-cache hits (full blocks already cached) reduce the tokens to compute;
4. the step's wall time = cost model (forward of n tokens reading kv tokens) + drafter + CPU
   scheduling overhead (hidden when async scheduling overlaps it with the GPU step);
5. prefills that finish their prompt sample one token; decodes emit accepted + 1 tokens.

State is arrays over requests (global per-request table) and the running batch; nothing is a
Python object per request or per token. The step's numeric work runs in compiled kernels: the
scheduler's prefill chunks, KV growth and admission (dsim.engine.compiled_sched.schedule_step), the
draws, verify windows and verify modes (dsim.engine.compiled_decode.plan_decodes) and the commit
(dsim.engine.compiled_sched.commit_step: prefills, decodes, new decode slots, removal of finished
ones). A step is planned as a ``StepPlan`` and committed as a ``DecodeOutcome``
(dsim.engine.records; ``_commit_step``); a decode window commits in the compiled ``commit_window`` (the same
``commit_decodes``, then the window's rows) and returns its ``DecodeOutcome``, and both end in
one accounting path (``_account``).

Decode-only stretches (nothing to admit, no prefill running) are simulated as a *window* of up to
``max_window`` steps (and ``dsim.engine.decode_window.WINDOW_SLOTS`` slots x steps) at once ([k, R] arrays), then committed up to the first event (a completion,
a KV shortage, a wake-up by an arrival); later steps are dropped. This is exact: a request's draws
come from its own stream per draft round, so every committed step is what a one-by-one loop
produces (tested for every method and policy).

The step paths (``Replica.loop`` picks one per step; all give the same results, byte for byte):

* general step from Python (``_plan_step``, ``_commit_step``; dsim.engine.general_step): always available, and the only
  path for prefix caching, step shapes, a draft script, a remote prefill delay and a preemption.
  A speculative step's schedule and draws are one compiled call (``plan_general``) where the
  budget is priced on the engine's own cost row and the profile's prefill terms compile;
  otherwise (a policy with its own cost table, or prefill terms only Python prices)
  ``schedule_step`` and ``plan_decodes`` are called apart, the row priced in Python between them.
* decode window (``_decode_window``; dsim.engine.decode_window): a decode-only batch with nothing to admit, up to the first
  possible completion; its draws and shape in one call (``plan_window``), or, with a draft
  script or step shapes (which Python applies between the draws and the shape), ``plan_decodes``
  and ``window_steps`` apart; one commit (``commit_window``).
* compiled run of general steps (``_run_steps_compiled``, ``run_general_steps``; dsim.engine.compiled_run): consecutive
  general steps in one call while each ends before the replica's next outside event and none
  needs Python (the preconditions in ``_setup_steps_compiled``). It pays where one replica runs
  many general steps alone (a closed loop on one replica; docs/results/performance.md "Engine speed"),
  not where replicas step in turn, each call then planning about one step (``_run_pays`` keeps
  those on the Python path). Where numba's cache lacks it, a background
  process compiles it (``dsim.engine.background_compile``) and the Python path runs meanwhile.

``Replica.fuse_plan = False`` and ``Replica.run_compiled = False`` force the paths apart and the
Python path (the tests compare them). Each path is needed by some configuration, so none is
kept only for speed.

The compiled kernels take named bundles (``dsim.engine.compiled_bundles.SlotTable``, ``DrawParams``,
``PolicyParams``, ``DecodePlan``, ``CommitOut``, ``WindowPricing``; ``dsim.engine.compiled_sched.RequestTable``,
``Queues``, ``SchedLimits``, ``SchedStep``, ``CommitStep``, ``RowPricing``, ``StepCosts``,
``RunBuffers`` and the ``RUN_STATE`` record), passed as plain tuples (see dsim.engine.compiled_bundles).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from dsim.cost import KV_BLOCK_TOKENS
from dsim.engine import compiled_general_steps
from dsim.engine.compiled_run import RUN_STEPS_KERNEL, CompiledRuns
from dsim.engine.decode_window import DecodeWindows
from dsim.errors import InputError

if TYPE_CHECKING:
    from collections.abc import Generator


class Replica(CompiledRuns, DecodeWindows):
    """One engine replica driven by a simpy process.

    The running queue is (decode slots) + (requests still prefilling, in admission order).
    Decodes are scheduled before prefills, as vLLM's FCFS queue does when older requests are
    decoding; preemption picks the most recently admitted request by its admission number, since
    with long_prefill_token_threshold a newer short prompt can decode while an older one still
    prefills. Its parts, each a base class in its own module: the state, its buffers and the
    kernels' bundles (``ReplicaState``, dsim.engine.replica_state), the general step planned and
    committed from Python (``GeneralSteps``, dsim.engine.general_step), the decode windows
    (``DecodeWindows``, dsim.engine.decode_window) and the compiled runs of general steps
    (``CompiledRuns``, dsim.engine.compiled_run); this class adds the router's interface and the
    step loop that picks a path per step. ``K`` is the method's drafts per step (0 without
    speculation), ``requests`` the simulation's shared request table (dsim.engine.shared.Requests).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        """ReplicaState's arguments (dsim.engine.replica_state); then the compiled runs' set-up and the
        step loop's simpy process."""
        super().__init__(*args, **kwargs)
        self._setup_steps_compiled()
        self.proc = self.env.process(self.loop())

    # ---- interface used by the router -------------------------------------------------------
    @property
    def outstanding(self) -> int:
        return self.n + self.n_pre + len(self.waiting) + self.in_transit

    def submit(self, rid: int) -> None:
        R = self.requests
        # A request whose whole life cannot fit the KV cache would be preempted forever (vLLM
        # refuses to start with max_model_len above the cache): say so on arrival.
        if R.prompt_l[rid] + R.output_l[rid] > self._fit_tokens:
            self._too_big(rid)
        R.replica[rid] = self.idx
        if self._transit_delay:
            cfg = self.cfg
            delay_ms = cfg.remote_prefill_ms + cfg.remote_prefill_ms_per_ktok * R.prompt_l[rid] / 1000.0
            self.in_transit += 1
            self.env.timeout(delay_ms / 1000.0).callbacks.append(lambda _, rid=rid: self._arrive(rid, True))
            return
        self._arrive(rid, False)

    def submit_many(self, rids) -> None:
        """submit(rid) for each of rids in turn (a range or list of request ids)."""
        if self._transit_delay:
            for rid in rids:
                self.submit(rid)
            return
        R = self.requests
        if R.longest_life > self._fit_tokens:  # (some request of the run may not fit: check these)
            prompt_l, output_l, lim = R.prompt_l, R.output_l, self._fit_tokens
            for rid in rids:
                if prompt_l[rid] + output_l[rid] > lim:
                    self._too_big(rid)
        if len(rids) == 1:  # (the closed loop's usual one: an item, cheaper than a slice)
            R.replica[rids[0]] = self.idx
        elif isinstance(rids, range) and rids.step == 1:
            R.replica[rids.start : rids.stop] = self.idx
        else:
            R.replica[list(rids)] = self.idx
        self.waiting.extend(rids)
        if not self.wake.triggered:
            self.wake.succeed()

    def _too_big(self, rid: int) -> None:
        R = self.requests
        need = -(-(R.prompt_l[rid] + R.output_l[rid] - 1 + self.lookahead) // KV_BLOCK_TOKENS)
        raise InputError(
            f"request {rid}: {R.prompt_l[rid]} prompt + {R.output_l[rid]} output tokens "
            f"need {need} KV blocks, the cache holds {self.total_blocks} "
            f"(profile memory.kv_cache_gib)"
        )

    def _arrive(self, rid: int, transit: bool) -> None:
        """rid joins the waiting queue (for a decode instance: its prompt's KV has arrived)."""
        self.in_transit -= transit
        self.waiting.append(rid)
        if not self.wake.triggered:
            self.wake.succeed()

    # ---- the step loop ----------------------------------------------------------------------
    def loop(self) -> Generator[Any, Any, None]:
        env = self.env
        compiled = True
        while True:
            # (a step the compiled run planned and this loop waited on is committed by the next
            # run, before anything else)
            pending = self._run_pending is not None
            if not pending and self.n == 0 and not self.n_pre and not self.waiting:
                self.wake = env.event()
                yield self.wake
            if not pending and self._window_ok():
                yield from self._decode_window()
                continue
            plan = None
            if pending or (
                compiled
                and self._steps_compiled
                and self.wake.triggered
                and self._run_pays()
                and RUN_STEPS_KERNEL.usable()
            ):
                stop, plan = self._run_steps_compiled()
                if stop in (
                    compiled_general_steps.STOP_WINDOW,
                    compiled_general_steps.STOP_IDLE,
                    compiled_general_steps.STOP_FINISHED,
                    compiled_general_steps.STOP_ROOM,
                ):
                    # (the loop's own checks next; should they disagree, one step from Python)
                    compiled = stop in (compiled_general_steps.STOP_FINISHED, compiled_general_steps.STOP_ROOM)
                    continue
            compiled = True
            planned = plan is not None  # (the compiled run's: it commits it too)
            if plan is None:  # (or the compiled run's step that needs Python: it runs here)
                plan = self._plan_step()
            if plan is None:  # nothing could be scheduled: wait for an event
                self.wake = env.event()
                yield self.wake
                continue
            self._step_s = plan.duration_ms / 1000.0
            if not self._skip(self._step_s):
                yield env.timeout(self._step_s)
            if planned and self._run_pays():  # (else Python commits the run's StepPlan)
                self._run_pending = self._run_planned
                continue
            self._commit_step(plan)
