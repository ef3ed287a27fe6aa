"""Where a value given to a collective comes from, read back along the call chain.

Two ranks at the same call with other sizes, or with the same calls in another order, do
run the same code: what differs is a value. This module follows that value back through
the source of the frames on the call's stack: a name to its assignment in its function,
a parameter to the argument its caller passed, ``d.items()`` to ``d``, a comprehension
to what it iterates. The shape rule (explain/rules/divergence.py) reads the chain it
returns to say what differs and where it comes from: a loop over a set, whose order
Python's per-process string hashing decides; a tensor cut by each rank's own data.
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from ncclcheck.model import Frame
from ncclcheck.source import reading

# methods that hand back the same items, in the same order, as the object they are called on
_SAME_ITEMS = frozenset({"items", "keys", "values", "copy", "clone", "detach", "contiguous", "float", "cpu"})
_SET_OPS = (ast.Sub, ast.BitOr, ast.BitAnd, ast.BitXor)
# calls whose result's size is what the data gives (a mask's count, the unique values)
SIZED_BY_DATA = frozenset({"nonzero", "masked_select", "unique", "argwhere", "bincount", "cat", "stack"})


@dataclass(frozen=True)
class Binding:
    """One step back: ``name`` bound to ``text`` at ``frame`` (a parameter: the caller's
    argument, at the caller's line)."""

    name: str
    text: str
    frame: Frame
    value: ast.expr
    passed_to: str = ""  # a parameter: the function the caller passed ``text`` to
    returned_by: str = ""  # a call's result: the function whose ``return`` gave ``text``
    appended: bool = False  # a list's items: ``name.append(text)``

    def __str__(self) -> str:
        if self.passed_to:
            return f"`{self.text}` passed to {self.passed_to}() as {self.name}"
        if self.returned_by:
            return f"`{self.text}` returned by {self.returned_by}()"
        if self.appended:
            return f"`{self.name}.append({self.text})`"
        return f"`{self.name} = {self.text}`"


def bindings(
    stack: list[Frame], expr: ast.expr, want: Callable[[ast.expr], bool] | None = None, depth: int = 6
) -> list[Binding]:
    """The bindings ``expr`` (read in the innermost frame of ``stack``) comes from, nearest
    first: a name to an assignment before the frame's line, a parameter to its caller's
    argument. Where a name is assigned more than once (``names = sorted(names)`` under an
    option), the path to a value ``want`` holds for is the one returned, else the one
    through each name's latest assignment. Stops where the source no longer says (an
    attribute, a call's result, a name bound another way too)."""
    paths = _paths(stack, len(stack) - 1, expr, depth)
    if want is not None:
        for path in paths:
            if any(want(binding.value) for binding in path):
                return path
    return paths[0] if paths else []


def _paths(stack: list[Frame], level: int, expr: ast.expr, depth: int) -> list[list[Binding]]:
    expr = followed(expr)
    if depth == 0 or level < 0:
        return [[]]
    if isinstance(expr, ast.IfExp):  # `sorted(names) if fixed else names`: either may hold
        return _paths(stack, level, expr.body, depth) + _paths(stack, level, expr.orelse, depth)
    frame = stack[level]
    function = reading.enclosing_function(frame.file, frame.line)
    if function is None:
        return [[]]
    if reading.self_attribute(expr) is not None:
        return _an_attribute_set_in_its_class(stack, level, expr, depth)
    if not isinstance(expr, ast.Name):
        return _items_of_a_joined_list(stack, level, function, expr, depth)
    assignments = _assignments(function, expr.id, frame.line)
    if assignments is None:
        return [[]]
    if not assignments and not _is_parameter(function, expr.id):
        constant = _module_constant(frame.file, expr.id)
        if constant is not None:  # a module's own constant (METRICS = {"loss", "acc"})
            line, value = constant
            here = Binding(expr.id, ast.unparse(value), Frame(frame.file, line, ""), value)
            return [[here]]
    found: list[list[Binding]] = []
    for assigned in assignments:  # latest first
        here = Binding(
            assigned.shown, ast.unparse(assigned.value), Frame(frame.file, assigned.line, ""), assigned.value
        )
        if assigned.element is None:
            found += [[here, *rest] for rest in _paths(stack, level, assigned.value, depth - 1)]
            continue
        # ``a, b = f(...)``: a's value is the element of what f returns, read on in f
        assert isinstance(assigned.value, ast.Call)
        returned = _returned_element(frame.file, assigned.value, assigned.element)
        if returned is None:
            found.append([here])
            continue
        callee, returned_at, element = returned
        inside = [
            *stack[:level],
            Frame(frame.file, assigned.line, frame.function),
            Frame(frame.file, returned_at, callee),
        ]
        back = Binding(
            expr.id, ast.unparse(element), Frame(frame.file, returned_at, ""), element, returned_by=callee
        )
        found += [[here, back, *rest] for rest in _paths(inside, len(inside) - 1, element, depth - 1)]
    if found:
        return found
    argument = _argument_for(function, expr.id, stack[level - 1] if level else None)
    if argument is None:
        return [[]]
    caller = stack[level - 1]
    passed_to = function.name if isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef) else ""
    here = Binding(expr.id, ast.unparse(argument), Frame(caller.file, caller.line, ""), argument, passed_to)
    return [[here, *rest] for rest in _paths(stack, level - 1, argument, depth - 1)]


