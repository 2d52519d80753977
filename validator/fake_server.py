"""A tiny OpenAI-compatible test server (standard library only) for fault tests and `ab` dry runs.

    python -m validator.fake_server --port 8000 [--mode ok|mixed|500|malformed|cut|hang|neg-usage|
        str-usage|nan-usage|choices-object|...] [--metrics ok|nan|negative] [--step-ms 2]

/v1/models, /health, /version, /metrics (vLLM-like counters plus one malformed line) and streaming
/v1/completions emitting one token per chunk every --step-ms. In ``mixed`` mode the request's
max_tokens picks the behaviour: max_tokens % 5 == 0 ok, 1 -> HTTP 500, 2 -> malformed SSE
(events that are not JSON), 3 -> the stream is cut (socket closed, no [DONE]), 4 -> hangs
(sends headers, then nothing for --hang-s seconds). Bad data, for the client's checks: ``neg-usage``
streams a negative completion_tokens count, ``str-usage`` a string one, ``nan-usage`` a NaN one;
``--metrics nan`` / ``negative`` put a NaN / negative counter sample in /metrics; the BAD_EVENTS
modes send one event that breaks the protocol (``choices`` not a list, a text that is not a string,
an event that is no object, ...).

``--spec-k K --spec-accept p1,p2,...`` serves as a speculative decoder would: after the first
token every step drafts K tokens and accepts draft i with conditional probability p_i given drafts
1..i-1 were (a seeded draw per request and step), streams the 1 + accepted tokens of the step as one
chunk, and counts vLLM's spec-decode counters (drafts, draft tokens, accepted, accepted per
position) in /metrics, so that `dsim validate calibrate` measures the curve it was given.

``--front-end-ms A --front-end-ms-per-stream B`` serves as an API server whose per-request work
queues behind the other streams': a request waits A + B (streams in flight - 1) ms before its
engine part starts, outside the latency histograms it then publishes (vLLM's TTFT, E2E, queue,
prefill, decode: the engine part only), so the client sees that much more than the server says.

``--prefix-caching on|off [--block-size B]`` answers as vLLM does about its configuration:
``owned_by: "vllm"`` in /v1/models and ``vllm:cache_config_info`` (the cache's settings as labels) in
/metrics (validator.serverconf reads both).
"""

from __future__ import annotations

import argparse
import json
import random
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

STATE = {"requests": 0, "tokens": 0, "lock": threading.Lock()}
# the front end's streams in flight and the engine-side latency sums of a --front-end fake
LATENCY = ("time_to_first_token", "e2e_request_latency", "request_queue_time", "request_prefill_time",
           "request_decode_time")  # fmt: skip
