"""The data every part of ncclcheck passes around: plain dataclasses.

The report's JSON shape is docs/contract.md's; ``Report.to_dict`` writes it and
``Report.from_dict`` reads it back, and ``schemas/report.schema.json`` states it
for tools that consume it. Nothing else in ncclcheck defines a report shape.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from enum import Enum
from typing import Any

from ncclcheck import __version__
from ncclcheck.causes import Cause


class TextEnum(str, Enum):
    """An enum whose members are their text: said and compared as written (in a trace,
    an environment variable, a command line), on every Python version."""

    def __str__(self) -> str:
        return str(self.value)

    def __format__(self, spec: str) -> str:
        return format(str(self.value), spec)


class Verdict(str, Enum):
    """What a diagnosing command concluded about the job as a whole."""

    ALIGNED = "aligned"
    MISALIGNED = "misaligned"
    HANG = "hang"
    PROGRESSING = "progressing"  # doctor: every rank moved between two looks
    # doctor: ranks wait in a collective for ranks outside every collective, which wait on
    # something that is not a rank (a download, a disk, a subprocess): no hang of the
    # collectives unless that wait outlasts the process group's timeout
    WAITING = "waiting"
    CRASH = "crash"
    ERROR = "error"
    # preflight: stopped (a signal, its time limit) before its budget was spent with
    # nothing found in what it ran: not a pass, so never "aligned"
    INCOMPLETE = "incomplete"
    # preflight: nothing wrong in what ran, but parts of the script that reach collectives
    # did not run (a periodic action that never fired): not "aligned" for what did not run
    PARTIAL = "partial"


INCOMPLETE_EXIT = 4  # docs/contract.md: ran, found nothing, but did not finish
PARTIAL_EXIT = 5  # docs/contract.md: ran to its budget, found nothing, but did not run all


class Severity(str, Enum):
    ERROR = "error"
    WARNING = "warning"


class RankStatus(str, Enum):
    """Where a rank was when the command looked last."""

    EXITED = "exited"
    RUNNING = "running"
    IN_COLLECTIVE = "in-collective"
    STUCK = "stuck"
    UNSEEN = "unseen"  # doctor --from: the files hold nothing of this rank, so nothing is said of it


@dataclass(frozen=True)
class Frame:
    """One frame of a Python stack: where a rank was, or where it called from."""

    file: str
    line: int
    function: str

    @property
    def site(self) -> str:
        return f"{self.file}:{self.line}"

    def __str__(self) -> str:
        return f"{self.site} in {self.function}"

    def to_dict(self) -> dict[str, Any]:
        return {"file": self.file, "line": self.line, "function": self.function}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Frame:
        return cls(file=str(data["file"]), line=int(data["line"]), function=str(data["function"]))


@dataclass(frozen=True)
class Deferred:
    """A collective a framework ran later for a call of the user's: Lightning reduces a
    value logged with ``self.log(..., sync_dist=True)`` when the epoch ends."""

    by: str  # "Lightning"
    request: str  # what the user called: "self.log('val_loss', sync_dist=True)"
    ran_in: Frame | None  # the user's innermost frame when it ran (trainer.fit's line)

    def to_dict(self) -> dict[str, Any]:
        return {
            "by": self.by,
            "request": self.request,
            "ran_in": self.ran_in.to_dict() if self.ran_in else None,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Deferred:
        ran_in = data.get("ran_in")
        return cls(str(data["by"]), str(data["request"]), Frame.from_dict(ran_in) if ran_in else None)


# Collectives whose tensors may differ in size from rank to rank when used right:
# all_to_all's splits (MoE token routing), and the object collectives, which pickle
# whatever each rank holds.
OBJECT_OPS = frozenset(
    {
        "all_gather_object",
        "gather_object",
        "broadcast_object_list",
        "scatter_object_list",
        "send_object_list",
        "recv_object_list",
    }
)
SIZE_FREE_OPS = OBJECT_OPS | {"all_to_all", "all_to_all_single"}
# gather(tensor, gather_list, dst) and scatter(tensor, scatter_list, src): only the root
# passes the list, whose tensors must each have ``tensor``'s shape and dtype, so the
# first tensor a rank recorded stands for the call whatever the arguments' order.
ROOT_LIST_OPS = frozenset({"gather", "scatter"})


@dataclass(slots=True)  # a long dry run holds one per recorded call
class CollectiveCall:
    """One collective (or p2p operation) as a rank issued it, recorded before it ran.

    ``seq`` counts calls per process group on that rank, so the n-th call of a
    group on one rank pairs with the n-th call of the same group on the others.
    ``site`` is the first frame in the user's own code; ``user_stack`` is the
    chain of the user's frames, outermost first, ending at ``site``.
    """

    rank: int
    seq: int
    op: str
    group: str
    group_ranks: list[int]
    shapes: list[list[int]] = field(default_factory=list)
    dtypes: list[str] = field(default_factory=list)
    device: str = "cpu"
    async_op: bool = False
    phase: str = "train"
    site: Frame | None = None
    user_stack: list[Frame] = field(default_factory=list)
    time: float = 0.0
    source: str = "python"  # "python" (wrapped call), "ddp" (comm hook), "deferred" (see via)
    n: int = 0  # this rank's running count of calls, all groups together
    position: dict[str, Any] | None = None  # the loader batch being processed: loader, pass, batch
    peer: int | None = None  # p2p only
    # A framework ran it later on the user's behalf; ``site`` is then where they asked for it.
    later: Deferred | None = None
    libraries: list[str] = field(default_factory=list)  # third-party packages on its stack
    # "module:function" of the library code that called the collective (SyncBatchNorm's
    # forward, a metric's gather); None when the user's own code called it.
    issuer: str | None = None
    # A stand-in DDP's Join context makes on a rank that ran out of batches, for the
    # collectives the others make in their steps: it pairs with them from another line.
    shadow: bool = False

    @classmethod
    def seen_on_stack(
        cls, rank: int, op: str, site: Frame | None, user_stack: list[Frame], libraries: list[str]
    ) -> CollectiveCall:
        """A call a rank waits in, as its stack dump shows it (doctor): which group, and
        which call of that group it is, a stack does not show (``group`` empty, ``seq`` -1)."""
        return cls(
            rank=rank,
            seq=-1,
            op=op,
            group="",
            group_ranks=[],
            site=site,
            user_stack=user_stack,
            libraries=libraries,
        )

    @property
    def site_text(self) -> str:
        return self.site.site if self.site else "?"

    @property
    def signature(self) -> tuple[str, tuple[tuple[int, ...], ...], tuple[str, ...]]:
        """What must agree across ranks for the call to pair correctly."""
        if self.op in SIZE_FREE_OPS:
            return (self.op, (), () if self.op in OBJECT_OPS else tuple(self.dtypes))
        if self.op in ROOT_LIST_OPS:  # the list is the root's alone: the tensor must agree
            return (self.op, tuple(tuple(s) for s in self.shapes[:1]), tuple(self.dtypes[:1]))
        return (self.op, tuple(tuple(s) for s in self.shapes), tuple(self.dtypes))

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["site"] = self.site.to_dict() if self.site else None
        data["user_stack"] = [f.to_dict() for f in self.user_stack]
        data["later"] = self.later.to_dict() if self.later else None
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CollectiveCall:
        values = {f.name: data[f.name] for f in fields(cls) if f.name in data}
        values["site"] = Frame.from_dict(data["site"]) if data.get("site") else None
        values["user_stack"] = [Frame.from_dict(f) for f in data.get("user_stack", [])]
        values["later"] = Deferred.from_dict(data["later"]) if data.get("later") else None
        return cls(**values)


EvalBatches = int | dict[str, int] | None


@dataclass
class RankState:
    """One rank as a report shows it (docs/contract.md's ``ranks`` entries)."""

    rank: int
    host: str = ""
    pid: int | None = None
    exit_code: int | None = None
    phase: str | None = None
    collectives: int = 0
    eval_batches: EvalBatches = None
    state: RankStatus = RankStatus.RUNNING
    where: str | None = None

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["state"] = self.state.value
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RankState:
        values = {f.name: data[f.name] for f in fields(cls) if f.name in data}
        values["state"] = RankStatus(data.get("state", RankStatus.RUNNING.value))
        return cls(**values)


@dataclass(frozen=True)
class SourceLocation:
    """Where lint found a finding in the source, for its text and SARIF outputs and for
    suppression comments: the collective's own place, and in the checked file the test
    that decides and the call that leads there. Not part of the report's JSON."""

    path: str
    line: int
    col: int
    condition_line: int | None = None  # the if that decides, where there is one
    call_line: int | None = None  # the call in the checked file that leads to the collective
    checked_path: str = ""  # the checked file (the condition and the call are there)
    label: str = ""  # the communicating call as lint names it (`self.log(sync_dist=True)`)


@dataclass
class Finding:
    """One diagnosed problem, named by a cause id of the catalogue."""

    cause: Cause
    severity: Severity
    message: str
    ranks: list[int] = field(default_factory=list)
    absent_ranks: list[int] = field(default_factory=list)
    op: str | None = None
    site: str | None = None
    evidence: list[str] = field(default_factory=list)
    fix: str = ""
    playbook: str = ""
    location: SourceLocation | None = None  # lint's findings: where in the source

    def __post_init__(self) -> None:
        self.cause = Cause(self.cause)  # an id no playbook has is an error, not an empty fix
        if not self.playbook:
            self.playbook = self.cause.value

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        del data["location"]  # lint's own detail: its JSON report says the site and column
        data["cause"] = self.cause.value
        data["severity"] = self.severity.value
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Finding:
        values = {f.name: data[f.name] for f in fields(cls) if f.name in data}
        values["severity"] = Severity(data["severity"])
        return cls(**values)


@dataclass
class Report:
    """What a diagnosing command hands to a renderer (console, JSON, HTML)."""

    command: str
    verdict: Verdict
    world_size: int
    ranks: list[RankState] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    # Free-form facts for people (where the dry run stopped, counts per phase);
    # tools must not depend on its keys.
    summary: dict[str, Any] = field(default_factory=dict)
    tool: str = "ncclcheck"
    version: str = __version__

    @property
    def has_errors(self) -> bool:
        return any(f.severity is Severity.ERROR for f in self.findings) or self.verdict in (
            Verdict.MISALIGNED,
            Verdict.HANG,
            Verdict.CRASH,
        )

    @property
    def exit_code(self) -> int:
        if self.has_errors:
            return 1
        if self.verdict is Verdict.INCOMPLETE:
            return INCOMPLETE_EXIT
        return PARTIAL_EXIT if self.verdict is Verdict.PARTIAL else 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "tool": self.tool,
            "version": self.version,
            "command": self.command,
            "verdict": self.verdict.value,
            "world_size": self.world_size,
            "ranks": [r.to_dict() for r in self.ranks],
            "findings": [f.to_dict() for f in self.findings],
            "summary": self.summary,
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Report:
        return cls(
            tool=data.get("tool", "ncclcheck"),
            version=data.get("version", __version__),
            command=data["command"],
            verdict=Verdict(data["verdict"]),
            world_size=int(data["world_size"]),
            ranks=[RankState.from_dict(r) for r in data.get("ranks", [])],
            findings=[Finding.from_dict(f) for f in data.get("findings", [])],
            summary=dict(data.get("summary", {})),
        )

    @classmethod
    def from_json(cls, text: str) -> Report:
        return cls.from_dict(json.loads(text))


def format_ranks(ranks: list[int]) -> str:
    """``[0, 1, 2, 3, 5]`` -> ``"0-3,5"``: how people write rank sets."""
    if not ranks:
        return ""
    ordered = sorted(set(ranks))
    parts: list[str] = []
    start = prev = ordered[0]
    for value in ordered[1:]:
        if value == prev + 1:
            prev = value
            continue
        parts.append(str(start) if start == prev else f"{start}-{prev}")
        start = prev = value
    parts.append(str(start) if start == prev else f"{start}-{prev}")
    return ",".join(parts)
