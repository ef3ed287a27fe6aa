"""NCCL's own trace of the collectives it launched (NCCL_DEBUG=INFO with
NCCL_DEBUG_SUBSYS=COLL), read from a job log:

    node1:52937:52937 [0] NCCL INFO AllReduce: opCount 1e7 sendbuff 0x7f.. recvbuff 0x7f..
        count 18816 datatype 7 op 0 root 0 comm 0x5595.. [nranks=16] stream 0x5595..

``opCount`` (hexadecimal) counts the operations launched on one communicator; the
line names the process (host, pid) and the communicator's address in it, not the
rank. The rank comes from the communicator's init line in the same process:

    node1:52937:52937 [0] NCCL INFO comm 0x5595.. rank 3 nRanks 16 nNodes 2 ...
    node1:52937:52937 [0] NCCL INFO ncclCommInitRank comm 0x5595.. rank 3 nranks 16 ... Init COMPLETE

A rank's rank in a communicator is its global rank only in the communicator of every
rank (the default process group's), so only a communicator whose size is the job's
largest is compared across ranks. What a launch line says: the rank launched that
operation; not that it completed, nor where the rank is now.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from ncclcheck.evidence.aftermath import Issued, Source

_WHO = r"(?P<host>[\w.\-]+):(?P<pid>\d+):\d+ \[(?P<device>\d+)\](?: \d+)? NCCL INFO "
_LAUNCH = re.compile(
    _WHO
    + r"(?P<op>[A-Za-z]+): opCount (?P<count>[0-9a-fA-F]+) .*?\bcount (?P<numel>\d+) datatype (?P<dtype>\d+)"
    r".*?\bcomm (?P<comm>0x[0-9a-fA-F]+) \[nranks=(?P<nranks>\d+)\]"
)
_INIT = re.compile(
    _WHO + r"(?:ncclCommInitRank(?:Config)?:? )?comm (?P<comm>0x[0-9a-fA-F]+) "
    r"rank (?P<rank>\d+) n[Rr]anks (?P<nranks>\d+)"
)
KEEP = 16  # launches kept per process and communicator: the last ones are what matter


@dataclass
class CollTrace:
    """What one file's COLL lines say: launches by (host, pid, communicator), and the
    rank and size of each communicator by its init line."""

    launches: dict[tuple[str, int, str], list[Issued]] = field(default_factory=dict)
    sizes: dict[tuple[str, int, str], int] = field(default_factory=dict)
    ranks: dict[tuple[str, int, str], int] = field(default_factory=dict)
    devices: dict[tuple[str, int], int] = field(default_factory=dict)  # (host, pid) -> its [device]

    def read(self, line: str, source: Source) -> bool:
        """Take one line (a rank's prefix removed); True when it was NCCL's trace."""
        if "NCCL INFO" not in line:
            return False
        if " opCount " in line and (launch := _LAUNCH.search(line)):
            key = (launch["host"], int(launch["pid"]), launch["comm"])
            self.sizes[key] = int(launch["nranks"])
            self.devices[key[:2]] = int(launch["device"])
            kept = self.launches.setdefault(key, [])
            shape = f"{launch['numel']} elements of NCCL type {launch['dtype']}"
            kept.append(Issued(int(launch["count"], 16), launch["op"], shape, source))
            del kept[:-KEEP]
            return True
        if " rank " in line and (init := _INIT.search(line)):
            key = (init["host"], int(init["pid"]), init["comm"])
            self.ranks[key] = int(init["rank"])
            self.sizes[key] = int(init["nranks"])
            return True
        return False

    def by_rank(self, prefixed: dict[tuple[str, int], int]) -> dict[int, list[Issued]]:
        """rank -> its launches on the communicator of every rank (the largest seen), for the
        processes whose rank an init line or a torchrun prefix (``prefixed``) gives."""
        if not self.launches:
            return {}
        world = max(self.sizes.values())
        every_rank = [key for key in self.launches if self.sizes.get(key) == world]
        per_process: dict[tuple[str, int], list[tuple[str, int, str]]] = {}
        for key in every_rank:
            per_process.setdefault(key[:2], []).append(key)
        found: dict[int, list[Issued]] = {}
        for keys in per_process.values():
            if len(keys) > 1:
                continue  # two communicators of every rank in one process: which pairs with which is unknown
            key = keys[0]
            rank = self.ranks.get(key, prefixed.get(key[:2]))
            if rank is not None:
                found[rank] = self.launches[key]
        return found

    def of_no_known_rank(self, placed: dict[int, list[Issued]]) -> dict[str, list[Issued]]:
        """The launches on the communicator of every rank of processes whose rank nothing
        gives (no init line, no prefix), each named by its host, pid and device. NCCL's
        "[d]" is the device, the local rank on its node at most: never taken for a rank."""
        if not self.launches:
            return {}
        world = max(self.sizes.values())
        taken = {id(launches) for launches in placed.values()}
        per_process: dict[tuple[str, int], list[tuple[str, int, str]]] = {}
        for key in self.launches:
            if self.sizes.get(key) == world:
                per_process.setdefault(key[:2], []).append(key)
        found: dict[str, list[Issued]] = {}
        for (host, pid), keys in per_process.items():
            if len(keys) == 1 and id(self.launches[keys[0]]) not in taken:
                found[f"{host} pid {pid} (device [{self.devices.get((host, pid), '?')}])"] = self.launches[
                    keys[0]
                ]
        return found

    @property
    def world(self) -> int:
        return max(self.sizes.values(), default=0)
