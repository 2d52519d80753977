"""Fuzzing the error contract (hypothesis): whatever a trace, profile, acceptance preset, SLA
string or flag holds, dsim either runs (and what it returns is valid) or refuses with one
InputError line that names the file (exit 2 from the CLI, nothing written). Example counts are
small so that the whole module stays fast on a 2-core CI machine."""

from __future__ import annotations

import copy
import json
import math
import os

import numpy as np
import pandas as pd
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cli_contract import run_cli, tree
from dsim.errors import InputError

# DSIM_FUZZ_SCALE=20 multiplies the example counts for a deeper run by hand
_SCALE = max(1, int(os.environ.get("DSIM_FUZZ_SCALE", "1")))
FAST = settings(max_examples=25 * _SCALE, deadline=None, suppress_health_check=list(HealthCheck))
CLI = settings(max_examples=12 * _SCALE, deadline=None, suppress_health_check=list(HealthCheck))

# values a hostile or broken writer puts in a numeric field
NASTY_NUMBERS = st.one_of(
    st.integers(min_value=-5, max_value=5000),
    st.sampled_from([0, -1, 2**63 - 1, 2**64, 10**30, 1e23, 1e300, -1e300, 0.5, 2.5, 1e-300]),
    st.floats(allow_nan=True, allow_infinity=True),
)
NASTY_TEXT = st.one_of(
    st.sampled_from(["", " ", "nan", "NaN", "inf", "-inf", "1e5", "0x10", "12abc", "None", "\x00", "\ufeff1", "１２"]),
    st.text(max_size=8),
)
NASTY = st.one_of(NASTY_NUMBERS, NASTY_TEXT, st.none(), st.booleans(), st.lists(st.integers(-3, 3), max_size=3))


def check_one_line(e: InputError, path) -> None:
    msg = str(e)
    assert "\n" not in msg.strip(), msg
    assert str(path) in msg, msg
    assert "np.int" not in msg and "np.float" not in msg, msg


def check_workload(w) -> None:
    assert len(w) >= 1
    assert np.all(np.isfinite(w.arrival_s)) and w.arrival_s[0] == 0 and np.all(np.diff(w.arrival_s) >= 0)
    assert np.all(w.prompt_tokens >= 1) and np.all(w.output_tokens >= 1)
    from dsim.workload import MAX_SPAN_S, MAX_TOKENS

    assert w.prompt_tokens.max() <= MAX_TOKENS and w.output_tokens.max() <= MAX_TOKENS
    assert w.arrival_s[-1] <= MAX_SPAN_S


def load_or_refuse(path, fmt="auto"):
    from dsim.workload import load_workload

    try:
        w = load_workload(str(path), fmt)
    except InputError as e:
        check_one_line(e, path)
        return None
    check_workload(w)
    return w


def _cell(v) -> str:
    return "" if v is None else str(v)


# ---- trace readers ---------------------------------------------------------------------------

ROWS = st.lists(st.tuples(NASTY, NASTY, NASTY), min_size=1, max_size=5)
GOOD_ROWS = st.lists(st.tuples(st.floats(0, 1e4), st.integers(1, 10**5), st.integers(1, 10**5)), min_size=1, max_size=5)


@FAST
@given(rows=st.one_of(ROWS, GOOD_ROWS), extra=st.sampled_from(["", ",", "\n\n", ",x"]))
def test_native_csv(tmp_path_factory, rows, extra):
    p = tmp_path_factory.mktemp("csv") / "t.csv"
    p.write_text(
        "arrival_s,prompt_tokens,output_tokens\n"
        + "".join(f"{_cell(a)},{_cell(b)},{_cell(c)}\n" for a, b, c in rows)
        + extra,
        encoding="utf-8",
        errors="surrogatepass",
    )
    load_or_refuse(p, "native-csv")


@FAST
@given(rows=st.one_of(ROWS, GOOD_ROWS), bom=st.booleans(), mooncake=st.booleans())
def test_jsonl_native_and_mooncake(tmp_path_factory, rows, bom, mooncake):
    keys = (
        ("timestamp", "input_length", "output_length") if mooncake else ("arrival_s", "prompt_tokens", "output_tokens")
    )
    p = tmp_path_factory.mktemp("jsonl") / "t.jsonl"
    text = "".join(json.dumps(dict(zip(keys, r))) + "\n" for r in rows)
    p.write_bytes((b"\xef\xbb\xbf" if bom else b"") + text.encode("utf-8", "surrogatepass"))
    load_or_refuse(p)