def _an_attribute_set_in_its_class(
    stack: list[Frame], level: int, expr: ast.expr, depth: int
) -> list[list[Binding]]:
    """``self.states``: where a method of the same class sets it (``self.states = {n: ...
    for n in METRICS}`` in ``__init__``), each such value followed on in that method; for a
    property of the class, what it returns."""
    frame, attr = stack[level], reading.self_attribute(expr)
    chain = reading.enclosing_chain(frame.file, frame.line)
    owner = next((node for node in reversed(chain) if isinstance(node, ast.ClassDef)), None)
    if owner is None or attr is None:
        return [[]]
    found: list[list[Binding]] = []
    for method in owner.body:
        if not isinstance(method, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        if method.name == attr and any(ast.unparse(d).endswith("property") for d in method.decorator_list):
            for node in ast.walk(method):
                if isinstance(node, ast.Return) and node.value is not None:
                    here = Binding(
                        f"self.{attr}",
                        ast.unparse(node.value),
                        Frame(frame.file, node.lineno, ""),
                        node.value,
                    )
                    inside = [*stack[:level], Frame(frame.file, node.lineno, method.name)]
                    found += [[here, *rest] for rest in _paths(inside, level, node.value, depth - 1)]
            continue
        for node in ast.walk(method):
            if (
                isinstance(node, ast.Assign)
                and len(node.targets) == 1
                and reading.self_attribute(node.targets[0]) == attr
            ):
                here = Binding(
                    f"self.{attr}", ast.unparse(node.value), Frame(frame.file, node.lineno, ""), node.value
                )
                inside = [*stack[:level], Frame(frame.file, node.lineno, method.name)]
                found += [[here, *rest] for rest in _paths(inside, level, node.value, depth - 1)]
    return found or [[]]


def _is_parameter(function: ast.AST, name: str) -> bool:
    if not isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef):
        return False
    arguments = function.args
    return name in {a.arg for a in (*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs)}


def _module_constant(path: str, name: str) -> tuple[int, ast.expr] | None:
    """The value a module-level assignment of ``path`` binds ``name`` to, where exactly one does."""
    tree = reading.parse(path)
    if tree is None:
        return None
    found = [
        (node.lineno, node.value)
        for node in tree.body
        if isinstance(node, ast.Assign)
        and any(isinstance(t, ast.Name) and t.id == name for t in node.targets)
    ]
    return found[0] if len(found) == 1 else None


# calls that join a list of tensors into one: its size is the sum of the pieces'
_JOINS = frozenset({"cat", "concat", "concatenate", "stack", "hstack", "vstack"})


def _items_of_a_joined_list(
    stack: list[Frame], level: int, function: ast.AST, expr: ast.expr, depth: int
) -> list[list[Binding]]:
    """``torch.cat(pieces)`` where ``pieces`` is a list the function fills with
    ``pieces.append(...)``: each appended piece, followed on (a piece cut by a mask)."""
    if not (
        isinstance(expr, ast.Call)
        and reading.callee_name(expr) in _JOINS
        and expr.args
        and isinstance(expr.args[0], ast.Name)
    ):
        return [[]]
    name, frame = expr.args[0].id, stack[level]
    found: list[list[Binding]] = []
    for node in ast.walk(function):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "append"
            and isinstance(node.func.value, ast.Name)
            and node.func.value.id == name
            and len(node.args) == 1
            and node.lineno <= frame.line
        ):
            piece = node.args[0]
            here = Binding(name, ast.unparse(piece), Frame(frame.file, node.lineno, ""), piece, appended=True)
            found += [[here, *rest] for rest in _paths(stack, level, piece, depth - 1)]
    return found or [[]]


