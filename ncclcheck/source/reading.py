"""Reading the source around a call site: which branch, loop or try guards it.

Pure functions over Python source (ast), shared by preflight's diagnosis,
doctor and lint. A condition is *rank-dependent* when it reads the rank
(``rank == 0``, ``dist.get_rank()``, ``accelerator.is_main_process``,
``trainer.is_global_zero``, a name assigned from such an expression);
*data-dependent* when it reads tensor values or shapes (``torch.isfinite``,
``.item()``, ``.shape``, ``len()``); anything else is *other*.
"""

from __future__ import annotations

import ast
import copy
import functools
from collections.abc import Callable, Collection, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

RANK = "rank"
DATA = "data"
OTHER = "other"

RANK_NAMES = frozenset(
    {
        "rank",
        "local_rank",
        "global_rank",
        "node_rank",
        "world_rank",
        "group_rank",
        "rank_id",
        "is_main_process",
        "is_local_main_process",
        "is_global_zero",
        "is_master",
        "is_main",
        "is_rank_zero",
        "is_rank0",
        "rank0",
        "rank_zero",
        "main_process",
        "is_leader",
        "is_node_leader",
        "process_index",
        "local_process_index",
        "is_world_process_zero",
        "is_local_process_zero",
        "master_process",
        "is_master_ordinal",
        "global_rank_zero",
    }
)
RANK_CALLS = frozenset(
    {
        "get_rank",
        "get_local_rank",
        "get_global_rank",
        "get_node_local_rank",
        "is_master_ordinal",
        "get_ordinal",
        "is_main_process",
        "is_rank_zero",
    }
)
# The environment variables launchers set to a process's rank: torchrun's, Slurm's,
# Open MPI's, MPICH/PMI's and MVAPICH's. A value read from one is a rank.
RANK_ENVIRONMENT = frozenset(
    {
        "RANK",
        "LOCAL_RANK",
        "GROUP_RANK",
        "NODE_RANK",
        "SLURM_PROCID",
        "SLURM_LOCALID",
        "SLURM_NODEID",
        "OMPI_COMM_WORLD_RANK",
        "OMPI_COMM_WORLD_LOCAL_RANK",
        "PMI_RANK",
        "PMIX_RANK",
        "MV2_COMM_WORLD_RANK",
    }
)
DATA_CALLS = frozenset(
    {
        "isfinite",
        "isnan",
        "isinf",
        "item",
        "any",
        "all",
        "size",
        "numel",
        "len",
        "nonzero",
        "dim",
        "tolist",
    }
)
DATA_ATTRS = frozenset({"shape", "ndim"})
# A tensor's (or an array's) reductions, called as its methods or torch's (`mask.sum() == 0`,
# `torch.max(x)`): a test on one reads the values of the data. Python's lists have no such
# methods, and the builtins of the same names (`sum(counts)`) are not read as such.
REDUCTION_METHODS = frozenset({"sum", "mean", "max", "min", "amax", "amin", "norm", "std", "prod"})


def reads_a_reduction(expr: ast.AST) -> bool:
    """Whether ``expr`` calls a reduction of a value (``mask.sum()``, ``torch.max(x)``)."""
    return any(
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr in REDUCTION_METHODS
        and not (isinstance(node.func.value, ast.Name) and node.func.value.id == "math")
        for node in ast.walk(expr)
    )


# Calls whose value differs between ranks by construction, each with what it reads:
# a decision on one, never synchronised, can part the ranks.
RANK_LOCAL_CALLS = {
    "time": "a clock",
    "perf_counter": "a clock",
    "monotonic": "a clock",
    "exists": "a file check",
    "isfile": "a file check",
    "isdir": "a file check",
    "random": "a random draw",
    "randint": "a random draw",
    "uniform": "a random draw",
    "choice": "a random draw",
    "rand": "a random draw",
}


@functools.lru_cache(maxsize=256)
def parse(path: str) -> ast.Module | None:
    try:
        return ast.parse(Path(path).read_text(encoding="utf-8"), filename=path)
    except (OSError, SyntaxError, ValueError):
        return None


def contains(node: ast.AST, line: int) -> bool:
    start = getattr(node, "lineno", None)
    end = getattr(node, "end_lineno", None)
    return start is not None and end is not None and start <= line <= end


def enclosing_chain(path: str, line: int) -> list[ast.AST]:
    """The statements that contain ``line``, outermost first (function defs included)."""
    tree = parse(path)
    if tree is None:
        return []
    chain: list[ast.AST] = []
    body: list[ast.AST] = list(tree.body)
    while True:
        inner = next((node for node in body if contains(node, line)), None)
        if inner is None:
            return chain
        chain.append(inner)
        body = [child for child in ast.iter_child_nodes(inner) if isinstance(child, ast.stmt)]
        # handlers of a try hold statements one level down
        if isinstance(inner, ast.Try):
            body += list(inner.handlers)


