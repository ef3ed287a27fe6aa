"""The project lint reads: its modules parsed and indexed, names resolved through their
imports, and which calls communicate (directly, or through the user's own functions)."""

from __future__ import annotations

import ast
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from ncclcheck.communicates import (
    ACCELERATE_METHODS,
    ACCELERATE_SAVE_STATE,
    DCP_FUNCTIONS,
    DCP_MODULE,
    LIGHTNING_COLLECTIVES,
    RECEIVER_METHODS,
    SHARDED_FORWARD,
    STATE_DICT_FUNCTIONS,
    STATE_DICT_MODULE,
    ZERO_CONSOLIDATE,
)
from ncclcheck.errors import InputError

# Point-to-point calls (send/recv, batch_isend_irecv) are rank-dependent by design: each
# side's branch is paired with the other's, so lint leaves them out.
from ncclcheck.lint.findings import (
    AttributeSite,
    Collective,
    Function,
    ParsedModule,
    dedupe,
    located,
    relative_path,
)
from ncclcheck.lint.rank_sets import imported_rank_names
from ncclcheck.lint.reaching import tests_over
from ncclcheck.lint.samplers import eval_loaders_without_sampler
from ncclcheck.lint.scope import ScopeChecker
from ncclcheck.lint.syntax import (
    called_names,
    constructed,
    ddp_parameters_of,
    ddp_wrapped_names,
    dist_label,
    element_sources,
    formatted_arguments,
    ignore_comments,
    is_property,
    is_rank_zero_only,
    keyword_true,
    nodes_under,
    reaching_nodes_in,
    returns_cat,
    walk_scope,
    wraps_in_ddp,
)
from ncclcheck.lint.tables import DIST_OPS, NUMBER_OF, RANK_WORDS, ROOTED, UNSYNCED_CALLS
from ncclcheck.model import Finding
from ncclcheck.source.reading import (
    bound_names,
    callee_name,
    derives_from_the_rank,
    device_names,
    rank_attributes,
    rank_derived_names,
    rank_fields,
    rank_functions,
    reads_a_reduction,
    self_attribute,
)


