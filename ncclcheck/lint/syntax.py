"""Small readings of Python syntax trees: calls, exits, decorators, DDP's models."""

from __future__ import annotations

import ast
import io
import tokenize
from collections.abc import Iterable, Iterator

# Point-to-point calls (send/recv, batch_isend_irecv) are rank-dependent by design: each
# side's branch is paired with the other's, so lint leaves them out.
from ncclcheck.lint.findings import Function
from ncclcheck.lint.tables import (
    BUFFERLESS_LAYERS,
    CHILD_FIELDS,
    IGNORE,
    NEW_GROUP,
    RANK_ZERO_DECORATORS,
    SCOPES,
    TENSOR_VALUE_CALLS,
)
from ncclcheck.source.reading import paired


def ddp_parameters_of(call: ast.Call, target: Function, ddp_names: set[str]) -> frozenset[str]:
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
    if isinstance(wrapped, ast.Call) and _callee_name(wrapped) in BUFFERLESS_LAYERS:
        return False
    if isinstance(wrapped, ast.Call) and _callee_name(wrapped) == "Sequential" and wrapped.args:
        return not all(
            isinstance(layer, ast.Call) and _callee_name(layer) in BUFFERLESS_LAYERS for layer in wrapped.args
        )
    return True  # a model of the user's own: it may hold buffers


def ddp_wrapped_names(nodes: Iterable[ast.AST], forward_communicates: bool = True) -> set[str]:
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
    return names | sharded_names(nodes)


def wraps_in_ddp(nodes: Iterable[ast.AST]) -> bool:
    """Whether any call among ``nodes`` wraps a model in DDP, whatever holds the result (a
    name, ``self.model``, a dict entry): its backward() then all-reduces the gradients."""
    return any(
        isinstance(node, ast.Call) and _callee_name(node) in ("DDP", "DistributedDataParallel")
        for node in nodes
    )


def sharded_names(nodes: Iterable[ast.AST]) -> set[str]:
    """Names of models whose parameters are sharded across the ranks, so that every forward
    all-gathers them: bound to ``FSDP(...)``, passed to ``fully_shard(...)`` (FSDP2 makes
    the module itself sharded), or the engine ``deepspeed.initialize`` returns first."""
    names: set[str] = set()
    for node in nodes:
        if not isinstance(node, ast.Call):
            continue
        callee = _callee_name(node)
        if callee == "fully_shard" and node.args and isinstance(node.args[0], ast.Name):
            names.add(node.args[0].id)
    for node in nodes:
        if not (isinstance(node, ast.Assign) and isinstance(node.value, ast.Call)):
            continue
        callee = _callee_name(node.value)
        if callee in ("FSDP", "FullyShardedDataParallel", "fully_shard"):
            names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        elif callee == "initialize" and "deepspeed" in ast.unparse(node.value.func):
            for target in node.targets:
                first = target.elts[0] if isinstance(target, ast.Tuple) and target.elts else target
                if isinstance(first, ast.Name):
                    names.add(first.id)
    return names


def calls_in(root: ast.AST) -> Iterator[ast.Call]:
    """Calls in ``root`` and below it, in source order, without entering nested functions,
    lambdas or classes (their bodies run when they are called, not here)."""
    yield from _run_here(root, ast.Call)  # type: ignore[misc]


def _run_here(root: ast.AST, kinds: type | tuple[type, ...]) -> Iterator[ast.AST]:
    """The nodes of these kinds in ``root`` and below it that run when ``root`` does, in
    source order: nested functions, lambdas and classes are not entered."""
    stack: list[ast.AST] = [root]
    while stack:
        node = stack.pop()
        if node is not root and isinstance(
            node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)
        ):
            continue
        if isinstance(node, kinds):
            yield node
        stack.extend(reversed(list(ast.iter_child_nodes(node))))


