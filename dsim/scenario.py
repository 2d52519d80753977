"""What a command runs: the workload (a trace, sliced and re-timed) and the speculative-decoding
method specs, built from plain values. Library code shared by the command line (dsim.cli.app,
dsim.cli.plan_cli), the benchmarks and the tests; bad values raise InputError naming the option."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dsim.engine.router import ROUTERS
from dsim.errors import InputError
from dsim.spec.heads import HEADS

if TYPE_CHECKING:  # imported where used: the command line starts without pandas and simpy
    from dsim.engine.config import EngineConfig
    from dsim.sim import SpecConfig
    from dsim.workload import Workload

METHODS = ("none", "mtp", "eagle3", "block", "dspark")  # dsim.spec.methods' registry (tests/test_registry.py)


def disaggregation(
    disaggregated: bool, remote_prefill_ms: float = 0.0, remote_prefill_ms_per_ktok: float = 0.0
) -> dict:
    """The EngineConfig fields of --disaggregated and its delays (dsim.engine.config.EngineConfig.kv_role):
    {} for a colocated engine. A delay without --disaggregated, or a negative or non-finite one,
    is an InputError."""
    for v, what in (
        (remote_prefill_ms, "--remote-prefill-ms"),
        (remote_prefill_ms_per_ktok, "--remote-prefill-ms-per-ktok"),
    ):
        if not (math.isfinite(v) and v >= 0):
            raise InputError(f"{what}: must be a finite number of ms >= 0, got {v}")
        if v and not disaggregated:
            raise InputError(f"{what}: applies only with --disaggregated")
    if not disaggregated:
        return {}
    return {
        "kv_role": "kv_consumer",
        "remote_prefill_ms": float(remote_prefill_ms),
        "remote_prefill_ms_per_ktok": float(remote_prefill_ms_per_ktok),
    }


def disaggregation_note(remote_prefill_ms: float, remote_prefill_ms_per_ktok: float) -> str:
    """The printed assumption of a disaggregated run (one wording for simulate, plan, sweep, ab)."""
    return (
        "decode instances of a prefill/decode-disaggregated deployment (kv_role kv_consumer): prompts' KV "
        "arrives computed, each request's first step computes its last prompt token; assumed prefill + "
        f"transfer delay {remote_prefill_ms:g} ms + {remote_prefill_ms_per_ktok:g} ms per 1000 prompt "
        "tokens, counted in TTFT"
    )


def build_workload(
    trace: str = "default",
    fmt: str = "auto",
    requests: int | None = None,
    window: str | None = None,
    rate: float | None = None,
    rate_scale: float | None = None,
    concurrency: int | None = None,
    mix: str | None = None,
    seed: int = 0,
) -> Workload:
    """The workload a command runs: a trace (or 'default'), sliced and re-timed as asked.

    requests: the first N requests; window: 'START:END' in seconds; rate: Poisson arrivals re-drawn
    at this many requests per second (seeded); rate_scale: the trace's arrival rate scaled;
    concurrency: a closed loop of this many users (arrivals all at 0); mix: a workload-class mix
    for traces without classes."""
    win = check_slicing(requests, window, rate)
    if seed < 0:
        raise InputError(f"--seed: must be >= 0, got {seed}")
    if concurrency is not None and concurrency < 1:
        raise InputError(f"--concurrency: must be >= 1, got {concurrency}")
    import numpy as np

    from dsim.workload import MAX_SPAN_S, load_workload

    w = load_workload(trace, fmt, mix=mix, seed=seed, n=requests, window=win, rate_scale=rate_scale)
    if rate is not None:
        rng = np.random.default_rng([seed, 7])
        gaps = rng.exponential(1.0 / rate, len(w.arrival_s))
        gaps[0] = 0.0
        if np.cumsum(gaps)[-1] > MAX_SPAN_S:
            raise InputError(f"--rate: {rate:g} req/s spreads {len(gaps)} requests over more than {MAX_SPAN_S:g} s")
        w = w.changed(
            f"arrivals re-drawn Poisson at {rate:g} req/s", detail=f" (seed {seed})", arrival_s=np.cumsum(gaps)
        )
    if concurrency is not None:
        w = w.changed(
            f"closed loop, {concurrency} users",
            closed_loop_concurrency=int(concurrency),
            arrival_s=np.zeros(len(w.arrival_s)),
        )
    return w


def check_slicing(requests: int | None, window: str | None, rate: float | None) -> tuple[float, float] | None:
    """Bad values of how a trace is sliced and re-timed (--requests, --window, --rate), each an
    InputError naming the option; returns the window as (start, end) seconds (None: the whole trace)."""
    if requests is not None and requests < 1:
        raise InputError(f"--requests: must be >= 1, got {requests}")
    if rate is not None and not (math.isfinite(rate) and rate > 0):
        raise InputError(f"--rate: must be a finite number > 0, got {rate}")
    if not window:
        return None
    try:
        a, b = (float(x) for x in window.split(":"))
    except ValueError:
        raise InputError(f"--window: expected START:END in seconds, got {window!r}") from None
    return (a, b)


def spec_config(
    method: str,
    k: int | None,
    adaptive: bool | None,
    policy: str,
    verify_mode: str,
    acceptance: str | None,
    head: str,
    head_auc: float,
) -> SpecConfig:
    """The spec config of `dsim simulate`'s options; adaptive defaults to on for a method with a
    confidence head (DSpark)."""
    from dsim.sim import SpecConfig

    if adaptive is None:
        from dsim.spec.methods import make_method

        adaptive = make_method(method).has_head  # a confidence head verifies adaptively by default
    return SpecConfig(
        method=method,
        k=k,
        adaptive=adaptive,
        policy=policy,
        verify_mode=verify_mode,
        acceptance=acceptance,
        head=head,
        head_auc=head_auc,
    )


def method_spec(token: str, **common: Any) -> SpecConfig:
    """A method token of --methods (or of the flag ``what``): none, mtp, mtpK (K drafts), eagle3,
    block, blockK (a block of K: e.g. block4 for a server's n-gram or draft-model proposer of K = 4,
    as the validator simulates one), dspark (adaptive), dspark-fixed, dsparkK / dsparkK-fixed (a
    block of K, e.g. dspark5: the DSpark paper's production gamma = 5); common: the other
    SpecConfig fields."""
    import re

    what = common.pop("what", "--methods")
    from dsim.sim import SpecConfig

    t = token.strip().lower()
    k = None
    adaptive = False
    if t.startswith("mtp") and t[3:].isdigit():
        t, k = "mtp", int(t[3:])
    elif t.startswith("block") and t[5:].isdigit():
        t, k = "block", int(t[5:])
    m = re.fullmatch(r"dspark(\d+)(-fixed|-adaptive)?", t)
    if m:
        t, k = "dspark" + (m.group(2) or ""), int(m.group(1))
    if k is not None and k < 1:
        raise InputError(f"{what}: {token!r}: the number of drafts must be >= 1")
    if t in ("dspark", "dspark-adaptive"):
        t, adaptive = "dspark", True
    elif t == "dspark-fixed":
        t = "dspark"
    if t not in METHODS:
        raise InputError(
            f"{what}: unknown method {token!r} (none, mtp, mtpK, eagle3, block, blockK, dspark, dspark-fixed, "
            "dsparkK, dsparkK-fixed)"
        )
    return SpecConfig(method=t, k=k, adaptive=adaptive, **common)


# ---- the scenario options: one definition for simulate, plan, sweep and ab ----------------------

ALL_COMMANDS = ("simulate", "plan", "sweep", "ab")
SEARCH_COMMANDS = ("plan", "ab")  # the node-count search
SECTIONS = {
    "model": "the model on its hardware: a profile (model x hardware x parallelism) and the node",
    "workload": "the traffic: a trace, sliced and re-timed",
    "speculation": "the speculative methods, their acceptance, verify policy and confidence head",
    "engine": "the serving engine (vLLM's names) and the router over its replicas",
    "sla": "what a fleet must meet, and how the node-count search counts it",
}
# The --policy, --verify-mode and --format choices: the registries' names (dsim.spec.budget
# POLICY_SPELLINGS, dsim.engine.compiled_bundles VERIFY_CODES, dsim.workload.readers FORMATS), written
# out here because those modules import numba or pandas and the command line starts without them;
# tests/test_registry.py checks each tuple against its registry. The router's and the confidence
# head's choices are their registries' (dsim.engine.router, dsim.spec.heads).
POLICY_NAMES = ("vllm", "paper", "paper-production", "sglang", "fixed", "threshold")
FORMAT_NAMES = ("azure", "mooncake", "burstgpt", "native-csv", "native-jsonl", "native-parquet")
VERIFY_MODE_NAMES = ("static", "compact", "cap-accept")


def _opt(default: Any, section: str, help: str, commands: tuple = ALL_COMMANDS, **meta: Any) -> Any:
    """A scenario option: its default, the file section it lives in, its help text and the
    commands that take it. meta: ``flag`` (the command-line spelling, for booleans
    ``--x/--no-x``), ``defaults`` (a command -> default mapping where commands differ),
    ``numbers`` (a text option a file may write as a number: seeds: 0)."""
    return dataclasses.field(default=default, metadata={"section": section, "help": help, "commands": commands, **meta})


@dataclasses.dataclass(frozen=True)
class Scenario:
    """Every option that says what is simulated, as `dsim simulate`, `plan`, `sweep` and `ab`
    take it (each the options named for it in its field's ``commands``): the command line's
    options are built from these fields (dsim.cli.app.scenario_options), a scenario file holds them by
    section (``load_scenario_file``, ``scenario_yaml``), and each command reads its values here.
    A value None means "not set": the command's own default applies (``default_for``)."""

    # model and hardware
    profile: str | None = _opt(
        None, "model", "profile name, model name or YAML path (default: deepseek-v4-flash-h200-dp8-ep8)"
    )
    gpus_per_node: int = _opt(8, "model", "GPUs per node")
    max_model_len: int | None = _opt(
        None, "model", "longest prompt + output a request may have (default: the profile's max_model_len, else none)"
    )
    price_per_gpu_hour: float | None = _opt(
        None,
        "model",
        "$ per GPU-hour (default: the public on-demand quote for the profile's GPU kind, dsim.study.prices)",
        SEARCH_COMMANDS,
    )
    # workload
    trace: str = _opt(
        "default",
        "workload",
        "trace path or name (default, azure-conv, azure-code, mooncake-conversation, mooncake-synthetic, ...)",
    )
    format: str = _opt("auto", "workload", ", ".join(("auto", *FORMAT_NAMES)))
    requests: int | None = _opt(None, "workload", "first N requests", ("simulate", "plan", "ab"))
    window: str | None = _opt(None, "workload", "time window START:END (s)")
    rate: float | None = _opt(None, "workload", "re-draw Poisson arrivals at R req/s", ("simulate", "plan", "ab"))
    rate_scale: float | None = _opt(
        None, "workload", "scale the trace's arrival rate (0.1-100)", ("simulate", "plan", "ab")
    )
    mix: str | None = _opt(None, "workload", "workload-class mix, e.g. math=0.3,code=0.2,chat=0.5")
    # speculative decoding
    methods: str | None = _opt(
        None,
        "speculation",
        "methods (none, mtp, mtpK, eagle3, block, blockK, dspark, dspark-fixed, dsparkK, dsparkK-fixed); "
        "plan: first = baseline, last = candidate (default: plan mtp,dspark; sweep none,mtp,block,dspark)",
        ("plan", "sweep"),
        defaults={"plan": "mtp,dspark", "sweep": "none,mtp,block,dspark"},
    )
    acceptance: str | None = _opt(
        None,
        "speculation",
        "acceptance: a preset name, a YAML/JSON file (e.g. the validator's calibrated-acceptance.yaml), "
        "'math=0.9,0.8;chat=0.7' or const:P (default: the method's preset, deepseek-v4 for mtp and dspark)",
    )
    policy: str = _opt("vllm", "speculation", "verify-budget policy: " + ", ".join(POLICY_NAMES))
    verify_mode: str = _opt("compact", "speculation", "SGLang verify mode: " + ", ".join(VERIFY_MODE_NAMES))
    head: str = _opt("model", "speculation", "confidence head: " + ", ".join(HEADS))
    head_auc: float = _opt(0.85, "speculation", "target ROC-AUC of the confidence head")
    # engine
    max_num_seqs: int = _opt(1024, "engine", "vLLM max_num_seqs (H200 default 1024)")
    max_num_batched_tokens: int = _opt(8192, "engine", "vLLM max_num_batched_tokens (H200 default 8192)")
    prefix_caching: bool = _opt(False, "engine", "vLLM prefix caching", flag="--prefix-caching/--no-prefix-caching")
    async_scheduling: bool = _opt(
        False,
        "engine",
        "async scheduling: hide the per-step CPU overhead",
        flag="--async-scheduling/--no-async-scheduling",
    )
    disaggregated: bool = _opt(
        False,
        "engine",
        "simulate decode instances of a prefill/decode-disaggregated deployment (vLLM kv_role "
        "kv_consumer): prompts' KV arrives computed, only decode runs on these GPUs",
        flag="--disaggregated/--no-disaggregated",
    )
    remote_prefill_ms: float = _opt(
        0.0, "engine", "--disaggregated: assumed delay per request on the prefill instance and the KV transfer (ms)"
    )
    remote_prefill_ms_per_ktok: float = _opt(
        0.0, "engine", "--disaggregated: assumed further delay per 1000 prompt tokens (ms)"
    )
    router: str = _opt("least_outstanding", "engine", "router: " + ", ".join(ROUTERS))
    # SLA and the node-count search
    sla: str | None = _opt(
        None,
        "sla",
        "SLA: comma-separated [metric_]pNN=VALUE (metric tpot (default), ttft, itl, e2e; VALUE with unit "
        "ms or s) and min_user_tok_s=VALUE, e.g. p50=20ms,ttft_p99=2s (plan: required; ab: p50=20ms)",
        SEARCH_COMMANDS,
        defaults={"ab": "p50=20ms"},
    )
    margin: float = _opt(
        0.10, "sla", "safety margin: pass only if every metric is within target x (1 - margin)", SEARCH_COMMANDS
    )
    seeds: str = _opt("0,1,2", "sla", "seeds; every one is simulated, the worst counts", SEARCH_COMMANDS, numbers=True)
    max_nodes: int = _opt(64, "sla", "largest node count tried", SEARCH_COMMANDS)

    def to_dict(self, command: str | None = None) -> dict:
        """{section: {option: value}} of the options ``command`` takes (all without one)."""
        out: dict = {s: {} for s in SECTIONS}
        for f in scenario_fields(command):
            out[f.metadata["section"]][f.name] = getattr(self, f.name)
        return {s: v for s, v in out.items() if v}


def scenario_fields(command: str | None = None) -> list:
    """The dataclass fields of Scenario that ``command`` takes (every one without a command)."""
    return [f for f in dataclasses.fields(Scenario) if command is None or command in f.metadata["commands"]]


def default_for(f: Any, command: str | None) -> Any:
    """A field's default for a command (the per-command default where it has one)."""
    return (f.metadata.get("defaults") or {}).get(command, f.default)


def field_types() -> dict:
    """name -> the plain type a field holds (str, int, float or bool), None allowed or not."""
    import typing

    hints = typing.get_type_hints(Scenario)
    out = {}
    for name, h in hints.items():
        args = [a for a in typing.get_args(h) if a is not type(None)]
        out[name] = (args[0] if args else h, len(args) != len(typing.get_args(h)) or h is None)
    return out


@dataclasses.dataclass(frozen=True)
class ScenarioSource:
    """Where a command's scenario came from: a named preset (default, measured) or a file, and
    the command's other options as given (for the line that reproduces a result)."""

    name: str = "default"  # default | measured | file
    path: str | None = None  # the scenario file
    marks: tuple = ()  # (option, 'FILE:LINE: section.key') of each option whose value the file gave
    other_options: tuple = ()  # the command line's tokens of the command's other options given


def file_marked(msg: str, src: ScenarioSource) -> str:
    """An error message that names a scenario option by its flag (``--router: ...``), naming it
    by the scenario file's line and key instead where the file gave the option's value."""
    for name, mark in src.marks:
        flag = "--" + name.replace("_", "-") + ": "
        if msg.startswith(flag):
            return f"{mark}: {msg[len(flag) :]}"
    return msg


def reproduce_header(command: str, src: ScenarioSource, file: str = "FILE") -> list[str]:
    """The comment lines that head a written scenario: what wrote it and the command that
    reproduces the result from it (its other options, as given, appended)."""
    import shlex

    rest = " ".join(shlex.quote(x) for x in src.other_options)
    return [
        f"dsim scenario: every option of the `dsim {command}` run that wrote this file",
        f"reproduce: dsim {command} --scenario {shlex.quote(file)}" + (f" {rest}" if rest else ""),
    ]


SCENARIO_FILE = "scenario.yaml"  # its name in an output directory
PATH_OPTIONS = ("trace", "profile", "acceptance")  # options whose value may be a file


def write_scenario(out_dir: str | Path, s: Scenario, command: str, src: ScenarioSource, out: str | Path) -> Path:
    """Write ``scenario.yaml`` (the file that reproduces a command's result) into ``out_dir``
    (where it is staged); ``out``: the output directory as the user gave it, named in the
    reproducing command line."""
    p = Path(out_dir) / SCENARIO_FILE
    p.write_text(scenario_yaml(s, command, header=reproduce_header(command, src, str(Path(out) / SCENARIO_FILE))))
    return p


def _names_a_file(value: Any) -> bool:
    """A value of a PATH_OPTIONS option written as a path (a folder part or a file extension),
    not a name (a profile, a preset, a trace name)."""
    return isinstance(value, str) and ("/" in value or "\\" in value or bool(Path(value).suffix))


def load_scenario_file(path: str | Path) -> dict:
    """The options a scenario file sets: {option: value} (read_scenario_file's values)."""
    return read_scenario_file(path)[0]


def read_scenario_file(path: str | Path) -> tuple[dict, dict]:
    """({option: value}, {option: 'FILE:LINE: section.key'}) of a scenario file, each value
    checked against its field's type. Keys may sit under their section (model:, workload:,
    speculation:, engine:, sla:) or at the top level; an unknown key or a value of the wrong type
    is an InputError naming file, line and key. Options a command does not take are kept (the
    file serves every command). A relative path of a trace, profile or acceptance file is read
    from the scenario file's folder where it exists there (so a file reproduces from any folder)."""
    from dsim import schema as Sch
    from dsim.errors import plain

    p = Path(path)
    if p.is_dir():
        raise InputError(f"--scenario: {p}: is a directory, not a scenario file")
    if not p.is_file():
        raise InputError(f"--scenario: {p}: scenario file not found (or a preset name: default, measured)")
    doc, marks = Sch.read_document(p, kind="json" if p.suffix.lower() == ".json" else "yaml")
    if doc is None:
        return {}, {}
    if not isinstance(doc, dict):
        raise InputError(f"{marks.at()}: a scenario file is a mapping of sections ({', '.join(SECTIONS)})")
    types = field_types()
    known = {f.name: f for f in scenario_fields()}
    out: dict = {}
    at: dict = {}

    def take(key: Any, value: Any, keys: tuple) -> None:
        name = str(key).replace("-", "_")
        if name not in known:
            raise InputError(f"{marks.at(*keys)}: unknown option {plain(str(key))} (known: {', '.join(known)})")
        if name in out:
            raise InputError(f"{marks.at(*keys)}: {name} given twice")
        out[name] = _typed(value, types[name], lambda: marks.at(*keys), known[name].metadata.get("numbers", False))
        if name in PATH_OPTIONS and _names_a_file(out[name]) and not Path(out[name]).expanduser().is_absolute():
            beside = p.parent / out[name]
            if beside.exists():
                out[name] = str(beside)
        at[name] = marks.at(*keys)

    for key, value in doc.items():
        if key in SECTIONS:
            if value is None:
                continue
            if not isinstance(value, dict):
                raise InputError(f"{marks.at(key)}: section {key} must be a mapping of options")
            for k2, v2 in value.items():
                take(k2, v2, (key, k2))
        else:
            take(key, value, (key,))
    return out, at


def _typed(value: Any, spec: tuple, where: Any, numbers: bool = False) -> Any:
    """A file value as the field's type: str, int, float or bool (None where the field allows it).
    A text option takes a number only where it says so (``numbers``): YAML reads unquoted text
    such as 10:20 (a window) as a number (620, base 60), which must not pass as the text."""
    from dsim.errors import plain

    typ, optional = spec
    if value is None:
        if optional:
            return None
        raise InputError(f"{where()}: must be set (null is not allowed here)")
    if typ is bool:
        if isinstance(value, bool):
            return value
    elif typ is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif typ is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            return float(value)
    elif typ is str:
        if isinstance(value, str):
            return value
        if numbers and isinstance(value, (int, float)) and not isinstance(value, bool):
            return str(value)  # seeds: 0
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            raise InputError(
                f"{where()}: must be a string, got the number {plain(value)}: quote the value "
                "(unquoted, YAML reads text such as 10:20 as a number, 620)"
            )
    raise InputError(f"{where()}: must be {_TYPE_WORD.get(typ, typ.__name__)}, got {plain(value)}")


_TYPE_WORD = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}


def resolve_scenario_options(command: str, given: dict, scenario: str | None) -> tuple[Scenario, ScenarioSource]:
    """The scenario a command runs: the command's defaults, overridden by the scenario file's
    options (``scenario`` a path; a preset name default / measured names no file), overridden by
    the options given on the command line (``given``: option -> value, None = not given)."""
    src_name, path = "default", None
    s = (scenario or "default").strip()
    if s in ("default", "measured"):
        src_name = s
    else:
        path = s
        src_name = "file"
    values = {f.name: default_for(f, command) for f in scenario_fields()}
    from_file: dict = {}
    marks: dict = {}
    if path is not None:  # (null in a file: not set, the command's default)
        from_file, marks = read_scenario_file(path)
        from_file = {k: v for k, v in from_file.items() if v is not None}
    set_here = {k: v for k, v in given.items() if v is not None}
    values.update(from_file)
    values.update(set_here)
    scn = Scenario(**values)
    taken = tuple((k, marks[k]) for k in from_file if k not in set_here)  # the file's values that count
    src = ScenarioSource(src_name, path, taken)
    try:
        check_scenario(scn)
    except InputError as e:  # a value the file gave: named by file, line and key, not by its flag
        raise InputError(file_marked(str(e), src)) from None
    return scn, src


def check_scenario(s: Scenario) -> None:
    """Bad option values, each an InputError naming the option as its flag (``--router: ...``)
    before anything runs."""
    if s.policy.strip().lower() not in POLICY_NAMES:
        raise InputError(f"--policy: unknown policy {s.policy!r} (choose from {', '.join(POLICY_NAMES)})")
    if s.verify_mode not in VERIFY_MODE_NAMES:
        raise InputError(f"--verify-mode: must be {', '.join(VERIFY_MODE_NAMES)}, got {s.verify_mode!r}")
    if s.head not in HEADS:
        raise InputError(f"--head: must be {', '.join(HEADS)}, got {s.head!r}")
    if s.router not in ROUTERS:
        raise InputError(f"--router: unknown router {s.router!r} (choose from {', '.join(ROUTERS)})")
    if not (math.isfinite(s.head_auc) and 0.5 <= s.head_auc <= 1.0):
        raise InputError(f"--head-auc: must be in [0.5, 1], got {s.head_auc:g}")
    for v, what in ((s.max_num_seqs, "--max-num-seqs"), (s.max_num_batched_tokens, "--max-num-batched-tokens")):
        if v < 1:
            raise InputError(f"{what}: must be >= 1, got {v}")
    if s.acceptance is not None and not s.acceptance.strip():
        raise InputError("--acceptance: empty (a preset name, a file, const:P or class=p1,p2,...)")
    disaggregation(s.disaggregated, s.remote_prefill_ms, s.remote_prefill_ms_per_ktok)
    check_slicing(s.requests, s.window, s.rate)


def scenario_engine(s: Scenario, **extra: Any) -> EngineConfig | None:
    """The EngineConfig of a scenario (extra: further EngineConfig fields); None where it is
    vLLM's default engine, so that plan / sweep / ab points keep their callers' default."""
    from dsim.engine.config import EngineConfig

    ec = EngineConfig(
        max_num_seqs=s.max_num_seqs,
        max_num_batched_tokens=s.max_num_batched_tokens,
        enable_prefix_caching=s.prefix_caching,
        async_scheduling=s.async_scheduling,
        **disaggregation(s.disaggregated, s.remote_prefill_ms, s.remote_prefill_ms_per_ktok),
        **extra,
    )
    return None if ec == EngineConfig() else ec


def spec_common(s: Scenario) -> dict:
    """The SpecConfig fields every method of a scenario shares (method_spec's ``common``)."""
    return dict(
        policy=s.policy.strip().lower(),
        verify_mode=s.verify_mode,
        acceptance=s.acceptance,
        head=s.head,
        head_auc=s.head_auc,
    )


def scenario_yaml(s: Scenario, command: str | None = None, *, comments: bool = True, header: Sequence[str] = ()) -> str:
    """A scenario file holding ``s`` (the options ``command`` takes; all without one): by section,
    each option with its help as a comment (``comments``), ``header`` lines first as comments.
    Without comments each section is one line (a compact form to print under a result)."""
    import os

    import yaml

    d = s.to_dict(command)
    for vals in d.values():  # a file given by a relative path: absolute, so the file is read from any folder
        for k in PATH_OPTIONS:
            v = vals.get(k)
            if _names_a_file(v) and os.path.exists(v):
                vals[k] = os.path.abspath(v)
    lines = [f"# {h}" if h else "#" for h in header]
    if not comments:
        for sec, vals in d.items():
            lines.append(yaml.safe_dump({sec: vals}, default_flow_style=None, sort_keys=False, width=10**6).rstrip())
        return "\n".join(lines) + "\n"
    helps = {f.name: f.metadata["help"] for f in scenario_fields()}
    for sec, vals in d.items():
        lines += ["", f"# {SECTIONS[sec]}", f"{sec}:"]
        for k, v in vals.items():
            val = yaml.safe_dump(v, default_flow_style=True, width=10**6).strip()
            val = val.removesuffix("\n...").removesuffix("...").strip()
            lines.append(f"  {k}: {val}".ljust(40) + f"  # {helps[k]}")
    return "\n".join(lines) + "\n"


# ---- the named presets (default, measured) and what they resolve to ------------------------------

# The embedded default trace (600 requests, ~6 req/s) is light for an 8-GPU node of a
# DeepSeek-V4-class model; the default plan scenario replays it at this arrival-rate multiplier
# so that MTP-1 needs more than one node at p50=20ms. Said in the output when applied.
DEFAULT_PLAN_RATE_SCALE = 20.0


def measured_profile_path() -> Path | None:
    """The first measured profile under profiles/h200/ (by file name), if any."""
    import yaml

    from dsim.cost import PROFILE_DIR

    d = Path(PROFILE_DIR) / "h200"
    if not d.is_dir():
        return None
    for p in sorted(d.glob("*.yaml")):
        try:
            prov = (yaml.safe_load(p.read_text()) or {}).get("provenance") or {}
        except Exception:  # noqa: BLE001 - a broken file is simply not offered
            continue
        if prov.get("kind") == "measured":
            return p
    return None


def resolve_presets(s: Scenario, src: ScenarioSource, command: str) -> tuple[Scenario, list[str]]:
    """The scenario with what its preset implies made explicit (so that a written scenario file
    reproduces the run without the preset): the profile (default: the default profile; measured:
    the first measured profile) and, for plan and ab on the default preset (not a scenario file),
    the default trace's rate multiplier. Returns (scenario, notes printed with the result)."""
    from dsim.cost import DEFAULT_PROFILE

    notes: list[str] = []
    profile, rate_scale = s.profile, s.rate_scale
    if src.name == "measured":
        p = measured_profile_path()
        if p is None:
            raise InputError("--scenario measured: no measured profile under profiles/h200/ yet")
        if profile is None:
            profile = str(p)
            notes.append(f"scenario 'measured': profile {p}")
    elif (
        src.name == "default"
        and command in SEARCH_COMMANDS
        and s.trace == "default"
        and s.rate is None
        and rate_scale is None
        and profile is None
    ):
        rate_scale = DEFAULT_PLAN_RATE_SCALE
        notes.append(
            f"default scenario: the embedded default trace replayed at {DEFAULT_PLAN_RATE_SCALE:g}x its "
            f"arrival rate (--rate-scale {DEFAULT_PLAN_RATE_SCALE:g}) so one 8-GPU node is not enough"
        )
    return dataclasses.replace(s, profile=DEFAULT_PROFILE if profile is None else profile, rate_scale=rate_scale), notes


def scenario_profile(s: Scenario) -> Any:
    """The profile of a resolved scenario (resolve_presets), its max_model_len as asked."""
    from dsim.cost import load_profile

    prof = load_profile(s.profile)
    if s.max_model_len is not None:
        if s.max_model_len < 1:
            raise InputError(f"--max-model-len: must be >= 1, got {s.max_model_len}")
        prof = dataclasses.replace(prof, max_model_len=s.max_model_len)
    return prof


def load_scenario_profile(s: Scenario, src: ScenarioSource, command: str = "simulate") -> tuple[Any, list[str]]:
    """(profile, notes) of a scenario as given (its presets resolved)."""
    r, notes = resolve_presets(s, src, command)
    return scenario_profile(r), notes


def template_yaml() -> str:
    """The commented template `dsim scenario init` writes: every option at its default, with the
    SLA and arrival-rate multiplier of the quick start (`dsim plan --sla p50=20ms`), each with its
    help."""
    s = dataclasses.replace(Scenario(), sla="p50=20ms", rate_scale=DEFAULT_PLAN_RATE_SCALE)
    return scenario_yaml(
        s,
        header=[
            "dsim scenario file. Use: dsim plan --scenario FILE (also simulate, sweep, ab: each reads the",
            "options it takes). Options given on the command line override the file's; null: the command's",
            "default. Every result dsim writes comes with the scenario file that reproduces it.",
            f"rate_scale {DEFAULT_PLAN_RATE_SCALE:g}: the embedded default trace replayed at {DEFAULT_PLAN_RATE_SCALE:g}x "
            "its arrival rate, as plan's default scenario",
            "replays it (one 8-GPU node is not enough at p50=20ms); null: the trace's own rate.",
        ],
    )
