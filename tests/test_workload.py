"""Tests for dsim.workload: real traces, formats, slicing, class mixes, synthesis, bad input."""

from __future__ import annotations

import dataclasses
import os
import time
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dsim.errors import InputError
from dsim.workload import (
    DEFAULT_SPEC,
    Workload,
    assign_classes,
    detect_format,
    load_workload,
    parse_mix,
    save_workload,
    synthesize,
)
from dsim.workload import (
    synthesize as _synth,
)
from dsim.workload.public_traces import (
    trace_dir as dsim_trace_dir,
)

REPO = Path(__file__).resolve().parent.parent
SHARED = dsim_trace_dir()  # $DSIM_TRACE_DIR or ../shared/traces

# rows, input mean, output mean, rate/s (shared/traces/README.md)
REAL = {
    "AzureLLMInferenceTrace_code.csv": ("azure-code", "azure", 8819, 2048, 28, 2.57),
    "AzureLLMInferenceTrace_conv.csv": ("azure-conv", "azure", 19366, 1155, 211, 5.53),
    "conversation_trace.jsonl": ("mooncake-conversation", "mooncake", 12031, 12035, 343, 3.40),
    "synthetic_trace.jsonl": ("mooncake-synthetic", "mooncake", 3993, 15325, 149, 3.91),
}


@pytest.fixture(autouse=True)
def _trace_dir(monkeypatch):
    monkeypatch.setenv("DSIM_TRACE_DIR", str(SHARED))


# ------------------------------------------------------------------------------------------
# real traces
# ------------------------------------------------------------------------------------------


