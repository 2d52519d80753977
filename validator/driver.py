"""Replay a workload against an OpenAI-compatible server and record what it observed.

One request = POST /v1/completions, streaming, a prompt of the trace's input length (token ids by
default: a base token sequence from the server's /tokenize, tiled; or text), max_tokens = the
trace's output length with ignore_eos, greedy. Per request we record the send time, the first-token
time, every chunk's time and token count (from ``continuous_usage_stats`` when the server gives
it, else one token per non-empty chunk), and errors with their reason. /metrics is scraped before
and after (deltas of counters and histograms) and the running/waiting gauges are sampled during the
run. Every wait has a timeout; a failing request is recorded and the run goes on.
"""

from __future__ import annotations

import asyncio
import datetime as _dt
import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import httpx
import numpy as np

from dsim.errors import InputError, plain
from validator import hostcpu, measure, noise, promtext, serverconf, stops
from validator.traces import Plan

if TYPE_CHECKING:
    from pathlib import Path

# The prompt with partial repeats that gives steady, mid-range ngram acceptance (vllm-cpu.md).
DEFAULT_BASE_TEXT = "d yd yQ d yd yR d yd yS x = 1; y = 2; x = 1; y = 2; x = 1; y"
API_KEY_ENVS = ("DSIM_API_KEY", "OPENAI_API_KEY")


def api_headers() -> dict:
    for name in API_KEY_ENVS:
        key = os.environ.get(name)
        if key:
            return {"Authorization": f"Bearer {key}"}
    return {}


@dataclass
class RunOptions:
    server: str
    model: str | None = None
    concurrency: int | None = None
    rate: float | None = None
    seed: int = 0
    prompt_mode: str = "ids"  # ids | text
    base_text: str = DEFAULT_BASE_TEXT
    temperature: float = 0.0
    connect_timeout_s: float = 5.0
    read_timeout_s: float = 60.0  # longest silence inside a stream
    request_timeout_s: float = 600.0  # whole request
    gauge_interval_s: float = 1.0  # at least; see sampler()
    progress: bool = True
    nice: int | None = -10  # client priority while it measures (None: leave it)
    cpus: list | None = None  # pin the client to these CPUs while it measures
    label: str = ""
    extra_header: dict = field(default_factory=dict)
    # called with each request's record as it is written (in the run's event loop; keep it short):
    # lets a caller act on what the run observed, e.g. a test that stops the server once a
    # request has finished
    on_request: Callable[[dict], None] | None = None


def _now_iso() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def _short(e: BaseException) -> str:
    s = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    return s[:200]


def _bounded(call, timeout_s: float):
    """An httpx call with a deadline on the whole of it: httpx's own timeouts bound each
    connect and each read, so a server that trickles a byte now and then would hold it forever."""
    return asyncio.wait_for(call, 2 * timeout_s)


async def _get_json(client, url, timeout=5.0):
    r = await _bounded(client.get(url, timeout=timeout), timeout)
    r.raise_for_status()
    return r.json()


async def probe(client: httpx.AsyncClient, server: str) -> dict:
    """Server facts: reachable (else InputError), model id, version, metrics available."""
    info = {}
    try:
        r = await _bounded(client.get(f"{server}/v1/models", timeout=5.0), 5.0)
    except asyncio.TimeoutError:
        raise InputError(f"{server}: server not answering (/v1/models: no whole answer within 10 s)") from None
    except httpx.TimeoutException as e:
        raise InputError(f"{server}: server not answering (/v1/models: {type(e).__name__} after 5 s)") from None
    except httpx.HTTPError as e:
        raise InputError(f"{server}: server not reachable ({type(e).__name__}: {_short(e)})") from None
    if r.status_code in (401, 403):
        raise InputError(f"{server}: /v1/models answered {r.status_code} (set DSIM_API_KEY)")
    try:
        info["models_doc"] = r.json()
        data = info["models_doc"].get("data") or []
        info["models"] = [m.get("id") for m in data]
        if data and data[0].get("max_model_len"):
            info["max_model_len"] = data[0]["max_model_len"]
    except (ValueError, AttributeError, TypeError):
        info["models"] = []
    info["models"] = [m for m in info["models"] if isinstance(m, str)]
    try:
        info["server_version"] = (await _get_json(client, f"{server}/version")).get("version")
    except (httpx.HTTPError, ValueError, AttributeError, asyncio.TimeoutError):
        info["server_version"] = None
    return info