@FAST
@given(rows=st.one_of(ROWS, GOOD_ROWS))
def test_parquet(tmp_path_factory, rows):
    p = tmp_path_factory.mktemp("pq") / "t.parquet"
    cols = list(zip(*rows))
    df = pd.DataFrame({"arrival_s": list(cols[0]), "prompt_tokens": list(cols[1]), "output_tokens": list(cols[2])})
    try:
        df.to_parquet(p)
    except Exception:  # noqa: BLE001 - a mix pyarrow cannot store is not a trace
        return
    load_or_refuse(p)


def _arrow_column(kind: str, n: int):
    """n values of a column of this Arrow shape (flat, nested, dictionary, null)."""
    import pyarrow as pa

    return {
        "int64": lambda: pa.array(range(1, n + 1), pa.int64()),
        "float": lambda: pa.array([float(i) for i in range(n)], pa.float64()),
        "bool": lambda: pa.array([True] * n),
        "string": lambda: pa.array([str(i + 1) for i in range(n)]),
        "null": lambda: pa.nulls(n),
        "list<int>": lambda: pa.array([[i, i] for i in range(n)], pa.list_(pa.int64())),
        "list<string>": lambda: pa.array([["a"]] * n, pa.list_(pa.string())),
        "struct": lambda: pa.array([{"x": i} for i in range(n)]),
        "map": lambda: pa.array([[("k", i)] for i in range(n)], pa.map_(pa.string(), pa.int64())),
        "dict<string>": lambda: pa.array(["a"] * n).dictionary_encode(),
        "binary": lambda: pa.array([b"\x00"] * n, pa.binary()),
        "timestamp": lambda: pa.array([0] * n, pa.timestamp("s")),
    }[kind]()


ARROW_KINDS = [
    "int64",
    "float",
    "bool",
    "string",
    "null",
    "list<int>",
    "list<string>",
    "struct",
    "map",
    "dict<string>",
    "binary",
    "timestamp",
]


