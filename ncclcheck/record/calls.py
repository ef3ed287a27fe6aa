"""What a recorded call is made of: its process group, its tensors' key and signature, the
library code that issued it, and the framework call it stands for (DeferredOrigin)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ncclcheck.communicates import GROUP_CREATION
from ncclcheck.frames import framework_name, is_user_code

if TYPE_CHECKING:
    pass


class _GroupCreation:
    """Stands for the sequence of new_group calls where a call names its group."""


CREATIONS = _GroupCreation()


_JOIN_MODULE = "torch.distributed.algorithms.join"


def describe_group(group: Any) -> tuple[str, list[int]]:
    import torch.distributed as dist

    if group is CREATIONS:
        return GROUP_CREATION, list(range(dist.get_world_size()))
    resolved = group if group is not None else dist.group.WORLD
    try:
        name = str(resolved.group_name)
    except Exception:  # a group object of another kind
        name = repr(resolved)
    try:
        ranks = list(dist.get_process_group_ranks(resolved))
    except Exception:
        ranks = []
    return name, ranks


def tensor_key(values: Any, key: list[Any], tensor_type: type, depth: int = 0) -> None:
    """What tells one call's tensors from another's, cheaply: shape, dtype object and
    device index (-1 on CPU), for the tensors in the arguments (lists of lists too).
    Hashable without formatting anything; the readable form is made once per key."""
    if isinstance(values, tensor_type):
        key.append(values.shape)  # type: ignore[attr-defined]
        key.append(values.dtype)  # type: ignore[attr-defined]
        key.append(values.get_device())  # type: ignore[attr-defined]
    elif isinstance(values, (list, tuple)) and depth < 2:
        for value in values:
            tensor_key(value, key, tensor_type, depth + 1)


def tensor_signature(values: Any, facts: list[tuple[tuple[int, ...], str, str]], depth: int = 0) -> None:
    """(shape, dtype, device) of the tensors in a call's arguments, as the trace writes them."""
    import torch

    if isinstance(values, torch.Tensor):
        facts.append((tuple(values.shape), str(values.dtype)[6:], values.device.type))
    elif isinstance(values, (list, tuple)) and depth < 2:
        for value in values:
            tensor_signature(value, facts, depth + 1)


@dataclass(frozen=True)
class DeferredOrigin:
    """Where the user asked for a collective a framework runs later (see record/frameworks.py)."""

    token: int  # tells origins apart in the recorder's per-call-site cache
    stack: list[list[Any]]  # the user's frames when they asked, outermost first
    described: str  # what they called: "self.log('val_loss', sync_dist=True)"
    framework: str


def libraries_on(frame: Any, outermost: Any) -> list[str]:
    """The third-party packages on a call's stack (lightning, accelerate, transformers):
    those that called the user's code or that the user called to reach the collective,
    so a finding can give the fix in that framework's terms."""
    found: set[str] = set()
    while frame is not None and frame is not outermost:
        if not is_user_code(frame.f_code):
            name = framework_name(str(frame.f_globals.get("__name__", "")).partition(".")[0])
            if name is not None:
                found.add(name)
        frame = frame.f_back
    return sorted(found)


def under_join_exit(frame: Any, outermost: Any) -> bool:
    """True for a collective that DDP's Join context issues from its ``__exit__`` on a
    rank that ran out of batches: a stand-in ("shadow") for the collective the ranks
    still training make in their step, from another line by design."""
    while frame is not None and frame is not outermost:
        if frame.f_code.co_name == "__exit__" and frame.f_globals.get("__name__") == _JOIN_MODULE:
            return True
        frame = frame.f_back
    return False


def issuer_name(frame: Any) -> str:
    """ "module:Class.function" of the library code that called a collective."""
    code = frame.f_code
    return f"{frame.f_globals.get('__name__', '?')}:{getattr(code, 'co_qualname', code.co_name)}"


def in_state(field: str, doc: str) -> Any:
    """A Recorder attribute kept in its ``state`` (hotstate.py), where the C path reads it."""
    return property(
        lambda self: getattr(self.state, field),
        lambda self, value: setattr(self.state, field, value),
        doc=doc,
    )
