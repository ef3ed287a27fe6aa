"""The reference keeps telling the truth about the tree: every module is on the
architecture page's map, the imports go down the layers with no cycle, private names
stay in their module, and no command matches the text of another's messages."""

from __future__ import annotations

import ast
import re
from pathlib import Path

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


# The layers, bottom first: a module imports only from its own layer or those below
# it. Top-level modules are placed one by one (the vocabulary every part shares is at
# the bottom; the entry points at the top); a package is placed whole.
LAYERS: list[tuple[str, ...]] = [
    (
        "ncclcheck",
        "ncclcheck.causes",
        "ncclcheck.errors",
        "ncclcheck.model",
        "ncclcheck.communicates",
        "ncclcheck.catalogue",
        "ncclcheck.settings",
        "ncclcheck.frames",
        "ncclcheck.wording",
    ),
    ("ncclcheck.source",),  # reading the user's source (ast), nothing run
    ("ncclcheck.lint",),  # collectives not every rank reaches, from source alone
    ("ncclcheck.record",),  # inside each rank of a dry run
    ("ncclcheck.runtime",),  # inside ranks outside a dry run
    ("ncclcheck.evidence",),  # what is observed: traces, stacks, logs, processes
    ("ncclcheck.launch",),  # starting and reaping ranks
    ("ncclcheck.explain",),  # evidence -> Explanation, through tables of rules
    ("ncclcheck.render",),
    ("ncclcheck.commands",),
    ("ncclcheck.cli", "ncclcheck.__main__", "ncclcheck.guard", "ncclcheck.pytest_plugin"),
]
# private names still imported across modules (a ratchet: the bound is 10)
PRIVATE_IMPORTS_ALLOWED = 10


def _module_files() -> dict[str, Path]:
    files = {}
    for path in PACKAGE.rglob("*.py"):
        if "_playbooks" in path.parts:
            continue
        parts = list(path.relative_to(REPO).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        files[".".join(parts)] = path
    return files


def _imports(modules: dict[str, Path]) -> tuple[dict[str, set[str]], list[str]]:
    """Every module's imports of the package's modules (inside functions too), and each
    private name one module imports from another."""
    edges: dict[str, set[str]] = {name: set() for name in modules}
    private: list[str] = []
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                edges[name] |= {a.name for a in node.names if a.name in modules}
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*anchor, *([base] if base else [])])
                if base not in modules:
                    continue
                for alias in node.names:
                    if f"{base}.{alias.name}" in modules:
                        edges[name].add(f"{base}.{alias.name}")
                        continue
                    edges[name].add(base)
                    if alias.name.startswith("_") and not alias.name.startswith("__"):
                        private.append(f"{name} imports {base}.{alias.name}")
    return edges, private


def _layer(module: str) -> int:
    for index, members in enumerate(LAYERS):
        if any(module == m or (m != "ncclcheck" and module.startswith(m + ".")) for m in members):
            return index
    raise AssertionError(f"{module} is in no layer of LAYERS: place it")


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for target in edges[module] - {module}:
            if target not in index:
                visit(target)
                low[module] = min(low[module], low[target])
            elif target in on_stack:
                low[module] = min(low[module], index[target])
        if low[module] == index[module]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == module:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for module in sorted(edges):
        if module not in index:
            visit(module)
    return found


def test_no_module_imports_from_a_layer_above_it() -> None:
    edges, _ = _imports(_module_files())
    upward = sorted(
        f"{module} imports {target}"
        for module, targets in edges.items()
        for target in targets
        if _layer(target) > _layer(module)
    )
    assert not upward, upward


def test_no_two_packages_import_each_other() -> None:
    edges, _ = _imports(_module_files())

    def unit(module: str) -> str:  # a subpackage, or a top-level module on its own
        parts = module.split(".")
        return ".".join(parts[:2]) if len(parts) > 1 and (PACKAGE / parts[1]).is_dir() else module

    crossing = {(unit(a), unit(b)) for a, targets in edges.items() for b in targets if unit(a) != unit(b)}
    pairs = sorted({tuple(sorted(pair)) for pair in crossing if pair[::-1] in crossing})
    assert not pairs, pairs


def test_no_module_cycles() -> None:
    edges, _ = _imports(_module_files())
    assert not _cycles(edges), _cycles(edges)


def test_private_names_stay_in_their_module() -> None:
    _, private = _imports(_module_files())
    assert len(private) <= PRIVATE_IMPORTS_ALLOWED, "\n".join(private)


def test_the_import_check_sees_what_it_checks() -> None:
    # the check itself: a module of every layer is found, with the imports it has
    modules = _module_files()
    edges, _ = _imports(modules)
    assert {_layer(m) for m in modules} == set(range(len(LAYERS)))
    assert "ncclcheck.model" in edges["ncclcheck.evidence.traces"]
    assert "ncclcheck.commands.preflight" in edges["ncclcheck.pytest_plugin"]  # inside a function
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_command_reads_the_text_of_a_finding() -> None:
    # commands and rules decide on fields (cause, reason, kind, location), never on the
    # words of a message, an evidence line or a summary's note
    pattern = re.compile(
        r"\.message\.(endswith|startswith)\(|in [a-z_]+\.message\b|\.message =="
        r"|summary\b[^#]*\.(startswith|endswith)\(|evidence\b[^#]* if \"[^\"]*\" in \w+"
        r"|\b(text|line|fact|item)\.(startswith|endswith)\(\"(its|the|no|rank) "
    )
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
