"""The recorder's C fast path (record/_fastcall.c) writes what the Python path writes."""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from ncclcheck.record import recorder as recorder_module
from ncclcheck.record.recorder import ENV_PURE_PYTHON, Recorder
from ncclcheck.record.tracefile import GROWTH

from ..conftest import REPO, cause_site_ranks
from .test_preflight import preflight

fastcall = recorder_module.fastcall


def test_the_fast_path_is_built_by_the_install() -> None:
    if os.environ.get("NCCLCHECK_NO_EXTENSION") == "1":
        pytest.skip("built without the extension on purpose")
    assert fastcall is not None, "make install should have compiled ncclcheck/record/_fastcall.c"


needs_fastcall = pytest.mark.skipif(fastcall is None, reason="the C fast path is not built")


def fake_all_reduce(tensor: Any, op: Any = None, group: Any = None, async_op: bool = False) -> str:
    inner = getattr(fake_all_reduce, "inner", None)
    if inner is not None:  # a collective that calls another inside (all_gather_object)
        inner(tensor)
    failure = getattr(fake_all_reduce, "failure", None)
    if failure is not None:
        raise failure
    return "done"


def wrapped(tmp_path: Path, name: str, pure: bool, monkeypatch: pytest.MonkeyPatch) -> tuple[Recorder, Any]:
    if pure:
        monkeypatch.setenv(ENV_PURE_PYTHON, "1")
    else:
        monkeypatch.delenv(ENV_PURE_PYTHON, raising=False)
    recorder = Recorder(str(tmp_path / name), 0, 5, 1, 10)
    return recorder, recorder.wrap_collective("all_reduce", fake_all_reduce)


def calls(recorder: Recorder) -> list[dict[str, Any]]:
    """The call lines, each with the fields of the site line it names."""
    recorder.close()
    records = [json.loads(line) for line in Path(recorder._trace.path).read_text().splitlines()]
    sites = {record.pop("id"): record for record in records if record.pop("t") == "site"}
    found = []
    for record in records:
        if "site" in record:
            found.append({**sites[record["site"]], **record})
    return found


def drive(collective: Callable[..., Any], recorder: Recorder) -> None:
    """The same calls, from the same lines, whichever wrapper is given."""
    model = torch.nn.Linear(2, 2)
    for shape in [(1,), (2, 3), (1,)]:
        collective(torch.ones(shape))
    collective(torch.ones(2, dtype=torch.float16), group=None, async_op=True)
    collective(torch.ones(2), op="sum")
    collective([torch.ones(1), torch.ones(4)])
    recorder.set_module_mode(model.eval())
    collective(torch.ones(3))
    recorder.set_module_mode(model.train())
    recorder.user_no_grad += 1
    with torch.no_grad():
        collective(torch.ones(3))
    recorder.user_no_grad -= 1
    batch = {"name": "val", "pass_index": 2, "index": 1, "role": "eval", "counted": True, "length": 9}
    recorder.batch_drawn(type("Tracked", (), batch)())
    collective(torch.ones(3))


@needs_fastcall
def test_c_and_python_write_the_same_call_lines(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    python_recorder, python_path = wrapped(tmp_path, "python", True, monkeypatch)
    c_recorder, c_path = wrapped(tmp_path, "c", False, monkeypatch)
    assert type(c_path).__name__ == "FastCall" and python_path.__name__ == "fake_all_reduce"
    for recorder, collective in ((python_recorder, python_path), (c_recorder, c_path)):
        drive(collective, recorder)  # from one line: the same stacks
    from_python, from_c = calls(python_recorder), calls(c_recorder)
    assert len(from_c) == 9
    for python_line, c_line in zip(from_python, from_c, strict=True):
        assert abs(python_line.pop("ns") - c_line.pop("ns")) < 60e9  # the same clock
        assert c_line == python_line
    assert [c["phase"] for c in from_c] == ["train"] * 6 + ["eval", "eval", "train"]
    assert from_c[-1]["pos"] == {"loader": "val", "pass": 2, "batch": 1, "role": "eval"}
    assert [c["seq"] for c in from_c] == list(range(9))


@needs_fastcall
def test_a_collective_inside_a_recorded_one_is_not_recorded_twice(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    recorder, collective = wrapped(tmp_path, "nested", False, monkeypatch)
    inner = recorder.wrap_collective("all_gather", lambda tensor, group=None, async_op=False: None)
    monkeypatch.setattr(fake_all_reduce, "inner", inner, raising=False)
    assert collective(torch.ones(1)) == "done"
    assert len(calls(recorder)) == 1


@needs_fastcall
def test_an_error_in_the_collective_propagates_and_the_next_call_is_recorded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    recorder, collective = wrapped(tmp_path, "error", False, monkeypatch)
    monkeypatch.setattr(fake_all_reduce, "failure", RuntimeError("gloo: size mismatch"), raising=False)
    with pytest.raises(RuntimeError, match="size mismatch"):
        collective(torch.ones(1))
    monkeypatch.setattr(fake_all_reduce, "failure", None)
    collective(torch.ones(1))
    assert [c["n"] for c in calls(recorder)] == [1, 2]  # written before the call, both


@needs_fastcall
def test_a_rooted_tensor_goes_the_python_way_and_is_cleared(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    recorder, collective = wrapped(tmp_path, "rooted", False, monkeypatch)
    tensor = torch.ones(1)
    recorder.rooted[id(tensor)] = object()  # what dist.reduce left on a rank that is not dst
    collective(tensor)
    assert recorder.rooted == {}
    assert len(calls(recorder)) == 1


@needs_fastcall
def test_the_trace_grows_under_the_fast_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    recorder, collective = wrapped(tmp_path, "grow", False, monkeypatch)
    tensor = torch.ones(1)
    count = 2 * GROWTH // 200 + 10  # every call line is longer than 200 bytes
    for _ in range(count):
        collective(tensor)
    written = calls(recorder)
    assert [c["n"] for c in written] == list(range(1, count + 1))
    assert [c["seq"] for c in written] == list(range(count))


@needs_fastcall
def test_a_writer_on_another_thread_is_waited_for(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    recorder, collective = wrapped(tmp_path, "thread", False, monkeypatch)
    held, release = threading.Event(), threading.Event()

    def hold_the_lock() -> None:
        with recorder._lock:  # a DDP hook's write on an autograd thread
            held.set()
            release.wait(10)

    holder = threading.Thread(target=hold_the_lock)
    holder.start()
    assert held.wait(10)
    threading.Timer(0.2, release.set).start()
    start = time.monotonic()
    collective(torch.ones(1))
    assert time.monotonic() - start >= 0.15  # it waited for the lock, not wrote beside it
    holder.join(10)
    assert [c["n"] for c in calls(recorder)] == [1]


@pytest.mark.ranks
@pytest.mark.warm_start
@needs_fastcall
def test_preflight_without_the_fast_path_finds_the_same(catalogue) -> None:
    """The pure-Python recorder finds what the playbook expects, the finding
    test_preflight's per-repro test holds the default (fast) path to."""
    playbook = catalogue.get("rank-conditional-collective")
    script = str(playbook.repro_path.relative_to(REPO))
    proc, report = preflight("--nproc-per-node", "2", script, env={ENV_PURE_PYTHON: "1"})
    assert proc.returncode == 1 and report is not None, proc.stderr
    finding = report["findings"][0]
    expect = playbook.repro
    assert cause_site_ranks(finding) == (
        "rank-conditional-collective",
        f"{script}:{expect.site_line(playbook.folder)}",
        expect.ranks,
        expect.absent_ranks,
    )
