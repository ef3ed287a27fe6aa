"""Eval DataLoaders without a DistributedSampler in a distributed script."""

from __future__ import annotations

import ast

from ncclcheck.causes import Cause

# Point-to-point calls (send/recv, batch_isend_irecv) are rank-dependent by design: each
# side's branch is paired with the other's, so lint leaves them out.
from ncclcheck.lint.findings import ParsedModule, ProjectIndex, lint_finding, relative_path
from ncclcheck.lint.tables import EVAL_NAMES
from ncclcheck.model import Finding
from ncclcheck.source.reading import (
    RANK,
    kind_of,
)


def eval_loaders_without_sampler(linter: ProjectIndex, module: ParsedModule) -> list[Finding]:
    """Eval DataLoaders without a DistributedSampler in a distributed script."""
    distributed = bool(module.dist_aliases or module.dist_functions) or "accelerate" in module.libraries
    if not distributed or module.libraries & {"lightning", "pytorch_lightning"}:
        return []  # Lightning inserts the DistributedSampler itself
    prepared = {
        ast.unparse(arg)
        for call in module.all_nodes
        if isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) and call.func.attr == "prepare"
        for arg in call.args
    }
    consumed = _iterated_or_passed(module, linter)
    found = []
    for node in module.all_nodes:
        if not (isinstance(node, ast.Assign) and isinstance(node.value, ast.Call)):
            continue
        call = node.value
        callee = call.func.attr if isinstance(call.func, ast.Attribute) else getattr(call.func, "id", "")
        if callee != "DataLoader" or any(k.arg in ("sampler", "batch_sampler") for k in call.keywords):
            continue
        names = [ast.unparse(t) for t in node.targets]
        if not any(EVAL_NAMES.search(n.split(".")[-1]) for n in names) or set(names) & prepared:
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
            if iterate is None or not linter.mentions_rank(iterate):
                continue
            message = (
                f"eval loader {names[0]} reads {stream.name}, an IterableDataset whose "
                f"__iter__ splits the stream by rank (line {iterate.lineno}): streams of "
                f"unequal length give unequal batch counts; make every rank yield as many"
            )
        else:
            scope_derived = linter.derived_names(module.tree) | {
                name
                for node in module.all_nodes
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and linter.mentions_rank(node)
                for name in linter.derived_names(node)
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
            lint_finding(
                cause, "warning", relative_path(module.path), node.lineno, node.col_offset + 1, message
            )
        )
    return found


def _iterable_dataset_class(module: ParsedModule, dataset: ast.expr) -> ast.ClassDef | None:
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


def _iterated_or_passed(module: ParsedModule, linter: ProjectIndex) -> set[str]:
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