async def scrape(client: httpx.AsyncClient, server: str, timeout: float = 5.0) -> tuple[Any, str | None]:
    """Parsed /metrics, or (None, reason)."""
    try:
        r = await _bounded(client.get(f"{server}/metrics", timeout=timeout), timeout)
        if r.status_code != 200:
            return None, f"http_{r.status_code}"
        p = promtext.parse(r.text)
        return p, (f"{p.problems} malformed lines" if p.problems else None)
    except asyncio.TimeoutError:
        return None, f"timeout: no whole /metrics answer within {2 * timeout:g} s"
    except (httpx.HTTPError, UnicodeError) as e:
        return None, f"{type(e).__name__}: {_short(e)}"


async def base_token_ids(client: httpx.AsyncClient, server: str, model: str, text: str) -> list[int]:
    try:
        r = await _bounded(
            client.post(
                f"{server}/tokenize", json={"model": model, "prompt": text, "add_special_tokens": False}, timeout=10.0
            ),
            10.0,
        )
        if r.status_code == 200:
            toks = r.json().get("tokens")
            if toks and isinstance(toks, list) and all(type(t) is int and t >= 0 for t in toks):
                return list(toks)
    except (httpx.HTTPError, ValueError, AttributeError, asyncio.TimeoutError):
        pass
    # no /tokenize: bytes of the text offset past typical special ids (still a valid id list)
    return [32 + (b % 200) for b in text.encode()]


def make_prompt(base: list[int], n: int, mode: str, text: str) -> list[int] | str:
    """Token ids: the base sequence tiled to n. Text (no /detokenize): about 4 characters a token."""
    if mode == "ids":
        reps = n // len(base) + 1
        return (base * reps)[:n]
    reps = (4 * n) // max(len(text), 1) + 1
    return ((text + " ") * reps)[: 4 * n]


class Prompts:
    """Prompts by length, cached. Text mode detokenizes the tiled ids through the server's
    /detokenize so the text tokenizes back to (about) the wanted length; the length the server
    really saw is recorded per request from its usage (prompt_tokens_server)."""

    def __init__(self, client, server, model, base, mode, text):
        self.client, self.server, self.model = client, server, model
        self.base, self.mode, self.text = base, mode, text
        self.cache = {}

    async def get(self, n: int) -> list[int] | str:
        if n in self.cache:
            return self.cache[n]
        ids = make_prompt(self.base, n, "ids", self.text)
        p = ids
        if self.mode == "text":
            p = make_prompt(self.base, n, "text", self.text)
            try:
                r = await _bounded(
                    self.client.post(
                        f"{self.server}/detokenize", json={"model": self.model, "tokens": ids}, timeout=10.0
                    ),
                    10.0,
                )
                doc = r.json() if r.status_code == 200 else None
                if isinstance(doc, dict) and isinstance(doc.get("prompt"), str):
                    p = doc["prompt"]
            except (httpx.HTTPError, ValueError, asyncio.TimeoutError):
                pass
        self.cache[n] = p
        return p


def _bad_usage(usage: dict, last_cum: int) -> str | None:
    """Why a server's usage counts cannot be trusted (None if they can): counts must be
    integers >= 0, and the cumulative completion count cannot go down within a stream."""
    for key in ("prompt_tokens", "completion_tokens"):
        v = usage.get(key)
        if v is None:
            continue
        if isinstance(v, bool) or not isinstance(v, int):
            return f"{key} is not an integer: {plain(v)}"
        if v < 0:
            return f"{key} is negative: {v}"
    cum = usage.get("completion_tokens")
    if cum is not None and cum < last_cum:
        return f"completion_tokens went down from {last_cum} to {cum}"
    return None


