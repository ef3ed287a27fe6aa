"""ncclcheck's pytest plugin (entry point ``pytest11``): "every rank meets at every
collective" as a test.

``@pytest.mark.ncclcheck(nproc=2)`` runs a test function on ``nproc`` real ranks
(torchrun, gloo on CPU by default) with preflight's recorder on every rank. The
test fails with ncclcheck's diagnosis (cause, ranks, call site, fix) when the
ranks' collective histories differ, when a rank raises, or when the ranks stop
making progress for ``stall_timeout`` seconds: a hang ends the test in seconds,
never the session. The function may take ``rank``, ``world_size`` and
``local_rank`` (each rank gets its own), its parametrize values and any fixture
whose value pickles (``tmp_path`` is the same folder on every rank)::

    @pytest.mark.ncclcheck(nproc=2)
    def test_eval_metric_is_reduced_on_every_rank(rank, world_size):
        loss = evaluate(model, val_loader)  # all-reduces inside
        assert loss > 0

``@pytest.mark.ncclcheck(world_size=256, nproc_per_node=8)`` runs it instead as
ranks of a 256-rank job on torch's fake process group (preflight --world-size): rank
0, then the ranks that differ (each virtual node's first and last, the last rank;
``ranks=[...]`` adds more, ``all_ranks=True`` runs every one); ``world_size`` is 256
in the function.

``assert_aligned(script, nproc=2, args=[...])`` runs preflight on a training
script from a test and fails with its findings; ``world_size=W`` runs it in a
virtual world of W ranks.
"""

from __future__ import annotations

import inspect
import os
import pickle
import shutil
import sys
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest

from ncclcheck.launch.torchrun import TorchrunOptions
from ncclcheck.launch.virtual import MAX_WORLD_SIZE, VirtualLayout, VirtualWorld
from ncclcheck.model import Report, Severity, Verdict
from ncclcheck.record.frameworks import UNLIMITED_STEPS
from ncclcheck.runtime.pytest_ranks import RUNNER, TestSpec
from ncclcheck.settings import (
    STALL_TIMEOUT_S,
    TEST_STALL_TIMEOUT_S,
    TOTAL_TIMEOUT_S,
    DryRunSettings,
    warm_start_from_environment,
)

MARKER = "ncclcheck"
_RANK_ARGUMENTS = ("rank", "world_size", "local_rank")
# A test function is not a training loop: no loader is cut short, every pass runs.
_UNLIMITED = UNLIMITED_STEPS


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        f"{MARKER}(nproc=2, stall_timeout={TEST_STALL_TIMEOUT_S:g}, timeout=300, backend='gloo', "
        "world_size=None, nproc_per_node=None, ranks=None, all_ranks=False): run the test on nproc "
        "real ranks and fail with ncclcheck's diagnosis when their collectives differ or they hang",
    )


@pytest.fixture
def rank() -> int:
    """This rank's number, in a test marked ncclcheck (0 in the controlling process)."""
    return 0


@pytest.fixture
def world_size(request: pytest.FixtureRequest) -> int:
    marker = request.node.get_closest_marker(MARKER)
    if marker is None:
        return 1
    return int(marker.kwargs.get("world_size") or marker.kwargs.get("nproc", 2))


@pytest.fixture
def local_rank() -> int:
    return 0


_OPTIONS: dict[str, Any] = {
    "nproc": 2,
    "stall_timeout": TEST_STALL_TIMEOUT_S,
    "timeout": 300.0,
    "backend": "gloo",
    "world_size": None,  # a virtual world of this many ranks (preflight --world-size)
    "nproc_per_node": None,  # its ranks per virtual node (default: min(8, world_size))
    "ranks": None,  # more of its ranks to run than the default subset
    "all_ranks": False,
}


@dataclass(frozen=True)
class _Options:
    nproc: int
    stall_timeout: float
    timeout: float
    backend: str
    virtual: VirtualWorld | None

    @property
    def what(self) -> str:
        if self.virtual is None:
            return f"({self.nproc} ranks)"
        return f"(ranks of a virtual world of {self.virtual.layout.world_size})"