MODES = ("ok", "500", "malformed", "cut", "hang")
BAD_USAGE = {"neg-usage": -3, "str-usage": "seven", "nan-usage": float("nan")}
# events that break the protocol mid-stream (sent in place of the middle token's event)
BAD_EVENTS: dict[str, Any] = {
    "choices-object": {"choices": {"0": {"text": "x"}}},
    "choices-number": {"choices": 5},
    "choices-string": {"choices": "xyz"},
    "text-number": {"choices": [{"index": 0, "text": 7}]},
    "text-list": {"choices": [{"index": 0, "text": ["x"]}]},
    "choice-null": {"choices": [None, {"index": 0, "text": "x"}]},
    "event-list": [1, 2, 3],
    "usage-list": {"choices": [{"index": 0, "text": "x"}], "usage": [1, 2]},
    "error-object": {"error": {"message": "boom", "code": 7}},
}
METRICS = ("ok", "nan", "negative")


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.0"
    server_version = "fake-openai/0"
    cfg: argparse.Namespace = None

    def log_message(self, *a: Any) -> None:  # quiet
        pass

    def _json(self, code, obj):
        body = json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        if self.path == "/health":
            return self._json(200, {})
        if self.path == "/version":
            return self._json(200, {"version": "fake-0"})
        if self.path == "/v1/models":
            owner = {"owned_by": "vllm"} if self.cfg.prefix_caching is not None else {}
            return self._json(200, {"data": [{"id": "fake", "max_model_len": 4096, **owner}]})
        if self.path == "/metrics":
            with STATE["lock"]:
                n, t = STATE["requests"], STATE["tokens"]
            text = (
                f'# HELP vllm:request_success_total x\nvllm:request_success_total{{engine="0"}} {n}\n'
                f'vllm:generation_tokens_total{{engine="0"}} {t}\n'
                f'vllm:num_requests_running{{engine="0"}} 0\n'
                "this line is not prometheus {{{\n"
            )
            text += _spec_metrics(self.cfg)
            text += _latency_metrics(self.cfg)
            if self.cfg.prefix_caching is not None:
                text += (
                    f'vllm:cache_config_info{{block_size="{self.cfg.block_size}",cache_dtype="auto",'
                    f'enable_prefix_caching="{self.cfg.prefix_caching}",engine="0"}} 1.0\n'
                )
            if self.cfg.metrics == "nan":
                text += 'vllm:spec_decode_num_drafts_total{engine="0"} NaN\n'
            elif self.cfg.metrics == "negative":
                text += 'vllm:spec_decode_num_drafts_total{engine="0"} -5\n'
            body = text.encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        self._json(404, {"error": "not found"})

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        try:
            req = json.loads(self.rfile.read(length) or b"{}")
        except json.JSONDecodeError:
            return self._json(400, {"error": "bad json"})
        if self.path == "/tokenize":
            return self._json(200, {"tokens": list(range(10, 40))})
        if self.path != "/v1/completions":
            return self._json(404, {"error": "not found"})
        n = int(req.get("max_tokens") or 16)
        mode = self.cfg.mode
        if mode == "mixed":
            mode = MODES[n % 5]
        if mode == "500":
            return self._json(500, {"error": "internal error (fake)"})
        fe = self.cfg.front_end
        if fe is not None:
            with fe["lock"]:
                fe["active"] += 1
                streams = fe["active"]
            self.left = False
            # the API server's work for this request, behind the other streams'
            time.sleep((self.cfg.front_end_ms + self.cfg.front_end_ms_per_stream * (streams - 1)) / 1e3)
            self.t_server = time.monotonic()
        try:
            self._serve_stream(n, mode)
        finally:
            self._leave()

    def _leave(self) -> None:
        """This stream leaves the front end (once: before its last event, so that the successor a
        closed-loop client sends on it does not find it still counted)."""
        fe = self.cfg.front_end
        if fe is not None and not getattr(self, "left", True):
            self.left = True
            with fe["lock"]:
                fe["active"] -= 1

    def _serve_stream(self, n: int, mode: str) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        step = self.cfg.step_ms / 1e3
        slow = self.cfg.slow_start
        if slow:
            # a fresh server warming up: the i-th request's steps 1 + (F - 1) (N - i) / N times as long
            with slow["lock"]:
                i = slow["started"]
                slow["started"] += 1
            step *= 1.0 + (slow["factor"] - 1.0) * max(slow["requests"] - i, 0) / slow["requests"]
        self.t_first = None
        try:
            if mode == "hang":
                self.wfile.flush()
                time.sleep(self.cfg.hang_s)
                return
            if self.cfg.spec_k:
                return self._stream_speculative(n, step)
            for i in range(n):
                time.sleep(step)
                if mode == "malformed":
                    self.wfile.write(b"data: {not json\n\n")
                    self.wfile.flush()
                    continue
                if mode == "cut" and i == n // 2:
                    self.wfile.flush()
                    self.connection.shutdown(2)
                    return
                ev = {"choices": [{"index": 0, "text": "x"}], "usage": {"prompt_tokens": 1, "completion_tokens": i + 1}}
                if mode in BAD_USAGE and i == n // 2:
                    ev["usage"]["completion_tokens"] = BAD_USAGE[mode]
                if mode in BAD_EVENTS and i == n // 2:
                    ev = BAD_EVENTS[mode]
                self.wfile.write(b"data: " + json.dumps(ev).encode() + b"\n\n")
                self.wfile.flush()
                self.t_first = self.t_first or time.monotonic()
            self._end_stream(n)
        except (BrokenPipeError, ConnectionResetError, OSError):
            return

    def _end_stream(self, n: int) -> None:
        """The closing usage event and [DONE] of a stream of n tokens, counted as served."""
        end = time.monotonic()
        self._leave()
        self.wfile.write(
            b"data: "
            + json.dumps({"choices": [], "usage": {"completion_tokens": n}}).encode()
            + b"\n\ndata: [DONE]\n\n"
        )
        self.wfile.flush()
        with STATE["lock"]:
            STATE["requests"] += 1
            STATE["tokens"] += n
        fe = self.cfg.front_end
        if fe is not None and self.t_first is not None:
            first, start = self.t_first - self.t_server, 0.0
            with fe["lock"]:
                for name, v in zip(LATENCY, (first, end - self.t_server, start, first, end - self.t_first)):
                    fe["sum"][name] += v
                fe["count"] += 1

    def _stream_speculative(self, n: int, step: float) -> None:
        """Stream n tokens as a speculative decoder: the first token alone, then per step 1 + the
        accepted drafts (the last step cut at n), counting vLLM's spec-decode counters."""
        cfg = self.cfg
        st = cfg.spec_state
        with st["lock"]:
            rng = random.Random(st["seed"])
            st["seed"] += 1
        done = 0
        while done < n:
            time.sleep(step)
            m = 1
            if done:
                acc = 0
                for p in cfg.spec_accept[: cfg.spec_k]:
                    if rng.random() >= p:
                        break
                    acc += 1
                m = min(1 + acc, n - done)
                with st["lock"]:
                    st["drafts"] += 1
                    st["draft_tokens"] += cfg.spec_k
                    st["accepted"] += acc
                    for i in range(acc):
                        st["per_pos"][i] += 1
            done += m
            ev = {"choices": [{"index": 0, "text": "x" * m}], "usage": {"prompt_tokens": 1, "completion_tokens": done}}
            self.wfile.write(b"data: " + json.dumps(ev).encode() + b"\n\n")
            self.wfile.flush()
            self.t_first = self.t_first or time.monotonic()
        self._end_stream(n)


