"""What a forked rank imported that its server had not, so that the server imports it
before forking the next ranks (launch/virtual.py, launch/replay.py).

A server imports torch once and forks ranks from it; a module a rank imports later is
imported again in every rank. DDP's constructor imports ``torch._dynamo`` (1.3 s of
CPU on torch 2.13, as long again as torch itself), so a rank that builds DDP writes the
outermost torch modules it has that the server had not, and the next server (the rest
of a virtual world, a replay) imports them before it forks. Nothing depends on it but
the cost: a module that fails to import in the server is left to the ranks.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import sys

FILE_NAME = "torch-imports.json"


def note_new_imports(before: set[str], folder: str) -> None:
    """Write the outermost torch modules imported since ``before`` into ``folder``."""
    new = {name for name in sys.modules if name.startswith("torch.") and name not in before}
    outermost = sorted(name for name in new if name.rpartition(".")[0] not in new)
    with contextlib.suppress(OSError), open(os.path.join(folder, FILE_NAME), "w", encoding="utf-8") as out:
        json.dump(outermost, out)


def import_noted(folder: str) -> None:
    """Import what a rank noted in ``folder`` (nothing where it noted nothing)."""
    try:
        with open(os.path.join(folder, FILE_NAME), encoding="utf-8") as saved:
            names = json.load(saved)
    except (OSError, ValueError):
        return
    for name in names:
        if isinstance(name, str) and name not in sys.modules:
            with contextlib.suppress(Exception):  # a module that imports only in a rank's state
                importlib.import_module(name)
