"""The check-in every rank makes through torchrun's store before anything else
(preflight's bootstrap and the probe's worker): bounded, and when it fails it
knows which ranks never arrived and what the others said of themselves."""

from __future__ import annotations

import datetime
import os
import socket
from typing import Any


class CheckInFailed(Exception):
    def __init__(self, missing: list[int], present: dict[int, str]) -> None:
        super().__init__(f"ranks {missing} never checked in")
        self.missing = missing
        self.present = present  # rank -> "host|group_rank|pid"


def check_in(namespace: str, timeout_s: float) -> None:
    """Announce this rank under ``namespace`` and wait for every rank, at most ``timeout_s``."""
    env = os.environ
    world, rank = int(env["WORLD_SIZE"]), int(env["RANK"])
    prefix = namespaced(namespace)
    timeout = datetime.timedelta(seconds=timeout_s)
    store = launcher_store(timeout_s)
    store.set(prefix + str(rank), f"{socket.gethostname()}|{env.get('GROUP_RANK', '0')}|{os.getpid()}")
    try:
        store.wait([prefix + str(r) for r in range(world)], timeout)
    except Exception:
        present = {
            r: store.get(prefix + str(r)).decode() for r in range(world) if store.check([prefix + str(r)])
        }
        raise CheckInFailed([r for r in range(world) if r not in present], present) from None


def namespaced(namespace: str) -> str:
    """The key prefix of ``namespace`` in this run: one per run and restart, so that a
    restarted job does not see the last one's keys."""
    env = os.environ
    run = f"{env.get('TORCHELASTIC_RUN_ID', 'none')}/{env.get('TORCHELASTIC_RESTART_COUNT', '0')}"
    return f"ncclcheck/{run}/{namespace}/"


def launcher_store(timeout_s: float, address: str | None = None, port: str | None = None) -> Any:
    """A client of torchrun's store (MASTER_ADDR:MASTER_PORT unless given): never a
    collective, so a rank that does not come makes the others wait at most ``timeout_s``."""
    from torch.distributed import TCPStore

    env = os.environ
    timeout = datetime.timedelta(seconds=timeout_s)
    host, number = address or env["MASTER_ADDR"], int(port or env["MASTER_PORT"])
    return TCPStore(host, number, is_master=False, timeout=timeout)