@FAST
@given(
    kinds=st.fixed_dictionaries(
        {c: st.sampled_from(ARROW_KINDS) for c in ("arrival_s", "prompt_tokens", "output_tokens")},
        optional={c: st.sampled_from(ARROW_KINDS) for c in ("session_id", "class", "prefix_hashes", "extra")},
    ),
    n=st.integers(0, 4),
)
def test_parquet_of_any_column_types_is_read_or_refused_in_one_line(tmp_path_factory, kinds, n):
    """Whatever Arrow type each column has (nested, dictionary, null, binary, timestamp...), the
    trace is read and sane or refused in one line naming the file; never a traceback."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    p = tmp_path_factory.mktemp("pqt") / "t.parquet"
    pq.write_table(pa.table({c: _arrow_column(k, n) for c, k in kinds.items()}), p)
    load_or_refuse(p)


@FAST
@given(
    rows=st.lists(
        st.tuples(
            st.one_of(
                st.sampled_from(
                    [
                        "2023-11-16 18:15:46.6805900",
                        "2023-11-16T18:15:47Z",
                        "2024-05-10 00:00:00+02:00",
                        "yesterday",
                        "",
                    ]
                ),
                NASTY_TEXT,
            ),
            NASTY,
            NASTY,
        ),
        min_size=1,
        max_size=4,
    )
)
def test_azure(tmp_path_factory, rows):
    p = tmp_path_factory.mktemp("az") / "a.csv"
    p.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        + "".join(f"{_cell(a)},{_cell(b)},{_cell(c)}\n" for a, b, c in rows),
        encoding="utf-8",
        errors="surrogatepass",
    )
    load_or_refuse(p, "azure")


@FAST
@given(rows=st.lists(st.tuples(NASTY, NASTY, NASTY), min_size=1, max_size=4))
def test_burstgpt(tmp_path_factory, rows):
    p = tmp_path_factory.mktemp("bg") / "b.csv"
    p.write_text(
        "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
        + "".join(f"{_cell(a)},ChatGPT,{_cell(b)},{_cell(c)},0,Conversation log\n" for a, b, c in rows),
        encoding="utf-8",
        errors="surrogatepass",
    )
    load_or_refuse(p, "burstgpt")


@FAST
@given(data=st.binary(min_size=1, max_size=300), ext=st.sampled_from([".csv", ".jsonl", ".bin", ".parquet"]))
def test_random_bytes(tmp_path_factory, data, ext):
    p = tmp_path_factory.mktemp("bytes") / f"t{ext}"
    p.write_bytes(data)
    load_or_refuse(p)


# ---- profiles ----------------------------------------------------------------------------------


def _base_profile() -> dict:
    from dsim.cost import resolve_profile_path

    return yaml.safe_load(resolve_profile_path("h200-llama-3.1-8b").read_text())


BASE = _base_profile()
FIELDS = [
    ("name",),
    ("provenance",),
    ("provenance", "kind"),
    ("provenance", "gpus_per_replica"),
    ("memory",),
    ("memory", "kv_cache_gib"),
    ("memory", "kv_bytes_per_token"),
    ("cpu_overhead_ms",),
    ("kv_ms_per_ktok",),
    ("capture_sizes",),
    ("capture_sizes", 0),
    ("capture_sizes", 3),
    ("forward",),
    ("forward", "tokens"),
    ("forward", "tokens", 2),
    ("forward", "ms"),
    ("forward", "ms", 5),
    ("prefill_terms",),
    ("prefill_terms", "discount_ms_per_ktok"),
    ("max_model_len",),
    ("draft",),
]


@FAST
@given(edits=st.lists(st.tuples(st.sampled_from(FIELDS), NASTY), min_size=0, max_size=3), drop=st.booleans())
@pytest.mark.slow
def test_profile_loader(tmp_path_factory, edits, drop):
    from dsim.cost import CostModel, load_profile

    d = copy.deepcopy(BASE)
    for path, value in edits:
        node = d
        try:
            for k in path[:-1]:
                node = node[k]
            if drop and isinstance(node, dict):
                node.pop(path[-1], None)
            else:
                node[path[-1]] = value
        except (KeyError, IndexError, TypeError):
            continue
    p = tmp_path_factory.mktemp("prof") / "p.yaml"
    p.write_text(yaml.safe_dump(d, sort_keys=False, allow_unicode=True))
    try:
        prof = load_profile(str(p))
    except InputError as e:
        check_one_line(e, p)
        return
    # what loads is usable: finite numbers, positive sizes, a cost model that prices a step
    assert prof.gpus_per_replica >= 1 and prof.kv_capacity_blocks >= 0
    assert all(math.isfinite(x) for x in (prof.cpu_overhead_ms, prof.kv_ms_per_ktok, prof.kv_cache_gib))
    assert list(prof.capture_sizes) == sorted(set(prof.capture_sizes))
    try:
        c = CostModel(prof)
    except InputError as e:  # inconsistent prefill terms are refused here too
        check_one_line(e, p)
        return
    assert math.isfinite(float(c.step_ms(64, 10_000)))


# ---- acceptance presets ------------------------------------------------------------------------

CURVE = st.one_of(st.lists(st.one_of(st.floats(-0.5, 1.5), NASTY), max_size=4), NASTY)


@FAST
@given(
    classes=st.dictionaries(st.sampled_from(["math", "code", "chat", "default", "x"]), CURVE, max_size=3),
    methods=st.booleans(),
    method=st.sampled_from([None, "mtp", "dspark"]),
)
def test_acceptance_loader(tmp_path_factory, classes, methods, method):
    from dsim.spec.acceptance import load_acceptance

    doc = {
        "name": "fuzz",
        "source": "fuzz",
        **({"methods": {"mtp": {"classes": classes}}} if methods else {"classes": classes}),
    }
    p = tmp_path_factory.mktemp("acc") / "a.yaml"
    p.write_text(yaml.safe_dump(doc, allow_unicode=True))
    try:
        cur = load_acceptance(str(p), method)
    except InputError as e:
        check_one_line(e, p)
        return
    for c in cur.classes:
        v = cur.curve(c, 4)
        assert np.all((v >= 0) & (v <= 1))


@FAST
@given(s=st.text(alphabet="0123456789.,;=:-abcdefghmnpst ", max_size=24))
def test_inline_acceptance(s):
    from dsim.spec.acceptance import parse_acceptance

    try:
        cur = parse_acceptance(s)
    except InputError as e:
        assert "\n" not in str(e)
        return
    for c in cur.classes:
        assert np.all((cur.curve(c, 3) >= 0) & (cur.curve(c, 3) <= 1))


# ---- the SLA grammar ---------------------------------------------------------------------------

SLA_PIECES = st.sampled_from(
    [
        "p50",
        "p99",
        "p0",
        "p100",
        "tpot_p90",
        "ttft_p99",
        "e2e_p50",
        "itl_p50",
        "x_p50",
        "min_user_tok_s",
        "=",
        "20ms",
        "2s",
        "-1ms",
        "0ms",
        "nan",
        "infms",
        "1e400ms",
        "20",
        ",",
        ",,",
        " ",
        "ms",
        "s",
    ]
)


@FAST
@given(parts=st.lists(SLA_PIECES, max_size=8))
def test_sla_grammar(parts):
    from dsim.study.sla import parse_request_slo, parse_sla

    s = "".join(parts)
    for parse in (parse_sla, parse_request_slo):
        try:
            out = parse(s)
        except InputError as e:
            assert "\n" not in str(e)
            continue
        vals = [x.target for x in out] if isinstance(out, list) else list(out.values())
        assert vals and all(math.isfinite(v) and v > 0 for v in vals), (s, out)


# ---- CLI flags ---------------------------------------------------------------------------------

FLAG_VALUES = {
    "--nodes": st.sampled_from(["1", "2", "0", "-1", "4097", "1000000", "x", ""]),
    "--gpus-per-node": st.sampled_from(["8", "1", "0", "73", "1000", "8.5"]),
    "--seed": st.sampled_from(["0", "7", "-1", "2", "1e3"]),
    "--rate": st.sampled_from(["5", "0.5", "0", "-2", "nan", "inf", "1e-300", "x"]),
    "--rate-scale": st.sampled_from(["1", "0.1", "20", "21", "nan", "-1"]),
    "--mix": st.sampled_from(["math=1", "math=0.5,chat=0.5", "alien=1", "math=0.7", "math=1,math=0", "=1", ""]),
    "--concurrency": st.sampled_from(["2", "0", "-3", "x"]),
    "--window": st.sampled_from(["0:50", "10:5", "nan:5", "0:inf", "a:b", "5"]),
    "--max-model-len": st.sampled_from(["100000", "10", "0", "-5"]),
    "--acceptance": st.sampled_from(["deepseek-v4", "", "const:0.7", "const:2", "math=0.9,1.2", "nope"]),
    "--policy": st.sampled_from(["vllm", "paper-production", "bogus", ""]),
    "--profile": st.sampled_from(["llama-3.1-8b", "", "nope", "/tmp", "profiles/nothing.yaml"]),
}


@CLI
@given(
    flags=st.dictionaries(st.sampled_from(sorted(FLAG_VALUES)), st.just(None), min_size=1, max_size=3).flatmap(
        lambda d: st.fixed_dictionaries({k: FLAG_VALUES[k] for k in d})
    ),
    method=st.sampled_from(["none", "mtp"]),
)
@pytest.mark.slow
def test_simulate_flags(tmp_path_factory, flags, method):
    d = tmp_path_factory.mktemp("cli")
    out = d / "o"
    args = ["simulate", "--requests", "5", "--quiet", "--method", method, "--out", str(out)]
    for k, v in flags.items():
        args += [k, v]
    rc, stdout, err = run_cli(*args)
    if rc == 0:
        # a valid run: its files are whole, its numbers are numbers (no NaN / Infinity)
        s = json.loads((out / "summary.json").read_text(), parse_constant=lambda c: pytest.fail(f"{c} in summary"))
        assert s["requests_completed"] == s["requests_total"] >= 1
        assert tree(d) == {
            "o",
            "o/.dsim-output.json",
            "o/requests.parquet",
            "o/scenario.yaml",
            "o/steps.parquet",
            "o/summary.json",
        }
    else:
        assert rc == 2, (args, rc, err)
        lines = [x for x in err.splitlines() if x.strip()]
        assert len(lines) == 1 and "Traceback" not in err, (args, err)
        assert tree(d) == set(), (args, sorted(tree(d)))


@CLI
@given(
    conc=st.sampled_from(["1,2", "1,,2", ",", "", "0,1", "1,1", "2,x", "70000", " 1 , 2 "]),
    seeds=st.sampled_from(["0", "0,1", "-1", "0,0", "", "a"]),
    sla=st.sampled_from(["p50=20ms", "p50=", "p101=2ms", "ttft_p99=2s,tpot_p50=30ms", "p50=-5ms"]),
)
@pytest.mark.slow
def test_plan_and_sweep_list_flags(tmp_path_factory, conc, seeds, sla):
    d = tmp_path_factory.mktemp("lists")
    # only the parse matters here: a bad list is refused before anything runs, a good one is
    # stopped by a bad trace right after (exit 2, one line)
    bad_trace = d / "missing.csv"
    for args in (
        ["sweep", "--concurrency", conc, "--methods", "none", "--trace", str(bad_trace), "--out", str(d / "o")],
        ["plan", "--sla", sla, "--seeds", seeds, "--trace", str(bad_trace)],
    ):
        rc, _, err = run_cli(*args)
        assert rc == 2, (args, err)
        lines = [x for x in err.splitlines() if x.strip()]
        assert len(lines) == 1 and "Traceback" not in err, (args, err)
    assert tree(d) == set()


@FAST
@given(rows=st.one_of(ROWS, GOOD_ROWS), jsonl=st.booleans())
def test_validator_trace_reader(tmp_path_factory, rows, jsonl):
    """The replay's reader (dsim's, else its own lenient one for input_tokens columns)."""
    from validator import traces

    d = tmp_path_factory.mktemp("vt")
    if jsonl:
        p = d / "t.jsonl"
        p.write_text(
            "".join(json.dumps({"timestamp": a, "input_tokens": b, "output_tokens": c}) + "\n" for a, b, c in rows),
            encoding="utf-8",
            errors="surrogatepass",
        )
    else:
        p = d / "t.csv"
        p.write_text(
            "timestamp,input_tokens,output_tokens\n"
            + "".join(f"{_cell(a)},{_cell(b)},{_cell(c)}\n" for a, b, c in rows),
            encoding="utf-8",
            errors="surrogatepass",
        )
    try:
        plan = traces.load(str(p), None, None, None)
    except InputError as e:
        check_one_line(e, p)
        return
    assert np.all(plan.prompt_tokens >= 1) and np.all(plan.output_tokens >= 1)
    assert np.all(np.isfinite(plan.arrival_s)) and plan.arrival_s[0] == 0


# ---- kernel tables ---------------------------------------------------------------------------

KT_BASE = {
    "name": "t",
    "provenance": {"kind": "measured"},
    "records": [
        {"op": "gemm", "m": 1, "k": 4096, "n": 4096, "dtype": "bf16", "ms": 0.05},
        {"op": "attn", "batch": 8, "kv": 1024, "q": 1, "heads": 32, "kind": "mha", "phase": "decode", "ms": 0.02},
    ],
}
KT_FIELDS = ["op", "ms", "m", "k", "dtype", "batch", "kv", "note"]


@FAST
@given(
    edits=st.lists(st.tuples(st.integers(0, 1), st.sampled_from(KT_FIELDS), NASTY), max_size=3),
    drop=st.sampled_from([None, "records", "provenance", "first_record_size"]),
    gz=st.booleans(),
    cut=st.one_of(st.none(), st.integers(0, 400)),
)
def test_kernel_table_loader(tmp_path_factory, edits, drop, gz, cut):
    """Any kernel table either loads (then every record's time is a finite number >= 0 and every
    size an integer >= 0) or is refused with one line naming the file."""
    import gzip

    from dsim.profiling.kernel_tables import load_kernel_table

    d = copy.deepcopy(KT_BASE)
    for i, k, v in edits:
        d["records"][i][k] = v
    if drop == "first_record_size":
        d["records"][0].pop("m")
    elif drop is not None:
        d.pop(drop)
    text = json.dumps(d)  # NaN / Infinity written as JSON's Python reading has them
    data = text.encode()[:cut] if cut is not None else text.encode()
    p = tmp_path_factory.mktemp("kt") / ("t.json.gz" if gz else "t.json")
    p.write_bytes(gzip.compress(data, mtime=0) if gz else data)
    try:
        t = load_kernel_table(str(p))
    except InputError as e:
        check_one_line(e, p)
        return
    for r in t.records:
        assert isinstance(r["ms"], (int, float)) and not isinstance(r["ms"], bool) and math.isfinite(r["ms"])
        assert r["ms"] >= 0
        for k, v in r.items():
            if k not in ("op", "ms", "dtype", "kind", "phase", "note"):
                assert isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 0, (k, v)


@FAST
@given(blob=st.binary(max_size=300), gz=st.booleans())
def test_kernel_table_bytes(tmp_path_factory, blob, gz):
    from dsim.profiling.kernel_tables import load_kernel_table

    p = tmp_path_factory.mktemp("kb") / ("t.json.gz" if gz else "t.json")
    p.write_bytes(blob)
    with pytest.raises(InputError) as e:
        load_kernel_table(str(p))
    check_one_line(e.value, p)


# ---- outputs never destroy ------------------------------------------------------------------

TARGET_STATES = [
    "absent",
    "empty dir",
    "dsim output",
    "dsim output + user file",
    "user dir",
    "file",
    "fifo",
    "symlink to dir",
    "symlink to file",
    "dangling symlink",
    "nested user file",
]


def _make_target(base, state):
    """A target path in one of TARGET_STATES; returns (path, {relative user file: bytes} to keep)."""
    from dsim.outputs import staged_dir

    t = base / "t"
    keep = {}
    if state == "empty dir":
        t.mkdir()
    elif state.startswith("dsim output"):
        with staged_dir(t) as s:
            (s / "old.json").write_text("old")
            (s / "sub").mkdir()
            (s / "sub" / "x.csv").write_text("1")
        if state.endswith("user file"):
            (t / "sub" / "mine.txt").write_text("mine")
            keep["t/sub/mine.txt"] = b"mine"
    elif state == "user dir":
        t.mkdir()
        (t / "data.txt").write_text("x")
        keep["t/data.txt"] = b"x"
    elif state == "nested user file":
        (t / "summary.json").mkdir(parents=True)
        (t / "summary.json" / "data.txt").write_text("x")
        keep["t/summary.json/data.txt"] = b"x"
    elif state == "file":
        t.write_text("f")
        keep["t"] = b"f"
    elif state == "fifo":
        os.mkfifo(t)
    elif state == "symlink to dir":
        (base / "real").mkdir()
        (base / "real" / "r.txt").write_text("r")
        t.symlink_to(base / "real")
        keep["real/r.txt"] = b"r"
    elif state == "symlink to file":
        (base / "real.txt").write_text("r")
        t.symlink_to(base / "real.txt")
        keep["real.txt"] = b"r"
    elif state == "dangling symlink":
        t.symlink_to(base / "nowhere")
    return t, keep


@FAST
@given(
    states=st.lists(st.sampled_from(TARGET_STATES), min_size=1, max_size=3),
    names=st.lists(
        st.sampled_from(["summary.json", "a.csv", "sub/x.csv", "sub/deeper/y.png"]), min_size=1, max_size=4, unique=True
    ),
    fail=st.booleans(),
)
def test_staged_dir_never_destroys_and_never_merges(tmp_path_factory, states, names, fail):
    """Whatever is at the target: the run's output appears whole and alone (exactly its files and
    the manifest), or it is refused before the body runs, or (the body fails) nothing changes;
    a file of the user's is never removed or changed."""
    from dsim.outputs import MANIFEST, debris, staged_dir

    base = tmp_path_factory.mktemp("o")
    t, keep = _make_target(base, states[0])
    for state in states[1:]:  # later states only add the user's files to what is there
        if state == "user dir" and t.is_dir() and not t.is_symlink():
            (t / "late.txt").write_text("late")
            keep["t/late.txt"] = b"late"
    before = tree(base)
    ran = False
    try:
        with staged_dir(t) as s:
            ran = True
            for n in names:
                (s / n).parent.mkdir(parents=True, exist_ok=True)
                (s / n).write_text(n)
            if fail:
                raise RuntimeError("the run failed")
    except InputError as e:
        assert not ran or keep, e  # refused up front, or at the commit for a user's file
        assert "\n" not in str(e)
        assert tree(base) == before
    except RuntimeError:
        assert tree(base) == before
    else:
        assert not keep or all(not k.startswith("t") for k in keep)
        files = {str(p.relative_to(t)) for p in t.rglob("*") if p.is_file()}
        assert files == set(names) | {MANIFEST}
        assert all((t / n).read_text() == n for n in names)
    for rel, data in keep.items():
        assert (base / rel).read_bytes() == data, rel
    assert debris(base) == [] and debris(t if t.is_dir() else base) == []
