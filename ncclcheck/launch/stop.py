"""A stop (Ctrl-C, SIGTERM) asked of preflight before its ranks were started.

cli/preflight.py listens for one from its first line; whatever starts the ranks
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
