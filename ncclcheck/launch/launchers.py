"""Who starts a script's ranks, and how preflight does it the same way
(``preflight --launcher``): torchrun (launch/torchrun.py runs the script under it), or
the script itself with torch.multiprocessing (record/spawned.py runs it once and
records every rank it starts)."""

from __future__ import annotations

import ast
from pathlib import Path

AUTO, TORCHRUN, SPAWN = "auto", "torchrun", "spawn"
LAUNCHERS = (AUTO, TORCHRUN, SPAWN)
# the functions of torch.multiprocessing that start ranks in a script
_STARTERS = frozenset({"spawn", "start_processes"})


def own_starter(path: Path) -> tuple[str, int] | None:
    """Where the script starts its own ranks (``mp.spawn(main, nprocs=4)``, ``from
    torch.multiprocessing import spawn``): the call as written and its line, or None.
    Read from the source, nothing imported: a script that starts them from another
    module is caught at run time instead (its ranks refuse to start more, and
    preflight runs it again with the spawn launcher)."""
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except (OSError, SyntaxError, UnicodeDecodeError):
        return None
    modules: set[str] = set()  # names bound to torch.multiprocessing
    functions: set[str] = set()  # names bound to its spawn / start_processes
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            modules |= {a.asname or a.name for a in node.names if a.name == "torch.multiprocessing"}
        elif isinstance(node, ast.ImportFrom) and node.module in ("torch.multiprocessing", "torch"):
            for alias in node.names:
                if node.module == "torch" and alias.name == "multiprocessing":
                    modules.add(alias.asname or alias.name)
                elif node.module == "torch.multiprocessing" and alias.name in _STARTERS:
                    functions.add(alias.asname or alias.name)
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        if isinstance(func, ast.Name) and func.id in functions:
            return ast.unparse(func), node.lineno
        if isinstance(func, ast.Attribute) and func.attr in _STARTERS:
            owner = ast.unparse(func.value)
            if owner in modules or owner == "torch.multiprocessing":
                return ast.unparse(func), node.lineno
    return None
