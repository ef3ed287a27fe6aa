"""Where a loop's loader was built: the ``DataLoader(...)`` call behind ``for batch in
loader``, its sampler, and whether its dataset was sharded by rank by hand (doctor's
loop rules: missing-distributed-sampler or uneven-eval-batches)."""

from __future__ import annotations

import ast
from dataclasses import dataclass

from ncclcheck.source.reading import callee_name, calls_on_line, enclosing_function, parse, rank_derived_names


@dataclass(frozen=True)
class LoaderOrigin:
    """Where the loader a loop iterates was built, as far as the source tells."""

    name: str  # the variable that holds it where it was built
    file: str
    line: int
    sampler: str | None  # the sampler= expression's source, None when there is none
    rank_sharded: bool  # built from a rank-dependent dataset (a hand-made shard)


def loader_origin(frames: list[tuple[str, int]], loop: ast.stmt) -> LoaderOrigin | None:
    """Follow the iterable of ``loop`` (in the innermost of ``frames``, outermost first)
    back to the ``DataLoader(...)`` call that built it: through ``enumerate(x)`` or
    ``tqdm(x)``, and from a parameter to the argument its caller passed."""
    if not isinstance(loop, (ast.For, ast.AsyncFor)) or not frames:
        return None
    iterable = loop.iter
    while isinstance(iterable, ast.Call) and iterable.args:  # enumerate(loader), tqdm(loader)
        iterable = iterable.args[0]
    if not isinstance(iterable, ast.Name):
        return None
    name = iterable.id
    for depth in range(len(frames) - 1, -1, -1):
        path, line = frames[depth]
        function = enclosing_function(path, line)
        scope: ast.AST | None = function if function is not None else parse(path)
        if scope is None:
            return None
        built = []
        for node in ast.walk(scope):
            if (
                isinstance(node, ast.Assign)
                and isinstance(node.value, ast.Call)
                and callee_name(node.value) == "DataLoader"
                and any(isinstance(t, ast.Name) and t.id == name for t in node.targets)
            ):
                sampler = next(
                    (k.value for k in node.value.keywords if k.arg in ("sampler", "batch_sampler")), None
                )
                built.append(
                    LoaderOrigin(
                        name=name,
                        file=path,
                        line=node.lineno,
                        sampler=ast.unparse(sampler) if sampler is not None else None,
                        rank_sharded=name in rank_derived_names(scope),
                    )
                )
        if built:
            # built on two paths (`if distributed: ... sampler=... else: ...`): the loop ran
            # a different number of times per rank, which a loader without a sampler explains
            return min(built, key=lambda origin: (origin.sampler is not None, origin.line))
        # not built here: a parameter? then follow the argument its caller passed
        if function is None or depth == 0:
            return None
        params = [a.arg for a in (*function.args.posonlyargs, *function.args.args)]
        caller_path, caller_line = frames[depth - 1]
        argument: ast.expr | None = None
        for call in calls_on_line(caller_path, caller_line):
            if callee_name(call) != function.name:
                continue
            argument = next((k.value for k in call.keywords if k.arg == name), None)
            if argument is None and name in params:
                index = params.index(name) - (1 if params and params[0] in ("self", "cls") else 0)
                if 0 <= index < len(call.args):
                    argument = call.args[index]
        if not isinstance(argument, ast.Name):
            return None
        name = argument.id
    return None


# the calls of a training step: gradients (and, under DDP/FSDP/DeepSpeed, their reduction)
_TRAINING_CALLS = frozenset({"backward", "manual_backward"})


def trains(loop: ast.stmt) -> bool:
    """Whether ``loop``'s own body runs a backward pass (``loss.backward()``,
    ``accelerator.backward(loss)``, Lightning's ``self.manual_backward(loss)``): a training
    loop, whose per-rank length is a sampler's business, not evaluation's."""
    return any(isinstance(node, ast.Call) and callee_name(node) in _TRAINING_CALLS for node in ast.walk(loop))
