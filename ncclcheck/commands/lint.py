"""lint: collectives that not every rank will reach, from source alone (ast).

What PARCOACH and MPI-Checker do for MPI in C, for PyTorch in Python: find every
collective (torch.distributed, the library calls that issue one, and the user's
own functions that reach one, across the user's modules), then the conditions
and early exits that depend on the rank, on a tensor's value, or on something
else that differs between ranks, and report each collective that only some
ranks would reach.

Nothing is imported or run: files are parsed, names are resolved by their
imports within the project. Calls the resolver cannot follow (a function passed
as an argument, ``getattr``) are not followed: lint errs on the side of silence.
"""

from __future__ import annotations

import ast
import io
import operator
import os
import re
import tokenize
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ncclcheck.causes import Cause
from ncclcheck.communicates import (
    ACCELERATE_METHODS,
    ACCELERATE_SAVE_STATE,
    COLLECTIVES,
    DCP_FUNCTIONS,
    DCP_MODULE,
    LIGHTNING_COLLECTIVES,
    P2P,
    STATE_DICT_FUNCTIONS,
    STATE_DICT_MODULE,
    ZERO_CONSOLIDATE,
)
from ncclcheck.errors import InputError
from ncclcheck.explain.source import (
    DATA,
    RANK,
    RANK_CALLS,
    RANK_LOCAL_CALLS,
    RANK_NAMES,
    bound_names,
    kind_of,
    rank_derived_names,
    reaching_rank_names,
)

# Point-to-point calls (send/recv, batch_isend_irecv) are rank-dependent by design: each
# side's branch is paired with the other's, so lint leaves them out.
_DIST_OPS = frozenset(COLLECTIVES) - frozenset(P2P) | {"new_group"}
# Every rank of the job enters new_group, members or not: groups are named by a count of
# the calls (with use_local_synchronization=True only the members do, and it is not flagged)
_NEW_GROUP = (
    "new_group (every rank enters it, members or not: groups are named by a count of "
    "new_group calls, so a rank that skips one names every later group differently)"
)
_RANK_ZERO_DECORATORS = frozenset(
    {"rank_zero_only", "main_process_only", "on_main_process", "on_local_main_process"}
)
# conditions on values that differ between ranks by construction
_UNSYNCED_CALLS = frozenset(RANK_LOCAL_CALLS)
_EVAL_NAMES = re.compile(
    r"(^|_)(val|valid|validation|eval|evaluation|test|dev)(_|$|loader|set|data)", re.IGNORECASE
)
_RANK_WORDS = RANK_NAMES | RANK_CALLS
# where the group goes among a collective's positional arguments
_GROUP_POSITION = {
    "all_reduce": 2,
    "broadcast": 2,
    "all_gather": 2,
    "all_gather_into_tensor": 2,
    "reduce": 3,
    "reduce_scatter": 3,
    "reduce_scatter_tensor": 3,
    "gather": 3,
    "scatter": 3,
    "all_to_all": 2,
    "barrier": 0,
    "all_gather_object": 2,
    "broadcast_object_list": 2,
}
# collectives whose result is meaningful on one rank only
_ROOTED = frozenset({"reduce", "gather", "gather_object", "scatter", "scatter_object_list"})
# tests on a tensor's values: what differs between ranks that hold different data
_TENSOR_VALUE_CALLS = frozenset({"isfinite", "isnan", "isinf", "item", "nonzero", "numel", "count_nonzero"})
_IGNORE = re.compile(r"#\s*ncclcheck:\s*ignore(?:\[([a-z0-9\-, ]+)\])?")


@dataclass
class LintFinding:
    cause: Cause
    severity: str  # error | warning
    path: str
    line: int
    col: int
    message: str
    evidence: list[str] = field(default_factory=list)
    condition_line: int | None = None  # the if that decides, where there is one
    call_line: int | None = None  # the call in the checked file that leads to the collective
    checked_path: str = ""  # the checked file (the condition and the call are there)
    label: str = ""  # the communicating call as lint names it (`self.log(sync_dist=True)`)

    @property
    def site(self) -> str:
        return f"{self.path}:{self.line}"


@dataclass
class _Collective:
    """How a call communicates: its label, and the chain to the torch call for user functions."""

    label: str
    chain: list[str]  # "function() at path:line", outermost first, ending at the collective
    path: str  # where the communicating call itself is (in a helper, maybe another module)
    line: int
    col: int
    certain: bool = True  # False for a DDP forward: it communicates only with buffers to sync


@dataclass
class _Function:
    node: ast.FunctionDef | ast.AsyncFunctionDef
    module: _Module
    class_name: str | None

    @property
    def name(self) -> str:
        return self.node.name


@dataclass
class _Module:
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
    functions: dict[str, list[_Function]] = field(default_factory=dict)
    methods: dict[tuple[str, str], _Function] = field(default_factory=dict)
    libraries: set[str] = field(default_factory=set)  # top-level packages imported
    wraps_ddp: bool = False  # the module wraps a model in DistributedDataParallel
    ddp_names: set[str] = field(default_factory=set)  # bound to DDP(...) whose forward() may broadcast
    shards_parameters: bool = False  # FSDP or DeepSpeed ZeRO: every forward gathers shards
    # accelerate's ProjectConfiguration(automatic_checkpoint_naming=True): save_state waits
    automatic_checkpoints: bool = False
    ignores: dict[int, set[str] | None] = field(default_factory=dict)  # line -> causes (None: all)
    all_nodes: list[ast.AST] = field(default_factory=list)  # one walk of the whole tree, reused


def _relative(path: Path) -> str:
    try:
        return os.path.relpath(path)
    except ValueError:
        return str(path)