async def _one(client, opts: RunOptions, i: int, prompt, plan: Plan, t0: float, arrival: float, model: str) -> dict:
    rec = {
        "type": "request",
        "i": i,
        "prompt_tokens": int(plan.prompt_tokens[i]),
        "max_tokens": int(plan.output_tokens[i]),
        "arrival_s": arrival,
        "send_s": None,
        "first_token_s": None,
        "end_s": None,
        "chunks": [],
        "output_tokens": 0,
        "ok": False,
        "error": None,
        "status": None,
    }
    body = {
        "model": model,
        "prompt": prompt,
        "max_tokens": int(plan.output_tokens[i]),
        "ignore_eos": True,
        "stream": True,
        "temperature": opts.temperature,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
    }
    usage_seen = False
    last_cum = 0
    done = False
    malformed = 0

    async def _stream():
        nonlocal usage_seen, last_cum, done, malformed
        async with client.stream("POST", f"{opts.server}/v1/completions", json=body) as resp:
            rec["status"] = resp.status_code
            if resp.status_code >= 400:
                txt = (await resp.aread())[:300].decode(errors="replace")
                rec["error"] = f"http_{resp.status_code}: {txt.strip()[:200]}"
                rec["end_s"] = time.perf_counter() - t0
                return rec
            async for line in resp.aiter_lines():
                now = time.perf_counter() - t0
                line = line.strip()
                if not line or line.startswith(":"):
                    continue
                if not line.startswith("data:"):
                    malformed += 1
                    continue
                payload = line[5:].strip()
                if payload == "[DONE]":
                    done = True
                    break
                try:
                    ev = json.loads(payload)
                except json.JSONDecodeError:
                    malformed += 1
                    continue
                if not isinstance(ev, dict):
                    malformed += 1
                    continue
                if "error" in ev and not ev.get("choices"):
                    rec["error"] = f"server_error: {str(ev['error'])[:200]}"
                    break
                usage = ev.get("usage") or None
                choices = ev.get("choices") or []
                if not isinstance(choices, list):
                    rec["error"] = f"malformed_event: choices is not a list: {plain(choices)}"
                    break
                texts = [c.get("text") for c in choices if isinstance(c, dict)]
                if any(t is not None and not isinstance(t, str) for t in texts):
                    bad_t = next(t for t in texts if t is not None and not isinstance(t, str))
                    rec["error"] = f"malformed_event: choices[].text is not a string: {plain(bad_t)}"
                    break
                text = "".join(t or "" for t in texts)
                ntok = None
                if usage is not None and not isinstance(usage, dict):
                    rec["error"] = f"bad_usage: usage is not an object: {plain(usage)}"
                    break
                bad = _bad_usage(usage, last_cum) if usage else None
                if bad:
                    rec["error"] = f"bad_usage: {bad}"
                    break
                if usage and usage.get("prompt_tokens") is not None:
                    rec["prompt_tokens_server"] = usage["prompt_tokens"]
                if usage and usage.get("completion_tokens") is not None:
                    cum = usage["completion_tokens"]
                    if choices:
                        ntok = cum - last_cum
                    last_cum = max(last_cum, cum)
                    usage_seen = True
                if choices:
                    if ntok is None:
                        ntok = 1 if text else 0
                    if ntok > 0 or text:
                        rec["chunks"].append([round(now, 6), int(ntok)])
                        if rec["first_token_s"] is None:
                            rec["first_token_s"] = now

    rec["send_s"] = time.perf_counter() - t0
    try:
        await asyncio.wait_for(_stream(), opts.request_timeout_s)
        end = time.perf_counter() - t0
        rec["end_s"] = end
        ntoks = last_cum if usage_seen else sum(c[1] for c in rec["chunks"])
        rec["output_tokens"] = int(ntoks)
        rec["token_counts"] = "usage" if usage_seen else "chunks"
        if malformed:
            rec["malformed_events"] = malformed
        if rec["error"] is None:
            if not done:
                rec["error"] = "stream_cut: stream ended without [DONE]"
            elif rec["first_token_s"] is None:
                rec["error"] = "malformed_sse: no parsable token events" if malformed else "empty: no tokens streamed"
            else:
                rec["ok"] = True
                if rec["output_tokens"] != rec["max_tokens"]:
                    rec["warning"] = f"output {rec['output_tokens']} tokens != max_tokens {rec['max_tokens']}"
    except asyncio.TimeoutError:
        rec["error"] = f"timeout: no answer within {opts.request_timeout_s:g}s"
    except httpx.ConnectError as e:
        rec["error"] = f"connect_error: {_short(e)}"
    except httpx.TimeoutException as e:
        rec["error"] = f"timeout: {type(e).__name__}"
    except (httpx.RemoteProtocolError, httpx.ReadError) as e:
        rec["error"] = f"stream_cut: {type(e).__name__}: {_short(e)}"
    except httpx.HTTPError as e:
        rec["error"] = f"http_error: {type(e).__name__}: {_short(e)}"
    except (ValueError, TypeError, KeyError, AttributeError, UnicodeError) as e:
        # whatever else a server that breaks the protocol makes of a stream: a failed request
        rec["error"] = f"protocol_error: {type(e).__name__}: {_short(e)}"
    if rec["end_s"] is None:
        rec["end_s"] = time.perf_counter() - t0
    if not rec["ok"]:
        rec["output_tokens"] = int(last_cum if usage_seen else sum(c[1] for c in rec["chunks"]))
    return rec


