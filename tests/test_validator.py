"""Validator tests that need no vLLM: metrics parsing, measurement files, bench import, calibration
math, and fault handling against a tiny local HTTP server (500s, malformed SSE, cut streams,
hangs, a closed port, a killed server)."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import yaml

from dsim.errors import InputError
from validator import bench_import, calibrate, driver, fake_server, measure, promtext, traces

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def fake(request):
    """A fake OpenAI server in a thread: fake(mode, step_ms) -> base URL."""
    servers = []

    def start(mode="ok", step_ms=1.0, hang_s=30.0):
        port = free_port()
        httpd = fake_server.serve(port, mode, step_ms, hang_s)
        t = threading.Thread(target=httpd.serve_forever, daemon=True)
        t.start()
        servers.append(httpd)
        return f"http://127.0.0.1:{port}"

    yield start
    for s in servers:
        s.shutdown()
        s.server_close()


METRICS = """# HELP vllm:spec_decode_num_drafts_total x
vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 10
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="m"} 40
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="m"} 25
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="0"} 9
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="1"} 7
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="2"} 5
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="3"} 4
vllm:inter_token_latency_seconds_bucket{engine="0",le="0.01"} 5
vllm:inter_token_latency_seconds_bucket{engine="0",le="0.02"} 10
vllm:inter_token_latency_seconds_bucket{engine="0",le="+Inf"} 10
vllm:inter_token_latency_seconds_sum{engine="0"} 0.12
vllm:inter_token_latency_seconds_count{engine="0"} 10
vllm:num_requests_running{engine="0",model_name="m"} 3
garbage line {{{
vllm:bad_value{engine="0"} notanumber
"""


def test_promtext_parse_delta_spec_and_histogram():
    p = promtext.parse(METRICS)
    assert p.problems == 2
    before = promtext.parse("vllm:spec_decode_num_drafts_total 4\n")
    d = promtext.delta(before, p)
    s = promtext.spec_stats(d)
    assert s["num_drafts"] == 6 and s["k"] == 4
    assert s["accepted_per_pos"] == [9, 7, 5, 4]
    assert s["acceptance_length"] == pytest.approx(1 + 25 / 6)
    h = promtext.histogram_stats(d, "vllm:inter_token_latency_seconds")
    assert h["count"] == 10 and h["mean"] == pytest.approx(0.012)
    assert h["p50"] == pytest.approx(0.01)
    assert promtext.gauges(p)["running"] == 3
    # a restarted server (counter went down) counts from zero
    d2 = promtext.delta(promtext.parse("vllm:x_total 50\n"), promtext.parse("vllm:x_total 7\n"))
    assert promtext.value(d2, "vllm:x_total") == 7


def test_acceptance_curves_per_step_and_per_draft():
    c = {"num_drafts": 10, "num_draft_tokens": 40, "num_accepted_tokens": 25,
         "accepted_per_pos": [9, 7, 5, 4], "decode_steps": 20}
    a = calibrate.acceptance_curves(c)
    assert a["per_draft"] == [0.9, pytest.approx(7 / 9, abs=1e-4), pytest.approx(5 / 7, abs=1e-4), 0.8]
    assert a["per_step"][0] == pytest.approx(9 / 20)
    # the per-step chain reproduces the emitted tokens per step: tau = 1 + A / S
    u = np.cumprod(a["per_step"])
    assert 1 + u.sum() == pytest.approx(a["tau_per_step"], abs=1e-3)
    assert a["tau_per_step"] == pytest.approx(1 + 25 / 20)
    assert a["trimmed_drafts"] is False
    c["num_draft_tokens"] = 30          # proposals shorter than K: flagged
    assert calibrate.acceptance_curves(c)["trimmed_drafts"] is True


def test_partial_file_is_readable(tmp_path):
    path = tmp_path / "m.jsonl"
    w = measure.Writer(path)
    w.write({"type": "header", "format": measure.FORMAT, "load": {"mode": "concurrency", "concurrency": 1}})
    w.write({"type": "request", "i": 0, "prompt_tokens": 4, "max_tokens": 3, "send_s": 0.0,
             "first_token_s": 0.1, "end_s": 0.3, "chunks": [[0.1, 1], [0.2, 1], [0.3, 1]],
             "output_tokens": 3, "ok": True, "error": None})
    w.close()
    with open(path, "a") as f:
        f.write('{"type": "request", "i": 1, "prom')       # torn line from a killed writer
    m = measure.read(path)
    assert not m.complete and len(m.requests) == 1 and m.header["torn_lines"] == 1
    s = m.stats()
    assert s["requests_completed"] == 1
    assert s["ttft_ms_mean"] == pytest.approx(100.0)
    assert s["tpot_ms_mean"] == pytest.approx(100.0)
    assert s["itl_ms_p50"] == pytest.approx(100.0)
    with pytest.raises(InputError):
        measure.read(tmp_path / "missing.jsonl")


def test_bench_import_detailed_and_summary_only(tmp_path):
    d = {"date": "x", "model_id": "m", "num_prompts": 2, "max_concurrency": 2, "duration": 1.0,
         "completed": 2, "failed": 0, "output_throughput": 8.0, "request_throughput": 2.0,
         "mean_ttft_ms": 100.0, "median_ttft_ms": 100.0, "p99_ttft_ms": 110.0,
         "mean_tpot_ms": 50.0, "median_tpot_ms": 50.0, "p99_tpot_ms": 50.0,
         "mean_itl_ms": 50.0, "median_itl_ms": 50.0, "p99_itl_ms": 50.0,
         "mean_e2el_ms": 250.0, "median_e2el_ms": 250.0, "p99_e2el_ms": 250.0,
         "spec_decode_acceptance_length": 2.5, "spec_decode_per_position_acceptance_rates": [0.8, 0.5]}
    src = tmp_path / "summary.json"
    src.write_text(json.dumps(d))
    s = bench_import.import_bench(src, tmp_path / "s.jsonl")
    assert s["ttft_ms_p50"] == 100.0 and s["output_tok_s"] == 8.0
    assert s["spec"]["acceptance_length"] == 2.5 and s["spec"]["k"] == 2
    m = measure.read(tmp_path / "s.jsonl")
    assert m.requests == [] and m.stats()["ttft_ms_mean"] == 100.0
    # detailed: per-token gaps a few microseconds apart fold into one chunk
    d.update({"ttfts": [0.1, 0.1], "latencies": [0.25, 0.3], "input_lens": [5, 5], "output_lens": [4, 4],
              "itls": [[0.05, 0.000003, 0.1], [0.1, 0.05, 0.05]], "start_times": [10.0, 10.05],
              "errors": ["", ""]})
    src.write_text(json.dumps(d))
    s = bench_import.import_bench(src, tmp_path / "d.jsonl")
    m = measure.read(tmp_path / "d.jsonl")
    assert len(m.requests) == 2
    assert m.requests[0]["chunks"][1][1] == 2      # merged chunk carries 2 tokens
    assert [c[1] for c in m.requests[1]["chunks"]] == [1, 1, 1, 1]
    assert m.requests[1]["send_s"] == pytest.approx(0.05)
    assert s["ttft_ms_mean"] == pytest.approx(100.0)
    with pytest.raises(InputError):
        bad = tmp_path / "bad.json"
        bad.write_text("{}")
        bench_import.import_bench(bad, tmp_path / "x.jsonl")


def test_run_against_fake_server_counts_every_failure_kind(fake, tmp_path):
    url = fake("mixed", step_ms=1.0, hang_s=20.0)
    # max_tokens % 5 picks: 0 ok, 1 -> 500, 2 -> malformed SSE, 3 -> cut stream, 4 -> hang
    plan = traces.Plan(np.zeros(10), np.full(10, 8), np.array([10, 11, 12, 13, 14, 15, 16, 17, 18, 19]), "t")
    opts = driver.RunOptions(server=url, concurrency=5, progress=False, read_timeout_s=1.0,
                             request_timeout_s=3.0)
    t0 = time.monotonic()
    s = driver.run(plan, opts, tmp_path / "m.jsonl")
    assert time.monotonic() - t0 < 15, "a hanging stream must time out"
    assert s["requests_sent"] == 10 and s["requests_completed"] == 2
    assert s["failure_reasons"] == {"http_500": 2, "malformed_sse": 2, "stream_cut": 2, "timeout": 2}
    m = measure.read(tmp_path / "m.jsonl")
    assert m.complete and len(m.requests) == 10
    by = {r["max_tokens"]: r for r in m.requests}
    assert by[10]["ok"] and by[10]["output_tokens"] == 10 and len(by[10]["chunks"]) == 10
    assert by[11]["status"] == 500 and "internal error" in by[11]["error"]
    assert by[13]["output_tokens"] == 6          # the tokens before the cut are kept
    assert m.header["metrics_error"] and "malformed" in m.header["metrics_error"]


def test_run_rate_mode_honours_arrivals(fake, tmp_path):
    url = fake("ok", step_ms=1.0)
    plan = traces.fixed(6, 8, 4)
    opts = driver.RunOptions(server=url, rate=20.0, seed=1, progress=False)
    driver.run(plan, opts, tmp_path / "m.jsonl")
    m = measure.read(tmp_path / "m.jsonl")
    for r in m.requests:
        assert r["send_s"] >= r["arrival_s"] - 1e-3
        assert r["send_s"] - r["arrival_s"] < 0.2
    assert m.header["load"]["mode"] == "rate"
    assert m.requests[-1]["arrival_s"] > 0


def test_api_key_is_sent_but_never_stored(fake, tmp_path, monkeypatch):
    monkeypatch.setenv("DSIM_API_KEY", "sk-secret-123")
    assert driver.api_headers() == {"Authorization": "Bearer sk-secret-123"}
    url = fake("ok")
    driver.run(traces.fixed(2, 4, 3), driver.RunOptions(server=url, concurrency=1, progress=False),
               tmp_path / "m.jsonl")
    assert "sk-secret" not in (tmp_path / "m.jsonl").read_text()


def test_closed_port_is_one_line_exit_2(tmp_path):
    port = free_port()
    r = subprocess.run([sys.executable, "-m", "validator.cli", "run", "--server", f"127.0.0.1:{port}",
                        "--out", str(tmp_path), "-n", "2", "--no-progress"],
                       capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip().count("\n") == 0 and "not reachable" in r.stderr
    with pytest.raises(InputError):
        driver.run(traces.fixed(1, 4, 4), driver.RunOptions(server=f"http://127.0.0.1:{port}", concurrency=1,
                                                             progress=False), tmp_path / "x.jsonl")


def test_server_killed_mid_run_keeps_data(tmp_path):
    """A server process that dies mid-run: requests in flight and after fail with a reason, the
    ones before are kept, the summary line is written."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "validator.fake_server", "--port", str(port),
                             "--step-ms", "5"], cwd=ROOT, start_new_session=True)
    from validator import server as srv
    try:
        srv.wait_health(f"http://127.0.0.1:{port}", 20, proc)
        killer = threading.Timer(1.0, lambda: srv.stop(proc))
        killer.start()
        s = driver.run(traces.fixed(40, 8, 50), driver.RunOptions(server=f"http://127.0.0.1:{port}",
                                                                   concurrency=2, progress=False,
                                                                   request_timeout_s=10),
                       tmp_path / "m.jsonl")
        killer.join()
    finally:
        srv.stop(proc)
    assert s["requests_completed"] >= 2 and s["requests_failed"] >= 1
    assert s["requests_completed"] + s["requests_failed"] == 40
    assert set(s["failure_reasons"]) <= {"connect_error", "stream_cut", "http_error", "timeout"}
    assert s["metrics_after_error"]
    m = measure.read(tmp_path / "m.jsonl")
    assert m.complete and len(m.requests) == 40


def test_interrupted_run_writes_nothing(fake, tmp_path):
    url = fake("ok", step_ms=5.0)
    out = tmp_path / "out"
    p = subprocess.Popen([sys.executable, "-m", "validator.cli", "run", "--server", url, "--out", str(out),
                          "-n", "200", "--input-len", "4", "--output-len", "40", "-c", "2", "--no-progress"],
                         cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(2.5)
    p.send_signal(2)       # Ctrl-C
    _, err = p.communicate(timeout=30)
    assert p.returncode == 130, err
    assert "nothing written" in err
    # all or nothing: no --out directory, no staging debris next to it
    assert sorted(x.name for x in tmp_path.iterdir()) == []


def test_ab_with_fake_servers(tmp_path):
    from validator import ab
    pa, pb = free_port(), free_port()
    cmd = f"{sys.executable} -m validator.fake_server --port {{}} --step-ms {{}}"
    rep = ab.ab(cmd.format(pa, 2), cmd.format(pb, 6), tmp_path, url_a=f"http://127.0.0.1:{pa}",
                url_b=f"http://127.0.0.1:{pb}", concurrencies=[1, 2], requests=4, input_len=8,
                output_len=10, health_timeout_s=30)
    assert (tmp_path / "ab.md").exists() and (tmp_path / "ab.json").exists()
    row = rep["rows"][0]
    assert row["B"]["tpot_ms_p50"] > 2 * row["A"]["tpot_ms_p50"]
    for tag in ("A", "B"):     # stopped: the port is free again
        with socket.socket() as s:
            assert s.connect_ex(("127.0.0.1", pa if tag == "A" else pb)) != 0


def test_cli_help():
    r = subprocess.run([sys.executable, "-m", "validator.cli", "--help"], capture_output=True, text=True,
                       timeout=60, cwd=ROOT)
    assert r.returncode == 0
    for cmd in ("run", "import-bench", "profile-server", "calibrate", "check", "ab"):
        assert cmd in r.stdout


def test_traces_native_formats(tmp_path):
    f = tmp_path / "t.jsonl"
    f.write_text('{"prompt_tokens": 5, "output_tokens": 3, "arrival_s": 1.5}\n'
                 '{"prompt_tokens": 7, "output_tokens": 2, "arrival_s": 0.5}\n')
    p = traces._native(f)
    assert p.arrival_s.tolist() == [0.0, 1.0] and p.prompt_tokens.tolist() == [7, 5]
    with pytest.raises(InputError):
        traces.fixed(0, 1, 1)


def _measurement(reqs, hist=None, k=4):
    """A Measurement from request dicts (send, end, prompt, chunk times) and histogram means (s)."""
    rows = []
    for i, (send, end, prompt, times) in enumerate(reqs):
        rows.append({"type": "request", "i": i, "prompt_tokens": prompt, "max_tokens": len(times),
                     "arrival_s": 0.0, "send_s": send, "first_token_s": times[0], "end_s": end,
                     "chunks": [[t, 1] for t in times], "output_tokens": len(times), "ok": True,
                     "error": None, "status": 200})
    summary = None
    if hist:
        summary = {"type": "summary", "server_histograms": {
            f"vllm:{name}": {"count": 10.0, "mean": v} for name, v in hist.items()}}
    m = measure.Measurement("mem", {"format": measure.FORMAT, "spec": {"k": k}}, rows, summary=summary)
    return m


def test_engine_steps_rebuild_step_composition_from_chunk_times():
    from validator import stepfit
    # step times 10, 15, 20, 25 ms; request 0 prefilled alone at 10, request 1 and 2 together at
    # 20 (with request 0 decoding); a stalled front end hands steps 20 and 25 of request 0 over
    # together (one group, split because request 0 appears twice)
    m = _measurement([(0.0, 0.03, 64, [0.010, 0.0150, 0.0201, 0.02012]),
                      (0.016, 0.03, 32, [0.02002, 0.02502]),
                      (0.016, 0.03, 64, [0.02004, 0.02504])])
    steps = stepfit.engine_steps(m)
    comp = [(s["prefills"], s["prompt_tokens"], s["decodes"]) for s in steps]
    assert comp[:2] == [(1, 64, 0), (0, 0, 1)]
    assert (2, 96, 1) in comp and (0, 0, 1) in comp[2:]
    assert comp[-1] == (0, 0, 2)
    assert sum(s["decodes"] for s in steps) == 5 and sum(s["prefills"] for s in steps) == 3


def test_server_points_at_the_mean_composition_of_the_sampled_steps():
    from validator import stepfit
    # two requests in a wave: both prompts in one step (n = 128), then two decode steps of both
    m = _measurement([(0.0, 0.02, 64, [0.005, 0.010, 0.015]), (0.0, 0.02, 64, [0.00501, 0.01001, 0.01501])],
                     hist={"inter_token_latency_seconds": 0.004, "request_prefill_time_seconds": 0.006})
    pts = {p["kind"]: p for p in stepfit.server_points(m, 4)}
    assert pts["prefill"]["n"] == pytest.approx(128) and pts["prefill"]["b"] == pytest.approx(2)
    assert pts["decode"]["n"] == pytest.approx(10) and pts["decode"]["step_ms"] == pytest.approx(4.0)
    # the prompts they carry, for a base profile's prefill terms: both 64-token prompts share the step
    assert (pts["prefill"]["prompt_tokens"], pts["prefill"]["prefills"]) == (pytest.approx(128), pytest.approx(2))
    assert pts["decode"]["prompt_tokens"] == pytest.approx(0)
    # without chunk timelines: the running-batch estimate
    m2 = _measurement([(0.0, 0.02, 64, [0.005]), (0.0, 0.02, 64, [0.00501])],
                      hist={"inter_token_latency_seconds": 0.004})
    assert [p["kind"] for p in stepfit.server_points(m2, 4)] == ["decode"]


def test_front_end_overhead_is_client_time_minus_the_engines_own_time():
    # client E2E 100 ms, TTFT 20 ms; engine: queue 1 + prefill 5 + decode 74 = 80 ms; the server's
    # E2E histogram (90 ms, from the API server's arrival) is not used when the parts are there
    m = _measurement([(0.0, 0.1, 64, [0.02 + 0.08 * j / 9 for j in range(10)])],
                     hist={"request_queue_time_seconds": 0.001, "request_prefill_time_seconds": 0.005,
                           "request_decode_time_seconds": 0.074, "e2e_request_latency_seconds": 0.09,
                           "time_to_first_token_seconds": 0.012})
    assert calibrate.engine_times(m.stats()) == pytest.approx({"ttft": 6.0, "e2e": 80.0})
    o = calibrate.request_overheads([m])
    assert o["e2e"] == pytest.approx(20.0) and o["first_token"] == pytest.approx(14.0)
    m2 = _measurement([(0.0, 0.1, 64, [0.02 + 0.08 * j / 9 for j in range(10)])],
                      hist={"e2e_request_latency_seconds": 0.09, "time_to_first_token_seconds": 0.012})
    assert calibrate.engine_times(m2.stats()) is None
    assert calibrate.request_overheads([m2])["e2e"] == pytest.approx(10.0)


def test_cpu_layout_and_client_pinning(fake, tmp_path):
    from validator import server as srv
    assert srv.cpu_layout([3, 1, 2]) == {"engine": [1, 2], "front": [3]}
    assert srv.cpu_layout([0]) is None
    cpus = sorted(os.sched_getaffinity(0))
    before = os.sched_getaffinity(0)
    url = fake("ok", 0.5)
    driver.run(traces.fixed(2, 8, 4), driver.RunOptions(server=url, concurrency=1, progress=False,
                                                       cpus=cpus[-1:], nice=None), tmp_path / "p.jsonl")
    m = measure.read(tmp_path / "p.jsonl")
    assert m.header["client_cpus"] == cpus[-1:] and m.stats()["requests_completed"] == 2
    assert os.sched_getaffinity(0) == before          # restored after the run