class Linter:
    def __init__(self) -> None:
        self.modules: dict[Path, _Module] = {}
        self.modules_by_tree: dict[int, _Module] = {}
        # (id(function node), its DDP parameters) -> the first collective it reaches
        self._collective_of: dict[tuple[int, frozenset[str]], _Collective | None] = {}
        self._in_progress: set[tuple[int, frozenset[str]]] = set()
        self._local_number: dict[int, bool] = {}  # id(function node) -> returns a rank-local number
        self._variable_size: dict[int, bool] = {}  # id(function node) -> returns a data-sized tensor
        self._nodes: dict[int, list[ast.AST]] = {}  # id(scope) -> its nodes, nested defs left out
        self._derived: dict[int, set[str]] = {}
        self._ddp: dict[int, set[str]] = {}
        self._mentions: dict[int, bool] = {}
        self._synced: dict[int, set[str]] = {}
        self._module_paths: dict[tuple[Path, str, int], Path | None] = {}
        self.files_checked = 0
        self.lines_checked = 0

    def derived_names(self, scope: ast.AST) -> set[str]:
        """Names assigned from rank values in ``scope`` (``is_main = rank == 0``), cached; a
        scope that names no rank at all is answered without analysis."""
        key = id(scope)
        if key not in self._derived:
            nodes = self.nodes(scope)
            mentioned = {
                n.id if isinstance(n, ast.Name) else n.attr
                for n in nodes
                if isinstance(n, (ast.Name, ast.Attribute))
            }
            self._mentions[key] = bool(mentioned & _RANK_WORDS)
            self._derived[key] = rank_derived_names(scope, nodes) if mentioned & _RANK_WORDS else set()
        return self._derived[key]

    def mentions_rank(self, scope: ast.AST) -> bool:
        """Does ``scope`` name a rank (``rank``, ``get_rank()``, ``is_main_process``, ...)?"""
        if id(scope) not in self._mentions:
            self.derived_names(scope)
        return self._mentions[id(scope)]

    def ddp_names_of(self, scope: ast.AST) -> set[str]:
        key = id(scope)
        if key not in self._ddp:
            self._ddp[key] = _ddp_names(self.nodes(scope))
        return self._ddp[key]

    def nodes(self, scope: ast.AST) -> list[ast.AST]:
        """The nodes of a function (or module top level), walked once: every check reads them."""
        key = id(scope)
        if key not in self._nodes:
            self._nodes[key] = list(_walk_scope(scope))
        return self._nodes[key]

    # -- loading -------------------------------------------------------------------

    def load(self, path: Path, follow: bool = True) -> _Module | None:
        path = path.resolve()
        if path in self.modules:
            return self.modules[path]
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            raise InputError(f"{_relative(path)}: not a text file") from None
        except OSError as exc:
            raise InputError(f"{_relative(path)}: {exc.strerror}") from None
        try:
            tree = ast.parse(text, filename=str(path))
        except SyntaxError as exc:
            raise InputError(f"{_relative(path)}:{exc.lineno}: syntax error: {exc.msg}") from None
        module = _Module(path, tree, text.splitlines())
        module.all_nodes = _walk(tree, enter_scopes=True)
        self.modules[path] = module
        self.modules_by_tree[id(tree)] = module
        self.lines_checked += len(module.lines)
        module.ignores = _ignore_comments(text)
        self._index(module, follow)
        return module

    def _index(self, module: _Module, follow: bool) -> None:
        for node in module.all_nodes:
            if isinstance(node, ast.Import):
                for alias in node.names:
                    module.libraries.add(alias.name.split(".")[0])
                    if alias.name == "torch.distributed":
                        module.dist_aliases.add(alias.asname or "torch.distributed")
                    elif alias.name == DCP_MODULE:
                        module.dcp_aliases.add(alias.asname or DCP_MODULE)
                    elif follow:
                        target = self._resolve_module(module.path, alias.name, 0)
                        if target is not None:
                            module.imported_modules[alias.asname or alias.name] = target
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level == 0:
                    module.libraries.add(base.split(".")[0])
                for alias in node.names:
                    local = alias.asname or alias.name
                    if base == "torch" and alias.name == "distributed":
                        module.dist_aliases.add(local)
                    elif base == "torch.distributed" and alias.name in _DIST_OPS:
                        module.dist_functions.add(local)
                    elif base == "torch.distributed" and alias.name == "checkpoint":
                        module.dcp_aliases.add(local)
                    elif base == DCP_MODULE and alias.name in DCP_FUNCTIONS:
                        module.dcp_functions.add(local)
                    elif base == STATE_DICT_MODULE and alias.name in STATE_DICT_FUNCTIONS:
                        module.state_dict_functions.add(local)
                    elif follow:
                        self._note_import(module, base, node.level, alias.name, local)
        for statement in module.tree.body:
            self._index_definitions(module, statement, None)
        module.ddp_names = _ddp_names(module.all_nodes)
        text = "\n".join(module.lines)
        module.shards_parameters = "deepspeed" in module.libraries or any(
            word in text for word in ("FullyShardedDataParallel", "fully_shard(", "zero_stage", "stage3")
        )
        module.automatic_checkpoints = any(
            isinstance(node, ast.keyword)
            and node.arg == "automatic_checkpoint_naming"
            and not (isinstance(node.value, ast.Constant) and not node.value.value)
            for node in module.all_nodes
        )
        # backward() all-reduces gradients whatever the model holds
        module.wraps_ddp = bool(_ddp_names(module.all_nodes, forward_communicates=False)) or (
            "DistributedDataParallel(" in text
        )

    def _index_definitions(self, module: _Module, node: ast.stmt, class_name: str | None) -> None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            function = _Function(node, module, class_name)
            module.functions.setdefault(node.name, []).append(function)
            if class_name is not None:
                module.methods[(class_name, node.name)] = function
        elif isinstance(node, ast.ClassDef):
            for child in node.body:
                self._index_definitions(module, child, node.name)

    def _note_import(self, module: _Module, base: str, level: int, name: str, local: str) -> None:
        # `from pkg import sub` may name a module or a function
        as_module = self._resolve_module(module.path, f"{base}.{name}" if base else name, level)
        if as_module is not None:
            module.imported_modules[local] = as_module
            return
        source = self._resolve_module(module.path, base, level) if base or level else None
        if source is not None:
            module.imported_functions[local] = (source, name)

    def _resolve_module(self, importer: Path, dotted: str, level: int) -> Path | None:
        """A module of the user's project: relative to the importer's folder (as
        ``python script.py`` puts it on sys.path) or to the package above it."""
        key = (importer.parent, dotted, level)
        if key not in self._module_paths:
            self._module_paths[key] = self._find_module(importer, dotted, level)
        return self._module_paths[key]

    def _find_module(self, importer: Path, dotted: str, level: int) -> Path | None:
        root = importer.parent
        for _ in range(max(0, level - 1)):
            root = root.parent
        parts = [p for p in dotted.split(".") if p]
        candidates = [root]
        if level == 0:
            candidates += [p for p in importer.parents][1:4]  # a package's root, a few levels up
        for base in candidates:
            target = base.joinpath(*parts) if parts else base
            for path in (target.with_suffix(".py"), target / "__init__.py"):
                if parts and path.is_file():
                    return path.resolve()
        return None

    def _module_of(self, path: Path) -> _Module | None:
        try:
            return self.load(path)
        except InputError:
            return None  # an imported module that does not parse: not followed

    # -- which calls communicate ----------------------------------------------------

    def is_dist(self, node: ast.expr, module: _Module) -> bool:
        if isinstance(node, ast.Name):
            return node.id in module.dist_aliases
        return (
            isinstance(node, ast.Attribute)
            and node.attr == "distributed"
            and isinstance(node.value, ast.Name)
            and node.value.id == "torch"
        )

    def collective_of_call(
        self, call: ast.Call, module: _Module, function: _Function | None, ddp_names: set[str]
    ) -> _Collective | None:
        label = self._direct_label(call, module, ddp_names)
        if label is not None:
            path = _relative(module.path)
            certain = not label.endswith("forward through DistributedDataParallel") and not (
                label.endswith(ACCELERATE_SAVE_STATE)
                and not (module.shards_parameters or module.automatic_checkpoints)
            )
            return _Collective(
                label, [f"{label} at {path}:{call.lineno}"], path, call.lineno, call.col_offset + 1, certain
            )
        func = call.func
        if isinstance(func, ast.Attribute):
            target = self._resolve_attribute_call(func, module, function)
        elif isinstance(func, ast.Name):
            target = self._resolve_name_call(func.id, module)
        else:
            return None
        if target is None:
            return None
        inner = self.collective_of_function(target, _ddp_parameters(call, target, ddp_names))
        if inner is None:
            return None
        here = f"{_relative(module.path)}:{call.lineno}"
        return _Collective(
            inner.label,
            [f"{target.name}() called at {here}", *inner.chain],
            inner.path,
            inner.line,
            inner.col,
            inner.certain,
        )

    def _direct_label(self, call: ast.Call, module: _Module, ddp_names: set[str]) -> str | None:
        """What a call communicates by itself (torch.distributed, a library), or None."""
        func = call.func
        if isinstance(func, ast.Name):
            if func.id in module.dist_functions:
                return _dist_label(func.id, call)
            if func.id in ddp_names:
                return f"{func.id}(...) forward through DistributedDataParallel"
            if func.id in module.dcp_functions and not _keyword_true(call, "no_dist"):
                return f"{func.id}() (torch.distributed.checkpoint plans it across the ranks)"
            if func.id in module.state_dict_functions:
                return f"{func.id}() (gathers or scatters sharded state across the ranks)"
            return None
        if not isinstance(func, ast.Attribute):
            return None
        receiver = ast.unparse(func.value)
        if not isinstance(func.value, (ast.Name, ast.Attribute, ast.Call, ast.Subscript)):
            receiver = f"({receiver})"  # (a + b).backward(), not a + b.backward()
        attr = func.attr
        if attr in _DIST_OPS and self.is_dist(func.value, module):
            return _dist_label(attr, call)
        if (
            attr in DCP_FUNCTIONS
            and (receiver in module.dcp_aliases or receiver == DCP_MODULE)
            and not _keyword_true(call, "no_dist")
        ):
            return f"{receiver}.{attr}() (torch.distributed.checkpoint plans it across the ranks)"
        if attr in ACCELERATE_METHODS and "accelerator" in receiver.lower():
            return f"{receiver}.{attr}"
        if attr == "consolidate_state_dict":  # ZeroRedundancyOptimizer's (a name of its own)
            return f"{receiver}.consolidate_state_dict() {ZERO_CONSOLIDATE}"
        if attr == "save_state" and "accelerator" in receiver.lower():
            return f"{receiver}.{ACCELERATE_SAVE_STATE}"
        if attr in ("log", "log_dict") and any(
            k.arg == "sync_dist" and not (isinstance(k.value, ast.Constant) and not k.value.value)
            for k in call.keywords
        ):
            return f"{receiver}.{attr}(sync_dist=True)"
        if (
            attr == "all_gather"
            and receiver == "self"
            and module.libraries & {"lightning", "pytorch_lightning"}
        ):
            return "self.all_gather"
        if attr == "barrier" and "strategy" in receiver:
            return f"{receiver}.barrier"
        if attr in LIGHTNING_COLLECTIVES and ("strategy" in receiver or "fabric" in receiver.lower()):
            return f"{receiver}.{attr}"  # Lightning's Strategy and Fabric: broadcast, reduce, ...
        if attr == "compute" and "torchmetrics" in module.libraries and not call.args:
            return f"{receiver}.compute() (torchmetrics syncs its states)"
        if attr in ("full_tensor", "redistribute") and "torch" in module.libraries:
            # DTensor's (FSDP2 parameters, tensor parallelism): both names are its own
            return f"{receiver}.{attr}() (a DTensor gathers or moves its shards)"
        if attr == "save_checkpoint" and "deepspeed" in module.libraries:
            return f"{receiver}.save_checkpoint (DeepSpeed)"
        if (
            attr == "save_checkpoint"
            and "trainer" in receiver.lower()
            and module.libraries & {"lightning", "pytorch_lightning"}
        ):
            return f"{receiver}.save_checkpoint() (Lightning waits for every rank in it)"
        if attr == "generate" and module.shards_parameters and not _keyword_true(call, "synced_gpus"):
            return f"{receiver}.generate() without synced_gpus=True"
        if attr == "backward" and module.wraps_ddp:
            return f"{receiver}.backward() (DDP all-reduces the gradients)"
        return None

    def _resolve_name_call(self, name: str, module: _Module) -> _Function | None:
        if name in module.functions:
            return module.functions[name][0]
        if name in module.imported_functions:
            path, original = module.imported_functions[name]
            source = self._module_of(path)
            if source is not None and original in source.functions:
                return source.functions[original][0]
        return None

    def _resolve_attribute_call(
        self, func: ast.Attribute, module: _Module, function: _Function | None
    ) -> _Function | None:
        value = func.value
        if isinstance(value, ast.Name):
            if value.id in ("self", "cls") and function is not None and function.class_name is not None:
                return module.methods.get((function.class_name, func.attr))
            if value.id in module.imported_modules:
                source = self._module_of(module.imported_modules[value.id])
                if source is not None and func.attr in source.functions:
                    return source.functions[func.attr][0]
        return None

    def collective_of_function(
        self, function: _Function, ddp_parameters: frozenset[str] = frozenset()
    ) -> _Collective | None:
        """The first collective a call to ``function`` reaches, whatever the branches.

        ``ddp_parameters``: its parameters that this call binds to a DDP-wrapped model
        (``evaluate(model, loader)``), whose forward then communicates as the caller's would.
        """
        key = (id(function.node), ddp_parameters)
        if key in self._collective_of:
            return self._collective_of[key]
        if key in self._in_progress:
            return None  # recursion: the first visit decides
        self._in_progress.add(key)
        found: _Collective | None = None
        ddp_names = self.ddp_names_of(function.node) | ddp_parameters
        for call in _calls_in(function.node):
            this = self.collective_of_call(call, function.module, function, ddp_names)
            if this is not None and (found is None or this.certain):
                found = this  # the first collective; a certain one over a DDP forward
            if found is not None and found.certain:
                break
        self._in_progress.discard(key)
        self._collective_of[key] = found
        return found

    def resolve_call(self, call: ast.Call, module: _Module, function: _Function | None) -> _Function | None:
        func = call.func
        if isinstance(func, ast.Name):
            return self._resolve_name_call(func.id, module)
        if isinstance(func, ast.Attribute):
            return self._resolve_attribute_call(func, module, function)
        return None

    def variable_size_names(self, scope: ast.AST, module: _Module, function: _Function | None) -> set[str]:
        """Tensors whose size depends on the data: boolean indexing, nonzero, masked_select,
        unique, torch.cat of a list built in a loop, or a user function returning one."""
        sized: set[str] = set()
        masks: set[str] = set()
        for node in self.nodes(scope):
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Compare):
                masks |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        for node in self.nodes(scope):
            if isinstance(node, ast.Assign) and self._is_variable_size(node.value, module, function, masks):
                sized |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        return sized

    def _is_variable_size(
        self, value: ast.expr, module: _Module, function: _Function | None, masks: set[str], depth: int = 0
    ) -> bool:
        for node in ast.walk(value):
            if isinstance(node, ast.Subscript) and (
                isinstance(node.slice, ast.Compare)
                or (isinstance(node.slice, ast.Name) and node.slice.id in masks)
            ):
                return True
            if isinstance(node, ast.Call):
                name = (
                    node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
                )
                if name in ("nonzero", "masked_select", "unique", "generate"):
                    return True
                target = self.resolve_call(node, module, function)
                if target is not None and depth < 2 and self._returns_variable_size(target, depth):
                    return True
        return False

    def _returns_variable_size(self, target: _Function, depth: int) -> bool:
        key = id(target.node)
        if key in self._variable_size:
            return self._variable_size[key]
        self._variable_size[key] = False  # recursion guard
        returns = [n.value for n in self.nodes(target.node) if isinstance(n, ast.Return) and n.value]
        inner_masks = {
            t.id
            for n in self.nodes(target.node)
            if isinstance(n, ast.Assign) and isinstance(n.value, ast.Compare)
            for t in n.targets
            if isinstance(t, ast.Name)
        }
        found = any(self._is_variable_size(r, target.module, target, inner_masks, depth + 1) for r in returns)
        if not found and any(_returns_cat(r) for r in returns):
            # torch.cat of a list that a loop appends boolean-indexed pieces to
            appended = [
                n.args[0]
                for n in self.nodes(target.node)
                if isinstance(n, ast.Call)
                and isinstance(n.func, ast.Attribute)
                and n.func.attr == "append"
                and n.args
            ]
            found = any(
                self._is_variable_size(a, target.module, target, inner_masks, depth + 1) for a in appended
            )
        self._variable_size[key] = found
        return found

    def rank_local_names(self, scope: ast.AST, module: _Module, function: _Function | None) -> set[str]:
        """Names whose value differs between ranks without any rank in sight: a clock, a file
        check, the ``.item()`` of a tensor no collective touched, or what a user function
        returns that computes a number from tensors and communicates nothing."""
        synced = self.synced_names(scope, module)
        local: set[str] = set()
        assignments = [
            n for n in self.nodes(scope) if isinstance(n, (ast.Assign, ast.AugAssign, ast.AnnAssign))
        ]
        # `skip = strategy.broadcast(skip)`: a value a collective returns is every rank's
        from_collectives = {
            name
            for node in assignments
            if isinstance(node.value, ast.Call) and self._direct_label(node.value, module, set()) is not None
            for target in (node.targets if isinstance(node, ast.Assign) else [node.target])
            for name in bound_names(target)
        }
        synced = synced | from_collectives
        for _ in range(3):
            before = len(local)
            for node in assignments:
                value = node.value
                if value is None:
                    continue
                if self._is_rank_local(value, module, function, synced, local):
                    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                    # `self.total += loss.item()` makes an attribute rank-local, not `self`
                    local |= {name for t in targets for name in bound_names(t)} - synced
            if len(local) == before:
                break
        return local

    def synced_names(self, scope: ast.AST, module: _Module) -> set[str]:
        """Names passed to a collective in ``scope``: their values agree across ranks after it."""
        key = id(scope)
        if key not in self._synced:
            synced: set[str] = set()
            for call in self.nodes(scope):
                if not isinstance(call, ast.Call):
                    continue
                label = self._direct_label(call, module, set())
                if label is not None and label.split(".")[-1] not in _ROOTED:
                    synced |= {arg.id for arg in call.args if isinstance(arg, ast.Name)}
            self._synced[key] = synced
        return self._synced[key]

    def rooted_names(self, scope: ast.AST, module: _Module) -> dict[str, tuple[str, int]]:
        """Tensors passed to dist.reduce / gather / scatter, each with that call's label and
        line: after the call their value is the result on the destination rank only, and
        whatever is left on the others. Not those a later line broadcasts or all-reduces
        (`dist.reduce(x, 0)` then `dist.broadcast(x, 0)`): every rank holds rank 0's again."""
        rooted: dict[str, tuple[str, int]] = {}
        synced_at: dict[str, int] = {}
        for call in self.nodes(scope):
            if not (isinstance(call, ast.Call) and call.args and isinstance(call.args[0], ast.Name)):
                continue
            label = self._direct_label(call, module, set())
            if label is None:
                continue
            name = call.args[0].id
            if label.split(".")[-1] in _ROOTED:
                rooted.setdefault(name, (label, call.lineno))
            else:
                synced_at[name] = max(synced_at.get(name, 0), call.lineno)
        return {name: at for name, at in rooted.items() if synced_at.get(name, 0) <= at[1]}

    def _is_rank_local(
        self, value: ast.expr, module: _Module, function: _Function | None, synced: set[str], local: set[str]
    ) -> bool:
        for node in ast.walk(value):
            if isinstance(node, ast.Name) and node.id in local:
                return True
            if not isinstance(node, ast.Call):
                continue
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if name in _UNSYNCED_CALLS:
                return True
            if name in ("item", "tolist") and isinstance(func, ast.Attribute):
                root = func.value
                while isinstance(root, (ast.Attribute, ast.Subscript, ast.Call)):
                    root = root.func if isinstance(root, ast.Call) else root.value
                if not (isinstance(root, ast.Name) and root.id in synced):
                    return True
            target = (
                self._resolve_name_call(func.id, module)
                if isinstance(func, ast.Name)
                else self._resolve_attribute_call(func, module, function)
                if isinstance(func, ast.Attribute)
                else None
            )
            if target is not None and self._returns_local_number(target):
                return True
        return False

    def _returns_local_number(self, function: _Function) -> bool:
        """A function that turns tensors into a number with ``.item()`` and communicates nothing."""
        key = id(function.node)
        if key not in self._local_number:
            self._local_number[key] = self._computes_local_number(function)
        return self._local_number[key]

    def _computes_local_number(self, function: _Function) -> bool:
        """``.item()`` of a tensor, or a clock, a file check, a random draw
        (``def should_resume(path): return os.path.exists(path)``)."""
        if self.collective_of_function(function) is not None:
            return False
        node = function.node
        has_return = any(isinstance(n, ast.Return) and n.value is not None for n in self.nodes(node))
        return has_return and any(
            isinstance(n, ast.Call)
            and (
                (isinstance(n.func, ast.Attribute) and n.func.attr == "item")
                or _called_names(n) & _UNSYNCED_CALLS
            )
            for n in self.nodes(node)
        )

    # -- findings --------------------------------------------------------------------

    def check(self, module: _Module) -> list[LintFinding]:
        self.files_checked += 1
        findings: list[LintFinding] = []
        module_derived = self.derived_names(module.tree)
        indexed = {id(f.node): f for functions in module.functions.values() for f in functions}
        scopes: list[tuple[_Function | None, ast.AST]] = [(None, module.tree)]
        for node in module.all_nodes:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                scopes.append((indexed.get(id(node)) or _Function(node, module, None), node))
        for function, scope in scopes:
            derived = module_derived | (self.derived_names(scope) if function is not None else set())
            ddp_names = (self.ddp_names_of(scope) if function is not None else set()) | module.ddp_names
            checker = _ScopeChecker(self, module, function, derived, ddp_names)
            body = (
                scope.body if isinstance(scope, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef)) else []
            )
            checker.block(body, [])
            if function is not None and _is_rank_zero_only(function.node):
                checker.decorated_rank_zero()
            findings += checker.findings
        findings += self._samplers(module)
        return [f for f in _dedupe(findings) if not self._ignored(module, f)]

    def _ignored(self, module: _Module, finding: LintFinding) -> bool:
        """``# ncclcheck: ignore[cause]`` on the collective's line, on the line of the call
        that leads to it, or on the line of its condition."""
        collective_module = self.modules.get(Path(finding.path).resolve(), module)
        places = [
            (collective_module, finding.line),
            (module, finding.call_line),
            (module, finding.condition_line),
        ]
        for place, line in places:
            if line is not None and line in place.ignores:
                causes = place.ignores[line]
                if causes is None or finding.cause in causes:
                    return True
        return False

    def _samplers(self, module: _Module) -> list[LintFinding]:
        """Eval DataLoaders without a DistributedSampler in a distributed script."""
        distributed = bool(module.dist_aliases or module.dist_functions) or "accelerate" in module.libraries
        if not distributed or module.libraries & {"lightning", "pytorch_lightning"}:
            return []  # Lightning inserts the DistributedSampler itself
        prepared = {
            ast.unparse(arg)
            for call in module.all_nodes
            if isinstance(call, ast.Call)
            and isinstance(call.func, ast.Attribute)
            and call.func.attr == "prepare"
            for arg in call.args
        }
        consumed = _iterated_or_passed(module, self)
        found = []
        for node in module.all_nodes:
            if not (isinstance(node, ast.Assign) and isinstance(node.value, ast.Call)):
                continue
            call = node.value
            callee = call.func.attr if isinstance(call.func, ast.Attribute) else getattr(call.func, "id", "")
            if callee != "DataLoader" or any(k.arg in ("sampler", "batch_sampler") for k in call.keywords):
                continue
            names = [ast.unparse(t) for t in node.targets]
            if not any(_EVAL_NAMES.search(n.split(".")[-1]) for n in names) or set(names) & prepared:
                continue
            if not set(names) & consumed:
                continue  # built and handed back (a loader factory): its user decides how to shard it
            dataset = ast.unparse(call.args[0]) if call.args else "?"
            cause = Cause.UNEVEN_EVAL_BATCHES
            stream = _iterable_dataset_class(module, call.args[0]) if call.args else None
            if stream is not None:
                # No sampler applies to an IterableDataset: it splits the stream itself.
                iterate = next(
                    (f for f in stream.body if isinstance(f, ast.FunctionDef) and f.name == "__iter__"), None
                )
                if iterate is None or not self.mentions_rank(iterate):
                    continue
                message = (
                    f"eval loader {names[0]} reads {stream.name}, an IterableDataset whose "
                    f"__iter__ splits the stream by rank (line {iterate.lineno}): streams of "
                    f"unequal length give unequal batch counts; make every rank yield as many"
                )
            else:
                scope_derived = self.derived_names(module.tree) | {
                    name
                    for node in module.all_nodes
                    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and self.mentions_rank(node)
                    for name in self.derived_names(node)
                }
                if bool(call.args) and kind_of(call.args[0], scope_derived) == RANK:
                    message = (
                        f"eval loader {names[0]} is built over a dataset sharded by rank by hand "
                        f"({dataset}): shards of unequal length give unequal batch counts; use "
                        f"DistributedSampler(..., shuffle=False)"
                    )
                else:
                    cause = Cause.MISSING_DISTRIBUTED_SAMPLER
                    message = (
                        f"eval loader {names[0]} = DataLoader({dataset}, ...) has no sampler= in a "
                        f"distributed script: every rank evaluates its own copy of the set"
                    )
            found.append(
                LintFinding(
                    cause, "warning", _relative(module.path), node.lineno, node.col_offset + 1, message
                )
            )
        return found


