"""Which frames are the user's own code: the first frame outside the standard
library, installed packages (torch, accelerate, lightning, transformers, ...)
and ncclcheck itself. Decided once per code object, so the hot path is one dict
lookup per frame."""

from __future__ import annotations

import importlib.util
import os
import site
import sys
import sysconfig
from types import CodeType, FrameType
from typing import Any

import ncclcheck


def _library_roots() -> tuple[str, ...]:
    roots: set[str] = set()
    for key in ("stdlib", "platstdlib", "purelib", "platlib"):
        path = sysconfig.get_paths().get(key)
        if path:
            roots.add(os.path.realpath(path))
    for path in [*site.getsitepackages(), site.getusersitepackages()]:
        roots.add(os.path.realpath(path))
    roots.add(os.path.realpath(os.path.dirname(ncclcheck.__file__)))
    for name in (
        "torch",
        "accelerate",
        "lightning",
        "pytorch_lightning",
        "transformers",
        "torchmetrics",
        "deepspeed",
    ):
        module = sys.modules.get(name)
        module_file = getattr(module, "__file__", None) if module is not None else None
        if module_file:
            roots.add(os.path.realpath(os.path.dirname(module_file)))
    return tuple(sorted(root + os.sep for root in roots))


_ROOTS = _library_roots()
_USER_ROOTS: tuple[str, ...] = ()
_IS_USER: dict[CodeType, bool] = {}


def add_user_root(folder: str) -> None:
    """Count ``folder`` as user code even inside site-packages (the script's own folder)."""
    global _USER_ROOTS
    _USER_ROOTS = (*_USER_ROOTS, os.path.realpath(folder) + os.sep)
    _IS_USER.clear()


def treat_as_library(code: CodeType) -> None:
    """Leave ``code`` out of the user's frames (a runner ncclcheck wrote into a user folder)."""
    _IS_USER[code] = False


def is_user_file(filename: str) -> bool:
    """The deepest root that holds the file decides: the script's folder inside
    site-packages is the user's, a virtualenv inside the script's folder
    (project/train.py next to project/.venv) is not."""
    if filename.startswith("<"):
        return False
    real = os.path.realpath(filename)
    library = max((len(root) for root in _ROOTS if real.startswith(root)), default=-1)
    user = max((len(root) for root in _USER_ROOTS if real.startswith(root)), default=-1)
    return library < 0 or user > library


def installed_origin(path: str) -> str | None:
    """The file of the installed module a relative path printed below site-packages starts
    with (py-spy's ``torch/nn/modules/linear.py``: torch's ``__init__.py``), or None where
    no module of that name is installed here."""
    first = path.replace("\\", "/").split("/", 1)[0].removesuffix(".py")
    if not first.isidentifier():
        return None
    try:
        spec = importlib.util.find_spec(first)
    except (ImportError, ValueError):
        return None
    return spec.origin if spec is not None else None


def is_user_code(code: CodeType) -> bool:
    known = _IS_USER.get(code)
    if known is None:
        known = _IS_USER[code] = is_user_file(code.co_filename)
    return known


_PATCHED_METHOD_CODES: set[CodeType] = set()


def patched_method(function: Any) -> Any:
    """Mark ``function`` as ncclcheck's replacement of a torch method, which another of
    ncclcheck's replacements may call in turn: past_own_wrappers looks through it."""
    _PATCHED_METHOD_CODES.add(function.__code__)
    return function


def past_own_wrappers(frame: FrameType | None) -> FrameType | None:
    """``frame`` or its nearest caller that is not one of ncclcheck's replacements of a
    torch method: the caller of Tensor.item when --perturb's and rooted.py's are
    installed one over the other, in whichever order."""
    while frame is not None and frame.f_code in _PATCHED_METHOD_CODES:
        frame = frame.f_back
    return frame


def first_user_frame(frame: FrameType | None) -> FrameType | None:
    """``frame`` or the nearest caller of it that is the user's own code."""
    while frame is not None and not is_user_code(frame.f_code):
        frame = frame.f_back
    return frame


def user_frames(frame: FrameType | None, limit: int = 24) -> list[tuple[str, int, str]]:
    """The user's frames from ``frame`` outwards, innermost first: (file, line, function)."""
    found: list[tuple[str, int, str]] = []
    while frame is not None and len(found) < limit:
        code = frame.f_code
        if is_user_code(code):
            found.append((code.co_filename, frame.f_lineno, code.co_name))
        frame = frame.f_back
    return found


# Packages that are not a training framework, on a stack: a finding names the others
# (lightning, accelerate, transformers) to give the fix in their terms.
NOT_FRAMEWORKS = frozenset({"torch", "ncclcheck", "__main__", "typing_extensions"})
_FRAMEWORK_ALIASES = {"pytorch_lightning": "lightning"}


def framework_name(package: str) -> str | None:
    """The framework a top-level package name stands for, or None for torch and the like."""
    if not package or package in NOT_FRAMEWORKS or package in sys.stdlib_module_names:
        return None
    return _FRAMEWORK_ALIASES.get(package, package)


def shown_path(path: str) -> str:
    """A path as reports show it: relative when under the current folder, else whole."""
    try:
        relative = os.path.relpath(path)
    except ValueError:  # another drive
        return path
    return path if relative.startswith("..") else relative