def _returned_element(path: str, call: ast.Call, element: int) -> tuple[str, int, ast.expr] | None:
    """The ``element``-th item of what a module-level function of ``path`` returns, where
    its every ``return`` gives a tuple of the same length: (its name, the last such
    return's line, that item)."""
    callee = (
        _function_of_the_file(path, reading.callee_name(call)) if isinstance(call.func, ast.Name) else None
    )
    if callee is None:
        return None
    returns = [n for n in _own_nodes(callee) if isinstance(n, ast.Return)]
    if not returns or not all(
        isinstance(r.value, ast.Tuple) and len(r.value.elts) > element for r in returns
    ):
        return None
    last = max(returns, key=lambda r: r.lineno)
    assert isinstance(last.value, ast.Tuple)
    return callee.name, last.lineno, last.value.elts[element]


def followed(expr: ast.expr) -> ast.expr:
    """The part of ``expr`` whose items (order, size) it has: ``d`` of ``d.items()``, the
    iterable of a comprehension."""
    while True:
        if (
            isinstance(expr, ast.Call)
            and isinstance(expr.func, ast.Attribute)
            and expr.func.attr in _SAME_ITEMS
            and not expr.args
        ):
            expr = expr.func.value
        elif isinstance(expr, ast.ListComp | ast.DictComp | ast.GeneratorExp) and expr.generators:
            expr = expr.generators[0].iter
        elif (
            isinstance(expr, ast.Call)
            and reading.callee_name(expr) in ("list", "tuple", "dict")
            and expr.args
        ):
            expr = expr.args[0]
        else:
            return expr


def is_unordered(expr: ast.expr) -> bool:
    """A set: a display, a set comprehension, set() or frozenset(), an operator of sets, or
    a conditional either of whose values is one."""
    expr = followed(expr)
    if isinstance(expr, ast.Set | ast.SetComp):
        return True
    if isinstance(expr, ast.IfExp):
        return is_unordered(expr.body) or is_unordered(expr.orelse)
    if isinstance(expr, ast.Call) and reading.callee_name(expr) in ("set", "frozenset"):
        return True
    return (
        isinstance(expr, ast.BinOp)
        and isinstance(expr.op, _SET_OPS)
        and (is_unordered(expr.left) or is_unordered(expr.right))
    )


_DEFAULT_DICTS = frozenset({"defaultdict", "Counter"})


def filled_on_first_sight(path: str, line: int, expr: ast.expr) -> ast.stmt | ast.expr | None:
    """Where the dict ``expr`` (read at ``path:line``; a name of its function or an
    attribute of ``self``) gets each key the first time the key is met: ``d[k] = ...``
    under ``if k not in d``, ``d.setdefault(k, ...)``, or any ``d[k]`` of a defaultdict or
    a Counter; in its function, or in a function of the same file it is passed to
    (``update(state, batch)`` whose ``state.setdefault(task, ...)`` fills it). Such a dict
    holds its keys in the order the process first met them, which each rank's own data
    decides, not in an order the ranks share. None where the source shows no such
    filling (a dict built from a fixed list keeps that list's order)."""
    target = followed(expr)
    if isinstance(target, ast.Name):
        scope: ast.AST | None = reading.enclosing_function(path, line) or reading.parse(path)
    elif isinstance(target, ast.Attribute) and ast.unparse(target.value) == "self":
        scope = next(
            (n for n in reversed(reading.enclosing_chain(path, line)) if isinstance(n, ast.ClassDef)), None
        )
    else:
        return None
    if scope is None:
        return None
    return _filled_in(path, scope, ast.unparse(target), passed=2 if isinstance(target, ast.Name) else 0)


