"""The fuzzer in CI: a few hundred seeded cases through `simfed`'s command line, none of which may
crash, hang, be silently accepted when invalid, or write invalid JSON or stray files. Thousands
more on demand: `python -m tests.fuzz --cases 5000` (see tests/fuzz/__main__.py)."""

import json
import math
import signal
import time

import pytest

from simfed.spec.scenario import Scenario
from simfed.spec.yamlio import dump_yaml

from .cases import INVALID, VALID, Case, Generator, generate, kinds, schema_keys
from .runner import BAD, _init_worker, run_case, run_cases, summarise

CI_CASES = 240
CI_SEED = 20


def test_ci_cases_end_cleanly():
    # a hang here is a case over 30 s (CI hosts are shared); `python -m tests.fuzz` holds
    # every case to the contract's 10 s
    results = run_cases(generate(CI_CASES, CI_SEED), jobs=2, time_limit_s=30)
    s = summarise(results)
    bad = [f"{r.outcome}: [{r.kind}] {r.what}: {r.detail}" for r in results if r.outcome in BAD]
    assert not bad, "\n".join(bad)
    # the cases are not vacuous: most are invalid and were refused, some ran
    assert s["outcomes"].get("refused", 0) > CI_CASES / 2
    assert s["outcomes"].get("ok", 0) > 10
    assert set(s["by_kind"]) == {"key", "yaml", "encoding", "include", "cli", "label", "cost"}


OTHER_KINDS_CI_CASES = 8  # per kind: results, trace, bench, published, converge, outputs,
# study, profile


def test_ci_cases_of_every_other_input_kind_end_cleanly():
    """A sample of every input kind beyond scenarios (tests/fuzz/families.py); thousands on
    demand: `python -m tests.fuzz --kind all --cases 5000`."""
    kinds_ = [k for k in kinds() if k != "scenario"]
    cases = [c for k in kinds_ for c in generate(OTHER_KINDS_CI_CASES, CI_SEED, k)]
    for i, c in enumerate(cases):
        c.id = i + 1
    results = run_cases(cases, jobs=2, time_limit_s=60)
    s = summarise(results)
    bad = [f"{r.outcome}: [{r.kind}] {r.what}: {r.detail}" for r in results if r.outcome in BAD]
    assert not bad, "\n".join(bad)
    assert {"results", "trace", "bench", "published", "converge", "outputs", "study",
            "profile"} <= set(s["by_kind"])
    assert s["outcomes"].get("refused", 0) > len(cases) / 3  # not vacuous: most are refused,
    assert s["outcomes"].get("ok", 0) > len(cases) / 10  # some run


def test_the_runner_sees_an_output_path_replaced(worker, monkeypatch, tmp_path):
    """The old writer (temporary file renamed over the path) replaced a symbolic link with a
    regular file: the runner calls that `replaced`; the writer of spec.paths does not."""
    import os

    import simfed.spec.paths as paths

    case = _case(VALID, argv=["run", "{dir}/s.yaml", "-q", "--json", "{dir}/o.json"],
                 outputs=("target.json",))
    case.files["target.json"] = b"old"
    case.specials = {"o.json": "link:target.json"}
    assert run_case(case).outcome == "ok"

    def old_writer(path, data):
        tmp = f"{path}.tmp"
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
        return path

    monkeypatch.setattr(paths, "write_bytes", old_writer)
    assert run_case(case).outcome == "replaced"


def test_every_schema_key_is_mutated():
    """The key family reaches every key of the scenario schema (walked from the dataclasses)."""
    gen = Generator(0)
    keys = {k.dotted for ks in gen.keys.values() for k in ks}
    import re

    plain = {re.sub(r"\[\d+\]", "", k) for k in keys}
    for must in ("cluster.nodes", "cluster.node.gpu.peak_tflops", "training.betas",
                 "stragglers.jitter.sigma", "validation.bench_sets", "algorithms.label",
                 "runtime.comm.op_bw_factor", "stragglers.slow_nodes.factor"):
        assert must in plain, must
    assert len(schema_keys(Scenario)) > 100


@pytest.fixture
def worker():
    old = signal.getsignal(signal.SIGALRM)
    _init_worker_signals_only()
    yield
    signal.signal(signal.SIGALRM, old)


def _init_worker_signals_only():
    from . import runner

    signal.signal(signal.SIGALRM, runner._on_alarm)


def _case(expect, argv=None, files=None, outputs=("out/result.json",)):
    g = Generator(0)
    data = g.bases["cpu4"]

    files = files or {"s.yaml": dump_yaml(data).encode()}
    return Case(1, "test", "test", expect, files,
                argv or ["run", "{dir}/s.yaml", "-q", "--json", "{dir}/out/result.json"],
                outputs)


def test_the_runner_sees_silent_acceptance_and_clean_refusal(worker):
    assert run_case(_case(INVALID)).outcome == "accepted_invalid"  # a valid scenario, said bad
    assert run_case(_case(VALID)).outcome == "ok"
    refused = run_case(_case(VALID, argv=["run", "{dir}/none.yaml", "-q"], outputs=()))
    assert refused.outcome == "refused_valid" and refused.exit_code == 2


