"""Ranks outside every collective while the job is quiet: what they wait on, and
whether the quiet is a hang at all.

A rank in a sleep, a socket read, a subprocess, a disk read or its own compute,
outside torch.distributed, waits on something that is not another rank. The ranks
inside a collective meanwhile wait for it, and the real job survives that as long
as the wait stays under the process group's timeout: rank 0 downloading a data set
while the others sit in a barrier is the most common set-up of all. So such a quiet
is no hang of the collectives; it becomes one only when the wait outlasts the
timeout. preflight's watchdog, doctor's rules and watch read this one picture.
"""

from __future__ import annotations

import linecache
from dataclasses import dataclass, field

from ncclcheck.evidence.stacks import ProcessStack, blocking
from ncclcheck.model import Frame

# A wait is taken as the job's failure when it comes this close to the timeout: the
# dry run stops there, before gloo's own timeout ends the waiting rank with an error of
# its own. The collective's clock starts before its record is seen, and a look at the
# stacks (py-spy, all ranks) takes a second or more on a loaded machine.
_TIMEOUT_MARGIN_S = 5.0
_TIMEOUT_MARGIN_SHARE = 0.25

# The innermost frames' files that tell what a rank outside collectives waits on,
# first match wins: (a fragment of the file path, what it is said as)
_WAIT_KINDS = (
    ("torch/utils/data/", "its DataLoader"),
    ("subprocess.py", "a subprocess"),
    ("/ssl.py", "a network read"),
    ("/socket.py", "a network read"),
    ("/http/", "a network read"),
    ("/urllib", "a network read"),
    ("/requests/", "a network read"),
    ("/huggingface_hub/", "a download"),
    ("/fsspec/", "a file system read"),
    ("/shutil.py", "a file copy"),
)


@dataclass(frozen=True)
class Standoff:
    """Who is outside every collective and who waits inside one, at one look."""

    outside: list[int]  # running in the script, not waiting on a peer
    waiting: list[int]  # inside a collective (or torch.distributed's set-up): waiting on a peer


@dataclass
class OutsideWait:
    """A quiet spell of a dry run in which ranks were outside every collective: waited
    for, not taken for a hang."""

    outside: list[int]
    waiting: list[int]
    began_s: float  # from the dry run's start: when the last record before it was written
    seconds: float = 0.0  # how long it lasted (to the next record, or to the run's end)
    over: bool = False  # a record came after it: the ranks outside went on
    stacks: dict[int, ProcessStack] = field(default_factory=dict)  # at its first look


def standoff(stacks: dict[int, ProcessStack], ended: set[int]) -> Standoff | None:
    """The ranks outside every collective, in their script, and those waiting inside one;
    None where no running rank is outside (every rank waits on a peer, or has ended: that
    quiet may be a hang), or where no rank waits and some rank has left the job."""
    outside: list[int] = []
    waiting: list[int] = []
    for rank, stack in sorted(stacks.items()):
        if rank in ended or stack.main is None or not stack.main.frames:
            continue  # ended, or in the interpreter's teardown: waits on no one and is waited on by no one
        if stack.status in ("stopped", "tracing-stop", "zombie"):
            return None  # a frozen rank is no wait on the outside world
        if blocking(stack).waits_for_peers:
            waiting.append(rank)
        else:
            outside.append(rank)
    if not outside or (not waiting and ended & stacks.keys()):
        # nobody waits on the ranks outside, and some rank has left the job: no peer is
        # held, and a wait for what the rest do next would last their whole work
        return None
    return Standoff(outside, waiting)


def waits_on(stack: ProcessStack | None) -> str:
    """What a rank outside every collective waits on, in words: what a library frame on its
    stack says ('a network read', 'a subprocess', 'its DataLoader'), else whether py-spy saw
    its thread idle (a sleep, a read, a lock: a C call holds no Python frame) or on the CPU,
    with the user's line it is at."""
    main = stack.main if stack is not None else None
    if main is None or not main.frames:
        return "something outside torch.distributed"
    for frame in main.frames:
        path = frame.file.replace("\\", "/")
        for fragment, said in _WAIT_KINDS:
            if fragment in path:
                return said
    said = "compute (on the CPU)" if main.active else "a blocking call (idle: a sleep, a read, a lock)"
    user = where_outside(stack)
    code = linecache.getline(user.file, user.line).split("  #")[0].strip() if user is not None else ""
    return f"{said}, `{code}`" if code else said


def where_outside(stack: ProcessStack | None) -> Frame | None:
    """The innermost frame of the user's own code in a rank's main thread."""
    main = stack.main if stack is not None else None
    if main is None:
        return None
    return next((f for i, f in enumerate(main.frames) if main.is_user(i)), None)


def timeout_limit(timeout_s: float) -> float:
    """The wait after which ranks in a collective are taken to fail at ``timeout_s``."""
    return timeout_s - min(_TIMEOUT_MARGIN_S, _TIMEOUT_MARGIN_SHARE * timeout_s)


def user_frames(stack: ProcessStack) -> list[Frame]:
    """The user's own frames of a rank's main thread, innermost first."""
    main = stack.main
    return [] if main is None else [f for i, f in enumerate(main.frames) if main.is_user(i)]
