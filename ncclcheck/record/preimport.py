"""What a forked rank imported that its server had not, so that the server imports it
before forking the next ranks (launch/virtual.py, launch/warm.py).

A server imports torch once and forks ranks from it; a module a rank imports later is
imported again in every rank. DDP's constructor imports ``torch._dynamo`` (1.3 s of
CPU on torch 2.13, as long again as torch itself), so a rank that builds DDP writes the
outermost torch modules it has that the server had not, and the next server (the rest
of a virtual world, a replay, a forcing run) imports them before it forks. The first
run has no note to read: ``modules_for`` guesses from the script's source. Nothing
depends on either but the cost: a module that fails to import in the server, or that
no rank needs, costs a little time and nothing else.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import re
import sys
from collections.abc import Iterable

FILE_NAME = "torch-imports.json"

# What in a script's source means its ranks import torch._dynamo: DDP's constructor asks
# it for its optimize mode, and FSDP, Lightning, accelerate, the transformers Trainer and
# DeepSpeed wrap DDP or import it themselves.
_BUILDS_ON_DYNAMO = re.compile(
    r"DistributedDataParallel|\bDDP\b|fully_shard|FullyShardedDataParallel|torch\.compile"
    r"|\b(?:lightning|pytorch_lightning|accelerate|transformers|deepspeed)\b"
)


def modules_for(files: Iterable[str]) -> list[str]:
    """What a first run's server imports besides torch, read from the source ``files``
    (the script and the local modules it imports)."""
    for path in files:
        with contextlib.suppress(OSError), open(path, encoding="utf-8", errors="replace") as source:
            if _BUILDS_ON_DYNAMO.search(source.read()):
                return ["torch._dynamo"]
    return []


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