def _iterable_dataset_class(module: _Module, dataset: ast.expr) -> ast.ClassDef | None:
    """The class of ``dataset`` (``Stream(...)``) when the module defines it over IterableDataset."""
    if not (isinstance(dataset, ast.Call) and isinstance(dataset.func, ast.Name)):
        return None
    for node in module.tree.body:
        if (
            isinstance(node, ast.ClassDef)
            and node.name == dataset.func.id
            and any(ast.unparse(base).split(".")[-1] == "IterableDataset" for base in node.bases)
        ):
            return node
    return None


def _iterated_or_passed(module: _Module, linter: Linter) -> set[str]:
    """Names the module loops over (``for b in loader``, ``enumerate(loader)``) or hands to
    one of the project's functions: the loaders it actually evaluates with."""
    names: set[str] = set()
    for node in module.all_nodes:
        if isinstance(node, (ast.For, ast.AsyncFor)):
            iterable = node.iter
            while isinstance(iterable, ast.Call) and iterable.args:
                iterable = iterable.args[0]
            names.add(ast.unparse(iterable))
        elif isinstance(node, ast.Call) and linter.resolve_call(node, module, None) is not None:
            names |= {ast.unparse(arg) for arg in node.args}
    return names


def _ddp_parameters(call: ast.Call, target: _Function, ddp_names: set[str]) -> frozenset[str]:
    """The parameters of ``target`` that ``call`` passes a DDP-wrapped model to, by name."""
    if not ddp_names:
        return frozenset()
    arguments = target.node.args
    positional = [a.arg for a in [*arguments.posonlyargs, *arguments.args]]
    if target.class_name is not None and isinstance(call.func, ast.Attribute) and positional:
        positional = positional[1:]  # self.evaluate(model): self is bound already
    found: set[str] = set()
    for name, value in zip(positional, call.args, strict=False):
        if isinstance(value, ast.Name) and value.id in ddp_names:
            found.add(name)
    keywords = set(positional) | {a.arg for a in arguments.kwonlyargs}
    for keyword in call.keywords:
        if keyword.arg in keywords and isinstance(keyword.value, ast.Name) and keyword.value.id in ddp_names:
            found.add(keyword.arg)
    return frozenset(found)