# What runs a method of the value's class without a call in the source: a property read
# (an attribute load), an f-string's field (__format__, __str__ or __repr__), and what
# print, str, repr, format and a logger's methods do with their arguments (__str__).
IMPLICIT_NODES = (ast.Attribute, ast.FormattedValue)
REACHING_NODES = (ast.Call, *IMPLICIT_NODES)  # what may run a function
FORMATTING_CALLS = frozenset({"print", "str", "repr", "format"})
LOGGING_METHODS = frozenset({"debug", "info", "warning", "warn", "error", "critical", "exception", "log"})


def reaching_nodes_in(root: ast.AST) -> Iterator[ast.expr]:
    """As calls_in, with the nodes that call a method implicitly (IMPLICIT_NODES)."""
    yield from _run_here(root, REACHING_NODES)  # type: ignore[misc]


def formatted_arguments(call: ast.Call) -> list[ast.expr]:
    """The arguments a call turns into text with their __str__: print(x), str(x),
    logger.info("%s", x); [] for any other call."""
    func = call.func
    name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
    if name in FORMATTING_CALLS and isinstance(func, ast.Name):
        return list(call.args)
    if name in LOGGING_METHODS and isinstance(func, ast.Attribute):
        return list(call.args[1:] if name != "log" else call.args[2:])
    return []


def is_property(function: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    """Decorated @property or @functools.cached_property: read as an attribute, run as a call."""
    for decorator in function.decorator_list:
        name = decorator.id if isinstance(decorator, ast.Name) else getattr(decorator, "attr", "")
        if name in ("property", "cached_property"):
            return True
    return False


def returns_cat(expr: ast.expr) -> bool:
    return isinstance(expr, ast.Call) and ast.unparse(expr.func) in ("torch.cat", "cat", "torch.concat")


def _child_fields(cls: type) -> tuple[str, ...]:
    # ctx (Load/Store) is a node under every name: skipping it halves the walk
    fields = CHILD_FIELDS.get(cls)
    if fields is None:
        fields = CHILD_FIELDS[cls] = tuple(
            f for f in getattr(cls, "_fields", ()) if f not in ("ctx", "type_comment", "type_ignores")
        )
    return fields


def nodes_under(root: ast.AST, enter_scopes: bool) -> list[ast.AST]:
    """The nodes under ``root`` (faster than ast.walk, which every check here would repeat);
    without ``enter_scopes``, nested functions, lambdas and classes are left out."""
    found: list[ast.AST] = []
    stack: list[ast.AST] = [root]
    while stack:
        node = stack.pop()
        if not enter_scopes and node is not root and isinstance(node, SCOPES):
            continue
        found.append(node)
        for name in _child_fields(type(node)):
            value = getattr(node, name, None)
            if type(value) is list:
                stack.extend(v for v in value if isinstance(v, ast.AST))
            elif isinstance(value, ast.AST):
                stack.append(value)
    return found


def walk_scope(root: ast.AST) -> list[ast.AST]:
    return nodes_under(root, enter_scopes=False)


def dist_label(name: str, call: ast.Call) -> str | None:
    if name != "new_group":
        return f"dist.{name}"
    return None if keyword_true(call, "use_local_synchronization") else f"dist.{NEW_GROUP}"


def keyword_true(call: ast.Call, name: str) -> bool:
    return any(
        k.arg == name and not (isinstance(k.value, ast.Constant) and not k.value.value) for k in call.keywords
    )


def tensor_value_roots(expr: ast.expr) -> set[str]:
    """The names whose tensor values ``expr`` reads (``loss`` of ``stop(loss.item())``,
    ``x`` of ``torch.isfinite(x)`` and of ``x.shape[0]``): what makes a test data-dependent,
    as opposed to the other names in it (an object whose method is called)."""
    roots: set[str] = set()
    for node in ast.walk(expr):
        value: ast.expr | None = None
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in TENSOR_VALUE_CALLS
        ):
            # `loss.item()` reads loss; `torch.isfinite(x)`, `math.isfinite(x)` read x
            value = node.args[0] if node.args else node.func.value
        elif isinstance(node, ast.Call) and called_names(node) & TENSOR_VALUE_CALLS and node.args:
            value = node.args[0]
        elif isinstance(node, ast.Attribute) and node.attr == "shape":
            value = node.value
        while isinstance(value, (ast.Attribute, ast.Subscript, ast.Call)):
            value = value.func if isinstance(value, ast.Call) else value.value
        if isinstance(value, ast.Name):
            roots.add(value.id)
    return roots


