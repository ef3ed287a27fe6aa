"""watch asks each rank's Flight Recorder for its dump through the pipe NCCL's watchdog
makes (commands/watch.flight_recorder_dumps). gloo makes no pipe, so the watchdog's side
is played here by a thread that does what torch's DumpPipe does: a FIFO named
``<stem><rank>.pipe``, read without blocking, and a dump written when a byte comes."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

from ncclcheck.commands.watch import FR_DUMP_PREFIX, FR_PIPE_STEM, flight_recorder_dumps


def watchdog(pipes: Path, rank: int, stop: threading.Event) -> threading.Thread:
    pipe = pipes / f"{FR_PIPE_STEM}{rank}.pipe"
    os.mkfifo(pipe)
    reader = os.open(pipe, os.O_RDONLY | os.O_NONBLOCK)

    def poll() -> None:
        try:
            while not stop.is_set():
                try:
                    asked = os.read(reader, 128)
                except BlockingIOError:
                    asked = b""
                if asked:
                    (pipes / f"{FR_DUMP_PREFIX}{rank}").write_bytes(b"dump of rank %d" % rank)
                time.sleep(0.05)
        finally:
            os.close(reader)

    thread = threading.Thread(target=poll, daemon=True)
    thread.start()
    return thread


def test_every_rank_with_a_pipe_is_asked_and_its_dump_copied_into_the_capture(tmp_path: Path) -> None:
    pipes, capture = tmp_path / "flight-recorder", tmp_path / "hang-1"
    pipes.mkdir()
    stop = threading.Event()
    threads = [watchdog(pipes, rank, stop) for rank in (0, 1)]
    (pipes / f"{FR_PIPE_STEM}2.pipe").touch()  # not a FIFO: rank 2's watchdog is gone
    os.mkfifo(pipes / f"{FR_PIPE_STEM}3.pipe")  # a FIFO nobody reads: skipped, not waited on
    try:
        answered = flight_recorder_dumps(pipes, capture, wait_s=10.0)
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=5)
    assert answered == [0, 1]
    assert (capture / f"{FR_DUMP_PREFIX}1").read_bytes() == b"dump of rank 1"
    assert sorted(p.name for p in capture.iterdir()) == [f"{FR_DUMP_PREFIX}0", f"{FR_DUMP_PREFIX}1"]


def test_a_job_without_pipes_gives_nothing_at_once(tmp_path: Path) -> None:
    started = time.monotonic()
    assert flight_recorder_dumps(tmp_path / "none", tmp_path / "hang", wait_s=10.0) == []
    # at once, not after its 10 s wait for dumps
    assert time.monotonic() - started < 9.0 and not (tmp_path / "hang").exists()