def _options(item: pytest.Item, marker: pytest.Mark) -> _Options:
    if marker.args:
        raise pytest.UsageError(f"{item.nodeid}: use ncclcheck(nproc=N), not positional arguments")
    unknown = sorted(set(marker.kwargs) - set(_OPTIONS))
    if unknown:
        raise pytest.UsageError(
            f"{item.nodeid}: unknown ncclcheck marker option(s) {unknown}; known: {', '.join(_OPTIONS)}"
        )
    values = {**_OPTIONS, **marker.kwargs}
    nproc = int(values["nproc"])
    if nproc < 1:
        raise pytest.UsageError(f"{item.nodeid}: ncclcheck(nproc={nproc}): at least one rank")
    virtual = None
    if values["world_size"] is not None:
        virtual = _virtual_world(item, marker.kwargs, values)
    elif any(marker.kwargs.get(name) for name in ("nproc_per_node", "ranks", "all_ranks")):
        raise pytest.UsageError(f"{item.nodeid}: nproc_per_node, ranks and all_ranks go with world_size=W")
    return _Options(
        nproc, float(values["stall_timeout"]), float(values["timeout"]), str(values["backend"]), virtual
    )


def _virtual_world(item: pytest.Item, given: Mapping[str, Any], values: dict[str, Any]) -> VirtualWorld:
    world = int(values["world_size"])
    if "nproc" in given:
        raise pytest.UsageError(f"{item.nodeid}: ncclcheck(nproc=..., world_size=...): give one of them")
    if not 1 <= world <= MAX_WORLD_SIZE:
        raise pytest.UsageError(f"{item.nodeid}: ncclcheck(world_size={world}): 1 to {MAX_WORLD_SIZE} ranks")
    per_node = int(values["nproc_per_node"] or min(8, world))
    ranks = tuple(int(rank) for rank in values["ranks"] or ())
    outside = [rank for rank in ranks if not 0 <= rank < world]
    if per_node < 1 or outside:
        raise pytest.UsageError(
            f"{item.nodeid}: ncclcheck(world_size={world}): nproc_per_node at least 1 and ranks "
            f"below {world} (not {outside or per_node})"
        )
    return VirtualWorld(VirtualLayout(world, per_node), ranks, bool(values["all_ranks"]))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Bad marker options stop the session at collection, before any rank starts."""
    for item in items:
        marker = item.get_closest_marker(MARKER)
        if marker is not None:
            _options(item, marker)


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> bool | None:
    marker = pyfuncitem.get_closest_marker(MARKER)
    if marker is None:
        return None
    options = _options(pyfuncitem, marker)
    _run_on_ranks(_spec(pyfuncitem, options.backend), options)
    return True


def _spec(item: pytest.Function, backend: str) -> TestSpec:
    function = item.obj
    module = item.module
    if module is None or "<locals>" in function.__qualname__:
        pytest.fail("ncclcheck: a test marked ncclcheck must be defined at module level", pytrace=False)
    wanted = [name for name in inspect.signature(function).parameters if name not in _RANK_ARGUMENTS]
    kwargs: dict[str, Any] = {}
    for name in wanted:
        if name == "self":
            continue
        value = item.funcargs.get(name)
        try:
            pickle.dumps(value)
        except Exception as error:
            pytest.fail(
                f"ncclcheck: fixture {name!r} cannot be sent to the ranks ({type(error).__name__}: "
                f"{error}); ranks get rank, world_size, local_rank, parameters and picklable fixtures",
                pytrace=False,
            )
        kwargs[name] = value
    return TestSpec(
        module=module.__name__,
        file=str(module.__file__),
        qualname=function.__qualname__,
        kwargs=kwargs,
        sys_path=list(sys.path),
        backend=backend,
    )


def _run_on_ranks(spec: TestSpec, options: _Options) -> None:
    folder = Path(tempfile.mkdtemp(prefix="ncclcheck-pytest-"))
    try:
        # The one pickle ncclcheck reads: written here, 0600 in the 0700 folder just made,
        # read by the ranks launched below (fixture values need it).
        spec_path = folder / "spec.pickle"
        fd = os.open(spec_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as handle:
            handle.write(pickle.dumps(spec))
        runner = folder / "run_test_on_rank.py"
        runner.write_text(RUNNER)
        settings = DryRunSettings(
            train_steps=_UNLIMITED,
            eval_passes=_UNLIMITED,
            max_train_passes=_UNLIMITED,
            stall_timeout=options.stall_timeout,
            probe_timeout=min(30.0, options.timeout),
            total_timeout=options.timeout,
            line_evidence=options.virtual is None,
        )
        _preflight_or_fail(
            runner,
            [str(spec_path)],
            options.nproc,
            settings,
            options.what,
            folder / "traces",
            options.virtual,
        )
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _preflight_or_fail(
    script: str | Path,
    args: Sequence[str],
    nproc: int,
    settings: DryRunSettings,
    what: str,
    trace_dir: Path | None = None,
    virtual: VirtualWorld | None = None,
) -> Report:
    """Run preflight; fail the calling test with the report when it has errors."""
    from ncclcheck.commands.preflight import run_preflight
    from ncclcheck.errors import NcclcheckError
    from ncclcheck.evidence.traces import eval_calls_without_loader, load_traces
    from ncclcheck.render.console import report_text

    # NCCLCHECK_WARM_START, as for the CLI: a CI job of many marked tests on one machine
    # forks each one's ranks from a warm interpreter
    settings = replace(settings, warm_start=settings.warm_start or warm_start_from_environment())
    try:
        outcome = run_preflight(
            str(script),
            [str(arg) for arg in args],
            TorchrunOptions(nproc_per_node=nproc),
            settings,
            trace_dir,
            virtual=virtual,
        )
    except NcclcheckError as error:
        pytest.fail(f"ncclcheck could not run {what}: {error}", pytrace=False)
    report = outcome.report
    if not report.has_errors and report.verdict not in (Verdict.INCOMPLETE, Verdict.PARTIAL):
        return report
    if trace_dir is not None and eval_calls_without_loader(load_traces(trace_dir)) == 0:
        report.summary.pop("note", None)  # "no eval phase": a test function is not a train/eval loop
    verdict = {
        Verdict.MISALIGNED: "saw the ranks' collectives differ",
        Verdict.HANG: "saw the ranks hang",
        Verdict.CRASH: "saw a rank fail",
        Verdict.INCOMPLETE: "did not finish its dry run",
        Verdict.PARTIAL: "did not run every part that reaches a collective",
    }.get(report.verdict, f"ended with {report.verdict.value}")
    first_error = next((f for f in report.findings if f.severity is Severity.ERROR), None)
    headline = f"found {first_error.cause}" if first_error is not None else verdict
    text = f"ncclcheck {headline} {what}\n\n{report_text(report).rstrip()}"
    log = outcome.launch.log_tail(40) if outcome.launch is not None else ""
    if log:
        text += "\n\nwhat the ranks printed (last lines):\n" + log
    pytest.fail(text, pytrace=False)


def assert_aligned(
    script: str | Path,
    nproc: int = 2,
    args: Sequence[str] = (),
    *,
    train_steps: int = 5,
    eval_passes: int = 1,
    stall_timeout: float = STALL_TIMEOUT_S,
    timeout: float = TOTAL_TIMEOUT_S,
    world_size: int | None = None,
    nproc_per_node: int | None = None,
) -> Report:
    """Run preflight on a training script; fail the calling test with the findings.
    ``world_size``: run it as ranks of a virtual world of that many (preflight
    --world-size), ``nproc_per_node`` of them per virtual node (default min(8, W)).

    Returns the report when the ranks stayed aligned, for further asserts.
    """
    settings = DryRunSettings(
        train_steps=train_steps,
        eval_passes=eval_passes,
        stall_timeout=stall_timeout,
        total_timeout=timeout,
        line_evidence=world_size is None,
    )
    if world_size is None:
        return _preflight_or_fail(script, args, nproc, settings, f"in {script} ({nproc} ranks)")
    layout = VirtualLayout(world_size, nproc_per_node or min(8, world_size))
    what = f"in {script} (ranks of a virtual world of {world_size})"
    return _preflight_or_fail(script, args, nproc, settings, what, None, VirtualWorld(layout))
