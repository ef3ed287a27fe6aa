"""The rank side of the pytest plugin: runs one test function on this rank.

The plugin writes a spec (pickled: the test's module, its qualified name, the
fixture values it asked for, the parent's ``sys.path``) and launches
``ncclcheck.record.bootstrap`` through torchrun on a two-line runner script that
calls ``run(spec_path)`` here. The recorder is installed by then, so every
collective the test makes is in this rank's trace; preflight's analysis
compares the ranks' histories afterwards.
"""

from __future__ import annotations

import datetime
import importlib
import importlib.util
import inspect
import os
import pickle
import sys
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

RUNNER = '''"""Written by ncclcheck's pytest plugin: runs one test function on this rank."""
import sys

from ncclcheck.runtime.pytest_ranks import run

run(sys.argv[1])
'''


@dataclass
class TestSpec:
    module: str  # the name pytest imported the test module under
    file: str
    qualname: str  # "test_x" or "TestClass.test_x"
    kwargs: dict[str, Any] = field(default_factory=dict)  # fixture and parameter values
    sys_path: list[str] = field(default_factory=list)
    backend: str = "gloo"
    timeout_s: float = 600.0  # the process group's; the plugin's stall watch ends hangs sooner


def _import(spec: TestSpec) -> ModuleType:
    try:
        return importlib.import_module(spec.module)
    except ImportError:
        # pytest's importlib mode names modules it never put on sys.path: load the file.
        loaded = importlib.util.spec_from_file_location(Path(spec.file).stem, spec.file)
        if loaded is None or loaded.loader is None:
            raise
        module = importlib.util.module_from_spec(loaded)
        loaded.loader.exec_module(module)
        return module


def resolve(spec: TestSpec) -> Any:
    """The test callable: a module-level function, or a method on a fresh instance."""
    target: Any = _import(spec)
    parts = spec.qualname.split(".")
    for part in parts[:-1]:
        target = getattr(target, part)
    if inspect.isclass(target):
        target = target()
    return getattr(target, parts[-1])


def run(spec_path: str) -> None:
    import torch.distributed as dist

    from ncclcheck import frames

    # The runner script is not the user's code: sites and call chains start at the test.
    frames.treat_as_library(sys._getframe(1).f_code)
    with open(spec_path, "rb") as handle:
        spec: TestSpec = pickle.load(handle)
    for entry in reversed(spec.sys_path):
        if entry not in sys.path:
            sys.path.insert(0, entry)
    function = resolve(spec)
    if not dist.is_initialized():
        dist.init_process_group(spec.backend, timeout=datetime.timedelta(seconds=spec.timeout_s))
    kwargs = dict(spec.kwargs)
    params = inspect.signature(function).parameters
    if "rank" in params:
        kwargs["rank"] = dist.get_rank()
    if "world_size" in params:
        kwargs["world_size"] = dist.get_world_size()
    if "local_rank" in params:
        kwargs["local_rank"] = int(os.environ.get("LOCAL_RANK", "0"))
    function(**kwargs)
    dist.destroy_process_group()