class Linter:
    def __init__(self) -> None:
        self.modules: dict[Path, ParsedModule] = {}
        self.modules_by_tree: dict[int, ParsedModule] = {}
        # (id(function node), its DDP parameters) -> the first collective it reaches
        self._collective_of: dict[tuple[int, frozenset[str]], Collective | None] = {}
        self._in_progress: set[tuple[int, frozenset[str]]] = set()
        self._local_number: dict[int, bool] = {}  # id(function node) -> returns a rank-local number
        self._variable_size: dict[int, bool] = {}  # id(function node) -> returns a data-sized tensor
        self._nodes: dict[int, list[ast.AST]] = {}  # id(scope) -> its nodes, nested defs left out
        self._derived: dict[int, set[str]] = {}
        self._class_attributes: dict[tuple[Path, str], set[str]] = {}
        self._class_members: dict[tuple[Path, str], frozenset[str]] = {}
        self.constructed: dict[int, dict[str, str]] = {}
        self._ddp: dict[int, set[str]] = {}
        self._mentions: dict[int, bool] = {}
        self._synced: dict[int, dict[str, list[int]]] = {}
        self._passed: dict[int, dict[str, list[int]]] = {}  # what sync_points starts from
        self._syncing: set[int] = set()  # id(scope) whose sync points are being read
        self._local_attributes: dict[int, set[str]] = {}  # id(module tree) -> rank-local attributes
        self._loop_elements: dict[int, dict[str, ast.expr]] = {}  # id(function node) -> element_sources
        self._fed_local: dict[int, set[str]] = {}  # id(function node) -> parameters fed local values
        # (module, attribute) -> {attribute} where a function of its program hands it a local value
        self._handed_local: dict[tuple[int, str], set[str]] = {}
        self._handing: dict[int, dict[str, list[Function]]] = {}  # id(module tree) -> _handing_functions
        # (module, modules loaded) -> the modules of its program
        self._beside: dict[tuple[int, int], list[ParsedModule]] = {}
        self._imports_loaded: set[int] = set()  # id(module tree) whose imported modules are loaded
        # nested computations of local attributes, fed parameters and handed attributes in
        # progress (_within_depth, attribute_is_local): past _HANDED_DEPTH, no answer is sought
        self._computing = 0
        self._shallow = 0  # > 0: reading a caller's own values only (fed_local_parameters)
        # attribute -> where a function sets it from (or under a test of) a rank-local value:
        # the line that decides for a test that only reads the attribute
        self._attribute_sites: dict[tuple[Path, str], AttributeSite] = {}
        self._calls_by_name: dict[int, dict[str, list[tuple[Function | None, ast.Call]]]] = {}  # _calls_in
        self._module_paths: dict[tuple[Path, str, int], Path | None] = {}
        self._properties: tuple[int, frozenset[str]] = (-1, frozenset())  # (modules read, their properties)
        self._duck_classes: dict[tuple[int, str], str | None] = {}  # (id(function node), parameter) -> class
        self._members_by_class: dict[int, dict[str, set[str]]] = {}  # id(module tree) -> class -> members
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
            self._mentions[key] = bool(mentioned & RANK_WORDS)
            self._derived[key] = rank_derived_names(scope, nodes) if mentioned & RANK_WORDS else set()
        return self._derived[key]

    def constructions(self, scope: ast.AST) -> dict[str, str]:
        """What class each name (``x``) or attribute (``self.x``) of ``scope`` is bound to an
        instance of, from one walk of the scope, cached."""
        key = id(scope)
        if key not in self.constructed:
            self.constructed[key] = constructed(scope)
        return self.constructed[key]

    def class_rank_attributes(self, module: ParsedModule, class_name: str) -> set[str]:
        """What the class's methods set from rank values, cached per class."""
        key = (module.path, class_name)
        if key not in self._class_attributes:
            classes = [n for n in module.all_nodes if isinstance(n, ast.ClassDef) and n.name == class_name]
            self._class_attributes[key] = set().union(*(rank_attributes(c) for c in classes))
        return self._class_attributes[key]

    def class_derived_members(self, module: ParsedModule, class_name: str) -> frozenset[str]:
        """Attributes and methods of a class whose values derive from the rank through what
        its constructions pass in: ``Trainer(model, args, load_shard(rank))`` makes
        ``self.train_dataset`` (set from that parameter in ``__init__``), what is computed
        from it (``len(self.train_dataset)``) and a method returning something built on it
        (``get_train_dataloader()``) rank-derived in the class's methods. Cached per class."""
        key = (module.path, class_name)
        if key in self._class_members:
            return self._class_members[key]
        self._class_members[key] = frozenset()  # while computing
        classes = [n for n in module.all_nodes if isinstance(n, ast.ClassDef) and n.name == class_name]
        methods = [
            m for c in classes for m in c.body if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef))
        ]
        init = next((m for m in methods if m.name == "__init__"), None)
        params = [a.arg for a in (init.args.posonlyargs + init.args.args)[1:]] if init is not None else []
        given = self._rank_derived_arguments(module, class_name, params) if params else set()
        members: set[str] = self._rank_tests_of(methods, self.class_rank_attributes(module, class_name))
        for _ in range(4 if given else 0):
            before = len(members)
            for method in methods:
                # once per method and round: its names derived from what is known so far
                seeds = frozenset(members | (given if method is init else set()))
                local = rank_derived_names(method, self.nodes(method), seeds=seeds) | seeds
                for node in self.nodes(method):
                    if isinstance(node, ast.Assign | ast.AnnAssign) and node.value is not None:
                        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                        if derives_from_the_rank(node.value, set(local)):
                            members |= {a for t in targets if (a := self_attribute(t)) is not None}
                    elif (
                        isinstance(node, ast.Return)
                        and node.value is not None
                        and method is not init
                        and derives_from_the_rank(node.value, set(local))
                    ):
                        members.add(method.name)
            if len(members) == before:
                break
        self._class_members[key] = frozenset(members)
        return self._class_members[key]

    def _rank_tests_of(
        self, methods: list[ast.FunctionDef | ast.AsyncFunctionDef], attributes: set[str]
    ) -> set[str]:
        """The methods (properties among them) that take no argument and return a rank
        value itself: ``return self.global_rank == 0`` on an attribute set from the rank,
        ``return dist.get_rank() == 0``. One that returns an object built with one is no
        rank (``return TrainerState(is_world_process_zero=...)``)."""
        found = set()
        for method in methods:
            arguments = method.args
            if method.name == "__init__" or len(arguments.args) > 1 or arguments.kwonlyargs:
                continue
            returned = [
                n.value for n in self.nodes(method) if isinstance(n, ast.Return) and n.value is not None
            ]
            if returned and all(
                isinstance(value, ast.Compare | ast.BoolOp | ast.UnaryOp | ast.Name | ast.Attribute)
                and derives_from_the_rank(value, attributes)
                for value in returned
            ):
                found.add(method.name)
        return found

    def _rank_derived_arguments(self, module: ParsedModule, class_name: str, params: list[str]) -> set[str]:
        """The ``__init__`` parameters some construction of the class in ``module`` passes a
        rank-derived value for, judged in the scope of that construction."""
        given: set[str] = set()
        module_derived = self.derived_names(module.tree)
        scopes: list[ast.AST] = [module.tree, *(f.node for fs in module.functions.values() for f in fs)]
        for scope in scopes:
            calls = [n for n in self.nodes(scope) if isinstance(n, ast.Call) and callee_name(n) == class_name]
            if not calls:
                continue
            nodes = self.nodes(scope)
            derived = module_derived | self.derived_names(scope)
            devices = device_names(nodes)
            for call in calls:
                for index, arg in enumerate(call.args[: len(params)]):
                    if derives_from_the_rank(arg, derived, devices):
                        given.add(params[index])
                for keyword in call.keywords:
                    if keyword.arg in params and derives_from_the_rank(keyword.value, derived, devices):
                        given.add(keyword.arg)
        return given

    def mentions_rank(self, scope: ast.AST) -> bool:
        """Does ``scope`` name a rank (``rank``, ``get_rank()``, ``is_main_process``, ...)?"""
        if id(scope) not in self._mentions:
            self.derived_names(scope)
        return self._mentions[id(scope)]

    def ddp_names_of(self, scope: ast.AST) -> set[str]:
        key = id(scope)
        if key not in self._ddp:
            self._ddp[key] = ddp_wrapped_names(self.nodes(scope))
        return self._ddp[key]

    def nodes(self, scope: ast.AST) -> list[ast.AST]:
        """The nodes of a function (or module top level), walked once: every check reads them."""
        key = id(scope)
        if key not in self._nodes:
            self._nodes[key] = list(walk_scope(scope))
        return self._nodes[key]

    # -- loading -------------------------------------------------------------------

    def load(self, path: Path, follow: bool = True) -> ParsedModule | None:
        path = path.resolve()
        if path in self.modules:
            return self.modules[path]
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            raise InputError(f"{relative_path(path)}: not a text file") from None
        except OSError as exc:
            raise InputError(f"{relative_path(path)}: {exc.strerror}") from None
        try:
            tree = ast.parse(text, filename=str(path))
        except SyntaxError as exc:
            raise InputError(f"{relative_path(path)}:{exc.lineno}: syntax error: {exc.msg}") from None
        module = ParsedModule(path, tree, text.splitlines())
        module.all_nodes = nodes_under(tree, enter_scopes=True)
        self.modules[path] = module
        self.modules_by_tree[id(tree)] = module
        self.lines_checked += len(module.lines)
        module.ignores = ignore_comments(text)
        self._index(module, follow)
        return module

    def _index(self, module: ParsedModule, follow: bool) -> None:
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
                    elif base == "torch.distributed" and alias.name in DIST_OPS:
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
        module.ddp_names = ddp_wrapped_names(module.all_nodes)
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
        module.wraps_ddp = wraps_in_ddp(module.all_nodes) or "DistributedDataParallel(" in text

    def _index_definitions(self, module: ParsedModule, node: ast.stmt, class_name: str | None) -> None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            function = Function(node, module, class_name)
            module.functions.setdefault(node.name, []).append(function)
            if class_name is not None:
                module.methods[(class_name, node.name)] = function
        elif isinstance(node, ast.ClassDef):
            for child in node.body:
                self._index_definitions(module, child, node.name)

    def _note_import(self, module: ParsedModule, base: str, level: int, name: str, local: str) -> None:
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

    def _module_of(self, path: Path) -> ParsedModule | None:
        try:
            return self.load(path)
        except InputError:
            return None  # an imported module that does not parse: not followed

    # -- which calls communicate ----------------------------------------------------

    def is_dist(self, node: ast.expr, module: ParsedModule) -> bool:
        if isinstance(node, ast.Name):
            return node.id in module.dist_aliases
        return (
            isinstance(node, ast.Attribute)
            and node.attr == "distributed"
            and isinstance(node.value, ast.Name)
            and node.value.id == "torch"
        )

    def collective_of_call(
        self, call: ast.Call, module: ParsedModule, function: Function | None, ddp_names: set[str]
    ) -> Collective | None:
        label = self._direct_label(call, module, ddp_names)
        if label is not None:
            path = relative_path(module.path)
            certain = not label.endswith("forward through DistributedDataParallel") and not (
                label.endswith(ACCELERATE_SAVE_STATE)
                and not (module.shards_parameters or module.automatic_checkpoints)
            )
            return Collective(
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
        inner = self.collective_of_function(target, ddp_parameters_of(call, target, ddp_names))
        if inner is None:
            return None
        here = f"{relative_path(module.path)}:{call.lineno}"
        return Collective(
            inner.label,
            [f"{target.name}() called at {here}", *inner.chain],
            inner.path,
            inner.line,
            inner.col,
            inner.certain,
        )

    def collective_of_node(
        self, node: ast.expr, module: ParsedModule, function: Function | None, ddp_names: set[str]
    ) -> Collective | None:
        """What a node reaches: a call, as collective_of_call; and what runs without a call in
        the source (syntax.IMPLICIT_NODES): a property read, an f-string field's __format__,
        __str__ or __repr__, an argument print() or a logger turns into text."""
        if isinstance(node, ast.Call):
            found = self.collective_of_call(node, module, function, ddp_names)
            if found is not None:
                return found
            for argument in formatted_arguments(node):
                found = self._dunder_collective(argument, ("__str__",), module, function, node)
                if found is not None:
                    return found
            return None
        if isinstance(node, ast.FormattedValue):
            dunders = ("__repr__",) if node.conversion == ord("r") else ("__format__", "__str__")
            return self._dunder_collective(node.value, dunders, module, function, node)
        if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load):
            if node.attr not in self._property_names():
                return None  # most attribute reads: not one of the project's properties
            getter = self._resolve_attribute_call(node, module, function)
            if getter is None or not is_property(getter.node):
                return None
            return self._implicitly(getter, f"property {getter.name} read", module, node)
        return None

    def _property_names(self) -> frozenset[str]:
        """The names of the properties of every module read so far."""
        if self._properties[0] != len(self.modules):
            names = frozenset(
                name
                for module in self.modules.values()
                for (_cls, name), method in module.methods.items()
                if is_property(method.node)
            )
            self._properties = (len(self.modules), names)
        return self._properties[1]

    def _dunder_collective(
        self,
        value: ast.expr,
        dunders: tuple[str, ...],
        module: ParsedModule,
        function: Function | None,
        at: ast.expr,
    ) -> Collective | None:
        """The collective the first of ``dunders`` the class of ``value`` defines reaches."""
        owner = self._class_of(value, module, function)
        if owner is None:
            return None
        owner_module, class_name = owner
        for dunder in dunders:
            method = owner_module.methods.get((class_name, dunder))
            if method is not None:
                return self._implicitly(
                    method, f"{class_name}.{dunder}() formatting `{ast.unparse(value)}`", module, at
                )
        return None

    def _implicitly(
        self, target: Function, what: str, module: ParsedModule, at: ast.expr
    ) -> Collective | None:
        inner = self.collective_of_function(target)
        if inner is None:
            return None
        here = f"{relative_path(module.path)}:{at.lineno}"
        return Collective(
            inner.label, [f"{what} at {here}", *inner.chain], inner.path, inner.line, inner.col, inner.certain
        )

    def _direct_label(self, call: ast.Call, module: ParsedModule, ddp_names: set[str]) -> str | None:
        """What a call communicates by itself (torch.distributed, a library), or None."""
        func = call.func
        if isinstance(func, ast.Name):
            if func.id in module.dist_functions:
                return dist_label(func.id, call)
            if func.id in ddp_names:
                if module.shards_parameters:  # FSDP or ZeRO-3: every forward gathers the shards
                    return f"{func.id}(...) {SHARDED_FORWARD}"
                return f"{func.id}(...) forward through DistributedDataParallel"
            if func.id in module.dcp_functions and not keyword_true(call, "no_dist"):
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
        if attr in DIST_OPS and self.is_dist(func.value, module):
            return dist_label(attr, call)
        if (
            attr in DCP_FUNCTIONS
            and (receiver in module.dcp_aliases or receiver == DCP_MODULE)
            and not keyword_true(call, "no_dist")
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
        if (
            attr == "manual_backward"
            and receiver == "self"
            and module.libraries & {"lightning", "pytorch_lightning"}
        ):
            # manual optimisation: the user's backward, with the strategy's gradient sync
            return "self.manual_backward() (under DDP, the gradients' all-reduce)"
        if attr == "barrier" and "strategy" in receiver:
            return f"{receiver}.barrier"
        for (word, method), what in RECEIVER_METHODS.items():
            if attr == method and word in receiver.lower():
                return f"{receiver}.{attr}() ({what})"
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
        if attr == "generate" and module.shards_parameters and not keyword_true(call, "synced_gpus"):
            return f"{receiver}.generate() without synced_gpus=True"
        if attr == "backward" and module.wraps_ddp:
            return f"{receiver}.backward() (DDP all-reduces the gradients)"
        return None

    def _resolve_name_call(self, name: str, module: ParsedModule) -> Function | None:
        if name in module.functions:
            return module.functions[name][0]
        if name in module.imported_functions:
            path, original = module.imported_functions[name]
            source = self._module_of(path)
            if source is not None and original in source.functions:
                return source.functions[original][0]
        return None

    def _resolve_attribute_call(
        self, func: ast.Attribute, module: ParsedModule, function: Function | None
    ) -> Function | None:
        value = func.value
        if isinstance(value, ast.Name):
            if value.id in ("self", "cls") and function is not None and function.class_name is not None:
                return module.methods.get((function.class_name, func.attr))
            if value.id in module.imported_modules:
                source = self._module_of(module.imported_modules[value.id])
                if source is not None and func.attr in source.functions:
                    return source.functions[func.attr][0]
        owner = self._class_of(value, module, function)
        if owner is not None:
            owner_module, class_name = owner
            return owner_module.methods.get((class_name, func.attr))
        return None

    def _class_of(
        self, value: ast.expr, module: ParsedModule, function: Function | None
    ) -> tuple[ParsedModule, str] | None:
        """The project's class of the instance a method is called on: ``meter`` bound to
        ``Meter(...)`` (or annotated ``meter: Meter``) in the calling function or at module
        level, or ``self.meter`` assigned ``Meter(...)`` in any method of the class."""
        named: str | None = None
        in_method = function is not None and function.class_name is not None
        if isinstance(value, ast.Name) and value.id == "self" and in_method:
            assert function is not None and function.class_name is not None
            return module, function.class_name  # f"{self}" in a method of the class
        if isinstance(value, ast.Name):
            named = self._bound_class(value.id, module, function)
            if named is None and function is not None:
                # a loop's element: ``for name, meter in self.meters.items()``
                key = id(function.node)
                if key not in self._loop_elements:
                    self._loop_elements[key] = element_sources(function.node)
                container = self._loop_elements[key].get(value.id)
                if container is not None:
                    named = self._element_class(container, module, function)
            if named is None and function is not None:
                named = self.duck_class(value.id, module, function)
        elif isinstance(value, ast.Attribute):
            named = self._bound_class(ast.unparse(value), module, function)
        elif isinstance(value, ast.Subscript):  # self.meters["loss"]
            named = self._element_class(value.value, module, function)
        if named is None:
            return None
        if any(cls == named for cls, _ in module.methods):
            return module, named
        if named in module.imported_functions:
            path, original = module.imported_functions[named]
            source = self._module_of(path)
            if source is not None and any(cls == original for cls, _ in source.methods):
                return source, original
        return None

    def duck_class(self, name: str, module: ParsedModule, function: Function) -> str | None:
        """The class of the module a parameter with no annotation and no binding is an
        instance of, by what the function uses of it: the one class that has every
        attribute and method read on it (``trainer.is_world_zero``, ``trainer.metric(...)``
        in a callback's ``on_epoch_end(self, trainer)``). None where no class or two fit."""
        node = function.node
        arguments = node.args
        parameters = {a.arg: a for a in (*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs)}
        if name not in parameters or name in ("self", "cls") or parameters[name].annotation is not None:
            return None
        key = (id(node), name)
        if key not in self._duck_classes:
            used = {
                n.attr
                for n in self.nodes(node)
                if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == name
            }
            classes = self._class_members_of(module)
            fitting = [cls for cls, members in classes.items() if used and used <= members]
            self._duck_classes[key] = fitting[0] if len(fitting) == 1 else None
        return self._duck_classes[key]

    def _class_members_of(self, module: ParsedModule) -> dict[str, set[str]]:
        """Each class of the module with what an instance has: its methods, its class-level
        names and the attributes its methods set on ``self``."""
        key = id(module.tree)
        if key not in self._members_by_class:
            found: dict[str, set[str]] = {}
            for cls in (n for n in module.all_nodes if isinstance(n, ast.ClassDef)):
                members = found.setdefault(cls.name, set())
                for item in cls.body:
                    if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                        members.add(item.name)
                        members |= {
                            a
                            for n in ast.walk(item)
                            if isinstance(n, ast.expr) and (a := self_attribute(n)) is not None
                        }
                    elif isinstance(item, ast.Assign | ast.AnnAssign):
                        targets = item.targets if isinstance(item, ast.Assign) else [item.target]
                        members |= {t.id for t in targets if isinstance(t, ast.Name)}
            self._members_by_class[key] = found
        return self._members_by_class[key]

    def _bound_class(self, key: str, module: ParsedModule, function: Function | None) -> str | None:
        """The class ``key`` (``x``, ``x[]``, ``self.x``, ``self.x[]``) is bound to an instance
        of: in the calling function or at module level, or for ``self.x`` in any method of the
        class."""
        if key.startswith("self."):
            if function is None or function.class_name is None:
                return None
            methods = [m for (cls, _), m in module.methods.items() if cls == function.class_name]
            return next((n for m in methods if (n := self.constructions(m.node).get(key))), None)
        scopes = ([function.node] if function is not None else []) + [module.tree]
        return next((n for scope in scopes if (n := self.constructions(scope).get(key))), None)

    def _element_class(
        self, container: ast.expr, module: ParsedModule, function: Function | None
    ) -> str | None:
        """The class of the elements of ``container`` (``self.meters`` built as
        ``defaultdict(Meter)``), or None."""
        if not isinstance(container, (ast.Name, ast.Attribute)):
            return None
        return self._bound_class(f"{ast.unparse(container)}[]", module, function)

    def collective_of_function(
        self, function: Function, ddp_parameters: frozenset[str] = frozenset()
    ) -> Collective | None:
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
        found: Collective | None = None
        ddp_names = self.ddp_names_of(function.node) | ddp_parameters
        for node in reaching_nodes_in(function.node):
            this = self.collective_of_node(node, function.module, function, ddp_names)
            if this is not None and (found is None or this.certain):
                found = this  # the first collective; a certain one over a DDP forward
            if found is not None and found.certain:
                break
        self._in_progress.discard(key)
        self._collective_of[key] = found
        return found

    def resolve_call(
        self, call: ast.Call, module: ParsedModule, function: Function | None
    ) -> Function | None:
        func = call.func
        if isinstance(func, ast.Name):
            found = self._resolve_name_call(func.id, module)
            if found is None and (owner := self._class_of(func, module, function)) is not None:
                # an instance called: ``stopper(val_loss)`` runs its class's __call__
                owner_module, class_name = owner
                found = owner_module.methods.get((class_name, "__call__"))
            return found
        if isinstance(func, ast.Attribute):
            return self._resolve_attribute_call(func, module, function)
        return None

    def variable_size_names(
        self, scope: ast.AST, module: ParsedModule, function: Function | None
    ) -> set[str]:
        """Tensors whose size depends on the data: boolean indexing, nonzero, masked_select,
        unique, torch.cat of a list built in a loop, or a user function returning one."""
        sized: set[str] = set()
        masks: set[str] = set()
        for node in self.nodes(scope):
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Compare):
                masks |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        assignments = [node for node in self.nodes(scope) if isinstance(node, ast.Assign)]
        for node in assignments:
            for target, value in _paired(node):
                if self._is_variable_size(value, module, function, masks):
                    sized.add(target)
        # what is built from such a tensor keeps its data-dependent size (a stack, a cast, a
        # slice of it, a list a loop appends it to, whose cat it is), unless it reads only its
        # size (len, .shape) or pads it to one
        appends = [
            (node.func.value.id, node.args[0])
            for node in self.nodes(scope)
            if isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in ("append", "extend")
            and isinstance(node.func.value, ast.Name)
            and len(node.args) == 1
        ]
        grew = True
        while grew:
            grew = False
            pairs = [pair for node in assignments for pair in _paired(node)] + appends
            for target, value in pairs:
                if target not in sized and (
                    _carries_size_of(value, sized) or self._is_variable_size(value, module, function, masks)
                ):
                    sized.add(target)
                    grew = True
        return sized

    def _is_variable_size(
        self,
        value: ast.expr,
        module: ParsedModule,
        function: Function | None,
        masks: set[str],
        depth: int = 0,
    ) -> bool:
        for node in ast.walk(value):
            if isinstance(node, ast.Subscript) and (
                isinstance(node.slice, ast.Compare)
                or (isinstance(node.slice, ast.Name) and node.slice.id in masks)
                or (  # x[mask.bool()]: indexed by a mask, whatever it was
                    isinstance(node.slice, ast.Call)
                    and isinstance(node.slice.func, ast.Attribute)
                    and node.slice.func.attr == "bool"
                )
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

    def _returns_variable_size(self, target: Function, depth: int) -> bool:
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
        if not found and any(returns_cat(r) for r in returns):
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

    def rank_local_names(self, scope: ast.AST, module: ParsedModule, function: Function | None) -> set[str]:
        """Names whose value differs between ranks without any rank in sight: a clock, a file
        check, the ``.item()`` of a tensor no collective touched, or what a user function
        returns that computes a number from tensors and communicates nothing."""
        synced = set(self.sync_points(scope, module))
        # a parameter the project's calls hand this rank's own value (a callback's metrics)
        local: set[str] = (
            set(self.fed_local_parameters(function)) if function is not None and not self._shallow else set()
        )
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
        # an assignment under a test on a rank-local value takes that value's difference
        # too (`bad += 1` in the else of `if val_loss < best`: a patience count each rank
        # keeps for itself)
        guarded = tests_over(scope)
        filling = [
            n.value
            for n in self.nodes(scope)
            if isinstance(n, ast.Expr)
            and isinstance(n.value, ast.Call)
            and isinstance(n.value.func, ast.Attribute)
            and n.value.func.attr in _FILLING_METHODS
            and isinstance(n.value.func.value, ast.Name)
        ]
        for _ in range(3):
            before = len(local)
            for node in assignments:
                value = node.value
                if value is None:
                    continue
                if self.is_rank_local(value, module, function, synced, local) or any(
                    self.is_rank_local(test, module, function, synced, local)
                    for test in guarded.get(id(node), [])
                ):
                    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                    # `self.total += loss.item()` makes an attribute rank-local, not `self`
                    local |= {name for t in targets for name in bound_names(t)} - synced
            # a container filled with a rank-local value holds it: `logs.update(self.evaluate())`
            for call in filling:
                assert isinstance(call.func, ast.Attribute) and isinstance(call.func.value, ast.Name)
                if call.func.value.id not in synced and any(
                    self.is_rank_local(arg, module, function, synced, local) for arg in call.args
                ):
                    local.add(call.func.value.id)
            if len(local) == before:
                break
        return local

    def sync_points(self, scope: ast.AST, module: ParsedModule) -> dict[str, list[int]]:
        """Each name passed to a collective in ``scope``, or bound to what one returns
        (``bad = fabric.all_reduce(flag, reduce_op="max")``), with the lines of those calls:
        its value agrees across ranks after them."""
        key = id(scope)
        if key in self._syncing:
            return {}  # a function that calls itself: what it syncs is being read
        if key not in self._synced:
            self._syncing.add(key)
            try:
                self._read_sync_points(scope, module, key)
            finally:
                self._syncing.discard(key)
        return self._synced[key]

    def _read_sync_points(self, scope: ast.AST, module: ParsedModule, key: int) -> None:
        synced: dict[str, list[int]] = {}
        for node in self.nodes(scope):
            call = node.value if isinstance(node, ast.Assign) else node
            if not isinstance(call, ast.Call):
                continue
            label = self._direct_label(call, module, set())
            if (
                label is None
                and isinstance(node, ast.Assign)
                and self.returns_what_it_synced(call, module, None)
            ):
                # `stop = broadcast_flag(stop or rank0_saw_the_file)`: a helper of the
                # project's that returns only what it broadcast or all-reduced
                for target in node.targets:
                    for name in bound_names(target):
                        synced.setdefault(name, []).append(call.lineno)
                continue
            if label is None or (label.split(".")[-1] in ROOTED and self._of_torch_distributed(call, module)):
                continue
            # torch.distributed's collectives work in place on what they are given; a
            # library's (accelerate's reduce or gather, its backward) returns its result
            # and leaves its argument as each rank had it
            named = (
                [arg.id for arg in call.args if isinstance(arg, ast.Name)]
                if self._of_torch_distributed(call, module)
                else []
            )
            if isinstance(node, ast.Assign):
                named = [name for target in node.targets for name in bound_names(target)]
            for name in named:
                synced.setdefault(name, []).append(call.lineno)
        self._passed[key] = dict(synced)
        # the numeric libraries as the module imports them (`F` for torch.nn.functional):
        # what they compute from agreed values agrees too
        libraries: dict[str, list[int]] = {alias: [] for alias in _numeric_aliases(module.tree)}
        found = _and_what_follows_from_them(
            {**libraries, **synced}, list(self.nodes(scope)), tests_over(scope)
        )
        self._synced[key] = {name: lines for name, lines in found.items() if name not in libraries}

    def passed_to_collectives(self, scope: ast.AST, module: ParsedModule) -> dict[str, list[int]]:
        """The names ``scope`` passes to a collective or binds to what one returns, without
        what follows from them (sync_points): the values a collective itself agreed."""
        self.sync_points(scope, module)
        return self._passed[id(scope)]

    def _of_torch_distributed(self, call: ast.Call, module: ParsedModule) -> bool:
        """A call of torch.distributed's own (``dist.reduce``, ``reduce`` imported from it),
        not a library's method of the same name: accelerate's ``reduce`` and ``gather``
        return the result on every rank and leave their argument as it was."""
        func = call.func
        if isinstance(func, ast.Name):
            return func.id in module.dist_functions
        return isinstance(func, ast.Attribute) and self.is_dist(func.value, module)

    def rooted_names(self, scope: ast.AST, module: ParsedModule) -> dict[str, tuple[str, int]]:
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
            if label.split(".")[-1] in ROOTED and self._of_torch_distributed(call, module):
                rooted.setdefault(name, (label, call.lineno))
            else:
                synced_at[name] = max(synced_at.get(name, 0), call.lineno)
        return {name: at for name, at in rooted.items() if synced_at.get(name, 0) <= at[1]}

    def is_rank_local(
        self,
        value: ast.expr,
        module: ParsedModule,
        function: Function | None,
        synced: set[str],
        local: set[str],
    ) -> bool:
        pending: list[ast.AST] = [value]
        while pending:
            node = pending.pop()
            if isinstance(node, ast.Call) and self.returns_what_it_synced(node, module, function):
                continue  # `out_of_time(start)` all-reduces its flag: what it is given stays inside
            pending.extend(ast.iter_child_nodes(node))
            if isinstance(node, ast.Name) and node.id in local:
                return True
            if (
                isinstance(node, ast.Attribute)
                and not self._shallow
                and self.attribute_is_local(module, node.attr)
            ):
                return True
            if not isinstance(node, ast.Call):
                continue
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if name in UNSYNCED_CALLS and not self._shallow:
                # not what a caller hands a parameter: a path or a clock handed on is most
                # often the same on every rank (a checkpoint's state loaded on each)
                return True
            if (
                isinstance(func, ast.Attribute)
                and name in ("item", "tolist")
                and not _of_synced(func.value, synced)
            ):
                return True
            if (
                isinstance(func, ast.Name)
                and name in NUMBER_OF
                and len(node.args) == 1
                and reads_a_reduction(node.args[0])
                and not _of_synced(node.args[0], synced)
            ):
                return True  # int(batch["mask"].sum()): .item() by another name
            target = self.resolve_call(node, module, function)
            if target is not None and self._shallow and self.collective_of_function(target) is None:
                # handed on to a parameter: only a number read off this rank's tensors
                if any(
                    isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "item"
                    for n in self.nodes(target.node)
                ):
                    return True
                continue
            if target is not None and self.returns_local_number(target):
                return True
        return False

    def returns_what_it_synced(self, call: ast.Call, module: ParsedModule, function: Function | None) -> bool:
        """A call of a project function every ``return`` of which gives back values built
        only from what it synchronised (``flag = ...; dist.all_reduce(flag, MAX); return
        bool(flag.item())``, an early stopper's ``dist.broadcast(decision, src=0)`` then
        ``return bool(decision[1])``): its result agrees across ranks, whatever it was
        given."""
        target = self.resolve_call(call, module, function)
        if target is None or self.collective_of_function(target) is None:
            return False
        returns = [n.value for n in self.nodes(target.node) if isinstance(n, ast.Return) and n.value]
        synced = self.sync_points(target.node, target.module)
        return bool(returns) and all(_built_from(value, synced) for value in returns)

    def local_attributes(self, module: ParsedModule) -> set[str]:
        """Attributes a method of the module sets on ``self`` only from a rank-local value
        (``self.local_val_loss = torch.stack(losses).mean().item()``), constants aside: read
        anywhere in the module (``pl_module.local_val_loss`` in a callback), each rank's own."""
        key = id(module.tree)
        return self._within_depth(
            self._local_attributes, key, lambda: self._compute_local_attributes(module, key)
        )

    def _compute_local_attributes(self, module: ParsedModule, key: int) -> set[str]:
        # while computing, none yet: one attribute's reading does not feed another's in the
        # same walk (an attribute read off another rank-local one is not followed: in a
        # library's classes that cascade reaches every attribute)
        self._local_attributes[key] = set()
        local: set[str] = set()
        handed: set[str] = set()
        other: set[str] = set()
        for functions in module.functions.values():
            for function in functions:
                if function.class_name is not None:
                    self._attributes_set_by(function, local, handed, other)
        self._local_attributes[key] = local - other
        return self._local_attributes[key]

    def _attributes_set_by(
        self, function: Function, local: set[str], handed: set[str], other: set[str]
    ) -> None:
        """The attributes ``function`` sets on ``self`` (a method) or on an object it was
        handed (``def on_epoch_end(self, trainer, metrics)``: ``trainer.should_stop = True``),
        each added to ``local`` / ``handed`` where a rank-local value or test decides it, to
        ``other`` where another value does."""
        module = function.module
        parameters = set(_parameter_names(function))
        owners = parameters - {"self", "cls"} if function.class_name is None else parameters
        if not any(
            isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id in owners
            for node in self.nodes(function.node)
            if isinstance(node, ast.Assign | ast.AugAssign | ast.AnnAssign)
            for t in (node.targets if isinstance(node, ast.Assign) else [node.target])
        ):
            return  # sets no attribute: nothing to read (most functions)
        synced = set(self.sync_points(function.node, module))
        names = self.rank_local_names(function.node, module, function)
        tests = tests_over(function.node)
        for node in self.nodes(function.node):
            if not isinstance(node, ast.Assign | ast.AugAssign | ast.AnnAssign) or node.value is None:
                continue
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            on_self: set[str] = set()
            on_handed: set[str] = set()
            for t in targets:
                if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id in owners:
                    is_self = function.class_name is not None and t.value.id == "self"
                    (on_self if is_self else on_handed).add(t.attr)
            attributes = on_self | on_handed
            if not attributes:
                continue
            # the tests it is set under, outermost first: the innermost decides, the
            # outermost names the value (`bad += 1` under `val_loss > best`)
            deciding = [
                test
                for test in tests.get(id(node), [])
                if self.is_rank_local(test, module, function, synced, names)
            ]
            if not deciding and (
                _a_starting_value(node.value)
                or not self.is_rank_local(node.value, module, function, synced, names)
            ):
                if not _a_starting_value(node.value):
                    other |= attributes
                continue
            # set from a rank-local value, or under a test of one (a patience counter bumped
            # when this rank's own loss did not improve): each rank's own
            local |= on_self
            handed |= on_handed
            for attribute in attributes:
                self._attribute_sites[(module.path, attribute)] = AttributeSite(
                    module.path,
                    node.lineno,
                    function.name
                    if function.class_name is None
                    else f"{function.class_name}.{function.name}",
                    " inside ".join(f"`{ast.unparse(test)}`" for test in deciding[::-1][:2]),
                )

    def attribute_is_local(self, module: ParsedModule, attribute: str) -> bool:
        """Whether ``attribute``, read in ``module``, holds a rank's own value: one its own
        methods set from one (local_attributes), or one a function of its program sets on
        an object handed to it (a callback's ``trainer.should_stop = True`` under its
        patience count, read as ``if self.should_stop: break`` in the trainer's loop)."""
        if attribute in self.local_attributes(module):
            return True
        key = (id(module.tree), attribute)
        return bool(
            self._within_depth(self._handed_local, key, lambda: self._compute_handed(module, attribute, key))
        )

    def _compute_handed(self, module: ParsedModule, attribute: str, key: tuple[int, str]) -> set[str]:
        self._handed_local[key] = set()  # while computing: not handed yet
        local: set[str] = set()
        handed: set[str] = set()
        other: set[str] = set()
        for beside in self.modules_beside(module):
            for function in self._handing_functions(beside).get(attribute, []):
                self._attributes_set_by(function, local, handed, other)
        self._handed_local[key] = {attribute} & (handed - other)
        return self._handed_local[key]

    def _handing_functions(self, module: ParsedModule) -> dict[str, list[Function]]:
        """attribute -> the functions of ``module`` that set it on an object they were
        handed (a parameter other than ``self``), from one walk of each function."""
        key = id(module.tree)
        if key not in self._handing:
            found: dict[str, list[Function]] = {}
            for functions in module.functions.values():
                for function in functions:
                    handed = set(_parameter_names(function)) - {"self", "cls"}
                    for node in self.nodes(function.node):
                        if not isinstance(node, ast.Assign | ast.AugAssign | ast.AnnAssign):
                            continue
                        for t in node.targets if isinstance(node, ast.Assign) else [node.target]:
                            if (
                                isinstance(t, ast.Attribute)
                                and isinstance(t.value, ast.Name)
                                and t.value.id in handed
                            ):
                                listed = found.setdefault(t.attr, [])
                                if function not in listed:
                                    listed.append(function)
            self._handing[key] = found
        return self._handing[key]

    def attribute_site(self, module: ParsedModule, attribute: str) -> AttributeSite | None:
        """Where a function of ``module``'s program sets ``attribute`` to a rank's own value."""
        self.attribute_is_local(module, attribute)
        return next(
            (
                site
                for other in self.modules_beside(module)
                if (site := self._attribute_sites.get((other.path, attribute))) is not None
            ),
            None,
        )

    def modules_beside(self, module: ParsedModule) -> list[ParsedModule]:
        """``module`` and the loaded modules of one program with it: those it imports and
        those that import it. Scripts linted side by side (a folder of examples) are other
        programs: a hook of one is not called by another's trainer."""

        # the modules it imports, loaded (a trainer checked alone hands its callbacks'
        # module its metrics); those importing it are loaded where lint was given them
        if id(module.tree) not in self._imports_loaded:
            self._imports_loaded.add(id(module.tree))
            for path in {
                *module.imported_modules.values(),
                *(s for s, _ in module.imported_functions.values()),
            }:
                self._module_of(path)
        key = (id(module.tree), len(self.modules))
        if key in self._beside:
            return self._beside[key]

        def imports(importer: ParsedModule, imported: ParsedModule) -> bool:
            return imported.path in importer.imported_modules.values() or any(
                source == imported.path for source, _ in importer.imported_functions.values()
            )

        self._beside[key] = [
            other
            for other in list(self.modules.values())
            if other is module or imports(module, other) or imports(other, module)
        ]
        return self._beside[key]

    def fed_local_parameters(self, function: Function) -> set[str]:
        """The parameters of ``function`` some call of the project hands a rank-local value:
        a callback hook given this rank's own metrics (``cb.on_epoch_end(self, metrics)``
        after ``metrics = self.validate()``, which all-reduces nothing). A method is matched
        by its name where the call cannot be resolved: hooks are called through a list of
        callbacks of several classes."""
        key = id(function.node)
        return self._within_depth(
            self._fed_local, key, lambda: self._compute_fed_local_parameters(function, key)
        )

    def _within_depth(
        self, cache: dict[_Key, set[str]], key: _Key, compute: Callable[[], set[str]]
    ) -> set[str]:
        """``cache[key]``, computed where it is not, unless the answers being computed
        already go _HANDED_DEPTH deep: too far from the code at hand to matter (an empty
        answer, not kept)."""
        if key in cache:
            return cache[key]
        if self._computing >= _HANDED_DEPTH:
            return set()
        self._computing += 1
        try:
            return compute()
        finally:
            self._computing -= 1

    def _compute_fed_local_parameters(self, function: Function, key: int) -> set[str]:
        self._fed_local[key] = set()  # while computing: a recursive call hands nothing yet
        arguments = function.node.args
        positional = [a.arg for a in [*arguments.posonlyargs, *arguments.args]]
        if function.class_name is not None and positional and positional[0] in ("self", "cls"):
            positional = positional[1:]
        keywords = set(positional) | {a.arg for a in arguments.kwonlyargs}
        found: set[str] = set()
        if function.name.startswith("__") or not keywords:
            return found
        calls = [
            (caller_module, caller, call)
            for caller_module in self.modules_beside(function.module)
            for caller, call in self._calls_in(caller_module).get(function.name, [])
        ]
        for caller_module, caller, call in calls:
            given = [
                (positional[i] if i < len(positional) else None, arg) for i, arg in enumerate(call.args)
            ] + [(k.arg, k.value) for k in call.keywords if k.arg in keywords]
            given = [(name, value) for name, value in given if name and not isinstance(value, ast.Constant)]
            if not given or any(isinstance(arg, ast.Starred) for arg in call.args):
                continue
            target = self.resolve_call(call, caller_module, caller)
            if target is not None and target.node is not function.node:
                continue
            if target is None and (function.class_name is None or not isinstance(call.func, ast.Attribute)):
                continue  # a plain call that does not resolve here calls someone else's
            scope: ast.AST = caller.node if caller is not None else caller_module.tree
            synced = set(self.sync_points(scope, caller_module))
            # the caller's own values only: not what its callers hand it, nor attributes
            # set elsewhere; one call deep keeps a library's web of calls from being walked
            self._shallow += 1
            try:
                local = self.rank_local_names(scope, caller_module, caller)
                for name, value in given:
                    if (
                        name is not None
                        and name not in found
                        and self.is_rank_local(value, caller_module, caller, synced, local)
                    ):
                        found.add(name)
            finally:
                self._shallow -= 1
        self._fed_local[key] = found
        return found

    def _calls_in(self, module: ParsedModule) -> dict[str, list[tuple[Function | None, ast.Call]]]:
        """Each name called in ``module`` -> its calls there, with the function each is made in
        (None at module level), from one walk of the module."""
        key = id(module.tree)
        if key not in self._calls_by_name:
            index: dict[str, list[tuple[Function | None, ast.Call]]] = {}
            scopes: list[tuple[ast.AST, Function | None]] = [(module.tree, None)]
            scopes += [(f.node, f) for functions in module.functions.values() for f in functions]
            for scope, function in scopes:
                for node in self.nodes(scope):
                    if isinstance(node, ast.Call) and (called := callee_name(node)):
                        index.setdefault(called, []).append((function, node))
            self._calls_by_name[key] = index
        return self._calls_by_name[key]

    def returns_local_number(self, function: Function) -> bool:
        """A function that turns tensors into a number with ``.item()`` and communicates nothing."""
        key = id(function.node)
        if key not in self._local_number:
            self._local_number[key] = self._computes_local_number(function)
        return self._local_number[key]

    def _computes_local_number(self, function: Function) -> bool:
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
                or called_names(n) & UNSYNCED_CALLS
            )
            for n in self.nodes(node)
        )

    # -- findings --------------------------------------------------------------------

    def check(self, module: ParsedModule) -> list[Finding]:
        self.files_checked += 1
        findings: list[Finding] = []
        module_derived = (
            self.derived_names(module.tree)
            | rank_functions(module.tree)
            | rank_fields(module.tree)
            | imported_rank_names(self.load, module)
        )
        indexed = {id(f.node): f for functions in module.functions.values() for f in functions}
        scopes: list[tuple[Function | None, ast.AST]] = [(None, module.tree)]
        for node in module.all_nodes:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                scopes.append((indexed.get(id(node)) or Function(node, module, None), node))
        classes = frozenset(n.name for n in module.all_nodes if isinstance(n, ast.ClassDef))
        for function, scope in scopes:
            derived = module_derived | (self.derived_names(scope) if function is not None else set())
            built = {
                name: cls
                for name, cls in self.constructions(scope).items()
                if function is not None and cls in classes and name in derived
            }
            if built:
                # an instance of the project's class built with the rank is no rank value:
                # its members that are (class_derived_members) stand for it
                derived = module_derived | rank_derived_names(scope, self.nodes(scope), classes=classes)
                for cls in set(built.values()):
                    derived |= self.class_derived_members(module, cls)
            if function is not None and function.class_name is not None:
                derived |= self.class_rank_attributes(module, function.class_name)
                members = self.class_derived_members(module, function.class_name)
                if members:  # what the class was given from the rank, and what follows from it
                    derived |= members | rank_derived_names(scope, self.nodes(scope), seeds=members)
            if function is not None:
                # a parameter that is an instance of a class of the module (a callback's
                # ``trainer``): its rank-derived members are rank values here too
                for argument in function.node.args.args:
                    duck = self.duck_class(argument.arg, module, function)
                    if duck is not None:
                        derived |= self.class_derived_members(module, duck)
            ddp_names = (self.ddp_names_of(scope) if function is not None else set()) | module.ddp_names
            checker = ScopeChecker(self, module, function, derived, ddp_names)
            body = (
                scope.body if isinstance(scope, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef)) else []
            )
            checker.block(body, [])
            checker.returns_without_a_value()
            if function is not None and is_rank_zero_only(function.node):
                checker.decorated_rank_zero()
            findings += dedupe(checker.findings)
        findings += eval_loaders_without_sampler(self, module)
        return [f for f in dedupe(findings, by_call=True) if not self._ignored(module, f)]

    def _ignored(self, module: ParsedModule, finding: Finding) -> bool:
        """``# ncclcheck: ignore[cause]`` on the collective's line, on the line of the call
        that leads to it, or on the line of its condition."""
        where = located(finding)
        collective_module = self.modules.get(Path(where.path).resolve(), module)
        places = [
            (collective_module, where.line),
            (module, where.call_line),
            (module, where.condition_line),
        ]
        for place, line in places:
            if line is not None and line in place.ignores:
                causes = place.ignores[line]
                if causes is None or finding.cause in causes:
                    return True
        return False