def _filled_in(path: str, scope: ast.AST, text: str, passed: int) -> ast.stmt | ast.expr | None:
    """The first-sight filling of the dict named ``text`` in ``scope``; through a call that
    passes it, ``passed`` functions deep, in the function it is passed to."""

    def is_target(node: ast.AST) -> bool:
        return isinstance(node, ast.Name | ast.Attribute) and ast.unparse(node) == text

    defaulting = any(
        isinstance(node, ast.Assign)
        and any(is_target(t) for t in node.targets)
        and isinstance(node.value, ast.Call)
        and reading.callee_name(node.value) in _DEFAULT_DICTS
        for node in ast.walk(scope)
    )
    for node in ast.walk(scope):
        if (
            isinstance(node, ast.If)
            and isinstance(node.test, ast.Compare)
            and len(node.test.ops) == 1
            and isinstance(node.test.ops[0], ast.NotIn)
            and is_target(node.test.comparators[0])
        ):
            key = ast.unparse(node.test.left)
            if any(
                isinstance(stored, ast.Subscript)
                and is_target(stored.value)
                and ast.unparse(stored.slice) == key
                for statement in node.body
                if isinstance(statement, ast.Assign)
                for stored in statement.targets
            ):
                return node
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "setdefault"
            and is_target(node.func.value)
        ):
            return node
        if defaulting and isinstance(node, ast.Subscript) and is_target(node.value):
            return node
    if passed <= 0:
        return None
    for call in (n for n in ast.walk(scope) if isinstance(n, ast.Call)):
        position = next((i for i, a in enumerate(call.args) if is_target(a)), None)
        if position is None or not isinstance(call.func, ast.Name):
            continue
        callee = _function_of_the_file(path, call.func.id)
        params = [a.arg for a in (*callee.args.posonlyargs, *callee.args.args)] if callee else []
        if callee is not None and position < len(params):
            filled = _filled_in(path, callee, params[position], passed - 1)
            if filled is not None:
                return filled
    return None


def _function_of_the_file(path: str, name: str) -> ast.FunctionDef | ast.AsyncFunctionDef | None:
    """The module-level function ``name`` of ``path``, where it defines one."""
    tree = reading.parse(path)
    body = tree.body if isinstance(tree, ast.Module) else []
    return next(
        (n for n in body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef) and n.name == name), None
    )


def sized_by_data(expr: ast.expr) -> bool:
    """Boolean indexing (``x[mask]``, ``x[x > 0]``) or a call whose size the data gives."""
    if isinstance(expr, ast.Subscript) and isinstance(expr.slice, ast.Name | ast.Compare | ast.UnaryOp):
        return not (isinstance(expr.slice, ast.Name) and expr.slice.id in ("i", "j", "k", "idx", "index"))
    return any(
        isinstance(node, ast.Call) and reading.callee_name(node) in SIZED_BY_DATA for node in ast.walk(expr)
    )


@dataclass(frozen=True)
class _Assigned:
    """``name`` bound at ``line`` to ``value``, or (``element`` set) to that element of
    ``value``, a call whose result is unpacked; ``shown``: the statement's targets."""

    line: int
    shown: str
    value: ast.expr
    element: int | None = None


def _assignments(function: ast.AST, name: str, before: int) -> list[_Assigned] | None:
    """Each binding of ``name`` by an assignment of the function at or before line
    ``before``, latest first: ``name = ...``, or ``name`` among unpacked targets (``a, b =
    x, y`` pairs them; ``a, b = f()`` takes an element of f's result). None where the name
    is also bound another way (a loop target, ``+=``): the source alone does not say
    which binding holds."""
    by_target: dict[int, _Assigned] = {}
    for node in ast.walk(function):
        if not isinstance(node, ast.Assign) or len(node.targets) != 1:
            continue
        target = node.targets[0]
        shown = (
            ", ".join(map(ast.unparse, target.elts)) if isinstance(target, ast.Tuple) else ast.unparse(target)
        )
        if isinstance(target, ast.Name):
            by_target[id(target)] = _Assigned(node.lineno, shown, node.value)
            continue
        pairs = reading.paired(target, node.value)
        if len(pairs) > 1:  # a, b = x, y
            for one, value in pairs:
                if isinstance(one, ast.Name):
                    by_target[id(one)] = _Assigned(node.lineno, one.id, value)
        elif (
            isinstance(target, ast.Tuple)
            and isinstance(node.value, ast.Call)
            and all(isinstance(e, ast.Name) for e in target.elts)
        ):
            for position, one in enumerate(target.elts):
                by_target[id(one)] = _Assigned(node.lineno, shown, node.value, element=position)
    found: list[_Assigned] = []
    for node in ast.walk(function):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store) and node.id == name:
            assigned = by_target.get(id(node))
            if assigned is None:
                return None
            if assigned.line <= before:
                found.append(assigned)
    return sorted(found, key=lambda a: -a.line)


def _argument_for(function: ast.AST, name: str, caller: Frame | None) -> ast.expr | None:
    """The caller's argument for parameter ``name`` of ``function``, at the caller's line."""
    if caller is None or not isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef):
        return None
    params = [a.arg for a in (*function.args.posonlyargs, *function.args.args)]
    if name not in params:
        return None
    for call in reading.calls_on_line(caller.file, caller.line):
        if reading.callee_name(call) != function.name:
            continue
        for keyword in call.keywords:
            if keyword.arg == name:
                return keyword.value
        position = params.index(name)
        if params and params[0] in ("self", "cls") and isinstance(call.func, ast.Attribute):
            position -= 1  # obj.method(x): x is the parameter after self
        if 0 <= position < len(call.args) and not isinstance(call.args[position], ast.Starred):
            return call.args[position]
    return None