class _Server(ThreadingHTTPServer):
    # (the standard library listens with a backlog of 5: eight clients connecting at once had
    # connections wait a second for the kernel's retry, a front-end delay no real server adds)
    request_queue_size = 128


def _latency_metrics(cfg: argparse.Namespace) -> str:
    """vLLM's engine-side latency histograms (sum and count) of a --front-end fake ("" else)."""
    fe = cfg.front_end
    if fe is None:
        return ""
    with fe["lock"]:
        lines = [f'vllm:{name}_seconds_sum{{engine="0"}} {fe["sum"][name]}' for name in LATENCY]
        lines += [f'vllm:{name}_seconds_count{{engine="0"}} {fe["count"]}' for name in LATENCY]
    return "\n".join(lines) + "\n"


def _spec_metrics(cfg: argparse.Namespace) -> str:
    """vLLM's spec-decode counters of a speculative fake server ("" for a plain one)."""
    if not cfg.spec_k:
        return ""
    st = cfg.spec_state
    p = "vllm:spec_decode_"
    with st["lock"]:
        lines = [
            f'{p}num_drafts_total{{engine="0"}} {st["drafts"]}',
            f'{p}num_draft_tokens_total{{engine="0"}} {st["draft_tokens"]}',
            f'{p}num_accepted_tokens_total{{engine="0"}} {st["accepted"]}',
        ] + [
            f'{p}num_accepted_tokens_per_pos_total{{engine="0",position="{i}"}} {v}'
            for i, v in enumerate(st["per_pos"])
        ]
    return "\n".join(lines) + "\n"