# Names a value the same on every rank may be built from besides synchronised ones: the
# tensor and math modules and the builtins that convert (`best = torch.zeros(1)`,
# `best = float("inf")`); a clock or a random module is not among them.
_SAME_EVERYWHERE = frozenset({"torch", "math", "np", "numpy", "float", "int", "bool", "min", "max", "abs"})


_Key = TypeVar("_Key", int, tuple[int, str])


def _parameter_names(function: Function) -> list[str]:
    arguments = function.node.args
    return [a.arg for a in (*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs)]


# how many modules' attributes and functions' parameters one answer may look through: a
# callback two calls from the trainer is found, a library's web of modules is not walked
_HANDED_DEPTH = 6
_FILLING_METHODS = frozenset({"update", "append", "extend", "setdefault", "insert", "add"})


def _and_what_follows_from_them(
    synced: dict[str, list[int]], nodes: list[ast.AST], guarded: dict[int, list[ast.expr]] | None = None
) -> dict[str, list[int]]:
    """``synced`` and every name whose every assignment in the scope is built only from
    synchronised names and constants (``best = val_acc.clone()`` after val_acc was
    broadcast, ``best = torch.zeros(1)`` before), or a container started empty and filled
    only with such values (``preds = []`` then ``preds.append(p)`` of a gathered ``p``): its
    value agrees across ranks too. ``guarded``: the tests each assignment is made under
    (reaching.tests_over): one under a test not itself built from such values (``stop =
    True`` under ``if out_of_time(start)``) holds what that test decided, which may not."""
    guarded = guarded or {}
    assigned: dict[str, list[tuple[int, ast.expr]]] = {}
    under: dict[str, list[ast.expr]] = {}
    stores: dict[str, int] = {}  # every binding of the name: a for target, a with, an unpacking
    filled: dict[str, list[ast.expr]] = {}  # what a container is filled with in place
    for node in nodes:
        if isinstance(node, ast.Assign):
            for name, value in _paired(node):
                assigned.setdefault(name, []).append((node.lineno, value))
                under.setdefault(name, []).extend(guarded.get(id(node), []))
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):  # the scope's nodes, walked
            stores[node.id] = stores.get(node.id, 0) + 1
        # filled in place afterwards (`stats = {}`, then `stats.update(local)`, `stats[k] = v`):
        # what it holds is what it was filled with
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in _FILLING_METHODS
            and isinstance(node.func.value, ast.Name)
        ):
            filled.setdefault(node.func.value.id, []).extend([*node.args, *(k.value for k in node.keywords)])
        if (
            isinstance(node, ast.Subscript)
            and isinstance(node.ctx, ast.Store)
            and isinstance(node.value, ast.Name)
        ):
            stores[node.value.id] = stores.get(node.value.id, 0) + 1
    found = dict(synced)
    changed = True
    while changed:
        changed = False
        for name, assignments in assigned.items():
            if name in found or stores.get(name, 0) != len(assignments):
                continue  # bound some other way too (a loop, a +=): not followed
            # its own earlier value among what it is built from (`preds = torch.cat(preds)`):
            # agreed where everything else is, by induction from its first assignment
            with_itself = {**found, name: []}
            if (
                all(
                    _built_from(value, with_itself) or _empty_container(value) for _line, value in assignments
                )
                and all(_built_from(value, with_itself) for value in filled.get(name, []))
                and all(_built_from(test, with_itself) for test in under.get(name, []))
            ):
                found[name] = [line for line, _value in assignments]
                changed = True
    return found