_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
# calls that take their argument's items in its iteration order
_TAKES_THE_ORDER = frozenset({"list", "tuple", "enumerate", "zip", "iter", "next", "dict"})


def first_iteration_of_a_set(paths: list[str]) -> tuple[str, int, str] | None:
    """(file, line, text) of the first place in ``paths`` that takes a set's items in its
    iteration order: a ``for`` or a comprehension over it, ``list(it)``, ``enumerate(it)``
    and the like (``sorted`` gives its own order), where ``it`` is a set itself or a name
    or ``self`` attribute the same function (or class) binds to one. A set of strings
    iterates in the order of their hashes, which Python seeds once per interpreter: the
    ranks forked from one interpreter (--warm-start) would share an order that ranks each
    started by torchrun do not. None where no such iteration is in the source (the
    caller's libraries are not read)."""
    for path in paths:
        tree = reading.parse(path)
        if tree is None:
            continue
        scopes: list[ast.AST] = [
            tree,
            *(
                n
                for n in ast.walk(tree)
                if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
            ),
        ]
        module_sets = _names_bound_to_sets(tree)  # read by name in every function of the file
        for scope in scopes:
            sets = _names_bound_to_sets(scope, module_sets)
            # a class: a method may iterate what another binds (self.names = set(...))
            nodes = list(ast.walk(scope)) if isinstance(scope, ast.ClassDef) else _own_nodes(scope)
            for node in nodes:
                for taken in _iterated(node):
                    text = ast.unparse(taken)
                    if is_unordered(taken) or text in sets:
                        return path, getattr(node, "lineno", 0), text
    return None


def _own_nodes(scope: ast.AST) -> list[ast.stmt | ast.expr]:
    """The statements and expressions of ``scope`` outside the functions and classes it
    defines (those are scopes of their own)."""
    found: list[ast.stmt | ast.expr] = []
    pending = list(ast.iter_child_nodes(scope))
    while pending:
        node = pending.pop()
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef | ast.Lambda):
            continue
        if isinstance(node, ast.stmt | ast.expr):
            found.append(node)
        pending.extend(ast.iter_child_nodes(node))
    return found


def _iterated(node: ast.AST) -> list[ast.expr]:
    """What ``node`` takes the items of, in their iteration order."""
    if isinstance(node, ast.For | ast.AsyncFor):
        return [node.iter]
    if isinstance(node, ast.ListComp | ast.DictComp | ast.GeneratorExp | ast.SetComp):
        return [generator.iter for generator in node.generators]
    if isinstance(node, ast.Call) and reading.callee_name(node) in _TAKES_THE_ORDER and node.args:
        return list(node.args)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "join":
        return list(node.args[:1])
    return []


def _names_bound_to_sets(scope: ast.AST, known: Iterable[str] = ()) -> set[str]:
    """Names (and ``self.x``) that ``scope``'s own code binds to a set, for a class the
    attributes any of its methods binds; with the ``known`` set names (the module's), a name
    bound to one of those too (``names = sorted(KEYS) if fixed else KEYS``)."""
    nodes: list[ast.AST] = (
        list(ast.walk(scope)) if isinstance(scope, ast.ClassDef) else list(_own_nodes(scope))
    )
    bound: set[str] = set(known)

    def may_be_a_set(value: ast.expr) -> bool:
        if isinstance(value, ast.IfExp):
            return may_be_a_set(value.body) or may_be_a_set(value.orelse)
        return is_unordered(value) or ast.unparse(value) in bound

    for node in sorted(
        (n for n in nodes if isinstance(n, ast.Assign | ast.AnnAssign)), key=lambda n: n.lineno
    ):
        if node.value is None or not may_be_a_set(node.value):
            continue
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        bound |= {ast.unparse(target) for target in targets}
    if isinstance(scope, ast.ClassDef):
        # a method that returns a set: ``self.names()``, or ``self.names`` for a property
        for method in (n for n in scope.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)):
            returned = [
                n.value for n in ast.walk(method) if isinstance(n, ast.Return) and n.value is not None
            ]
            if returned and any(may_be_a_set(value) for value in returned):
                is_property = any(ast.unparse(d).endswith("property") for d in method.decorator_list)
                bound.add(f"self.{method.name}" + ("" if is_property else "()"))
    return bound