def enclosing_function(path: str, line: int) -> ast.FunctionDef | ast.AsyncFunctionDef | None:
    for node in reversed(enclosing_chain(path, line)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            return node
    return None


def names_read(node: ast.AST) -> tuple[set[str], set[str], set[str]]:
    """Names and attributes read, and functions called, in an expression."""
    names: set[str] = set()
    attrs: set[str] = set()
    calls: set[str] = set()
    for child in ast.walk(node):
        if isinstance(child, ast.Name):
            names.add(child.id)
        elif isinstance(child, ast.Attribute):
            attrs.add(child.attr)
        if isinstance(child, ast.Call):
            func = child.func
            if isinstance(func, ast.Name):
                calls.add(func.id)
            elif isinstance(func, ast.Attribute):
                calls.add(func.attr)
    return names, attrs, calls


def rank_derived_names(
    scope: ast.AST | None,
    nodes: Iterable[ast.AST] | None = None,
    seeds: frozenset[str] = frozenset(),
    classes: frozenset[str] = frozenset(),
) -> set[str]:
    """Names assigned from rank-dependent expressions in ``scope`` (``is_main = rank == 0``).
    Where the rank only places a value (``x.to(device)`` with ``device = f"cuda:{rank}"``,
    ``DDP(net, device_ids=[local_rank])``), the value is not the rank's: a loss computed on
    rank 3's GPU is no rank test.

    ``nodes``: the scope's nodes where the caller has walked them already; ``seeds``: names
    and attributes known to be rank-derived from outside the scope (a class's members);
    ``classes``: the project's classes, an instance of which, built with the rank, is no
    rank value itself (``logger = MetricsLogger(out, rank)``): what of it is, its class
    says (the caller adds those members)."""
    walked = list(ast.walk(scope) if nodes is None else nodes) if scope is not None else []
    devices = device_names(walked)

    def holds(value: ast.expr, derived: set[str]) -> bool:
        if classes and isinstance(value, ast.Call) and callee_name(value) in classes:
            return False
        return derives_from_the_rank(value, derived | seeds, devices)

    return _names_assigned(scope, walked, holds)


def derives_from_the_rank(value: ast.expr, derived: set[str], devices: Iterable[str] = ()) -> bool:
    """Whether ``value`` is computed from the rank (or the ``derived`` names), beyond placing
    it on a device or picking a DistributedSampler's shard."""
    if kind_of(value, derived) != RANK:
        return False
    placing = set(devices)
    return _is_device(value, placing) or kind_of(_unplaced(value), derived - placing) == RANK


# where a value is put, not what it is: `.to(device)`, `.cuda(rank)`, `device_ids=[rank]`
_PLACING_METHODS = frozenset({"to", "cuda", "pin_memory"})
_PLACING_KEYWORDS = frozenset(
    {"device", "device_ids", "output_device", "map_location", "device_mesh", "device_id", "process_group"}
)


def _is_device(value: ast.expr, devices: set[str]) -> bool:
    """``torch.device("cuda", rank)``, ``f"cuda:{local_rank}"``, ``"cuda:%d" % rank``, or a
    device name already found."""
    if isinstance(value, ast.Name):
        return value.id in devices
    if isinstance(value, ast.Call) and callee_name(value) == "device":
        return True
    text = ast.unparse(value)
    return isinstance(value, ast.JoinedStr | ast.BinOp) and ("cuda" in text or "npu" in text or "xpu" in text)


def device_names(nodes: Iterable[ast.AST]) -> set[str]:
    """Names bound to a device built from the rank (``device = torch.device("cuda", rank)``)."""
    found: set[str] = set()
    for node in nodes:
        if (
            isinstance(node, ast.Assign)
            and len(node.targets) == 1
            and isinstance(node.targets[0], ast.Name)
            and _is_device(node.value, found)
        ):
            found.add(node.targets[0].id)
    return found


class _Unplace(ast.NodeTransformer):
    """A copy of an expression without what only places it on a device, or picks a rank's
    shard of equal length."""

    def visit_Call(self, node: ast.Call) -> ast.AST:
        self.generic_visit(node)
        func = node.func
        if isinstance(func, ast.Attribute) and func.attr in _PLACING_METHODS:
            return func.value  # x.to(device) -> x
        if callee_name(node).endswith("DistributedSampler"):
            # the rank picks its shard, of one length on every rank (the sampler pads)
            return node.args[0] if node.args else ast.Constant(None)
        node.keywords = [k for k in node.keywords if k.arg not in _PLACING_KEYWORDS]
        return node


def _unplaced(value: ast.expr) -> ast.AST:
    unplaced: ast.AST = _Unplace().visit(copy.deepcopy(value))
    return unplaced


def reads_the_rank(path: str, expr: ast.expr) -> bool:
    """Whether ``expr`` reads the rank (``range(rank, n, world_size)``) or a name its
    function (or module) computes from it (``range(num_batches)``)."""
    function = enclosing_function(path, getattr(expr, "lineno", 0))
    derived = rank_derived_names(function) | rank_derived_names(parse(path))
    return kind_of(expr, derived) == RANK or bool(
        {n.id for n in ast.walk(expr) if isinstance(n, ast.Name)} & derived
    )


def rank_valued_names(scope: ast.AST | None) -> set[str]:
    """Names assigned a rank or a test of one (``is_main = rank == 0``, ``local =
    int(os.environ["LOCAL_RANK"])``): the names a rank test reads. Not a value computed
    from what a rank holds (``loss = train_one_epoch(model, DataLoader(shard(rank)))``):
    a test on that tests the data."""
    return _names_assigned(scope, None, lambda value, named: _is_rank_value(value, set(), named))


def _names_assigned(
    scope: ast.AST | None,
    nodes: Iterable[ast.AST] | None,
    holds: Callable[[ast.expr, set[str]], bool],
) -> set[str]:
    """The names ``scope`` assigns a value that ``holds`` of, given the names found so far."""
    found: set[str] = set()
    if scope is None:
        return found
    # in the order written, so that one round follows a chain written top to bottom (a =
    # rank; b = f(a); c = g(b)); more rounds for the bindings a loop carries back up
    assignments = sorted(
        (
            n
            for n in (ast.walk(scope) if nodes is None else nodes)
            if isinstance(n, (ast.Assign, ast.AnnAssign))
        ),
        key=lambda n: (n.lineno, n.col_offset),
    )
    for _ in range(3):
        before = len(found)
        for node in assignments:
            if node.value is None:
                continue
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for whole_target in targets:
                for target, value in paired(whole_target, node.value):
                    if holds(value, found):
                        found |= bound_names(target)
        if len(found) == before:
            break
    return found


def rank_functions(tree: ast.Module | None) -> set[str]:
    """The module's functions that return a rank or a test of one (``def get_rank(): return
    int(os.environ.get("RANK", 0))``, ``def is_leader(): return get_rank() == 0``): a call
    to one is a rank value, as ``dist.get_rank()`` is."""
    found: set[str] = set()
    if tree is None:
        return found
    functions = [n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    for _ in range(3):  # is_leader() calls get_rank()
        before = len(found)
        for function in functions:
            if function.name in found:
                continue
            returned = [
                n.value for n in ast.walk(function) if isinstance(n, ast.Return) and n.value is not None
            ]
            named = rank_valued_names(function) | found
            if returned and all(_is_rank_value(value, set(), named) for value in returned):
                found.add(function.name)
        if len(found) == before:
            break
    return found


def rank_attributes(class_def: ast.ClassDef) -> set[str]:
    """Attributes a class's methods set to a rank value (``self.is_primary =
    int(os.environ["RANK"]) == 0`` in ``__init__``): rank tests in all of its methods. The
    value must be a rank itself, not an object built with one (``self.state =
    TrainerState(is_world_process_zero=...)`` is no rank)."""
    assignments = [
        (attr, node.value)
        for method in class_def.body
        if isinstance(method, (ast.FunctionDef, ast.AsyncFunctionDef))
        for node in ast.walk(method)
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None
        for target in (node.targets if isinstance(node, ast.Assign) else [node.target])
        if (attr := self_attribute(target)) is not None
    ]
    found: set[str] = set()
    for _ in range(3):  # self.is_main = self.rank == 0 after self.rank = get_rank()
        before = len(found)
        found |= {attr for attr, value in assignments if _is_rank_value(value, found)}
        if len(found) == before:
            break
    return found


def rank_fields(tree: ast.Module | None) -> set[str]:
    """Class-level fields whose default is a rank value, as a dataclass or config class
    declares them (``lead: bool = int(os.environ["RANK"]) == 0``, or through
    ``field(default_factory=lambda: ...)``): ``cfg.lead`` is a rank test wherever read."""
    classes = [n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)] if tree is not None else []
    found: set[str] = set()
    for field_ in (n for c in classes for n in c.body if isinstance(n, ast.AnnAssign)):
        value = field_.value
        if isinstance(value, ast.Call) and callee_name(value) == "field":
            given = {k.arg: k.value for k in value.keywords}
            value = given.get("default", given.get("default_factory"))
            value = value.body if isinstance(value, ast.Lambda) else value
        if isinstance(field_.target, ast.Name) and value is not None and _is_rank_value(value, set()):
            found.add(field_.target.id)
    return found


_CONVERSIONS = frozenset({"int", "str", "bool", "float"})


def _is_rank_value(expr: ast.AST, attributes: set[str], names: set[str] | None = None) -> bool:
    """An expression whose value is a rank (or a test of one), not merely built from one;
    ``names``: local names known to hold one."""
    names = names or set()
    if isinstance(expr, ast.Call):
        func = expr.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
        if name in _CONVERSIONS and expr.args:
            return _is_rank_value(expr.args[0], attributes, names)
        return name in RANK_CALLS or name in names or reads_rank_environment(expr)
    if isinstance(expr, ast.Subscript):
        return reads_rank_environment(expr)
    if isinstance(expr, ast.Compare):
        return any(_is_rank_value(side, attributes, names) for side in [expr.left, *expr.comparators])
    if isinstance(expr, ast.BinOp):
        return _is_rank_value(expr.left, attributes, names) or _is_rank_value(expr.right, attributes, names)
    if isinstance(expr, ast.UnaryOp):
        return _is_rank_value(expr.operand, attributes, names)
    if isinstance(expr, ast.BoolOp):
        return any(_is_rank_value(value, attributes, names) for value in expr.values)
    if isinstance(expr, ast.IfExp):
        return _is_rank_value(expr.body, attributes, names) or _is_rank_value(expr.orelse, attributes, names)
    if isinstance(expr, ast.Name):
        return expr.id in RANK_NAMES or expr.id in names
    if isinstance(expr, ast.Attribute):
        return expr.attr in RANK_NAMES or (
            isinstance(expr.value, ast.Name) and expr.value.id == "self" and expr.attr in attributes
        )
    return False


def paired(target: ast.expr, value: ast.expr) -> list[tuple[ast.expr, ast.expr]]:
    """``rank, world = get_rank(), get_world_size()`` as two assignments: only ``rank``
    is rank-derived (the world size is the same on every rank, and so is what is
    built from it). Anything else unpacked (a call's result, a starred target) stays
    one assignment."""
    if (
        isinstance(target, (ast.Tuple, ast.List))
        and isinstance(value, (ast.Tuple, ast.List))
        and len(target.elts) == len(value.elts)
        and not any(isinstance(e, ast.Starred) for e in (*target.elts, *value.elts))
    ):
        return [pair for t, v in zip(target.elts, value.elts, strict=True) for pair in paired(t, v)]
    return [(target, value)]


def self_attribute(expr: ast.expr) -> str | None:
    """``is_primary`` of ``self.is_primary``: an attribute of the instance, read by the
    class's other methods (another object's ``state.rank`` keeps its own meaning)."""
    if isinstance(expr, ast.Attribute) and isinstance(expr.value, ast.Name) and expr.value.id == "self":
        return expr.attr
    return None


def bound_names(target: ast.expr) -> set[str]:
    """The names an assignment target binds: ``a``, ``a, (b, *c)``; not the object of
    ``state.rank = ...`` or ``ranks[i] = ...``, which keep their own meaning."""
    if isinstance(target, ast.Name):
        return {target.id}
    if isinstance(target, ast.Starred):
        return bound_names(target.value)
    if isinstance(target, (ast.Tuple, ast.List)):
        return {name for element in target.elts for name in bound_names(element)}
    return set()


def reads_rank_environment(expr: ast.AST) -> bool:
    """``os.environ["LOCAL_RANK"]``, ``os.environ.get("RANK")``, ``os.getenv("SLURM_PROCID")``:
    a read of a variable the launcher sets to the process's rank."""
    for node in ast.walk(expr):
        key: ast.AST | None = None
        if isinstance(node, ast.Subscript) and _is_environ(node.value):
            key = node.slice
        elif isinstance(node, ast.Call) and node.args:
            func = node.func
            getenv = isinstance(func, ast.Attribute) and func.attr == "getenv"
            getenv = getenv or (isinstance(func, ast.Name) and func.id == "getenv")
            environ_get = isinstance(func, ast.Attribute) and func.attr == "get" and _is_environ(func.value)
            if getenv or environ_get:
                key = node.args[0]
        if isinstance(key, ast.Constant) and key.value in RANK_ENVIRONMENT:
            return True
    return False


def _is_environ(node: ast.AST) -> bool:
    return (isinstance(node, ast.Attribute) and node.attr == "environ") or (
        isinstance(node, ast.Name) and node.id == "environ"
    )


def kind_of(expr: ast.AST, derived: set[str]) -> str:
    names, attrs, calls = names_read(expr)
    if (names | attrs) & (RANK_NAMES | derived) or calls & RANK_CALLS or reads_rank_environment(expr):
        return RANK
    if calls & DATA_CALLS or attrs & DATA_ATTRS or reads_a_reduction(expr):
        return DATA
    return OTHER


def condition_kind(path: str, test: ast.expr) -> str:
    """rank, data or other, for the test of an if/while at ``path``."""
    tree = parse(path)
    line = getattr(test, "lineno", 0)
    function = enclosing_function(path, line)
    derived = rank_valued_names(function) | rank_valued_names(tree) | rank_functions(tree) | rank_fields(tree)
    for node in enclosing_chain(path, line):
        if isinstance(node, ast.ClassDef):
            derived |= rank_attributes(node)
    kind = kind_of(test, derived)
    if tree is not None and kind == OTHER:
        # `not batch_is_finite(batch)`: a helper of the file that tests a tensor's values
        return _kind_through_helpers(tree, ast.unparse(test))
    if tree is not None and kind == DATA and _judged_by_the_files_own(tree, test):
        # `stopper(val_loss.item())`: the value goes into the project's own judgement (a
        # patience count, a best so far), which decides on what this rank has seen: a
        # decision on a value of its own, not a test of the batch at hand
        return OTHER
    if function is not None and kind == DATA and reads_a_total_of_a_loop_it_is_past(function, test):
        # `if epoch_loss < target: break` after `running_loss += loss.item()` over the
        # epoch's batches: a metric of the rank's own, taken over all it has seen
        return OTHER
    return kind


def reads_a_total_of_a_loop_it_is_past(
    function: ast.AST, test: ast.expr, synchronised: Collection[str] = ()
) -> bool:
    """The test reads a value summed up over a loop (``running += loss.item()`` in a loop's
    body), or one computed from such a value before the test (``mean = running / n``),
    and the test stands after that loop, not in it: it judges what the rank saw over
    many batches, not the batch at hand. A total in ``synchronised`` (all-reduced before
    the test) is every rank's, not this rank's own."""
    line = getattr(test, "lineno", 0)
    loops = [n for n in ast.walk(function) if isinstance(n, ast.For | ast.While)]
    past = [n for n in loops if (n.end_lineno or n.lineno) < line]
    totals = {
        node.target.id
        for loop in past
        for node in ast.walk(loop)
        if isinstance(node, ast.AugAssign) and isinstance(node.target, ast.Name)
    }
    totals -= set(synchronised)
    if not totals:
        return False
    # derivations past the loops, in the order written: `epoch_loss = running_loss / n` reads
    # a total; `running_loss, n = summed.tolist()` after `dist.all_reduce(summed)` replaces
    # one with every rank's
    after = max((loop.end_lineno or loop.lineno) for loop in past)
    assigns = sorted(
        (n for n in ast.walk(function) if isinstance(n, ast.Assign) and after < n.lineno < line),
        key=lambda n: n.lineno,
    )
    for node in assigns:
        targets = {t.id for target in node.targets for t in ast.walk(target) if isinstance(t, ast.Name)}
        read = names_read(node.value)[0]
        if read & totals:
            totals |= targets
        elif read & set(synchronised):
            totals -= targets
    return bool(names_read(test)[0] & totals)


def _judged_by_the_files_own(tree: ast.Module, test: ast.expr) -> bool:
    """The test is a call (or its negation) of an instance of a class of the file, which
    keeps state across calls (``stopper = EarlyStopping(3)`` then ``stopper(loss.item())``,
    ``self.tracker.improved(acc)``); a plain function of the file that tests a value
    (``is_finite(loss)``) stays a test of the data."""
    while isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        test = test.operand
    if not isinstance(test, ast.Call):
        return False
    defined = {n.name for n in ast.walk(tree) if isinstance(n, ast.ClassDef)}
    func = test.func
    owner = func.value if isinstance(func, ast.Attribute) else func
    name = owner.attr if isinstance(owner, ast.Attribute) else getattr(owner, "id", None)
    if name is None:
        return False
    for node in ast.walk(tree):
        if not isinstance(node, ast.Assign):
            continue
        # `stopper, step = EarlyStopping(3), 0` too: each target with its own value
        for target, value in (pair for whole in node.targets for pair in paired(whole, node.value)):
            bound = target.attr if isinstance(target, ast.Attribute) else getattr(target, "id", None)
            if bound == name and isinstance(value, ast.Call) and callee_name(value) in defined:
                return True
    return False


def rank_local_reads(text: str, path: str | None = None, line: int | None = None) -> list[str]:
    """What the rank-local calls in a condition read ("a file check", "a clock"), in
    the order written, for a condition as text (a Guard's). With ``path``, a function of
    that file the condition calls is read too (`if should_resume(path)`), one level; with
    ``line`` (the test's), so are the assignments of the names it reads in its function
    before it (`draw = random.random()` then `if draw < p:`), one level."""
    try:
        expression = ast.parse(text, mode="eval")
    except SyntaxError:
        return []
    tree = parse(path) if path is not None else None
    assigned: list[ast.AST] = []
    function = enclosing_function(path, line) if path is not None and line is not None else None
    if function is not None and line is not None:
        names = {n.id for n in ast.walk(expression) if isinstance(n, ast.Name)}
        for node in ast.walk(function):
            if isinstance(node, ast.Assign | ast.AnnAssign | ast.AugAssign) and node.lineno < line:
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                if node.value is not None and any(
                    isinstance(t, ast.Name) and t.id in names for target in targets for t in ast.walk(target)
                ):
                    assigned.append(node.value)
    helpers = {
        node.name: node
        for node in (ast.walk(tree) if tree is not None else ())
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
    }
    found: list[str] = []
    scanned: list[ast.AST] = [*reversed(assigned), expression]
    while scanned:
        for node in ast.walk(scanned.pop()):
            if not isinstance(node, ast.Call):
                continue
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            what = RANK_LOCAL_CALLS.get(name)
            if what is not None and what not in found:
                found.append(what)
            helper = helpers.pop(name, None) if isinstance(func, ast.Name) else None
            if helper is not None:
                scanned.append(helper)
    return found


@dataclass(frozen=True)
class Guard:
    """A branch or exit that decides whether a rank reaches a line."""

    kind: str  # rank | data | other
    line: int  # the if/while line, or the exit statement's line
    text: str  # the condition as written
    statement: str = "if"  # if | return | break | continue | raise | while
    test_line: int = 0  # for an exit: the line of the if-test above it (0: ``line`` itself)

    @property
    def decided_at(self) -> int:
        """The line whose test decided: the if above an exit, else the guard's own line."""
        return self.test_line or self.line


def guards_of(path: str, line: int) -> list[Guard]:
    """The if-conditions that enclose ``line`` inside its function, innermost first."""
    found: list[Guard] = []
    for node in enclosing_chain(path, line):
        if isinstance(node, ast.If):
            found.append(Guard(condition_kind(path, node.test), node.lineno, ast.unparse(node.test)))
    return list(reversed(found))


_EXITS: dict[type[ast.AST], str] = {
    ast.Return: "return",
    ast.Break: "break",
    ast.Continue: "continue",
    ast.Raise: "raise",
}


def conditional_exits(path: str, scope: ast.AST, before_line: int | None = None) -> list[Guard]:
    """return/break/continue/raise statements under an if in ``scope`` (not in nested defs).

    Each comes with the kind of the innermost if-test above it. ``before_line``
    keeps only the exits that come before that line.
    """
    found: list[Guard] = []

    def visit(node: ast.AST, tests: list[ast.If]) -> None:
        for child in ast.iter_child_nodes(node):
            line = getattr(child, "lineno", 0)
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
                continue
            statement = _EXITS.get(type(child))
            if statement and tests and (before_line is None or line < before_line):
                above = tests[-1]
                kind = condition_kind(path, above.test)
                found.append(Guard(kind, line, ast.unparse(above.test), statement, above.lineno))
            if isinstance(child, ast.If):
                visit_body(child.body, [*tests, child])
                visit_body(child.orelse, [*tests, child])
            else:
                visit(child, tests)

    def visit_body(statements: list[ast.stmt], tests: list[ast.If]) -> None:
        holder = ast.Module(body=statements, type_ignores=[])
        visit(holder, tests)

    visit(scope, [])
    return found


# Statements after the stop that cannot hang or wait: leaving them out of "did not run"
_HARMLESS_CALLS = frozenset({"destroy_process_group", "print", "cleanup", "info", "debug", "warning"})


def statements_after(path: str, line: int) -> tuple[list[ast.stmt], bool]:
    """The statements of ``line``'s function that come after it, for a run stopped there,
    and whether a loop of that function was running (True: what a deeper frame does
    after its own line may have run in an earlier pass, and is not said).

    After the outermost loop around ``line`` if there is one (the statements after it
    in its body ran in the earlier passes), else after the statement holding ``line``;
    then after each statement that holds that one, up to the function. Siblings only: a
    ``finally`` runs as the stop unwinds. Prints, returns and destroy_process_group()
    are left out: they wait for nothing."""
    chain = enclosing_chain(path, line)
    functions = [i for i, n in enumerate(chain) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    scope = functions[-1] if functions else -1  # the innermost function; -1: module level
    inside = chain[scope + 1 :]
    loops = [i for i, node in enumerate(inside) if isinstance(node, (ast.For, ast.While, ast.AsyncFor))]
    anchor = loops[0] if loops else len(inside) - 1
    after: list[ast.stmt] = []
    for depth in range(anchor, -1, -1):
        node = inside[depth]
        parent = inside[depth - 1] if depth > 0 else (chain[scope] if scope >= 0 else None)
        for block in _blocks(parent, path):
            for index, child in enumerate(block):
                if child is node:
                    after += block[index + 1 :]
    return [stmt for stmt in after if not _harmless(stmt)], bool(loops)


def blocks(node: ast.AST, with_finally: bool = True) -> list[list[ast.stmt]]:
    """The statement lists right inside ``node``: a body, an ``else``, each ``except``'s
    body, a ``finally`` (unless ``with_finally`` is False: a stop unwinding through a try
    runs it, so it is no sibling that did not run)."""
    names = ("body", "orelse", "finalbody") if with_finally else ("body", "orelse")
    found = [block for name in names if isinstance(block := getattr(node, name, None), list) and block]
    for handler in getattr(node, "handlers", ()):  # a try's (and a try/except*'s) excepts
        found.append(handler.body)
    return found  # the node's own lists, not copies: callers ask `block is loop.body`


def _blocks(parent: ast.AST | None, path: str) -> list[list[ast.stmt]]:
    if parent is None:
        tree = parse(path)
        return [list(tree.body)] if tree is not None else []
    return blocks(parent, with_finally=False)


def _harmless(stmt: ast.stmt) -> bool:
    if isinstance(stmt, (ast.Return, ast.Pass)):
        return stmt.value is None if isinstance(stmt, ast.Return) else True
    if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call):
        return callee_name(stmt.value).rpartition(".")[2] in _HARMLESS_CALLS
    return False


def enclosing_loops(path: str, line: int) -> list[ast.stmt]:
    """The for/while loops around ``line`` within its function, innermost first."""
    loops: list[ast.stmt] = []
    for node in reversed(enclosing_chain(path, line)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            break
        if isinstance(node, (ast.For, ast.While, ast.AsyncFor)):
            loops.append(node)
    return loops


def while_test(path: str, loop: ast.stmt) -> Guard | None:
    """The test of a ``while`` loop as the way out of it (``while time.time() < end``),
    unless it is a constant (``while True``: only its break/return leave it)."""
    if not isinstance(loop, ast.While) or isinstance(loop.test, ast.Constant):
        return None
    return Guard(condition_kind(path, loop.test), loop.lineno, ast.unparse(loop.test), "while")


def decision_at(path: str, line: int) -> str | None:
    """``if …`` or ``while …`` when ``line`` lies in the test of the innermost branch or
    loop around it (an elif is an If of its own): a value read there decides where the
    rank goes."""
    chain = enclosing_chain(path, line)
    if not chain:
        return None
    node = chain[-1]
    if isinstance(node, (ast.If, ast.While)) and contains(node.test, line):
        return f"{'while' if isinstance(node, ast.While) else 'if'} {ast.unparse(node.test)}"
    return None


def loops_before(path: str, line: int) -> list[ast.For | ast.AsyncFor]:
    """The for loops of ``line``'s function that ended before ``line`` (its loop
    variables keep their last values), the last one first; nested functions aside."""
    function = enclosing_function(path, line)
    scope: ast.AST | None = function if function is not None else parse(path)
    found: list[ast.For | ast.AsyncFor] = []

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
                continue
            if isinstance(child, (ast.For, ast.AsyncFor)) and (child.end_lineno or child.lineno) < line:
                found.append(child)
            visit(child)

    if scope is not None:
        visit(scope)
    return sorted(found, key=lambda loop: loop.end_lineno or loop.lineno, reverse=True)


def innermost_loop(path: str, line: int) -> ast.stmt | None:
    loops = enclosing_loops(path, line)
    return loops[0] if loops else None


def swallowing_try(path: str, line: int) -> ast.Try | None:
    """The innermost try whose body holds ``line`` and one of whose handlers does not re-raise."""
    for node in reversed(enclosing_chain(path, line)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            return None
        if isinstance(node, ast.Try) and any(contains(s, line) for s in node.body):
            for handler in node.handlers:
                if not any(isinstance(n, ast.Raise) for n in ast.walk(handler)):
                    return node
    return None


def try_that_continues(loop: ast.stmt, before_line: int) -> tuple[ast.Try, ast.ExceptHandler] | None:
    """A try in ``loop``'s body, before ``before_line``, with an ``except`` that goes on to
    the next pass of this loop (a ``continue`` of its own, not of a loop inside it): the
    way a rank whose pass raised skips the rest of it (`try: batch = decode(...) / except
    ValueError: continue`), its collectives included."""
    for node in ast.walk(loop):
        if not isinstance(node, ast.Try) or node.lineno >= before_line:
            continue
        for handler in node.handlers:
            inner_loops = [n for n in ast.walk(handler) if isinstance(n, (ast.For, ast.AsyncFor, ast.While))]
            own = [
                n
                for n in ast.walk(handler)
                if isinstance(n, ast.Continue) and not any(n in ast.walk(inner) for inner in inner_loops)
            ]
            if own:
                return node, handler
    return None


def try_that_returns(function: ast.AST, before_line: int) -> tuple[ast.Try, ast.ExceptHandler] | None:
    """The last try of ``function`` (not of a function nested in it) before ``before_line``
    with an ``except`` that returns: the way a rank whose step raised leaves the function
    (`except RuntimeError: log.warning(...); return None`) and skips every collective after
    the try. The try's body must not hold ``before_line``: a call inside it is skipped by
    any handler, which swallowing_try reads."""
    found: tuple[ast.Try, ast.ExceptHandler] | None = None
    for node in _own_nodes(function):
        if not isinstance(node, ast.Try) or node.lineno >= before_line:
            continue
        if any(contains(statement, before_line) for statement in node.body):
            continue
        for handler in node.handlers:
            if any(isinstance(n, ast.Return) for n in _own_nodes(handler)) and (
                found is None or node.lineno > found[0].lineno
            ):
                found = (node, handler)
                break
    return found


def _own_nodes(scope: ast.AST) -> Iterator[ast.AST]:
    """``scope`` and the nodes below it, not entering the functions, lambdas and classes it
    defines (their returns are not its own)."""
    pending = [scope]
    while pending:
        node = pending.pop()
        yield node
        for child in ast.iter_child_nodes(node):
            if not isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
                pending.append(child)


def where_a_flag_is_set(paths: list[str], test: str) -> list[tuple[str, int, Guard | None]]:
    """Where a test of a flag attribute (``if self.control.should_training_stop``, ``if not
    state.keep_going``) gets the value that makes it hold: each assignment of such a
    constant to an attribute of that name in ``paths`` (a callback's
    ``control.should_training_stop = True``), with the innermost ``if`` around it, the test
    that set it. Empty for a test of anything else."""
    try:
        expr = ast.parse(test, mode="eval").body
    except SyntaxError:
        return []
    passes_when = True  # the value that makes the test hold: `if not flag` holds on False
    while isinstance(expr, ast.UnaryOp) and isinstance(expr.op, ast.Not):
        expr, passes_when = expr.operand, not passes_when
    if not isinstance(expr, ast.Attribute):
        return []
    found: list[tuple[str, int, Guard | None]] = []
    for path in dict.fromkeys(paths):
        tree = parse(path)
        for node in ast.walk(tree) if tree is not None else []:
            if not (isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant)):
                continue
            if bool(node.value.value) is not passes_when:
                continue  # a reset to the other value (`should_training_stop = False` each step)
            if any(isinstance(t, ast.Attribute) and t.attr == expr.attr for t in node.targets):
                around = next(
                    (
                        n
                        for n in reversed(enclosing_chain(path, node.lineno))
                        if isinstance(n, ast.If) and any(contains(b, node.lineno) for b in n.body)
                    ),
                    None,
                )
                guard = (
                    Guard(condition_kind(path, around.test), around.lineno, ast.unparse(around.test))
                    if around is not None
                    else None
                )
                found.append((path, node.lineno, guard))
    return found


def loop_targets(loop: ast.stmt) -> list[str]:
    """The names a for loop binds on each pass (``for step, (x, y) in ...``)."""
    if not isinstance(loop, (ast.For, ast.AsyncFor)):
        return []
    return [n.id for n in ast.walk(loop.target) if isinstance(n, ast.Name)]


def callee_name(call: ast.Call) -> str:
    func = call.func
    return func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""


def calls_on_line(path: str, line: int) -> list[ast.Call]:
    chain = enclosing_chain(path, line)
    if not chain:
        return []
    return [
        n
        for n in ast.walk(chain[-1])
        if isinstance(n, ast.Call) and n.lineno <= line <= (n.end_lineno or n.lineno)
    ]


def group_argument(path: str, line: int, op: str) -> ast.expr | None:
    """The ``group=`` expression of the call to ``op`` at ``line``; None when the call
    passes none (the default group)."""
    for call in calls_on_line(path, line):
        if callee_name(call) == op:
            for keyword in call.keywords:
                if keyword.arg == "group":
                    return keyword.value
    return None


def where_the_sentinel_comes_from(path: str, guard: Guard) -> Guard | None:
    """For a test on a function's sentinel (``if loss is None: continue`` after ``loss =
    runner.training_step(batch)``), the test inside that function (of this file) under which
    it returns None (``if not batch_is_finite(batch): return None``): the decision the
    caller's test only passes on."""
    try:
        test = ast.parse(guard.text, mode="eval").body
    except SyntaxError:
        return None
    name = None
    if isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.Is):
        if isinstance(test.left, ast.Name) and isinstance(test.comparators[0], ast.Constant):
            name = test.left.id if test.comparators[0].value is None else None
    elif (
        isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not) and isinstance(test.operand, ast.Name)
    ):
        name = test.operand.id
    function = enclosing_function(path, guard.decided_at)
    tree = parse(path)
    if name is None or function is None or tree is None:
        return None
    assigned = [
        node.value
        for node in ast.walk(function)
        if isinstance(node, ast.Assign)
        and node.lineno < guard.decided_at
        and any(isinstance(t, ast.Name) and t.id == name for t in node.targets)
        and isinstance(node.value, ast.Call)
    ]
    if not assigned:
        return None
    called = callee_name(assigned[-1])
    functions = {n.name: n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    target = functions.get(called)
    # a decorator of the file's on it (`@requires_supervision`): its wrapper returns the
    # sentinel before calling the function, and is where the decision is
    decorators = [
        inner
        for d in (target.decorator_list if target is not None else [])
        if (name := callee_name(d) if isinstance(d, ast.Call) else ast.unparse(d)) in functions
        for inner in ast.walk(functions[name])
        if isinstance(inner, (ast.FunctionDef, ast.AsyncFunctionDef))
    ]
    for helper in [*decorators, *([target] if target is not None else [])]:
        nones = {
            node.lineno
            for node in ast.walk(helper)
            if isinstance(node, ast.Return) and (node.value is None or _is_none(node.value))
        }
        for inner in conditional_exits(path, helper):
            if inner.statement != "return" or inner.line not in nones:
                continue
            kind = inner.kind if inner.kind != OTHER else _kind_through_helpers(tree, inner.text)
            if kind in (RANK, DATA):
                return Guard(kind, inner.line, inner.text, inner.statement, inner.test_line)
    return None


def _kind_through_helpers(tree: ast.Module, text: str) -> str:
    """The kind of a test that calls a function of the file (``not batch_is_finite(batch)``):
    DATA where each such function returns a test of a tensor's value (``return
    bool(torch.isfinite(x).all())``), one level down."""
    try:
        test = ast.parse(text, mode="eval").body
    except SyntaxError:
        return OTHER
    called = {callee_name(n) for n in ast.walk(test) if isinstance(n, ast.Call)}
    helpers = [
        n
        for n in ast.walk(tree)
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name in called
    ]
    for helper in helpers:
        returned = [n.value for n in ast.walk(helper) if isinstance(n, ast.Return) and n.value is not None]
        if returned and all(kind_of(value, set()) == DATA for value in returned):
            return DATA
    return OTHER


def _is_none(value: ast.expr) -> bool:
    return isinstance(value, ast.Constant) and value.value is None
