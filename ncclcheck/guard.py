"""Runtime guards that stay in the training loop: fail fast and alike instead of hanging.

``check_aligned`` / ``aligned_phase``: before a phase (evaluation, a checkpoint,
a logging block) every rank says how many steps it is about to take; if the
counts differ, every rank raises the same error naming the ranks and their
counts, instead of the one with more steps waiting forever at its last
collective. The exchange goes through the process group's rendezvous store
with its own timeout, not through a collective, so a rank that never arrives
is named rather than waited for::

    with aligned_phase("eval", steps=len(val_loader)):
        for batch in val_loader:
            ...

``watchdog(timeout=...)`` (see ncclcheck.runtime.watchdog) reports a collective that
waits too long, with its site and what the other ranks do, before the backend's
timeout.

Depends on torch only. (The playbooks name torch's and accelerate's own fixes
first: DistributedSampler padding, ``accelerator.gather_for_metrics``,
``torch.distributed.algorithms.Join``.)
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from ncclcheck.runtime.watchdog import Watchdog, _open_phases, watchdog

__all__ = ["AbsentRanks", "MisalignedPhase", "Watchdog", "aligned_phase", "check_aligned", "watchdog"]


class MisalignedPhase(RuntimeError):
    """The ranks are about to run a phase with different counts."""

    def __init__(self, name: str, counts: dict[int, dict[str, Any]]) -> None:
        groups: dict[str, list[int]] = {}
        for rank, values in sorted(counts.items()):
            groups.setdefault(json.dumps(values, sort_keys=True), []).append(rank)
        described = "; ".join(f"{_who(ranks)}: {values}" for values, ranks in groups.items())
        super().__init__(
            f"phase {name!r} is not aligned across ranks ({described}): the ranks with more steps "
            f"would wait forever at a collective the others never make"
        )
        self.name = name
        self.counts = counts


class AbsentRanks(RuntimeError):
    """Some ranks never reached the check (they crashed, exited, or took another path)."""

    def __init__(self, name: str, missing: list[int], timeout: float) -> None:
        super().__init__(
            f"phase {name!r}: {_who(missing)} did not arrive within {timeout:g} s "
            f"(crashed, exited early, or skipped this phase)"
        )
        self.name = name
        self.missing = missing


_calls: dict[str, int] = {}  # per phase name: how many checks this process made (the key's sequence)


def check_aligned(name: str, *, timeout: float = 60.0, **counts: Any) -> None:
    """Every rank contributes ``counts``; raises the same MisalignedPhase on every rank when
    they differ, AbsentRanks naming the ranks that did not arrive within ``timeout``."""
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_initialized():
        return  # one process: nothing to align
    world, rank = dist.get_world_size(), dist.get_rank()
    store = dist.distributed_c10d._get_default_store()
    sequence = _calls.get(name, 0)
    _calls[name] = sequence + 1
    prefix = f"ncclcheck/guard/{name}/{sequence}/"
    store.set(prefix + str(rank), json.dumps(counts, sort_keys=True, default=str))
    keys = [prefix + str(r) for r in range(world)]
    try:
        store.wait(keys, datetime.timedelta(seconds=timeout))
    except Exception:  # the store's timeout (a RuntimeError or DistStoreError by version)
        missing = [r for r in range(world) if not store.check([keys[r]])]
        raise AbsentRanks(name, missing, timeout) from None
    everyone = {r: json.loads(store.get(keys[r])) for r in range(world)}
    if any(values != everyone[0] for values in everyone.values()):
        raise MisalignedPhase(name, everyone)


@contextmanager
def aligned_phase(name: str, *, timeout: float = 60.0, **counts: Any) -> Iterator[None]:
    """``check_aligned`` on entry; the phase runs only when every rank agrees.
    While it runs, a ``watchdog`` report names it as the phase."""
    check_aligned(name, timeout=timeout, **counts)
    _open_phases.append(name)
    try:
        yield
    finally:
        _open_phases.pop()


def _who(ranks: list[int]) -> str:
    from ncclcheck.model import format_ranks

    return f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {format_ranks(ranks)}"