# Layers that register no buffer: a DDP model made of these alone broadcasts nothing
# at forward(). (BatchNorm's running statistics are the buffers that matter.)
_BUFFERLESS_LAYERS = frozenset(
    {
        "Linear", "Bilinear", "Conv1d", "Conv2d", "Conv3d", "ConvTranspose1d", "ConvTranspose2d",
        "Embedding", "LayerNorm", "GroupNorm", "RMSNorm", "Dropout", "Dropout1d", "Dropout2d",
        "ReLU", "GELU", "SiLU", "Tanh", "Sigmoid", "LeakyReLU", "Softmax", "LogSoftmax",
        "Flatten", "Identity", "MultiheadAttention", "MaxPool1d", "MaxPool2d", "AvgPool1d",
        "AvgPool2d", "AdaptiveAvgPool1d", "AdaptiveAvgPool2d",
    }
)  # fmt: skip


def _callee_name(call: ast.Call) -> str:
    func = call.func
    return func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")


def _forward_broadcasts(ddp_call: ast.Call) -> bool:
    """Whether this DDP model's forward() may broadcast buffers: not with
    ``broadcast_buffers=False``, nor for an inline stack of buffer-free layers."""
    for keyword in ddp_call.keywords:
        if keyword.arg == "broadcast_buffers" and isinstance(keyword.value, ast.Constant):
            return bool(keyword.value.value)
    wrapped = ddp_call.args[0] if ddp_call.args else None
    if isinstance(wrapped, ast.Call) and _callee_name(wrapped) in _BUFFERLESS_LAYERS:
        return False
    if isinstance(wrapped, ast.Call) and _callee_name(wrapped) == "Sequential" and wrapped.args:
        return not all(
            isinstance(layer, ast.Call) and _callee_name(layer) in _BUFFERLESS_LAYERS
            for layer in wrapped.args
        )
    return True  # a model of the user's own: it may hold buffers


def _ddp_names(nodes: Iterable[ast.AST], forward_communicates: bool = True) -> set[str]:
    """Names bound to ``DDP(...)`` / ``DistributedDataParallel(...)`` among ``nodes``; with
    ``forward_communicates``, only those whose forward() may (see _forward_broadcasts)."""
    names: set[str] = set()
    for node in nodes:
        if (
            isinstance(node, ast.Assign)
            and isinstance(node.value, ast.Call)
            and _callee_name(node.value) in ("DDP", "DistributedDataParallel")
            and (not forward_communicates or _forward_broadcasts(node.value))
        ):
            names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
    return names