async def run_async(plan: Plan, opts: RunOptions, out_path: str | Path) -> dict:
    headers = api_headers()
    timeout = httpx.Timeout(
        connect=opts.connect_timeout_s, read=opts.read_timeout_s, write=opts.read_timeout_s, pool=opts.request_timeout_s
    )
    limits = httpx.Limits(
        max_connections=max(opts.concurrency or 0, 64) + 4, max_keepalive_connections=max(opts.concurrency or 0, 64) + 4
    )
    async with httpx.AsyncClient(headers=headers, timeout=timeout, limits=limits) as client:
        info = await probe(client, opts.server)
        model = opts.model or (info["models"][0] if info.get("models") else None)
        if not model:
            raise InputError(f"{opts.server}: no model served (pass --model)")
        base = await base_token_ids(client, opts.server, model, opts.base_text)
        prompts = Prompts(client, opts.server, model, base, opts.prompt_mode, opts.base_text)
        if opts.prompt_mode == "text":  # build the texts before the clock starts
            for n in sorted(set(int(x) for x in plan.prompt_tokens)):
                await prompts.get(n)
        before, before_err = await scrape(client, opts.server)
        spec_before = promtext.spec_stats(before) if before else None
        n = len(plan)
        if opts.concurrency:
            mode, arrivals = "concurrency", np.zeros(n)
        elif opts.rate:
            rng = np.random.default_rng(opts.seed)
            arrivals = np.concatenate([[0.0], np.cumsum(rng.exponential(1.0 / opts.rate, n - 1))])
            mode = "rate"
        else:
            mode, arrivals = "trace", np.asarray(plan.arrival_s, dtype=np.float64)
        header = {
            "type": "header",
            "format": measure.FORMAT,
            "source": "run",
            "label": opts.label,
            "server": opts.server,
            "model": model,
            "server_version": info.get("server_version"),
            "date": _now_iso(),
            "trace": plan.source,
            "requests": n,
            "load": {"mode": mode, "concurrency": opts.concurrency, "rate": opts.rate, "seed": opts.seed},
            "prompt_mode": opts.prompt_mode,
            "temperature": opts.temperature,
            "spec": {"k": spec_before["k"]} if spec_before else None,
            "metrics_available": before is not None,
            "metrics_error": before_err,
        }
        header.update({k: v for k, v in opts.extra_header.items() if k != "engine"})
        # the server's configuration: what it says of itself over what the caller was told
        # (validator.serverconf); check simulates what this block says
        header["engine"] = serverconf.resolve(
            opts.extra_header.get("engine"),
            header.get("server_flags"),
            serverconf.queried(info.get("models_doc"), info.get("server_version"), before),
        )
        if header["engine"].get("spec_k"):
            header["spec"] = dict(header["spec"] or {"k": header["engine"]["spec_k"]})
            header["spec"]["method"] = header["engine"].get("spec_method")
        # the host's load at the start and the end: a run during which it changed is flagged
        # (validator.noise.load_change)
        load0 = noise.host_load()
        header["host_load"] = {"loadavg": load0["loadavg"], "cpus": load0["cpus"]} if load0 else None
        # other work on a local server's engine CPUs over the run (validator.hostcpu)
        server_procs = hostcpu.server_pids(opts.server)
        cpu0 = hostcpu.snapshot(server_procs)
        w = measure.Writer(out_path)
        w.write(header, sync=True)
        if before is not None:
            w.write({"type": "metrics_before", "metrics": promtext.to_jsonable(promtext.interesting(before))})

        bar = None
        if opts.progress:
            from tqdm import tqdm

            bar = tqdm(total=n, desc="requests", unit="req", leave=False, dynamic_ncols=True)
        t0 = time.perf_counter()
        counts = {"ok": 0, "failed": 0}
        gauge_samples = []
        stop = asyncio.Event()

        async def sampler() -> None:
            async with httpx.AsyncClient(headers=headers, timeout=2.0) as gclient:
                wait = opts.gauge_interval_s
                while not stop.is_set():
                    try:  # first sample after one interval, not on top of the first requests
                        await asyncio.wait_for(stop.wait(), wait)
                        break
                    except asyncio.TimeoutError:
                        pass
                    t_s = time.perf_counter()
                    p, _ = await scrape(gclient, opts.server, timeout=2.0)
                    # rendering /metrics costs the API server real CPU (0.1 s and more on a busy
                    # 2-core machine) and stalls its streams: keep it under ~5% of the front end
                    wait = max(opts.gauge_interval_s, 20 * (time.perf_counter() - t_s))
                    if p is not None:
                        g = promtext.gauges(p)
                        if g:
                            g = {"type": "gauge", "t": round(time.perf_counter() - t0, 4), **g}
                            gauge_samples.append(g)
                            w.write(g)

        def finish(rec: dict) -> None:
            w.write(rec)
            counts["ok" if rec["ok"] else "failed"] += 1
            if opts.on_request is not None:
                opts.on_request(rec)
            if bar is not None:
                bar.update(1)
                bar.set_postfix(failed=counts["failed"], refresh=False)

        async def worker_conc(queue: asyncio.Queue) -> None:
            while True:
                if _cancel_requested():
                    raise asyncio.CancelledError
                try:
                    i = queue.get_nowait()
                except asyncio.QueueEmpty:
                    return
                prompt = await prompts.get(int(plan.prompt_tokens[i]))
                finish(await _one(client, opts, i, prompt, plan, t0, time.perf_counter() - t0, model))

        async def timed(i: int) -> None:
            delay = arrivals[i] - (time.perf_counter() - t0)
            if delay > 0:
                await asyncio.sleep(delay)
            prompt = await prompts.get(int(plan.prompt_tokens[i]))
            finish(await _one(client, opts, i, prompt, plan, t0, float(arrivals[i]), model))

        sampler_task = asyncio.create_task(sampler())
        interrupted = None
        finished = False
        try:
            if mode == "concurrency":
                q = asyncio.Queue()
                for i in range(n):
                    q.put_nowait(i)
                await asyncio.gather(*(worker_conc(q) for _ in range(min(opts.concurrency, n))))
            else:
                await asyncio.gather(*(timed(i) for i in range(n)))
            finished = True
        except (asyncio.CancelledError, KeyboardInterrupt) as e:
            interrupted = "interrupted (Ctrl-C)"
            stopped_by = e  # re-raised as it came: asyncio turns a cancel by Ctrl-C into KeyboardInterrupt
        finally:
            duration = time.perf_counter() - t0
            stop.set()
            try:
                await asyncio.wait_for(sampler_task, 5.0)
            except (asyncio.TimeoutError, asyncio.CancelledError, Exception):
                sampler_task.cancel()
            if bar is not None:
                bar.close()
            after, after_err = await scrape(client, opts.server)
            summary = {
                "type": "summary",
                "duration_s": duration,
                "interrupted": interrupted is not None,
                "interrupt_reason": interrupted,
                "metrics_after_error": after_err,
                "host_load": noise.load_change(load0, noise.host_load()),
                "interference": hostcpu.interference(cpu0, hostcpu.snapshot(server_procs)),
            }
            if before is not None and after is not None:
                d = promtext.interesting(promtext.delta(before, after))
                summary["metrics_delta"] = promtext.to_jsonable(d)
                summary["spec"] = promtext.spec_stats(d)
                summary["server_histograms"] = {
                    name: promtext.histogram_stats(d, name)
                    for name in promtext.HISTOGRAMS
                    if promtext.histogram_stats(d, name)
                }
            if gauge_samples:
                run = [g["running"] for g in gauge_samples if "running" in g]
                wait = [g["waiting"] for g in gauge_samples if "waiting" in g]
                summary["gauges"] = {
                    "samples": len(gauge_samples),
                    "running_mean": float(np.mean(run)) if run else None,
                    "running_max": float(np.max(run)) if run else None,
                    "waiting_mean": float(np.mean(wait)) if wait else None,
                    "waiting_max": float(np.max(wait)) if wait else None,
                }
            if not finished:
                w.discard()  # all or nothing: an interrupted run writes no file
            else:
                m = measure.read(w.write_path)  # recompute latency stats from what was written
                stats = measure.summarize_requests(m.requests)
                summary.update({k: v for k, v in stats.items() if k not in summary})
                w.write(summary, sync=True)
                w.close()
        if interrupted:
            raise stopped_by
        return summary


