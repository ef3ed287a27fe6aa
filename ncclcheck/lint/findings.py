"""What lint finds and what it works on: the finding, and the collectives, functions,
modules and guards it reasons about."""

from __future__ import annotations

import ast
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from ncclcheck.causes import Cause
from ncclcheck.model import Finding, Severity, SourceLocation

# Point-to-point calls (send/recv, batch_isend_irecv) are rank-dependent by design: each
# side's branch is paired with the other's, so lint leaves them out.


def lint_finding(
    cause: Cause,
    severity: str,
    path: str,
    line: int,
    col: int,
    message: str,
    evidence: list[str] | None = None,
    condition_line: int | None = None,
    call_line: int | None = None,
    checked_path: str = "",
    label: str = "",
) -> Finding:
    """A finding of lint's: the one Finding type, sited in the source."""
    return Finding(
        cause=cause,
        severity=Severity(severity),
        message=message,
        site=f"{path}:{line}",
        evidence=evidence or [],
        location=SourceLocation(path, line, col, condition_line, call_line, checked_path, label),
    )


def located(finding: Finding) -> SourceLocation:
    """Where a finding of lint's is (every one has a location)."""
    assert finding.location is not None, "lint's findings carry their location"
    return finding.location


@dataclass
class Collective:
    """How a call communicates: its label, and the chain to the torch call for user functions."""

    label: str
    chain: list[str]  # "function() at path:line", outermost first, ending at the collective
    path: str  # where the communicating call itself is (in a helper, maybe another module)
    line: int
    col: int
    certain: bool = True  # False for a DDP forward: it communicates only with buffers to sync


@dataclass
class Function:
    node: ast.FunctionDef | ast.AsyncFunctionDef
    module: ParsedModule
    class_name: str | None

    @property
    def name(self) -> str:
        return self.node.name


@dataclass
class ParsedModule:
    path: Path
    tree: ast.Module
    lines: list[str]
    dist_aliases: set[str] = field(default_factory=set)  # names bound to torch.distributed
    dist_functions: set[str] = field(default_factory=set)  # ops imported by name
    dcp_aliases: set[str] = field(default_factory=set)  # names of torch.distributed.checkpoint
    dcp_functions: set[str] = field(default_factory=set)  # its save/load imported by name
    state_dict_functions: set[str] = field(default_factory=set)  # its state_dict helpers, by name
    imported_functions: dict[str, tuple[Path, str]] = field(default_factory=dict)
    imported_modules: dict[str, Path] = field(default_factory=dict)
    functions: dict[str, list[Function]] = field(default_factory=dict)
    methods: dict[tuple[str, str], Function] = field(default_factory=dict)
    libraries: set[str] = field(default_factory=set)  # top-level packages imported
    wraps_ddp: bool = False  # the module wraps a model in DistributedDataParallel
    ddp_names: set[str] = field(default_factory=set)  # bound to DDP(...) whose forward() may broadcast
    shards_parameters: bool = False  # FSDP or DeepSpeed ZeRO: every forward gathers shards
    # accelerate's ProjectConfiguration(automatic_checkpoint_naming=True): save_state waits
    automatic_checkpoints: bool = False
    ignores: dict[int, set[str] | None] = field(default_factory=dict)  # line -> causes (None: all)
    all_nodes: list[ast.AST] = field(default_factory=list)  # one walk of the whole tree, reused


# a guard's kind besides reading's RANK, DATA and "other": a swallowing except handler's
# body, which a rank runs where its try failed on it alone
CAUGHT = "caught"


@dataclass(frozen=True)
class Guard:
    kind: str  # rank | data | unsynced | caught | other
    line: int
    text: str
    # both sides issue the same collectives: no rank misses one by taking either side
    balanced: bool = False
    # `rank == src`, `self.rank == to`: one peer chosen per round, as collective algorithms
    # do on purpose; lint cannot prove the other side matches, so it only warns
    peer: bool = False
    test: ast.expr | None = field(default=None, compare=False)  # the if's test


@dataclass(frozen=True)
class AttributeSite:
    """Where a function sets an attribute to a rank's own value."""

    path: Path
    line: int
    function: str  # `EarlyStopping.on_epoch_end`
    test: str  # the rank-local tests it is set under, innermost first; '' if its value is local


class ProjectIndex(Protocol):
    """What the checks of one scope (scope.py) and of the eval loaders (samplers.py) ask
    of the project's index (project.py's Linter): its modules' names resolved, walked
    once and cached."""

    def nodes(self, scope: ast.AST) -> list[ast.AST]: ...
    def derived_names(self, scope: ast.AST) -> set[str]: ...
    def mentions_rank(self, scope: ast.AST) -> bool: ...
    def ddp_names_of(self, scope: ast.AST) -> set[str]: ...
    def resolve_call(
        self, call: ast.Call, module: ParsedModule, function: Function | None
    ) -> Function | None: ...
    def returns_what_it_synced(
        self, call: ast.Call, module: ParsedModule, function: Function | None
    ) -> bool: ...
    def collective_of_call(
        self, call: ast.Call, module: ParsedModule, function: Function | None, ddp_names: set[str]
    ) -> Collective | None: ...
    def collective_of_node(
        self, node: ast.expr, module: ParsedModule, function: Function | None, ddp_names: set[str]
    ) -> Collective | None: ...
    def variable_size_names(
        self, scope: ast.AST, module: ParsedModule, function: Function | None
    ) -> set[str]: ...
    def rank_local_names(
        self, scope: ast.AST, module: ParsedModule, function: Function | None
    ) -> set[str]: ...
    def sync_points(self, scope: ast.AST, module: ParsedModule) -> dict[str, list[int]]: ...
    def attribute_is_local(self, module: ParsedModule, attribute: str) -> bool: ...

    def attribute_site(self, module: ParsedModule, attribute: str) -> AttributeSite | None: ...

    def rooted_names(self, scope: ast.AST, module: ParsedModule) -> dict[str, tuple[str, int]]: ...
    def is_rank_local(
        self,
        value: ast.expr,
        module: ParsedModule,
        function: Function | None,
        synced: set[str],
        local: set[str],
    ) -> bool: ...
    def returns_local_number(self, function: Function) -> bool: ...
    def constructions(self, scope: ast.AST) -> dict[str, str]: ...
    def collective_of_function(
        self, function: Function, ddp_parameters: frozenset[str] = frozenset()
    ) -> Collective | None: ...
    def local_attributes(self, module: ParsedModule) -> set[str]: ...


def relative_path(path: Path) -> str:
    try:
        return os.path.relpath(path)
    except ValueError:
        return str(path)


def dedupe(findings: list[Finding], by_call: bool = False) -> list[Finding]:
    """One finding per collective and cause, the first; ``by_call``: one error per call
    that reaches it as well. lint dedupes each function's findings without it (two tests
    in one function, a flag set under the first and tested again or branches nested in
    one protocol, are one decision, the first said) and the module's with it (two
    functions that each reach the collective under a rank test of their own are two
    places to fix; the warnings of other paths to it add nothing to read)."""
    seen: set[tuple[str, int, int, str, str, int | None]] = set()
    unique = []
    for finding in findings:
        where = located(finding)
        by_its_call = by_call and finding.severity is Severity.ERROR
        key: tuple[str, int, int, str, str, int | None] = (
            where.path,
            where.line,
            where.col,
            finding.cause,
            where.checked_path if by_its_call else "",
            where.call_line if by_its_call else None,
        )
        if key not in seen:
            seen.add(key)
            unique.append(finding)
    return unique