@pytest.mark.needs_traces(*(name for name, *_ in REAL.values()))
def test_every_shared_trace_loads_with_readme_counts():
    files = sorted(p.name for p in SHARED.iterdir() if p.suffix in (".csv", ".jsonl"))
    assert files, "no traces found"
    for fname in files:
        name, fmt, rows, pin, pout, rate = REAL[fname]
        t = time.perf_counter()
        w = load_workload(SHARED / fname)
        assert time.perf_counter() - t < 2.0, f"{fname} too slow"
        assert detect_format(SHARED / fname) == fmt
        assert len(w) == rows
        d = w.describe()
        assert d["prompt_mean"] == pytest.approx(pin, rel=0.02)
        assert d["output_mean"] == pytest.approx(pout, rel=0.02)
        assert d["rate_per_s"] == pytest.approx(rate, rel=0.02)
        assert w.arrival_s[0] == 0.0 and np.all(np.diff(w.arrival_s) >= 0)
        assert w.arrival_s.dtype == np.float64 and w.prompt_tokens.dtype == np.int64
        assert w.cls.dtype == np.int16 and w.session_id.dtype == np.int64
        assert w.class_mix_assumed
        assert str(SHARED / fname) in w.source
        if fmt == "mooncake":
            assert w.prefix_hashes is not None and w.prefix_block_tokens == 512
            assert all(h.dtype == np.int64 for h in w.prefix_hashes[:50])
            lens = np.array([len(h) for h in w.prefix_hashes])
            assert np.array_equal(lens, -(-w.prompt_tokens // 512))
        else:
            assert w.prefix_hashes is None


@pytest.mark.needs_traces("azure-code", "azure-conv", "mooncake-conversation", "mooncake-synthetic")
def test_names_and_default_class_mix():
    code = load_workload("azure-code")
    assert code.class_names == ("code",) and np.all(code.cls == 0) and code.class_mix_assumed
    conv = load_workload("azure-conv")
    share = conv.describe()["class_share"]
    assert share == pytest.approx({"chat": 0.6, "code": 0.2, "math": 0.2}, abs=1e-3)
    assert "per-trace default" in conv.source
    mc = load_workload("mooncake-conversation", n=100)
    assert len(mc) == 100 and len(mc.prefix_hashes) == 100
    assert len(load_workload("mooncake-synthetic", window=(0, 60))) > 100


def test_default_workload():
    w = load_workload("default")
    d = w.describe()
    assert 550 <= len(w) <= 650
    assert d["prompt_mean"] == pytest.approx(1100, rel=0.1)
    assert d["output_mean"] == pytest.approx(210, rel=0.1)
    assert d["class_share"] == pytest.approx({"math": 0.3, "code": 0.2, "chat": 0.5}, abs=0.01)
    assert w.class_mix_assumed and "default" in w.source
    assert (REPO / "traces" / "default.jsonl").stat().st_size < 200_000


def test_default_regenerates_byte_for_byte(tmp_path):
    from dsim.workload import make_default

    p = make_default(tmp_path / "default.jsonl")
    assert p.read_bytes() == (REPO / "traces" / "default.jsonl").read_bytes()


def test_unknown_name_and_missing_file(tmp_path):
    with pytest.raises(InputError, match="no-such-trace"):
        load_workload("no-such-trace")
    with pytest.raises(InputError, match="nothere.csv"):
        load_workload(tmp_path / "nothere.csv")
    os.environ["DSIM_TRACE_DIR"] = str(tmp_path)  # restored by the fixture
    with pytest.raises(InputError, match="AzureLLMInferenceTrace_conv.csv"):
        load_workload("azure-conv")


# ------------------------------------------------------------------------------------------
# formats
# ------------------------------------------------------------------------------------------


def _write(tmp_path, name, text):
    p = tmp_path / name
    p.write_text(text)
    return p


def test_azure_2024_timestamps(tmp_path):
    p = _write(
        tmp_path,
        "az24.csv",
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2024-05-10 00:00:00.0123456+00:00,10,5\n"
        "2024-05-10T02:00:01.0123456+02:00,20,6\n"
        "2024-05-10 00:00:02.5Z,30,7\n",
    )
    w = load_workload(p)
    assert np.allclose(w.arrival_s, [0, 1.0, 2.4876544])
    p = _write(
        tmp_path,
        "az23.csv",
        "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03.9799600,4808,10\n"
        "2023-11-16 18:17:04.0319600,3180,8\n",
    )
    assert np.allclose(load_workload(p).arrival_s, [0, 0.052])


def test_burstgpt_drops_failed(tmp_path):
    p = _write(
        tmp_path,
        "b.csv",
        "Timestamp,Session ID,Elapsed time,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
        "5,1,2.0,ChatGPT,100,50,150,Conversation log\n"
        "6,1,0.1,ChatGPT,120,0,120,Conversation log\n"
        "7.5,2,3.0,GPT-4,300,80,380,API log\n",
    )
    assert detect_format(p) == "burstgpt"
    w = load_workload(p)
    assert len(w) == 2 and list(w.prompt_tokens) == [100, 300] and list(w.session_id) == [1, 2]
    assert np.allclose(w.arrival_s, [0, 2.5])
    assert "dropped 1 failed requests" in w.source


def _sample_workload():
    w = _synth(40, rate=3.0, prompt_len="lognormal:500,1", output_len="fixed:7", mix="math=0.5,chat=0.5", seed=3)
    rng = np.random.default_rng(1)
    hashes = [rng.integers(0, 1 << 40, size=rng.integers(0, 5)).astype(np.int64) for _ in range(len(w))]
    sess = np.where(np.arange(len(w)) % 3 == 0, -1, np.arange(len(w)) // 2).astype(np.int64)
    import dataclasses

    return dataclasses.replace(w, prefix_hashes=hashes, session_id=sess)


@pytest.mark.parametrize(
    "ext,fmt", [(".csv", "native-csv"), (".jsonl", "native-jsonl"), (".parquet", "native-parquet")]
)
def test_native_round_trip(tmp_path, ext, fmt):
    w = _sample_workload()
    p = save_workload(w, tmp_path / f"w{ext}")
    assert detect_format(p) == fmt
    r = load_workload(p)
    assert np.allclose(r.arrival_s, w.arrival_s, atol=1e-6)
    assert np.array_equal(r.prompt_tokens, w.prompt_tokens)
    assert np.array_equal(r.output_tokens, w.output_tokens)
    assert np.array_equal(r.session_id, w.session_id)
    assert list(r.class_labels) == list(w.class_labels)
    assert not r.class_mix_assumed
    assert all(np.array_equal(a, b) for a, b in zip(r.prefix_hashes, w.prefix_hashes))
    assert len(load_workload(p, fmt="native")) == len(w)


def test_explicit_and_unknown_format(tmp_path):
    p = _write(tmp_path, "x.txt", "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03,4,1\n")
    assert len(load_workload(p, fmt="azure")) == 1
    with pytest.raises(InputError, match="x.txt.*unknown format"):
        load_workload(p, fmt="vhs")
    q = _write(tmp_path, "y.csv", "a,b,c\n1,2,3\n")
    with pytest.raises(InputError, match=r"y\.csv:1: unknown format"):
        load_workload(q)
    q = _write(tmp_path, "y.jsonl", '{"foo": 1}\n')
    with pytest.raises(InputError, match=r"y\.jsonl:1: unknown format"):
        load_workload(q)


# ------------------------------------------------------------------------------------------
# slicing
# ------------------------------------------------------------------------------------------


def test_slicing_and_rate_scale():
    w = synthesize(200, rate=10.0, seed=1)
    h = w.head(50)
    assert len(h) == 50 and np.array_equal(h.arrival_s, w.arrival_s[:50]) and "first 50" in h.source
    win = w.window(5.0, 10.0)
    sel = (w.arrival_s >= 5.0) & (w.arrival_s < 10.0)
    assert len(win) == sel.sum() and win.arrival_s[0] == 0.0
    assert np.allclose(win.arrival_s, w.arrival_s[sel] - w.arrival_s[sel][0])
    assert np.array_equal(win.prompt_tokens, w.prompt_tokens[sel])
    s = w.scale_rate(2.0)
    assert np.allclose(s.arrival_s, w.arrival_s / 2) and "rate x2" in s.source
    assert np.array_equal(s.prompt_tokens, w.prompt_tokens)
    for bad in (0.05, 250, -1):
        with pytest.raises(InputError, match="out of range"):
            w.scale_rate(bad)
    with pytest.raises(InputError):
        w.window(1e6, 2e6)
    with pytest.raises(InputError):
        w.head(0)


# ------------------------------------------------------------------------------------------
# class mixes
# ------------------------------------------------------------------------------------------


def test_assign_classes_deterministic_and_proportional():
    w = synthesize(1000, rate=5.0, seed=2)
    a = assign_classes(w, "math=0.3,code=0.2,chat=0.5", seed=7)
    b = assign_classes(w, {"math": 0.3, "code": 0.2, "chat": 0.5}, seed=7)
    c = assign_classes(w, "math=0.3,code=0.2,chat=0.5", seed=8)
    assert np.array_equal(a.cls, b.cls) and not np.array_equal(a.cls, c.cls)
    assert a.class_names == ("math", "code", "chat") and a.class_mix_assumed
    assert np.bincount(a.cls, minlength=3).tolist() == [300, 200, 500]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(1, 1000), min_size=1, max_size=6))
def test_parse_mix_property(weights):
    total = sum(weights)
    names = [f"c{i}" for i in range(len(weights))]
    spec = ",".join(f"{n}={w / total!r}" for n, w in zip(names, weights))
    m = parse_mix(spec)
    assert list(m) == names and sum(m.values()) == pytest.approx(1.0, abs=1e-9)
    bad = ",".join(f"{n}={w / total * 1.001!r}" for n, w in zip(names, weights))
    with pytest.raises(InputError, match="sum"):
        parse_mix(bad)


@pytest.mark.parametrize("spec", ["", "math", "math=x", "math=0.5,math=0.5", "math=-0.5,chat=1.5", "math=0.3,chat=0.6"])
def test_parse_mix_bad(spec):
    with pytest.raises(InputError):
        parse_mix(spec)


# ------------------------------------------------------------------------------------------
# synthesis
# ------------------------------------------------------------------------------------------


def test_synth_poisson_rate_and_determinism():
    w = synthesize(20000, rate=8.0, seed=5)
    d = w.describe()
    assert d["rate_per_s"] == pytest.approx(8.0, rel=0.03)
    assert d["interarrival_cv"] == pytest.approx(1.0, abs=0.05)
    assert d["prompt_mean"] == pytest.approx(1100, rel=0.03)
    assert w.class_mix_assumed and w.closed_loop_concurrency is None
    w2 = synthesize(20000, rate=8.0, seed=5)
    assert np.array_equal(w.arrival_s, w2.arrival_s) and np.array_equal(w.cls, w2.cls)
    wd = synthesize(duration_s=100.0, rate=8.0, seed=5)
    assert wd.arrival_s[-1] < 100.0 and len(wd) == pytest.approx(800, rel=0.15)


@pytest.mark.parametrize("cv", [0.5, 2.0, 4.0])
def test_synth_gamma_cv(cv):
    w = synthesize(40000, rate=5.0, arrival="gamma", burstiness_cv=cv, seed=11)
    d = w.describe()
    assert d["interarrival_cv"] == pytest.approx(cv, rel=0.08)
    assert d["rate_per_s"] == pytest.approx(5.0, rel=0.08)


def test_synth_closed_loop_and_lengths():
    w = synthesize(300, concurrency=16, prompt_len="fixed:128", output_len="lognormal:50,0.5", seed=1)
    assert w.closed_loop_concurrency == 16 and np.all(w.arrival_s == 0)
    assert np.all(w.prompt_tokens == 128) and w.output_tokens.min() >= 1
    with pytest.raises(InputError):
        w.scale_rate(2)
    tiny = synthesize(2000, rate=1.0, output_len="lognormal:1,2", seed=1)
    assert tiny.output_tokens.min() >= 1
    for kw in (
        dict(rate=None),
        dict(rate=1.0, duration_s=5),
        dict(concurrency=4, rate=1.0),
        dict(rate=1.0, prompt_len="uniform:3"),
        dict(rate=1.0, arrival="weibull"),
        dict(rate=1.0, burstiness_cv=3.0),
    ):
        with pytest.raises(InputError):
            synthesize(10, **kw)


def test_synth_trace_lengths_joint():
    ref = load_workload("default")
    w = synthesize(500, rate=2.0, prompt_len="trace:default", output_len="trace:default", seed=4)
    pairs = set(zip(ref.prompt_tokens.tolist(), ref.output_tokens.tolist()))
    assert all(p in pairs for p in zip(w.prompt_tokens.tolist(), w.output_tokens.tolist()))


# ------------------------------------------------------------------------------------------
# bad input: InputError naming file, line and field
# ------------------------------------------------------------------------------------------

AZ = "TIMESTAMP,ContextTokens,GeneratedTokens\n"
T = "2023-11-16 18:17:0{}.5"
GOOD = [f"{T.format(i)},{100 + i},{10 + i}\n" for i in range(6)]


def _az(rows):
    return AZ + "".join(rows)


BAD_CASES = [
    # name, content, line, words in message
    ("nonnum.csv", _az(GOOD[:2] + [f"{T.format(2)},abc,5\n"] + GOOD[3:]), 4, ["ContextTokens", "not a number"]),
    ("neg.csv", _az(GOOD[:3] + [f"{T.format(3)},100,-5\n"] + GOOD[4:]), 5, ["GeneratedTokens", "> 0"]),
    ("zero.csv", _az(GOOD[:1] + [f"{T.format(1)},0,5\n"] + GOOD[2:]), 3, ["ContextTokens", "> 0"]),
    ("frac.csv", _az(GOOD[:1] + [f"{T.format(1)},10.5,5\n"] + GOOD[2:]), 3, ["ContextTokens", "integer"]),
    ("back.csv", _az(GOOD[:4] + [f"{T.format(1)},100,5\n"] + GOOD[5:]), 6, ["TIMESTAMP", "back in time", "line 5"]),
    ("badts.csv", _az(GOOD[:2] + ["yesterday,100,5\n"] + GOOD[3:]), 4, ["TIMESTAMP", "not a timestamp"]),
    ("long.csv", _az(GOOD[:2] + [f"{T.format(2)},100,5,9\n"] + GOOD[3:]), 4, ["malformed"]),
    ("short.csv", _az(GOOD[:2] + [f"{T.format(2)},100\n"] + GOOD[3:]), 4, ["GeneratedTokens", "missing"]),
    ("blank.csv", _az(GOOD[:2] + ["\n"] + GOOD[2:3] + [f"{T.format(3)},x,1\n"]), 6, ["ContextTokens"]),
    ("nocol.csv", "TIMESTAMP,ContextTokens,Tokens\n" + "".join(GOOD), 1, ["missing column", "GeneratedTokens"]),
    ("headonly.csv", AZ, None, ["empty"]),
    ("empty.csv", "", None, ["empty"]),
    (
        "mc_json.jsonl",
        '{"timestamp": 0, "input_length": 5, "output_length": 3}\n{"timestamp": 1, "input_',
        2,
        ["malformed JSON"],
    ),
    (
        "mc_miss.jsonl",
        '{"timestamp": 0, "input_length": 5, "output_length": 3}\n{"timestamp": 1, "input_length": 5}\n',
        2,
        ["output_length", "missing"],
    ),
    (
        "mc_str.jsonl",
        '{"timestamp": 0, "input_length": 5, "output_length": 3}\n\n'
        '{"timestamp": 1, "input_length": "5", "output_length": 3}\n',
        3,
        ["input_length", "not a number"],
    ),
    (
        "mc_zero.jsonl",
        '{"timestamp": 0, "input_length": 5, "output_length": 3}\n'
        '{"timestamp": 1, "input_length": 5, "output_length": 0}\n',
        2,
        ["output_length", "> 0"],
    ),
    (
        "mc_back.jsonl",
        '{"timestamp": 10, "input_length": 5, "output_length": 3}\n'
        '{"timestamp": 20, "input_length": 5, "output_length": 3}\n'
        '{"timestamp": 15, "input_length": 5, "output_length": 3}\n',
        3,
        ["timestamp", "back in time", "line 2"],
    ),
    (
        "mc_hash.jsonl",
        '{"timestamp": 0, "input_length": 5, "output_length": 3, "hash_ids": [1, "a"]}\n',
        1,
        ["hash_ids"],
    ),
    ("mc_empty.jsonl", "\n\n", None, ["empty"]),
    (
        "bg_neg.csv",
        "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
        "1,ChatGPT,10,5,15,x\n2,ChatGPT,-10,5,-5,x\n",
        3,
        ["Request tokens", "> 0"],
    ),
    ("nat_cls.csv", "arrival_s,prompt_tokens,output_tokens,class\n0,5,5,math\n1,5,5,\n", 3, ["class", "missing"]),
    (
        "nat_t.jsonl",
        '{"arrival_s": 0, "prompt_tokens": 5, "output_tokens": 5}\n'
        '{"arrival_s": -1, "prompt_tokens": 5, "output_tokens": 5}\n',
        2,
        ["arrival_s"],
    ),
]


@pytest.mark.parametrize("name,content,line,words", BAD_CASES, ids=[c[0] for c in BAD_CASES])
def test_bad_input(tmp_path, name, content, line, words):
    p = _write(tmp_path, name, content)
    with pytest.raises(InputError) as ei:
        load_workload(p)
    msg = str(ei.value)
    assert "\n" not in msg
    assert msg.startswith(str(p)), msg
    if line is not None:
        assert f"{name}:{line}:" in msg, msg
    for w in words:
        assert w in msg, msg


def test_bad_parquet(tmp_path):
    p = _write(tmp_path, "junk.parquet", "not parquet")
    with pytest.raises(InputError, match="junk.parquet"):
        load_workload(p)
    w = _sample_workload()
    import pyarrow as pa
    import pyarrow.parquet as pq

    q = tmp_path / "neg.parquet"
    pq.write_table(
        pa.table({"arrival_s": w.arrival_s, "prompt_tokens": -w.prompt_tokens, "output_tokens": w.output_tokens}), q
    )
    with pytest.raises(InputError, match=r"neg\.parquet:row 1: prompt_tokens"):
        load_workload(q)


def test_sort_option(tmp_path):
    p = _write(tmp_path, "unsorted.csv", _az([GOOD[3], GOOD[1], GOOD[2]]))
    w = load_workload(p, sort=True)
    assert list(w.prompt_tokens) == [101, 102, 103] and "sorted" in w.source


def test_workload_is_frozen():
    w = load_workload("default")
    with pytest.raises(dataclasses.FrozenInstanceError):
        w.source = "x"
    with pytest.raises(ValueError):
        w.arrival_s[0] = 5.0
    assert isinstance(w, Workload) and DEFAULT_SPEC["n_requests"] == len(w)