def test_the_runner_sees_hangs_invalid_json_and_stray_files(worker, monkeypatch):
    import simfed.engine

    real = simfed.engine.simulate
    monkeypatch.setattr(simfed.engine, "simulate", lambda *a, **k: time.sleep(30))
    assert run_case(_case(VALID), time_limit_s=1).outcome == "hang"

    def nan_result(*a, **k):
        out, spans = real(*a, **k)
        out["algorithms"][0]["mfu"] = math.nan
        return out, spans

    import simfed.analysis.report as report

    monkeypatch.setattr(simfed.engine, "simulate", nan_result)
    monkeypatch.setattr(report, "dumps", lambda out: json.dumps(out))  # not strict
    assert run_case(_case(VALID)).outcome == "invalid_json"
    monkeypatch.setattr(simfed.engine, "simulate", real)
    stray = run_case(_case(VALID, outputs=()))  # its --json is not a named output
    assert stray.outcome == "stray_file"


def test_worker_limits_are_set():
    """The pool's initializer caps memory (a blow-up becomes MemoryError, then an internal
    error, not a dead machine): a case may grow the worker by at most MEMORY_LIMIT_BYTES beyond
    its imports; checked in a child so this process keeps its limits."""
    from concurrent.futures import ProcessPoolExecutor

    from .runner import MEMORY_LIMIT_BYTES

    with ProcessPoolExecutor(max_workers=1, initializer=_init_worker) as pool:
        soft, used = pool.submit(_as_limit).result()
    assert 0 < soft - used <= MEMORY_LIMIT_BYTES


def _as_limit() -> tuple[int, int]:
    import resource

    from .runner import address_space

    return resource.getrlimit(resource.RLIMIT_AS)[0], address_space()


def test_the_convergence_oracle():
    """The study and profile kinds' oracle (tests/fuzz/convergence.py): the bases keep every
    rule; a mutation that breaks a stated rule (cross-field ones included) is invalid, one that
    breaks none is not."""
    from . import convergence as c
    from .families import DELETE, UNKNOWN, Raw, apply

    def study(path, value):
        return c.broken_by(apply(c.study_base(), path, value), c.STUDY_RULES, c.STUDY_CLOSED,
                           strict_json=True, cross=c.study_cross)

    assert c.broken_by(c.study_base(), c.STUDY_RULES, c.STUDY_CLOSED, strict_json=True,
                       cross=c.study_cross) is False
    assert study(("runs", 0, "eval_steps", 0), 8)  # must start at 0
    assert study(("runs", 0, "eval_steps", 2), 8)  # 0, 8, 8: not increasing
    assert study(("runs", 0, "eval_steps", 16), 129)  # past the run's 128 steps
    assert study(("runs", 0, "eval_loss", 3), DELETE)  # one loss per step
    assert study(("runs", 1, "steps"), "12")  # lax: 12 steps, evaluated up to 128
    assert study(("runs", 1, "lr"), 100.5) and study(("model", "vocab"), 1.5)
    assert study(("runs", 0, "noise", 0, "step"), UNKNOWN)  # an unknown key in a run's noise
    assert study(("recipe", "paper_lr"), Raw("NaN"))  # not strict JSON
    assert not study(("recipe", "paper_lr"), "x") and not study(("runs", 0, "lr"), True)
    n_scaling, optional = len(c.SCALING_PARAMS), len(c.OPTIONAL_PARAMS)
    for form, n in (("scaling", n_scaling), ("constants", n_scaling), ("noise_progress", 7)):
        model = "noise_progress" if form == "noise_progress" else "scaling"
        base = c.convergence_base(form)

        opt = optional if model == "scaling" else 0

        def prof(path, value, base=base, model=model, n=n, opt=opt):
            return c.broken_by(apply(base, path, value), c.convergence_rules(model),
                               c.CONV_CLOSED, strict_json=False, cross=c.profile_cross(n, opt))

        assert prof(("model",), "x") is True
        assert prof(("model",), DELETE) is False  # the default, none, reads no profile
        assert c.broken_by(base, c.convergence_rules(model), c.CONV_CLOSED, strict_json=False,
                           cross=c.profile_cross(n, opt)) is False
        assert prof(("profile", "params", "exponent"), 0)  # > 0
        assert prof(("profile", "params", "loss_floor"), -1)
        assert prof(("profile", "params", "exponent"), UNKNOWN)  # a misspelt key
        assert prof(("profile", "covariance", 2, 3), DELETE)  # a row of n - 1
        assert prof(("profile", "draws", 2), [1, 2])
        assert not prof(("profile", "draws", 2), DELETE)  # one draw fewer
        assert prof(("profile", "params", "exponent"), Raw("NaN"))
    scaling = c.convergence_base("constants")
    for name, value, bad in (("floor_size_exponent", 3.5, True), ("optimal_lr", 1e-300, True),
                             ("noise_star_tokens", 1e13, False), ("loss_floor", 0, False)):
        doc = apply(scaling, ("data_constants", name), value)
        assert bool(c.broken_by(doc, c.convergence_rules("scaling"), c.CONV_CLOSED,
                                strict_json=False, cross=c.profile_cross(n_scaling, optional))
                ) == bad, name