def _boost(nice: int | None):
    """Raise this thread's scheduling priority while it timestamps chunks: on a busy machine a
    client at normal priority is scheduled late and sees streams arrive in bursts (measured on the
    shared 2-core CI machine: TTFT 150-190 ms and ITL ~0 at nice 0, 13-33 ms and 3-5 ms at -10).
    Under autogroup scheduling a thread's nice only counts inside its session's group, so the
    group's nice is raised too (and restored after). Needs CAP_SYS_NICE (root); otherwise nothing
    changes. Returns (old, achieved, old_group)."""
    if nice is None or not hasattr(os, "setpriority"):
        return None, None, None
    from validator import server

    old = os.getpriority(os.PRIO_PROCESS, 0)
    try:
        os.setpriority(os.PRIO_PROCESS, 0, nice)
    except OSError:
        return old, None, None
    old_group = server.autogroup_nice()
    if old_group is not None and nice < old_group:
        server.set_autogroup_nice(0, nice)
    else:
        old_group = None
    return old, os.getpriority(os.PRIO_PROCESS, 0), old_group


def _pin(cpus):
    """Pin this thread to ``cpus`` (threads it starts inherit it); returns the old set or None."""
    if not cpus or not hasattr(os, "sched_setaffinity"):
        return None
    old = os.sched_getaffinity(0)
    try:
        os.sched_setaffinity(0, set(int(c) for c in cpus))
    except OSError:
        return None
    return old


