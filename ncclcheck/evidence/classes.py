"""Stack classes: ranks whose stacks are identical where it matters, merged (as LLNL's
STAT does for MPI jobs), with what tells apart ranks that wait at the same line."""

from __future__ import annotations

import ast
import os
from dataclasses import dataclass, field

from ncclcheck.communicates import DEFERRED_FRAMES, DeferredFrame, issued_at
from ncclcheck.evidence import device
from ncclcheck.evidence.stacks import Blocking, ProcessStack, blocking, issuer_advice
from ncclcheck.frames import framework_name
from ncclcheck.model import Frame
from ncclcheck.source import reading
from ncclcheck.wording import relative, who


@dataclass
class StackClass:
    """Ranks whose relevant stacks are identical."""

    ranks: list[int]
    blocking: str  # all_reduce, barrier, DataLoader, sleep, compute, ...
    in_collective: bool
    frames: list[Frame]  # the user's frames, outermost first
    # per rank: what tells apart ranks waiting at the same line (see rank_state)
    states: dict[int, dict[str, str]] = field(default_factory=dict)
    # a framework running a collective for an earlier call of the user's (see DEFERRED_FRAMES)
    deferred: DeferredFrame | None = None
    libraries: list[str] = field(default_factory=list)  # third-party packages on the stack
    advice: str | None = None  # what to do about a collective library code issued
    # NCCL's shape: the ranks wait at a device sync point (".item() at train.py:45"), and
    # ``frames`` end at the collective enqueued before it (evidence/device.py)
    sync: str | None = None
    # the collectives other threads of these ranks wait in at the same time (Blocking.concurrent)
    concurrent: tuple[str, ...] = ()

    @property
    def site(self) -> Frame | None:
        return self.frames[-1] if self.frames else None


def _deferred_in(stack: ProcessStack) -> DeferredFrame | None:
    main = stack.main
    for frame in main.frames if main else []:
        path = frame.file.replace("\\", "/")
        for known in DEFERRED_FRAMES:
            # py-spy qualifies methods with their class: _ResultMetric.compute
            if path.endswith(known.file) and frame.function.rsplit(".", 1)[-1] == known.function:
                return known
    return None


def _libraries(stack: ProcessStack) -> list[str]:
    """Third-party packages on the main thread's stack (lightning, transformers), named
    after their folder in site-packages: the playbooks give some fixes in their terms."""
    main = stack.main
    found: set[str] = set()
    for index, frame in enumerate(main.frames if main else []):
        path = frame.file.replace("\\", "/")
        marker = path.rfind("-packages/")
        if main is not None and not main.is_user(index) and marker >= 0:
            name = framework_name(path[marker + len("-packages/") :].split("/", 1)[0])
            if name is not None and not name.endswith(".py"):
                found.add(name)
    return sorted(found)


def merge_stacks(
    stacks: dict[int, ProcessStack], waits: dict[int, Waiting] | None = None
) -> list[StackClass]:
    """``waits``: each rank's ``waiting_at``, where the caller has it already."""
    classes: dict[tuple[object, ...], StackClass] = {}
    for rank, stack in sorted(stacks.items()):
        waiting = waits[rank] if waits is not None and rank in waits else waiting_at(stack)
        what, in_collective, frames = waiting.what, waiting.blocking.waits_for_peers, waiting.frames
        deferred = _deferred_in(stack) if in_collective else None
        concurrent = waiting.blocking.concurrent
        key = (what, tuple((f.file, f.line, f.function) for f in frames), deferred, waiting.sync, concurrent)
        if key not in classes:
            classes[key] = StackClass(
                [],
                what,
                in_collective,
                frames,
                deferred=deferred,
                libraries=_libraries(stack),
                advice=issuer_advice(stack),
                sync=waiting.sync,
                concurrent=concurrent,
            )
        classes[key].ranks.append(rank)
        if in_collective:
            # at a sync point, the group is the enqueued collective's, at its own line
            classes[key].states[rank] = rank_state(
                stack, what, frames[-1] if waiting.sync and frames else None
            )
    return sorted(classes.values(), key=lambda c: c.ranks[0])


@dataclass(frozen=True)
class Waiting:
    """What a rank waits in and the user's frames that lead to it, outermost first. At a
    device sync point, the collective enqueued before it, found in the source, stands
    for the wait (``what`` its op, ``frames`` ending at its line), and ``sync`` says
    where the rank really is."""

    blocking: Blocking
    what: str
    frames: list[Frame]
    sync: str | None = None


def waiting_at(stack: ProcessStack) -> Waiting:
    where = blocking(stack)
    frames = list(reversed(user_frames(stack)))
    if where.sync is None or not frames:
        return Waiting(where, where.what, frames)
    at = f"{where.sync} at {relative(frames[-1].file, os.getcwd())}:{frames[-1].line}"
    enqueued = device.enqueued_before(frames)
    if enqueued is None:
        read = os.path.isfile(frames[-1].file)
        said = (
            "with no collective before it in the source"
            if read
            else "the collective before it unknown: its source is not on this host"
        )
        return Waiting(where, where.what, frames, f"{at}, {said}")
    return Waiting(where, enqueued.op, enqueued.frames, f"{at}, after {enqueued.what}")


def user_frames(stack: ProcessStack) -> list[Frame]:
    """The user's frames of the main thread, innermost first."""
    main = stack.main
    return [f for i, f in enumerate(main.frames) if main.is_user(i)] if main else []


