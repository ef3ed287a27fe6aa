"""lint's entry point: the files to read, the checks, and suppressions."""

from __future__ import annotations

import os
from pathlib import Path

from ncclcheck.errors import InputError

# Point-to-point calls (send/recv, batch_isend_irecv) are rank-dependent by design: each
# side's branch is paired with the other's, so lint leaves them out.
from ncclcheck.lint.findings import located
from ncclcheck.lint.project import Linter
from ncclcheck.model import Finding


def python_files(paths: list[Path]) -> list[Path]:
    """The files to check: the paths given, folders recursed (hidden and virtualenv folders skipped)."""
    files: list[Path] = []
    for path in paths:
        if not path.exists():
            raise InputError(f"{path}: no such file or directory")
        if path.is_dir():
            for root, dirs, names in os.walk(path):
                dirs[:] = sorted(
                    d for d in dirs if not d.startswith(".") and d not in ("__pycache__", "node_modules")
                )
                files += [Path(root) / n for n in sorted(names) if n.endswith(".py")]
        elif path.suffix != ".py" and not _looks_like_python(path):
            raise InputError(f"{path}: not a Python file")
        else:
            files.append(path)
    return files


def _looks_like_python(path: Path) -> bool:
    try:
        with path.open("rb") as handle:
            first = handle.readline(200)
    except OSError:
        return False
    return first.startswith(b"#!") and b"python" in first


def run_lint(paths: list[Path]) -> tuple[list[Finding], Linter]:
    linter = Linter()
    findings: list[Finding] = []
    # every file read before any is checked: a callback's module is checked knowing the
    # trainer that hands it its metrics, whichever comes first
    modules = [linter.load(path) for path in python_files(paths)]
    for module in modules:
        if module is not None:
            findings += linter.check(module)
    findings.sort(key=lambda f: (located(f).path, located(f).line, located(f).col))
    return findings, linter
