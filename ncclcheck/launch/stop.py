"""A stop (Ctrl-C, SIGTERM) asked of preflight before its ranks were started.

The command line listens for one from its first lines (listen_early), cli/preflight.py
again from its own; whatever starts the ranks
(run_dry, a virtual world's server) installs its own handler and, when a stop was
asked already, stops at once. The run is then incomplete (exit 4), as a stop later in
the run makes it, instead of preflight dying of the signal or the launch being called a
failure.
"""

from __future__ import annotations

import signal
import threading

STOP_ASKED = threading.Event()


def listen_for_a_stop() -> None:
    """From now on, Ctrl-C and SIGTERM set STOP_ASKED instead of ending the process."""
    for stop in (signal.SIGINT, signal.SIGTERM):
        signal.signal(stop, lambda *_: STOP_ASKED.set())


def listen_early(argv: list[str]) -> None:
    """Listen from the interpreter's first lines when the command is preflight: typer,
    rich and the commands take a second or more to import on a loaded machine, and a
    CI job's SIGTERM in that second would otherwise end preflight by the signal."""
    command = next((arg for arg in argv[1:] if not arg.startswith("-")), None)
    if command == "preflight":
        listen_for_a_stop()