def user_frames_and_the_call_out(stack: ProcessStack) -> list[Frame]:
    """The user's frames of the main thread, innermost first, led by the library function the
    innermost of them called (``engine.save_checkpoint()``): the phase the user's code is in
    may be a library's entry point, named there and nowhere in the user's frames."""
    main = stack.main
    if main is None:
        return []
    first_user = next((i for i in range(len(main.frames)) if main.is_user(i)), None)
    if not first_user:  # no user frame, or the innermost frame is the user's own
        return user_frames(stack)
    return [main.frames[first_user - 1], *user_frames(stack)]


CREATED_GROUP = "name of the group being created"


def after_loop(target: str, function: str, line: int) -> str:
    """The state key of a counter a finished loop left behind (``step`` of ``for step, batch
    in enumerate(loader)``): ranks that wait at one line with different last values ran
    that loop a different number of times."""
    return f"{target} after the loop at line {line} of {function}()"


def rank_state(stack: ProcessStack, op: str, site: Frame | None = None) -> dict[str, str]:
    """What tells apart ranks that wait at the same line, from py-spy's locals: the
    process group the user's call passes (named after the variable that holds it)
    and the values of the loop variables around each user frame. Ranks at one line
    with different values are at different points of their collective sequences."""
    main = stack.main
    if main is None or not main.locals:
        return {}
    user = [  # innermost first
        (f, values)
        for i, (f, values) in enumerate(zip(main.frames, main.locals, strict=False))
        if main.is_user(i)
    ]
    state: dict[str, str] = {}
    for frame, values in zip(main.frames, main.locals, strict=False):
        # torch names a new group by a count of new_group calls on that rank
        if frame.function.endswith("_new_group_with_tag") and "group_name" in values:
            state[CREATED_GROUP] = values["group_name"]
    if user:
        innermost, site_locals = user[0]
        site = site or innermost
        group = reading.group_argument(site.file, site.line, op)
        if group is None:
            state["process group"] = "the default group"
        else:
            text = site_locals.get(group.id) if isinstance(group, ast.Name) else None
            if text is None:
                state["process group"] = ast.unparse(group)
            elif text == "None":
                state["process group"] = "the default group"
            else:
                # an object: name it after the outermost user variable holding the same one
                holders = [n for _f, values in reversed(user) for n, t in values.items() if t == text]
                state["process group"] = holders[0] if holders else ast.unparse(group)
    for frame, values in user:
        for loop in reading.enclosing_loops(frame.file, frame.line):
            for target in reading.loop_targets(loop):
                text = values.get(target)
                if text is not None and " at 0x" not in text:  # addresses differ by process
                    state[f"{target} in {frame.function}()"] = text
        for finished in reading.loops_before(frame.file, frame.line):
            for target in reading.loop_targets(finished):
                text = values.get(target)
                if text is not None and text.lstrip("-").isdigit():  # a counter, not a batch
                    state[after_loop(target, frame.function, finished.lineno)] = text
    return state


def state_split(cls: StackClass) -> tuple[list[list[int]], list[str]] | None:
    """Ranks of one class grouped by the state values that differ among them."""
    if len(cls.states) < 2:
        return None
    shared = set.intersection(*(set(state) for state in cls.states.values()))
    differing = sorted(k for k in shared if len({state[k] for state in cls.states.values()}) > 1)
    if not differing:
        return None
    groups: dict[tuple[str, ...], list[int]] = {}
    for rank, state in sorted(cls.states.items()):
        groups.setdefault(tuple(state[k] for k in differing), []).append(rank)
    parts = sorted(groups.values(), key=lambda ranks: (len(ranks), ranks[0]))
    lines = [
        f"{who(ranks)}: " + ", ".join(f"{k} = {v}" for k, v in zip(differing, values, strict=True))
        for values, ranks in groups.items()
    ]
    return parts, lines


def unplaced_classes(stacks: list[tuple[str, ProcessStack]]) -> list[str]:
    """Stacks of no known rank ((label, stack)), merged into classes and said: where each
    class waits (at a device sync point, the collective enqueued before it, where the
    source shows one) and which dumps it holds. No rank numbers: none is known."""
    by_index = {index: stack for index, (_, stack) in enumerate(stacks)}
    waits = {index: waiting_at(stack) for index, stack in by_index.items()}
    said = []
    for found in merge_stacks(by_index, waits):
        labels = ", ".join(stacks[i][0] for i in found.ranks)
        site = found.site
        where = (
            f" at {relative(site.file, os.getcwd())}:{site.line} in {site.function}"
            if site and site.line
            else ""
        )
        if found.sync and found.blocking.startswith("a device sync point"):
            waits_in, where = f"a device sync point: {found.sync}", ""  # the sync names its site
        elif found.sync:
            waits_in = f"{found.blocking} (waits at a device sync point: {found.sync})"
        else:
            waits_in = found.blocking
        count = f"{len(found.ranks)} dump{'s' if len(found.ranks) > 1 else ''}"
        said.append(f"{count} ({labels}): {waits_in}{where}")
    return said


def libraries_waited_in(stacks: list[ProcessStack]) -> list[tuple[str, str]]:
    """The libraries that issue collectives (communicates.ISSUERS) on any thread of these
    stacks, each once with what it asks of every rank: what a stack of no known rank can
    still say about the cause's family, without naming one."""
    found: dict[str, str] = {}
    for stack in stacks:
        for thread in stack.threads:
            for frame in thread.frames:
                issued = issued_at(frame.file, frame.function)
                if issued is not None and issued[1] and issued[1] not in found.values():
                    found[issued[0]] = issued[1]
    return list(found.items())