def reads_shape(expr: ast.expr) -> bool:
    return any(isinstance(n, ast.Attribute) and n.attr == "shape" for n in ast.walk(expr))


def has_exit(statements: list[ast.stmt]) -> bool:
    return any(
        isinstance(n, (ast.Return, ast.Break, ast.Continue))
        for statement in statements
        for n in walk_scope(statement)
    )


def is_rank_zero_only(node: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    for decorator in node.decorator_list:
        target = decorator.func if isinstance(decorator, ast.Call) else decorator
        name = target.attr if isinstance(target, ast.Attribute) else getattr(target, "id", "")
        if name in RANK_ZERO_DECORATORS:
            return True
    return False


def names_tested_for_value(test: ast.expr) -> set[str]:
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


def tests_membership(node: ast.AST, group_text: str, members: set[str]) -> bool:
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


def called_names(where: ast.AST | Iterable[ast.AST]) -> set[str]:
    """Names of the functions called in an expression (or among a list of nodes)."""
    calls: set[str] = set()
    for child in ast.walk(where) if isinstance(where, ast.AST) else where:
        if isinstance(child, ast.Call):
            func = child.func
            calls.add(func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", ""))
    return calls


def is_exit_call(node: ast.stmt) -> bool:
    if not (isinstance(node, ast.Expr) and isinstance(node.value, ast.Call)):
        return False
    func = node.value.func
    return ast.unparse(func) in ("sys.exit", "exit", "quit", "os._exit")


def clean_exit(node: ast.stmt) -> bool:
    """sys.exit() / sys.exit(0) / exit(None): the process ends with status 0."""
    assert isinstance(node, ast.Expr) and isinstance(node.value, ast.Call)
    args = node.value.args
    return not args or (isinstance(args[0], ast.Constant) and args[0].value in (0, None))


def exit_word(node: ast.stmt) -> str:
    if isinstance(node, ast.Expr) and isinstance(node.value, ast.Call):
        return ast.unparse(node.value.func) + "()"
    return type(node).__name__.lower()


def ignore_comments(text: str) -> dict[int, set[str] | None]:
    found: dict[int, set[str] | None] = {}
    if "ncclcheck" not in text:
        return found
    try:
        for token in tokenize.generate_tokens(io.StringIO(text).readline):
            if token.type == tokenize.COMMENT:
                match = IGNORE.search(token.string)
                if match:
                    causes = match.group(1)
                    found[token.start[0]] = {c.strip() for c in causes.split(",")} if causes else None
    except (tokenize.TokenError, SyntaxError):
        pass
    return found


def constructed(scope: ast.AST) -> dict[str, str]:
    """The class each name (``x``) or attribute of ``self`` (``self.x``) of ``scope`` is bound
    to an instance of: ``x = Name(...)``, ``x: Name = ...``, ``self.x = Name(...)``, or a
    parameter ``x: Name``. The first binding of a name counts."""
    found: dict[str, str] = {}

    def key(target: ast.expr) -> str | None:
        if isinstance(target, ast.Name):
            return target.id
        if (
            isinstance(target, ast.Attribute)
            and isinstance(target.value, ast.Name)
            and target.value.id == "self"
        ):
            return f"self.{target.attr}"
        return None

    for node in ast.walk(scope):
        if isinstance(node, ast.Assign):
            for whole in node.targets:
                # `budget, best = TimeBudget(60), 0.0`: each name with its own value
                for target, value in paired(whole, node.value):
                    if (
                        isinstance(target, ast.Name)
                        and target is not whole
                        and isinstance(value, ast.Call)
                        and isinstance(value.func, ast.Name)
                    ):
                        found.setdefault(target.id, value.func.id)
            for target in node.targets:
                if isinstance(target, ast.Subscript):  # self.meters[name] = Meter(...)
                    if (name := key(target.value)) is not None and (cls := _called_class(node.value)):
                        found.setdefault(f"{name}[]", cls)
                elif (name := key(target)) is not None:
                    if isinstance(node.value, ast.Call) and isinstance(node.value.func, ast.Name):
                        found.setdefault(name, node.value.func.id)
                        if (element := _container_element(node.value)) is not None:
                            found.setdefault(f"{name}[]", element)
                    elif (element := _container_element(node.value)) is not None:
                        found.setdefault(f"{name}[]", element)
        elif isinstance(node, ast.AnnAssign):
            if (name := key(node.target)) is not None:
                _note_annotation(found, name, node.annotation)
        elif isinstance(node, ast.arg) and node.annotation is not None:
            _note_annotation(found, node.arg, node.annotation)
    return found


def _called_class(value: ast.expr) -> str | None:
    """``Meter`` of ``Meter(...)``."""
    if isinstance(value, ast.Call) and isinstance(value.func, ast.Name):
        return value.func.id
    return None


def _container_element(value: ast.expr) -> str | None:
    """The class of the elements of a container built in one expression:
    ``defaultdict(Meter)``, ``[Meter() for _ in ...]``, ``{k: Meter() for k in ...}``,
    ``[Meter(), Meter()]``, ``{"loss": Meter()}``."""
    if isinstance(value, ast.Call) and ast.unparse(value.func) in ("defaultdict", "collections.defaultdict"):
        factory = value.args[0] if value.args else None
        return factory.id if isinstance(factory, ast.Name) else None
    if isinstance(value, (ast.ListComp, ast.SetComp)):
        return _called_class(value.elt)
    if isinstance(value, ast.DictComp):
        return _called_class(value.value)
    elements = (
        value.elts
        if isinstance(value, (ast.List, ast.Tuple, ast.Set))
        else [v for v in value.values if v is not None]
        if isinstance(value, ast.Dict)
        else []
    )
    classes = {_called_class(e) for e in elements}
    if len(classes) == 1:
        return classes.pop()
    return None


def _note_annotation(found: dict[str, str], name: str, annotation: ast.expr) -> None:
    """``x: Meter`` binds ``x``; ``x: dict[str, Meter]`` or ``list[Meter]`` its elements."""
    if isinstance(annotation, ast.Name):
        found.setdefault(name, annotation.id)
    elif isinstance(annotation, ast.Subscript) and ast.unparse(annotation.value).endswith("Optional"):
        if isinstance(annotation.slice, ast.Name):
            found.setdefault(name, annotation.slice.id)
    elif isinstance(annotation, ast.Subscript):
        inner = annotation.slice
        last = inner.elts[-1] if isinstance(inner, ast.Tuple) and inner.elts else inner
        if isinstance(last, ast.Name):
            found.setdefault(f"{name}[]", last.id)


def element_sources(scope: ast.AST) -> dict[str, ast.expr]:
    """Each name a loop in ``scope`` binds to the elements of a container, with that
    container (the first such loop, in walk order): ``for m in meters``, ``for m in
    meters.values()``, ``for k, m in meters.items()``, ``for i, m in enumerate(meters)``, in
    a statement or a comprehension. One walk for every name: callers ask for many."""
    found: dict[str, ast.expr] = {}
    for node in ast.walk(scope):
        if not isinstance(node, (ast.For, ast.AsyncFor, ast.comprehension)):
            continue
        target, source = node.target, node.iter
        if isinstance(source, ast.Call) and isinstance(source.func, ast.Attribute) and not source.args:
            method = source.func
            if method.attr == "items" and isinstance(target, ast.Tuple) and len(target.elts) == 2:
                target, source = target.elts[1], method.value
            elif method.attr == "values":
                source = method.value
        elif (
            isinstance(source, ast.Call)
            and isinstance(source.func, ast.Name)
            and source.func.id == "enumerate"
            and source.args
            and isinstance(target, ast.Tuple)
            and len(target.elts) == 2
        ):
            target, source = target.elts[1], source.args[0]
        if isinstance(target, ast.Name):
            found.setdefault(target.id, source)
    return found
