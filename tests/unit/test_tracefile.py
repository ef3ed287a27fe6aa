"""The trace file writer: records stored through a shared mapping outlive their process."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from ncclcheck.evidence.traces import EmptyTrace, load_rank_trace, load_traces
from ncclcheck.record.tracefile import GROWTH, TraceFile, data_end, seal


def _line(record: dict[str, object]) -> bytes:
    return (json.dumps(record, separators=(",", ":")) + "\n").encode()


def test_open_file_ends_at_its_data_and_close_cuts_it(tmp_path: Path) -> None:
    path = tmp_path / "rank-00000.jsonl"
    trace = TraceFile(str(path))
    lines = [_line({"t": "batch", "i": i}) for i in range(3)]
    for line in lines:
        trace.append(line)
    assert path.stat().st_size == GROWTH  # grown ahead of the data
    with path.open("rb") as handle:
        assert data_end(handle.fileno()) == sum(map(len, lines))
    trace.close()
    assert path.read_bytes() == b"".join(lines)
    trace.append(b"after close\n")  # a no-op, not an error at interpreter exit
    assert path.read_bytes() == b"".join(lines)


def test_growth_keeps_every_byte_in_order(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    trace = TraceFile(str(path))
    chunk = b"x" * 999 + b"\n"
    count = 3 * GROWTH // len(chunk) + 7
    for _ in range(count):
        trace.append(chunk)
    with path.open("rb") as handle:
        assert data_end(handle.fileno()) == count * len(chunk)
    assert path.stat().st_size > count * len(chunk)
    trace.close()
    assert path.read_bytes() == chunk * count


def test_data_end_of_plain_and_empty_files(tmp_path: Path) -> None:
    for content in (b"", b"abc\n", b"a\0\0\0"):
        path = tmp_path / "f"
        path.write_bytes(content)
        with path.open("rb") as handle:
            assert data_end(handle.fileno()) == len(content.rstrip(b"\0"))


_WRITER = textwrap.dedent(
    """
    import json, os, sys, time
    from ncclcheck.record.tracefile import TraceFile
    trace = TraceFile(sys.argv[1])
    trace.append(b'{"t":"hello","rank":3,"pid":%d}\\n' % os.getpid())
    for n in range(1, 501):
        trace.append(b'{"t":"call","n":%d,"seq":%d,"ns":%d,"op":"all_reduce","group":"0",'
                     b'"group_ranks":[0,1],"shapes":[[1]],"dtypes":["float32"],"device":"cpu",'
                     b'"async":false,"phase":"train","src":"python","stack":[["t.py",%d,"main"]]}\\n'
                     % (n, n - 1, time.time_ns(), n))
    if os.fork() == 0:  # a DataLoader worker: its writes must not land in the parent's file
        trace.append(b'{"t":"call","n":999}\\n')
        os._exit(0)
    os.wait()
    print("written", flush=True)
    if sys.argv[2] == "abort":
        os.abort()
    time.sleep(60)
    """
)


@pytest.mark.parametrize("how", ["kill", "abort"])
def test_records_outlive_a_killed_or_aborted_writer(tmp_path: Path, how: str) -> None:
    path = tmp_path / "rank-00003.jsonl"
    proc = subprocess.Popen(
        [sys.executable, "-c", _WRITER, str(path), how], stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "written"
        if how == "kill":
            proc.send_signal(signal.SIGKILL)
        assert proc.wait(timeout=30) == -(signal.SIGKILL if how == "kill" else signal.SIGABRT)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
    assert path.stat().st_size == GROWTH  # left open: zero bytes after the records
    trace = load_rank_trace(path)  # the reader stops at the data's end
    assert trace.rank == 3
    assert [call.n for call in trace.calls] == list(range(1, 501))
    seal(str(path))
    assert path.read_bytes().endswith(b'"main"]]}\n')
    assert b"\0" not in path.read_bytes()
    assert os.path.getsize(path) < GROWTH


def test_a_file_grown_before_its_rank_wrote_a_record_is_a_rank_that_never_started(tmp_path: Path) -> None:
    # a rank stopped between opening its trace and its first record: zero bytes, as grown
    TraceFile(str(tmp_path / "rank-00001.jsonl"))
    assert (tmp_path / "rank-00001.jsonl").stat().st_size == GROWTH
    with pytest.raises(EmptyTrace):
        load_rank_trace(tmp_path / "rank-00001.jsonl")
    assert len(load_traces(tmp_path)) == 0  # no rank read, and no error: the caller says why