def serve(
    port: int,
    mode: str = "ok",
    step_ms: float = 2.0,
    hang_s: float = 30.0,
    host: str = "127.0.0.1",
    metrics: str = "ok",
    spec_k: int = 0,
    spec_accept: tuple = (),
    seed: int = 0,
    prefix_caching: bool | None = None,
    block_size: int = 16,
    front_end_ms: float | None = None,
    front_end_ms_per_stream: float = 0.0,
    slow_start_requests: int = 0,
    slow_start_factor: float = 3.0,
) -> ThreadingHTTPServer:
    """spec_k > 0: a speculative server drafting spec_k tokens a step, spec_accept the conditional
    acceptance per position (padded with its last value), draws seeded from ``seed``.
    prefix_caching True / False: the server says it is vLLM and publishes its cache's settings
    (None: it says nothing of them). slow_start_requests N: the first N requests run slower, from
    slow_start_factor times the step down to 1 (a fresh server warming up)."""
    acc = tuple(float(x) for x in spec_accept) or (0.0,)
    acc = acc[:spec_k] + (acc[-1],) * max(0, spec_k - len(acc))
    state = {
        "lock": threading.Lock(),
        "seed": seed,
        "drafts": 0,
        "draft_tokens": 0,
        "accepted": 0,
        "per_pos": [0] * spec_k,
    }
    cfg = argparse.Namespace(
        mode=mode,
        step_ms=step_ms,
        hang_s=hang_s,
        metrics=metrics,
        spec_k=spec_k,
        spec_accept=acc,
        spec_state=state,
        prefix_caching=prefix_caching,
        block_size=block_size,
        front_end_ms=front_end_ms or 0.0,
        front_end_ms_per_stream=front_end_ms_per_stream,
        slow_start={
            "lock": threading.Lock(),
            "started": 0,
            "requests": slow_start_requests,
            "factor": slow_start_factor,
        }
        if slow_start_requests > 0
        else None,
        front_end=None
        if front_end_ms is None
        else {"lock": threading.Lock(), "active": 0, "count": 0, "sum": dict.fromkeys(LATENCY, 0.0)},
    )
    handler = type("H", (Handler,), {"cfg": cfg})
    httpd = _Server((host, port), handler)
    httpd.daemon_threads = True
    return httpd


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--mode", default="ok", choices=("mixed",) + MODES + tuple(BAD_USAGE) + tuple(BAD_EVENTS))
    ap.add_argument("--metrics", default="ok", choices=METRICS)
    ap.add_argument("--step-ms", type=float, default=2.0)
    ap.add_argument("--hang-s", type=float, default=30.0)
    ap.add_argument("--spec-k", type=int, default=0, help="drafts per step (0: no speculative decoding)")
    ap.add_argument("--spec-accept", default="", help="conditional acceptance per position, e.g. 0.8,0.6,0.5")
    ap.add_argument("--prefix-caching", choices=("on", "off"), help="publish vLLM's cache_config_info")
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--front-end-ms", type=float, help="the API server's time per request (and histograms)")
    ap.add_argument("--front-end-ms-per-stream", type=float, default=0.0, help="... more per other stream in flight")
    ap.add_argument("--slow-start-requests", type=int, default=0, help="the first N requests slower (warming up)")
    a = ap.parse_args()
    accept = tuple(float(x) for x in a.spec_accept.split(",") if x.strip())
    pc = None if a.prefix_caching is None else a.prefix_caching == "on"
    serve(
        a.port,
        a.mode,
        a.step_ms,
        a.hang_s,
        metrics=a.metrics,
        spec_k=a.spec_k,
        spec_accept=accept,
        prefix_caching=pc,
        block_size=a.block_size,
        front_end_ms=a.front_end_ms,
        front_end_ms_per_stream=a.front_end_ms_per_stream,
        slow_start_requests=a.slow_start_requests,
    ).serve_forever()


if __name__ == "__main__":
    main()