def _numeric_aliases(tree: ast.Module) -> set[str]:
    """Names the module binds by importing torch, numpy or math (``import torch.nn.functional
    as F``, ``from torch import nn``)."""
    found: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.Import):
            found |= {
                alias.asname or alias.name.split(".")[0]
                for alias in node.names
                if alias.name.split(".")[0] in _NUMERIC_LIBRARIES and "distributed" not in alias.name
            }
        elif (
            isinstance(node, ast.ImportFrom)
            and (node.module or "").split(".")[0] in _NUMERIC_LIBRARIES
            and "distributed" not in (node.module or "")
        ):
            found |= {alias.asname or alias.name for alias in node.names if alias.name != "distributed"}
    return found


_NUMERIC_LIBRARIES = frozenset({"torch", "numpy", "math"})


def _empty_container(value: ast.expr) -> bool:
    """``[]``, ``{}``, ``list()``, ``dict()``: what a container starts from, alike everywhere."""
    if isinstance(value, ast.List | ast.Dict | ast.Tuple | ast.Set):
        return not (value.keys if isinstance(value, ast.Dict) else value.elts)
    return isinstance(value, ast.Call) and ast.unparse(value.func) in ("list", "dict") and not value.args


def _built_from(value: ast.expr, synced: dict[str, list[int]]) -> bool:
    read = {n.id for n in ast.walk(value) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    return read <= (synced.keys() | _SAME_EVERYWHERE) and not any(
        isinstance(n, ast.Attribute) and n.attr in ("rank", "get_rank", "local_rank") for n in ast.walk(value)
    )


def _a_starting_value(value: ast.expr) -> bool:
    """A constant, or ``float("inf")``: what an attribute starts from, alike everywhere."""
    if isinstance(value, ast.Constant):
        return True
    return (
        isinstance(value, ast.Call)
        and ast.unparse(value.func) in ("float", "int")
        and all(isinstance(a, ast.Constant) for a in value.args)
    )


def _of_synced(value: ast.expr, synced: set[str]) -> bool:
    """Whether ``value`` is read off a name the function synchronised (all-reduced)."""
    root = value
    while isinstance(root, (ast.Attribute, ast.Subscript, ast.Call)):
        root = root.func if isinstance(root, ast.Call) else root.value
    return isinstance(root, ast.Name) and root.id in synced


def _paired(node: ast.Assign) -> list[tuple[str, ast.expr]]:
    """The names an assignment binds, each with the expression it gets: ``a, b = x, y``
    pairs a with x and b with y; ``a = b = x`` both with x."""
    pairs: list[tuple[str, ast.expr]] = []
    for target in node.targets:
        if isinstance(target, ast.Name):
            pairs.append((target.id, node.value))
        elif (
            isinstance(target, ast.Tuple)
            and isinstance(node.value, ast.Tuple)
            and len(target.elts) == len(node.value.elts)
        ):
            pairs += [
                (t.id, v)
                for t, v in zip(target.elts, node.value.elts, strict=True)
                if isinstance(t, ast.Name)
            ]
    return pairs


# reads of a tensor that give its size or a scalar, not a tensor of its size
_SIZE_READS = frozenset(
    {"shape", "size", "numel", "dim", "item", "sum", "mean", "max", "min", "tolist", "len"}
)


def _carries_size_of(value: ast.expr, sized: set[str]) -> bool:
    """Whether ``value`` is a tensor built from one of ``sized`` with its size: it uses one
    otherwise than to read its size or a scalar (``len(x)``, ``x.shape``, ``x.sum()``), and
    pads nothing (``F.pad``, ``pad_sequence``, ``pad_across_processes`` fix the size)."""
    for node in ast.walk(value):
        if isinstance(node, ast.Call):
            name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            if "pad" in name.lower():
                return False
    reads: set[int] = set()
    for node in ast.walk(value):
        if isinstance(node, ast.Attribute) and node.attr in _SIZE_READS and isinstance(node.value, ast.Name):
            reads.add(id(node.value))
        if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "len":
            reads |= {id(a) for a in node.args if isinstance(a, ast.Name)}
    return any(
        isinstance(node, ast.Name) and node.id in sized and id(node) not in reads for node in ast.walk(value)
    )