def _calls_in(root: ast.AST) -> Iterator[ast.Call]:
    """Calls in ``root`` and below it, in source order, without entering nested functions,
    lambdas or classes (their bodies run when they are called, not here)."""
    stack: list[ast.AST] = [root]
    while stack:
        node = stack.pop()
        if node is not root and isinstance(
            node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)
        ):
            continue
        if isinstance(node, ast.Call):
            yield node
        stack.extend(reversed(list(ast.iter_child_nodes(node))))


_SIZE_SENSITIVE = frozenset(
    {
        "all_gather",
        "all_gather_into_tensor",
        "all_reduce",
        "reduce_scatter",
        "reduce_scatter_tensor",
        "all_to_all_single",
        "broadcast",
        "reduce",
    }
)


def _returns_cat(expr: ast.expr) -> bool:
    return isinstance(expr, ast.Call) and ast.unparse(expr.func) in ("torch.cat", "cat", "torch.concat")


_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)
_CHILD_FIELDS: dict[type, tuple[str, ...]] = {}


def _child_fields(cls: type) -> tuple[str, ...]:
    # ctx (Load/Store) is a node under every name: skipping it halves the walk
    fields = _CHILD_FIELDS.get(cls)
    if fields is None:
        fields = _CHILD_FIELDS[cls] = tuple(
            f for f in getattr(cls, "_fields", ()) if f not in ("ctx", "type_comment", "type_ignores")
        )
    return fields


def _walk(root: ast.AST, enter_scopes: bool) -> list[ast.AST]:
    """The nodes under ``root`` (faster than ast.walk, which every check here would repeat);
    without ``enter_scopes``, nested functions, lambdas and classes are left out."""
    found: list[ast.AST] = []
    stack: list[ast.AST] = [root]
    while stack:
        node = stack.pop()
        if not enter_scopes and node is not root and isinstance(node, _SCOPES):
            continue
        found.append(node)
        for name in _child_fields(type(node)):
            value = getattr(node, name, None)
            if type(value) is list:
                stack.extend(v for v in value if isinstance(v, ast.AST))
            elif isinstance(value, ast.AST):
                stack.append(value)
    return found


def _walk_scope(root: ast.AST) -> list[ast.AST]:
    return _walk(root, enter_scopes=False)


def _dist_label(name: str, call: ast.Call) -> str | None:
    if name != "new_group":
        return f"dist.{name}"
    return None if _keyword_true(call, "use_local_synchronization") else f"dist.{_NEW_GROUP}"


def _keyword_true(call: ast.Call, name: str) -> bool:
    return any(
        k.arg == name and not (isinstance(k.value, ast.Constant) and not k.value.value) for k in call.keywords
    )


def _reads_shape(expr: ast.expr) -> bool:
    return any(isinstance(n, ast.Attribute) and n.attr == "shape" for n in ast.walk(expr))


_NEGATED_OPS: dict[type[ast.cmpop], type[ast.cmpop]] = {
    ast.Eq: ast.NotEq,
    ast.NotEq: ast.Eq,
    ast.Lt: ast.GtE,
    ast.GtE: ast.Lt,
    ast.Gt: ast.LtE,
    ast.LtE: ast.Gt,
    ast.In: ast.NotIn,
    ast.NotIn: ast.In,
    ast.Is: ast.IsNot,
    ast.IsNot: ast.Is,
}


def _negates(first: ast.expr, second: ast.expr) -> bool:
    """``not x`` / ``x``, ``rank == 0`` / ``rank != 0``: one test is the other's negation
    (or its complement over the ranks, see _complementary_on_ranks)."""
    if isinstance(first, ast.UnaryOp) and isinstance(first.op, ast.Not):
        return ast.dump(first.operand) == ast.dump(second)
    if isinstance(second, ast.UnaryOp) and isinstance(second.op, ast.Not):
        return ast.dump(second.operand) == ast.dump(first)
    if (
        isinstance(first, ast.Compare)
        and isinstance(second, ast.Compare)
        and len(first.ops) == len(second.ops) == 1
        and ast.dump(first.left) == ast.dump(second.left)
        and ast.dump(first.comparators[0]) == ast.dump(second.comparators[0])
        and _NEGATED_OPS.get(type(first.ops[0])) is type(second.ops[0])
    ):
        return True
    return _complementary_on_ranks(first, second)


# Rank values two tests on one variable are tried on: -1 stands for "not distributed"
# (the HF and YOLO idiom `local_rank in [-1, 0]`), where neither side need hold.
_RANK_SAMPLES = range(-1, 9)


def _is_in(value: int, other: Any) -> bool:
    return value in other


def _not_in(value: int, other: Any) -> bool:
    return value not in other


_COMPARE: dict[type[ast.cmpop], Callable[[int, Any], bool]] = {
    ast.Eq: operator.eq,
    ast.NotEq: operator.ne,
    ast.Lt: operator.lt,
    ast.LtE: operator.le,
    ast.Gt: operator.gt,
    ast.GtE: operator.ge,
    ast.In: _is_in,
    ast.NotIn: _not_in,
}


def _ranks_where(test: ast.expr) -> tuple[str, frozenset[int]] | None:
    """(the variable, the sampled ranks where ``test`` holds) for ``x OP constant``, the
    constant an int or a list/tuple/set of ints; None for any other test."""
    if not (isinstance(test, ast.Compare) and len(test.ops) == 1):
        return None
    compare = _COMPARE.get(type(test.ops[0]))
    try:
        other = ast.literal_eval(test.comparators[0])
    except ValueError:
        return None
    is_int = isinstance(other, int) and not isinstance(other, bool)
    is_ints = isinstance(other, (list, tuple, set)) and all(isinstance(v, int) for v in other)
    if compare is None or not (is_int or is_ints):
        return None
    try:
        holds = frozenset(value for value in _RANK_SAMPLES if compare(value, other))
    except TypeError:  # `x < [0, 1]`
        return None
    return ast.dump(test.left), holds


def _same_on_every_rank(test: ast.expr) -> bool:
    """``local_rank != -1``, ``rank >= 0``: a rank test that every rank (>= 0) meets, or
    none does; -1 is the "not distributed" value of the idiom."""
    where = _ranks_where(test)
    if where is None:
        return False
    ranks = frozenset(value for value in _RANK_SAMPLES if value >= 0)
    held = where[1] & ranks
    return not held or held == ranks


def _complementary_on_ranks(first: ast.expr, second: ast.expr) -> bool:
    """``local_rank not in [-1, 0]`` / ``local_rank == 0``: on one variable, every rank
    (>= 0) meets exactly one of the two tests."""
    one, two = _ranks_where(first), _ranks_where(second)
    if one is None or two is None or one[0] != two[0]:
        return False
    ranks = frozenset(value for value in _RANK_SAMPLES if value >= 0)
    return (one[1] & ranks).isdisjoint(two[1]) and (one[1] | two[1]) >= ranks


def _has_exit(statements: list[ast.stmt]) -> bool:
    return any(
        isinstance(n, (ast.Return, ast.Break, ast.Continue))
        for statement in statements
        for n in _walk_scope(statement)
    )


