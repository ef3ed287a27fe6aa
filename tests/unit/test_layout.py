"""The reference keeps telling the truth about the tree: every module is on the
architecture page's map, no module outgrows the layout, and no command matches the
text of another's messages."""

from __future__ import annotations

import ast
import re

from ..conftest import REPO

PACKAGE = REPO / "ncclcheck"
ARCHITECTURE = (REPO / "docs" / "architecture.md").read_text()


def _modules() -> list[str]:
    return sorted(
        str(path.relative_to(PACKAGE))
        for path in PACKAGE.rglob("*.py")
        if path.name not in ("__init__.py", "__main__.py") and "_playbooks" not in path.parts
    )


def test_every_module_is_on_the_architecture_map() -> None:
    missing = [m for m in _modules() if m.rsplit("/", 1)[-1].removesuffix(".py") not in ARCHITECTURE]
    assert not missing, f"docs/architecture.md does not name: {missing}"


def test_every_folder_on_the_map_exists() -> None:
    named = set(re.findall(r"^  ([a-z_]+)/ ", ARCHITECTURE, re.M))
    assert named, "the map lists the package's folders"
    assert all((PACKAGE / folder).is_dir() for folder in named), named


def test_no_module_outgrows_the_layout() -> None:
    # about 600 lines a module (the recorder, 678, and lint's project index, 660, are the
    # largest); a module past 690 is split
    big = {m: n for m in _modules() if (n := (PACKAGE / m).read_text().count("\n")) > 690}
    assert not big, big


def test_no_command_reads_the_text_of_a_finding() -> None:
    # commands and rules decide on fields (cause, reason, location), never on words
    pattern = re.compile(r"\.message\.(endswith|startswith)\(|in [a-z_]+\.message\b|\.message ==")
    offenders = [
        f"{path.relative_to(REPO)}:{number}"
        for path in PACKAGE.rglob("*.py")
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if pattern.search(line)
    ]
    assert not offenders, offenders


def test_the_cause_ids_are_named_through_the_enum() -> None:
    from ncclcheck.causes import Cause

    ids = {cause.value for cause in Cause}
    literal = [
        f"{path.relative_to(REPO)}:{node.lineno}"
        for path in PACKAGE.rglob("*.py")
        if path.name != "causes.py"
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Constant) and node.value in ids
    ]
    assert not literal, f"use Cause.X, not the id's string: {literal}"