def _holds_interrupt(e: BaseException) -> bool:
    """Whether an exception group (at any depth) holds a KeyboardInterrupt."""
    return any(isinstance(x, KeyboardInterrupt) or _holds_interrupt(x) for x in getattr(e, "exceptions", ()))


def _cancel_requested() -> bool:
    """Whether this task was asked to stop: Python 3.11's asyncio.wait_for swallows a cancel that
    comes as its request finishes (it returns the result), and a worker went on with the next
    requests of a stopped run (seen: a SIGTERM took the whole run's length)."""
    cancelling = getattr(asyncio.current_task(), "cancelling", None)  # (Python 3.11+)
    return bool(cancelling()) if cancelling is not None else False


def run(plan: Plan, opts: RunOptions, out_path: str | Path) -> dict:
    old, achieved, old_group = _boost(opts.nice)
    old_cpus = _pin(opts.cpus)
    opts.extra_header = dict(
        opts.extra_header,
        client_nice=achieved if achieved is not None else old,
        client_cpus=sorted(os.sched_getaffinity(0)) if old_cpus is not None else None,
    )
    try:
        return stops.run_stoppable(run_async(plan, opts, out_path))
    except BaseException as e:
        # SIGTERM is turned into KeyboardInterrupt (stops.terminate_as_interrupt); when it lands inside
        # the HTTP client's task group it comes wrapped in an exception group: unwrap it, so callers see
        # the interrupt itself.
        if not isinstance(e, KeyboardInterrupt) and _holds_interrupt(e):
            raise KeyboardInterrupt(str(e)) from None
        raise
    finally:
        if old_cpus is not None:
            try:
                os.sched_setaffinity(0, old_cpus)
            except OSError:
                pass
        if old_group is not None:
            from validator import server

            server.set_autogroup_nice(0, old_group)
        if achieved is not None:
            try:
                os.setpriority(os.PRIO_PROCESS, 0, old)
            except OSError:
                pass