def _is_rank_zero_only(node: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    for decorator in node.decorator_list:
        target = decorator.func if isinstance(decorator, ast.Call) else decorator
        name = target.attr if isinstance(target, ast.Attribute) else getattr(target, "id", "")
        if name in _RANK_ZERO_DECORATORS:
            return True
    return False


@dataclass(frozen=True)
class _Guard:
    kind: str  # rank | data | other
    line: int
    text: str
    # both sides issue the same collectives: no rank misses one by taking either side
    balanced: bool = False
    # `rank == src`, `self.rank == to`: one peer chosen per round, as collective algorithms
    # do on purpose; lint cannot prove the other side matches, so it only warns
    peer: bool = False
    test: ast.expr | None = field(default=None, compare=False)  # the if's test


class _ScopeChecker:
    """Walks one function (or a module's top level) with the conditions around each statement."""

    def __init__(
        self, linter: Linter, module: _Module, function: _Function | None, derived: set[str], ddp: set[str]
    ) -> None:
        self.linter = linter
        self.module = module
        self.function = function
        self.derived = derived
        self.ddp = ddp
        self.findings: list[LintFinding] = []
        self.path = _relative(module.path)
        # an exit under a diverging condition, waiting for a later collective: (guard, statement, loop)
        self.pending_exits: list[tuple[_Guard, ast.stmt, ast.stmt | None]] = []
        self.reported_exits: set[int] = set()  # one finding per exit: the first call it skips
        scope = function.node if function is not None else module.tree
        self.scope = scope
        self._scope_collectives: list[tuple[ast.Call, _Collective]] | None = None
        self._complementary: set[int] = set()  # ifs balanced by a sibling with the negated test
        self._filled_lines: dict[str, list[int]] = {}  # container -> lines of its rank-dependent filling
        # computed on first use: most scopes never need them
        self._rank_local: set[str] | None = None
        self._rank_ordered: set[str] | None = None
        self._variable_size: set[str] | None = None

    @property
    def rank_local(self) -> set[str]:
        if self._rank_local is None:
            self._rank_local = self.linter.rank_local_names(self.scope, self.module, self.function)
        return self._rank_local

    @property
    def rank_ordered(self) -> set[str]:
        if self._rank_ordered is None:
            self._rank_ordered = self._filled_under_rank_conditions(self.scope)
        return self._rank_ordered

    @rank_ordered.setter
    def rank_ordered(self, names: set[str]) -> None:
        self._rank_ordered = names

    @property
    def variable_size(self) -> set[str]:
        if self._variable_size is None:
            padded = any("pad" in name for name in _called_names(self.linter.nodes(self.scope)))
            self._variable_size = (
                set() if padded else self.linter.variable_size_names(self.scope, self.module, self.function)
            )
        return self._variable_size

    def _filled_under_rank_conditions(self, scope: ast.AST) -> set[str]:
        """Containers that only some ranks add to (``if local_rank == 0: metrics["x"] = ...``):
        their order or length differs per rank."""
        filled: set[str] = set()
        if not (self.derived or self.linter.mentions_rank(scope)):
            return filled
        for node in self.linter.nodes(scope):
            if not (isinstance(node, ast.If) and kind_of(node.test, self.derived) == RANK):
                continue
            for inner in (n for statement in node.body + node.orelse for n in _walk_scope(statement)):
                if isinstance(inner, ast.Assign):
                    for target in inner.targets:
                        if isinstance(target, ast.Subscript) and isinstance(target.value, ast.Name):
                            filled.add(target.value.id)
                            self._filled_lines.setdefault(target.value.id, []).append(inner.lineno)
                elif (
                    isinstance(inner, ast.Call)
                    and isinstance(inner.func, ast.Attribute)
                    and inner.func.attr in ("setdefault", "update", "add", "append", "insert", "extend")
                    and isinstance(inner.func.value, ast.Name)
                ):
                    filled.add(inner.func.value.id)
                    self._filled_lines.setdefault(inner.func.value.id, []).append(inner.lineno)
        return filled

    def order_of_loop(self, loop: ast.For | ast.AsyncFor) -> str | None:
        """Why the iteration order of ``loop`` may differ between ranks, or None."""
        iterable = loop.iter
        if (
            isinstance(iterable, ast.Call)
            and isinstance(iterable.func, ast.Attribute)
            and iterable.func.attr
            in (
                "items",
                "keys",
                "values",
            )
        ):
            iterable = iterable.func.value
        if (
            isinstance(iterable, ast.Name)
            and iterable.id in self.rank_ordered
            and not self._rebound(iterable.id, loop)
        ):
            return f"{iterable.id} is filled under a rank-dependent condition, so its order differs per rank"
        if isinstance(iterable, (ast.Set, ast.SetComp)):
            return "a set's iteration order is not the same in every process"
        if isinstance(iterable, ast.Call):
            name = ast.unparse(iterable.func)
            if name in ("set", "frozenset"):
                return "a set's iteration order is not the same in every process"
            if name.split(".")[-1] in ("listdir", "scandir", "glob", "iglob", "rglob", "iterdir"):
                return f"{name}() lists files in file-system order, which differs between hosts"
        return None

    def _rebound(self, name: str, loop: ast.stmt) -> bool:
        """Is ``name`` assigned anew (``ret = broadcast_list[0]``) after its rank-dependent
        filling and before ``loop``? Then the loop sees the new value."""
        filled_at = max((line for line in self._filled_lines.get(name, []) if line < loop.lineno), default=0)
        return any(
            isinstance(node, ast.Assign)
            and filled_at < node.lineno < loop.lineno
            and any(isinstance(t, ast.Name) and t.id == name for t in node.targets)
            for node in self.linter.nodes(self.scope)
        )

    def check_ordered_loop(self, loop: ast.For | ast.AsyncFor) -> None:
        reason = self.order_of_loop(loop)
        if reason is None:
            return
        found = self.collectives(loop.body)
        if found:
            call, collective = found[0]
            self.add(
                Cause.COLLECTIVE_ORDER_MISMATCH,
                "warning",
                call,
                f"{collective.label} in a loop over {ast.unparse(loop.iter)} (line {loop.lineno}): "
                f"{reason}; iterate sorted(...) so every rank issues the same sequence",
                collective,
            )

    def check_passed_containers(self, call: ast.Call) -> None:
        """A rank-filled container handed to a helper that loops over it with a collective."""
        if not any(isinstance(a, ast.Name) for a in [*call.args, *(k.value for k in call.keywords)]):
            return
        if not self.rank_ordered:
            return
        target = self.linter.resolve_call(call, self.module, self.function)
        if target is None:
            return
        params = [a.arg for a in (*target.node.args.posonlyargs, *target.node.args.args)]
        if params and params[0] in ("self", "cls"):
            params = params[1:]
        passed: dict[str, str] = {}
        for index, arg in enumerate(call.args):
            if isinstance(arg, ast.Name) and arg.id in self.rank_ordered and index < len(params):
                passed[params[index]] = arg.id
        for keyword in call.keywords:
            if isinstance(keyword.value, ast.Name) and keyword.value.id in self.rank_ordered and keyword.arg:
                passed[keyword.arg] = keyword.value.id
        if not passed:
            return
        helper = _ScopeChecker(
            self.linter, target.module, target, set(), self.linter.ddp_names_of(target.node)
        )
        helper.rank_ordered = set(passed)
        for node in self.linter.nodes(target.node):
            if isinstance(node, (ast.For, ast.AsyncFor)) and helper.order_of_loop(node) is not None:
                found = helper.collectives(node.body)
                if found:
                    _inner_call, collective = found[0]
                    param = ast.unparse(node.iter)
                    self.add(
                        Cause.COLLECTIVE_ORDER_MISMATCH,
                        "warning",
                        call,
                        f"{collective.label} in a loop over {param} in {target.name}() (line "
                        f"{node.lineno}), which gets {', '.join(sorted(set(passed.values())))}: filled "
                        f"under a rank-dependent condition, its order differs per rank; iterate sorted(...)",
                        collective,
                    )
                    return

    def check_shapes(self, call: ast.Call, collective: _Collective) -> None:
        if not collective.label.startswith("dist.") or len(collective.chain) != 1:
            return
        if collective.label.split(".")[-1] not in _SIZE_SENSITIVE or not self.variable_size:
            return
        sized = [
            a.id
            for a in [*call.args, *(k.value for k in call.keywords)]
            if isinstance(a, ast.Name) and a.id in self.variable_size
        ]
        if sized:
            self.add(
                Cause.COLLECTIVE_SHAPE_MISMATCH,
                "warning",
                call,
                f"{collective.label} of {sized[0]}, whose size depends on the data (boolean indexing, "
                f"nonzero, masked_select, cat of a list): ranks pass tensors of different sizes; pad "
                f"to a common size (gather the sizes first) or use all_gather_object",
                collective,
            )

    def kind(self, test: ast.expr, branches: list[ast.stmt]) -> str:
        kind = kind_of(test, self.derived)
        if kind == RANK and kind_of(test, set()) != RANK:
            # rank-dependent only through names: those whose rank value reaches the test
            kind = kind_of(test, reaching_rank_names(self.scope, self.derived, test.lineno))
        if kind == RANK and _same_on_every_rank(test):
            return "other"  # `local_rank != -1`: "is this job distributed", true on every rank
        if kind == DATA and not (_called_names(test) & _TENSOR_VALUE_CALLS or _reads_shape(test)):
            kind = "other"  # len() of a list, any() of flags: the same on every rank as a rule
        if kind == DATA:
            names = {n.id for n in ast.walk(test) if isinstance(n, ast.Name)}
            if names & self.linter.rooted_names(self.scope, self.module).keys():
                return "unsynced"  # dist.reduce's result, read on ranks that are not its dst
            if names and names <= self.linter.synced_names(self.scope, self.module):
                kind = "other"  # the value of a tensor that was all-reduced or broadcast first
        if kind in (RANK, DATA):
            return kind
        if _called_names(test) & _UNSYNCED_CALLS:
            return "unsynced"
        if self.collectives(branches) or _has_exit(branches):
            # a function of the project's that returns such a value: `if should_resume(path)`
            for call in (n for n in ast.walk(test) if isinstance(n, ast.Call)):
                target = self.linter.resolve_call(call, self.module, self.function)
                if target is not None and self.linter._returns_local_number(target):
                    return "unsynced"
        names = _names_tested_for_value(test)
        # rank-local values take an analysis of the scope: only worth it where the branch
        # could skip something (a collective or an exit)
        if names and (self.collectives(branches) or _has_exit(branches)) and names & self.rank_local:
            return "unsynced"
        return kind

    @property
    def scope_collectives(self) -> list[tuple[ast.Call, _Collective]]:
        """Every call of this scope that communicates, found in one pass (most scopes: none)."""
        if self._scope_collectives is None:
            found = [
                (node, collective)
                for node in self.linter.nodes(self.scope)
                if isinstance(node, ast.Call)
                and (collective := self.linter.collective_of_call(node, self.module, self.function, self.ddp))
                is not None
            ]
            self._scope_collectives = sorted(found, key=lambda pair: (pair[0].lineno, pair[0].col_offset))
        return self._scope_collectives

    def collectives_within(self, node: ast.AST) -> list[tuple[ast.Call, _Collective]]:
        start = (getattr(node, "lineno", 0), getattr(node, "col_offset", 0))
        end = (getattr(node, "end_lineno", 0) or 0, getattr(node, "end_col_offset", 0) or 0)
        return [
            (call, collective)
            for call, collective in self.scope_collectives
            if start <= (call.lineno, call.col_offset)
            and (call.end_lineno or 0, call.end_col_offset or 0) <= end
        ]

    def collectives(self, statements: list[ast.stmt]) -> list[tuple[ast.Call, _Collective]]:
        if not self.scope_collectives:
            return []
        found = []
        for statement in statements:
            if not isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                found += self.collectives_within(statement)
        return found

    def block(self, statements: list[ast.stmt], guards: list[_Guard], loop: ast.stmt | None = None) -> None:
        self._mark_complementary(statements)
        for statement in statements:
            self.statement(statement, guards, loop)

    def _mark_complementary(self, statements: list[ast.stmt]) -> None:
        """``if not is_main: barrier()`` ... ``if is_main: barrier()`` in one block (the
        "main process first" idiom): every rank makes the call once, in one of the two."""
        ifs = [s for s in statements if isinstance(s, ast.If) and not s.orelse]
        if len(ifs) < 2 or not self.scope_collectives:
            return
        for i, first in enumerate(ifs):
            for second in ifs[i + 1 :]:
                if _negates(first.test, second.test):
                    labels_first = [c.label for _call, c in self.collectives(first.body)]
                    labels_second = [c.label for _call, c in self.collectives(second.body)]
                    if labels_first and labels_first == labels_second:
                        self._complementary |= {id(first), id(second)}

    def statement(self, node: ast.stmt, guards: list[_Guard], loop: ast.stmt | None) -> None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            return  # checked as scopes of their own
        if isinstance(node, (ast.Return, ast.Break, ast.Continue, ast.Raise)) or _is_exit_call(node):
            self.calls_here(node, guards)  # `return helper(x)`: the value runs before the exit
            # A raise (or a non-zero exit) fails the rank, and torchrun stops the others:
            # a crash (rank-crashed), not a silent wait. A clean sys.exit() leaves them waiting.
            if isinstance(node, ast.Raise) or (_is_exit_call(node) and not _clean_exit(node)):
                return
            # the test right above the exit decides it (an outer rank test around an inner
            # `if not isinstance(state, Tensor): return` does not make that return rank-driven)
            if guards and guards[-1].kind != "other":
                self.pending_exits.append((guards[-1], node, loop))
            return
        if isinstance(node, ast.If):
            self.calls_here(node.test, guards)
            kind = self.kind(node.test, [*node.body, *node.orelse])
            balanced = kind == "other" or id(node) in self._complementary or not self._branches_differ(node)
            peer = (
                isinstance(node.test, ast.Compare)
                and kind == RANK
                and all(
                    kind_of(side, self.derived) == RANK for side in [node.test.left, *node.test.comparators]
                )
            )
            guard = _Guard(kind, node.lineno, ast.unparse(node.test), balanced, peer, node.test)
            # An exit in one branch does not skip what the other branch runs: each branch
            # starts from the exits seen before the if; both sets apply after it.
            exits_before = list(self.pending_exits)
            self.block(node.body, [*guards, guard], loop)
            from_body = self.pending_exits[len(exits_before) :]
            self.pending_exits = list(exits_before)
            self.block(node.orelse, [*guards, guard], loop)
            self.pending_exits += from_body
            return
        if isinstance(node, (ast.For, ast.AsyncFor, ast.While)):
            if isinstance(node, ast.While):
                self.calls_here(node.test, guards)
                self.check_while_test(node)
            else:
                self.calls_here(node.iter, guards)
                self.check_ordered_loop(node)
            before = len(self.pending_exits)
            self.block(node.body, guards, node)
            # A continue under a diverging condition skips the collectives after it in
            # this pass; a break skips those and every later pass's.
            in_loop = sorted(
                self.collectives(node.body), key=lambda pair: (pair[0].lineno, pair[0].col_offset)
            )
            for guard, exit_node, exit_loop in self.pending_exits[before:]:
                if exit_loop is not node or not isinstance(exit_node, (ast.Break, ast.Continue)):
                    continue
                skipped = [pair for pair in in_loop if pair[0].lineno > exit_node.lineno]
                if isinstance(exit_node, ast.Break):
                    skipped += in_loop
                certain = [pair for pair in skipped if pair[1].certain]
                if certain or skipped:
                    call, collective = (certain or skipped)[0]
                    self.report_exit(guard, exit_node, call, collective)
            self.pending_exits[before:] = [
                p for p in self.pending_exits[before:] if not isinstance(p[1], (ast.Break, ast.Continue))
            ]
            self.block(node.orelse, guards, loop)
            return
        if isinstance(node, ast.Try):
            self.block(node.body, guards, loop)
            swallowing = [h for h in node.handlers if not any(isinstance(n, ast.Raise) for n in ast.walk(h))]
            if swallowing:
                handled = {c.label for _call, c in self.collectives(list(swallowing[0].body))}
                for call, collective in self.collectives(node.body):
                    if collective.label not in handled:
                        self.add(
                            Cause.RANK_EXCEPTION,
                            "warning",
                            call,
                            f"{collective.label} inside a try whose except (line "
                            f"{swallowing[0].lineno}) swallows the error: a rank that fails before "
                            f"it skips the collective the others wait in",
                            collective,
                        )
            for handler in node.handlers:
                self.block(handler.body, guards, loop)
            self.block(node.orelse, guards, loop)
            self.block(node.finalbody, guards, loop)
            return
        if isinstance(node, (ast.With, ast.AsyncWith)):
            for item in node.items:
                self.calls_here(item.context_expr, guards)
            self.block(node.body, guards, loop)
            return
        if isinstance(node, ast.Match):
            for case in node.cases:
                self.block(case.body, guards, loop)
            return
        self.calls_here(node, guards)

    def _branches_differ(self, node: ast.If) -> bool:
        """Do the two sides of the if issue different collectives? (same on both: fine)"""
        body = [c.label for _call, c in self.collectives(node.body)]
        orelse = [c.label for _call, c in self.collectives(node.orelse)]
        return body != orelse

    def calls_here(self, node: ast.AST, guards: list[_Guard]) -> None:
        if self.rank_ordered:
            for call in _calls_in(node):
                self.check_passed_containers(call)
        for call, collective in self.collectives_within(node) if self.scope_collectives else []:
            self.check_shapes(call, collective)
            if (
                collective.label.endswith("generate() without synced_gpus=True")
                and len(collective.chain) == 1
            ):
                self.add(
                    Cause.DATA_DEPENDENT_BRANCH,
                    "warning",
                    call,
                    f"{collective.label}: generation runs one forward per new token and, with FSDP "
                    f"or ZeRO-3, every forward all-gathers sharded parameters; ranks whose sequences "
                    f"end sooner stop gathering and the others wait. Pass synced_gpus=True",
                    collective,
                )
            for guard, exit_node, _loop in self.pending_exits:
                if not isinstance(exit_node, (ast.Break, ast.Continue)):
                    self.report_exit(guard, exit_node, call, collective)
            diverging = [
                g
                for g in guards
                if g.kind != "other" and not g.balanced and not self.members_of_its_group(g, call, collective)
            ]
            if diverging:
                self.report_branch(diverging[-1], call, collective)

    def members_of_its_group(self, guard: _Guard, call: ast.Call, collective: _Collective) -> bool:
        """``if rank in ranks: dist.all_reduce(x, group=group)`` where ``group =
        dist.new_group(ranks)``, or a test on ``get_process_group_ranks(group)`` or
        ``get_rank(group)``: only the group's members call it, and they are all its ranks."""
        if guard.kind != RANK or guard.test is None or len(collective.chain) != 1:
            return False
        group = next((k.value for k in call.keywords if k.arg == "group"), None)
        position = _GROUP_POSITION.get(collective.label.rpartition(".")[2])
        if group is None and position is not None and len(call.args) > position:
            group = call.args[position]
        if group is None:
            return False
        group_text = ast.unparse(group)
        members = self.ranks_of_group(group_text) | {
            f"{prefix}get_process_group_ranks({group_text})" for prefix in ("", "dist.", "torch.distributed.")
        }
        return any(_tests_membership(node, group_text, members) for node in ast.walk(guard.test))

    def ranks_of_group(self, group_text: str) -> set[str]:
        """The expressions a group of this name was made from: ``ranks`` for
        ``group = dist.new_group(ranks)`` (or ``new_group(ranks=ranks)``), in this scope or
        at module level."""
        found: set[str] = set()
        for scope in (self.scope, self.module.tree):
            for node in self.linter.nodes(scope):
                if not (isinstance(node, ast.Assign) and isinstance(node.value, ast.Call)):
                    continue
                if getattr(node.value.func, "attr", getattr(node.value.func, "id", "")) != "new_group":
                    continue
                if not any(ast.unparse(target) == group_text for target in node.targets):
                    continue
                made_from = [
                    *node.value.args[:1],
                    *(k.value for k in node.value.keywords if k.arg == "ranks"),
                ]
                found |= {ast.unparse(ranks) for ranks in made_from}
        return found

    def at(self, line: int, collective: _Collective) -> str:
        """A line of the checked file, named so that it reads right next to the finding's site."""
        return f"line {line}" if collective.path == self.path else f"{self.path}:{line}"

    def report_branch(self, guard: _Guard, call: ast.Call, collective: _Collective) -> None:
        if guard.kind == RANK:
            cause, severity, why = Cause.RANK_CONDITIONAL_COLLECTIVE, "error", "rank-dependent"
        elif guard.kind == DATA:
            cause, severity, why = (
                Cause.DATA_DEPENDENT_BRANCH,
                "warning",
                "data-dependent (a tensor's value or size)",
            )
        else:
            cause, severity, why = (
                Cause.UNSYNCHRONIZED_DECISION,
                "warning",
                "rank-local (a clock, a file check, a random draw)",
            )
        if not collective.certain or guard.peer:
            severity = "warning"
        self.add(
            cause,
            severity,
            call,
            f"{collective.label} is reached only where `{guard.text}` "
            f"({self.at(guard.line, collective)}) holds, a {why} condition: the other ranks never "
            f"make this call",
            collective,
            guard,
        )

    def check_while_test(self, loop: ast.While) -> None:
        """``while time.time() - start < budget:`` around a collective: a test whose value
        differs per rank ends the loop after a different number of passes on each."""
        if isinstance(loop.test, ast.Constant) or self.collectives_within(loop.test):
            return  # a test that communicates (broadcasts rank 0's decision) is agreed on
        in_loop = sorted(self.collectives(loop.body), key=lambda pair: (pair[0].lineno, pair[0].col_offset))
        if not in_loop:
            return
        kind = self.kind(loop.test, loop.body)
        if kind == "other":
            return
        certain = [pair for pair in in_loop if pair[1].certain]
        call, collective = (certain or in_loop)[0]
        cause = {RANK: Cause.RANK_CONDITIONAL_COLLECTIVE, DATA: Cause.DATA_DEPENDENT_BRANCH}.get(
            kind, Cause.UNSYNCHRONIZED_DECISION
        )
        guard = _Guard(kind, loop.lineno, ast.unparse(loop.test))
        self.add(
            cause,
            "error" if kind == RANK and collective.certain else "warning",
            call,
            f"{collective.label} runs in every pass of the `while` at line {loop.lineno}, whose test "
            f"`{guard.text}` can differ per rank: ranks that leave the loop sooner never make "
            "the others' last calls",
            collective,
            guard,
        )

    def report_exit(
        self, guard: _Guard, exit_node: ast.stmt, call: ast.Call, collective: _Collective
    ) -> None:
        if id(exit_node) in self.reported_exits:
            return  # one finding per exit: the first call it skips
        self.reported_exits.add(id(exit_node))
        statement = _exit_word(exit_node)
        cause = {RANK: Cause.RANK_EARLY_EXIT, DATA: Cause.DATA_DEPENDENT_BRANCH}.get(
            guard.kind, Cause.UNSYNCHRONIZED_DECISION
        )
        severity = "error" if guard.kind == RANK and collective.certain else "warning"
        self.add(
            cause,
            severity,
            call,
            f"{collective.label} is skipped by the `{statement}` at line {exit_node.lineno} under "
            f"`{guard.text}` ({self.at(guard.line, collective)}): ranks that take it never make "
            f"this call",
            collective,
            guard,
        )

    def rooted_reason(self, guard: _Guard) -> str:
        """Why a condition is rank-local when it reads what dist.reduce left on a rank: said,
        since the value came out of a collective and looks synchronised."""
        if guard.kind != "unsynced":
            return ""
        try:
            read = {n.id for n in ast.walk(ast.parse(guard.text, mode="eval")) if isinstance(n, ast.Name)}
        except SyntaxError:
            return ""
        rooted = self.linter.rooted_names(self.scope, self.module)
        for name in sorted(read & rooted.keys()):
            label, line = rooted[name]
            return (
                f"; `{name}` holds the result of {label}() at line {line}, which only its "
                "destination rank receives: the others test their own partial value"
            )
        return ""

    def decorated_rank_zero(self) -> None:
        assert self.function is not None
        for call in _calls_in(self.function.node):
            collective = self.linter.collective_of_call(call, self.module, self.function, self.ddp)
            if collective is not None:
                self.add(
                    Cause.RANK_CONDITIONAL_COLLECTIVE,
                    "error" if collective.certain else "warning",
                    call,
                    f"{collective.label} in {self.function.name}(), which runs on rank 0 only "
                    f"(decorated with a rank-zero decorator)",
                    collective,
                )

    def add(
        self,
        cause: Cause,
        severity: str,
        call: ast.Call,
        message: str,
        collective: _Collective,
        guard: _Guard | None = None,
    ) -> None:
        where = f" (in {self.function.name}()" if self.function else " (at module level"
        evidence = [f"call chain: {' -> '.join(collective.chain)}"]
        if guard is not None:
            evidence.append(f"condition at {self.path}:{guard.line}: {guard.text}")
            message += self.rooted_reason(guard)
        if len(collective.chain) > 1:
            where += f", through {' -> '.join(collective.chain[:-1])}"
        where += ")"
        self.findings.append(
            LintFinding(
                cause,
                severity,
                collective.path,
                collective.line,
                collective.col,
                message + where,
                evidence,
                guard.line if guard is not None else None,
                call.lineno,
                self.path,
                collective.label,
            )
        )


def _names_tested_for_value(test: ast.expr) -> set[str]:
    """The names a condition reads the value of: not those it only tests against None
    (``if grad_norm is None``: whether it was given, the same on every rank)."""
    presence_only: set[int] = set()
    for node in ast.walk(test):
        if (
            isinstance(node, ast.Compare)
            and all(isinstance(op, (ast.Is, ast.IsNot)) for op in node.ops)
            and all(isinstance(c, ast.Constant) and c.value is None for c in node.comparators)
        ):
            presence_only |= {id(n) for n in ast.walk(node.left)}
    return {n.id for n in ast.walk(test) if isinstance(n, ast.Name) and id(n) not in presence_only}


def _tests_membership(node: ast.AST, group_text: str, members: set[str]) -> bool:
    """``rank in ranks`` (``members``: what the group was made from, or its
    get_process_group_ranks), or ``dist.get_rank(group) >= 0`` (-1 outside the group;
    not ``== 0``, which picks the group's first rank)."""
    if not isinstance(node, ast.Compare) or len(node.ops) != 1:
        return False
    op, left, right = node.ops[0], node.left, node.comparators[0]
    if isinstance(op, ast.In):
        return ast.unparse(right) in members
    if not isinstance(left, ast.Call):
        return False
    name = left.func.attr if isinstance(left.func, ast.Attribute) else getattr(left.func, "id", "")
    if name not in ("get_rank", "get_group_rank"):
        return False
    if not any(ast.unparse(arg) == group_text for arg in [*left.args, *(k.value for k in left.keywords)]):
        return False
    bound = ast.unparse(right)
    return (isinstance(op, ast.GtE) and bound == "0") or (
        isinstance(op, (ast.NotEq, ast.Gt)) and bound == "-1"
    )


def _called_names(where: ast.AST | Iterable[ast.AST]) -> set[str]:
    """Names of the functions called in an expression (or among a list of nodes)."""
    calls: set[str] = set()
    for child in ast.walk(where) if isinstance(where, ast.AST) else where:
        if isinstance(child, ast.Call):
            func = child.func
            calls.add(func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", ""))
    return calls


def _is_exit_call(node: ast.stmt) -> bool:
    if not (isinstance(node, ast.Expr) and isinstance(node.value, ast.Call)):
        return False
    func = node.value.func
    return ast.unparse(func) in ("sys.exit", "exit", "quit", "os._exit")


def _clean_exit(node: ast.stmt) -> bool:
    """sys.exit() / sys.exit(0) / exit(None): the process ends with status 0."""
    assert isinstance(node, ast.Expr) and isinstance(node.value, ast.Call)
    args = node.value.args
    return not args or (isinstance(args[0], ast.Constant) and args[0].value in (0, None))


def _exit_word(node: ast.stmt) -> str:
    if isinstance(node, ast.Expr) and isinstance(node.value, ast.Call):
        return ast.unparse(node.value.func) + "()"
    return type(node).__name__.lower()


def _ignore_comments(text: str) -> dict[int, set[str] | None]:
    found: dict[int, set[str] | None] = {}
    if "ncclcheck" not in text:
        return found
    try:
        for token in tokenize.generate_tokens(io.StringIO(text).readline):
            if token.type == tokenize.COMMENT:
                match = _IGNORE.search(token.string)
                if match:
                    causes = match.group(1)
                    found[token.start[0]] = {c.strip() for c in causes.split(",")} if causes else None
    except (tokenize.TokenError, SyntaxError):
        pass
    return found


def _dedupe(findings: list[LintFinding]) -> list[LintFinding]:
    seen: set[tuple[str, int, int, str]] = set()
    unique = []
    for finding in findings:
        key = (finding.path, finding.line, finding.col, finding.cause)
        if key not in seen:
            seen.add(key)
            unique.append(finding)
    return unique


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


def run_lint(paths: list[Path]) -> tuple[list[LintFinding], Linter]:
    linter = Linter()
    findings: list[LintFinding] = []
    for path in python_files(paths):
        module = linter.load(path)
        if module is not None:
            findings += linter.check(module)
    findings.sort(key=lambda f: (f.path, f.line, f.col))
    return findings, linter
