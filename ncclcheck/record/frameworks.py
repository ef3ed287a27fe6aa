"""What the recorder needs to know about training frameworks (Lightning, transformers).

1. The dry-run budget in the framework's own terms. Lightning decides when to
   validate from the length of the train loader: a pass the recorder cuts at
   ``--train-steps`` batches would end without the validation that a real epoch
   ends with. The Trainer is built with ``limit_train_batches`` (and an integer
   ``val_check_interval``) no larger than the budget instead, so Lightning runs a
   short epoch and then its validation; its sanity check does not count as the
   evaluation. The transformers Trainer's ``eval_steps`` is lowered to the budget
   likewise. Each change is written to the trace and shown in the report.

2. Collectives a framework runs later on the user's behalf, sited where the user
   asked for them. Lightning reduces a value logged with ``self.log(...,
   sync_dist=True)`` (or a torchmetrics Metric logged with ``self.log``) when the
   epoch ends, from deep inside ``trainer.fit``: the only user frame on the stack
   of that all_reduce is the ``trainer.fit(...)`` line, which says nothing about
   which ``self.log`` call, under which condition, made one rank reduce and not
   the other. The ``self.log`` call is remembered for the value's result object
   when it is logged, and while Lightning reduces that object the recorder sites
   the collectives at the ``self.log`` line (``Recorder.deferred``), with a note
   of when the reduction ran.

3. Which loader is which: the transformers Trainer draws its first train batch
   before it calls model.train(); its loaders are named and given their role by
   the Trainer method that made them (``Recorder.loader_hints``). Lightning makes
   its evaluation loop's iterator before it calls model.eval(): the stage the
   Trainer runs gives the role (``Recorder.framework_role``), so that the eval
   fast-forward's agreement, made as a pass starts, applies to Lightning's passes.

The frameworks are imported by the user's script after the recorder is
installed, so the patches are applied by an import hook the moment their modules
have loaded (or at once, if they already have).
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.machinery
import sys
import weakref
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

from ncclcheck.communicates import FUNCTIONAL_COLLECTIVES
from ncclcheck.frames import first_user_frame, user_frames
from ncclcheck.record.calls import DeferredOrigin
from ncclcheck.record.recorder import Recorder

# Lightning's modules, under the unified package and the standalone one.
LIGHTNING_PACKAGES = ("lightning.pytorch", "pytorch_lightning")
_LIGHTNING_RESULT = ".trainer.connectors.logger_connector.result"
_LIGHTNING_TRAINER = ".trainer.trainer"
UNLIMITED_STEPS = 1_000_000_000  # a budget this large is none


class _PatchAfterImport(importlib.abc.MetaPathFinder):
    """Runs ``patch(module)`` right after one of the named modules has been executed."""

    def __init__(self, patches: dict[str, Callable[[ModuleType], None]]) -> None:
        self._patches = patches

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        patch = self._patches.get(fullname)
        if patch is None:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        loader = spec.loader
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        original_exec = loader.exec_module

        def exec_module(module: ModuleType) -> None:
            original_exec(module)
            patch(module)

        # The loader object belongs to this one module's spec: patching it touches nothing else.
        loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def _patch_lightning_results(module: ModuleType, recorder: Recorder) -> None:
    collection = getattr(module, "_ResultCollection", None)
    result_metric = getattr(module, "_ResultMetric", None)
    if collection is None or result_metric is None or hasattr(collection, "_ncclcheck_patched"):
        return  # another Lightning layout: its collectives are still recorded, sited at trainer.fit
    original_update_metrics = collection.update_metrics
    original_compute = result_metric.compute
    origins: dict[tuple[Any, ...], DeferredOrigin] = {}  # one object per distinct origin: a stable id
    # Kept beside the result objects, not on them: Lightning walks their attributes
    # (apply_to_collection) and rejects a frozen dataclass among them. Keyed by id, as
    # a torchmetrics Metric hashes its changing state and overloads ==.
    origin_of: dict[int, tuple[weakref.ref[Any], DeferredOrigin]] = {}

    def update_metrics(self: Any, key: str, value: Any, batch_size: int) -> None:
        metric = self[key]
        known = origin_of.get(id(metric))
        if known is None or known[0]() is not metric:
            # The first self.log of this key: the user frames of the logging call.
            stack = tuple(reversed(user_frames(sys._getframe(1))))
            meta = metric.meta
            described = f"self.log({meta.name!r}" + (", sync_dist=True)" if meta.sync.should else ")")
            origin_key = (stack, described)
            origin = origins.get(origin_key)
            if origin is None:
                origin = origins[origin_key] = DeferredOrigin(
                    len(origins) + 1, [list(frame) for frame in stack], described, "Lightning"
                )
            metric_id = id(metric)
            origin_of[metric_id] = (weakref.ref(metric, lambda _: origin_of.pop(metric_id, None)), origin)
        original_update_metrics(self, key, value, batch_size)

    def compute(self: Any) -> Any:
        known = origin_of.get(id(self))
        if known is None or known[0]() is not self:
            return original_compute(self)
        origin = known[1]
        outer = recorder.deferred
        recorder.deferred = origin
        try:
            return original_compute(self)
        finally:
            recorder.deferred = outer

    collection.update_metrics = update_metrics
    result_metric.compute = compute
    collection._ncclcheck_patched = True


def _patch_lightning_trainer(module: ModuleType, recorder: Recorder) -> None:
    trainer_class = getattr(module, "Trainer", None)
    if trainer_class is None or hasattr(trainer_class, "_ncclcheck_patched"):
        return
    original_init = trainer_class.__init__
    budget = recorder.train_steps
    if budget >= UNLIMITED_STEPS:
        return  # no budget to apply (the pytest plugin runs a test to its end)

    def init(self: Any, *args: Any, **kwargs: Any) -> None:
        changes = []
        limit = kwargs.get("limit_train_batches")
        # a fraction (1.0 by default) or more batches than the budget: the budget
        if limit is None or isinstance(limit, float) or (isinstance(limit, int) and limit > budget):
            kwargs["limit_train_batches"] = budget
            changes.append(f"limit_train_batches={budget} (was {limit if limit is not None else 1.0})")
        interval = kwargs.get("val_check_interval")
        if isinstance(interval, int) and not isinstance(interval, bool) and interval > budget:
            kwargs["val_check_interval"] = budget  # else Lightning refuses the short epoch
            changes.append(f"val_check_interval={budget} (was {interval})")
        where = first_user_frame(sys._getframe(1))
        for change in changes:
            recorder.note_site("framework", f"Lightning Trainer {change}", where)
        original_init(self, *args, **kwargs)
        trainer = weakref.ref(self)
        # The sanity check validates a couple of batches before training: the dry run
        # still waits for a real validation, where `if not trainer.sanity_checking` code runs.
        recorder.counts_as_eval_pass = lambda: not getattr(trainer(), "sanity_checking", False)
        recorder.framework_role = lambda: _lightning_role(trainer())

    functools.update_wrapper(init, original_init)
    trainer_class.__init__ = init
    trainer_class._ncclcheck_patched = True


def _lightning_role(trainer: Any) -> str | None:
    """What the loop Lightning runs now iterates its loaders for. Its evaluation loop makes
    the loader's iterator before it calls model.eval(): without this, an eval pass would
    start as a train pass and miss --eval-batches' agreement, which is made as it starts."""
    stage = getattr(getattr(trainer, "state", None), "stage", None)
    stage = getattr(stage, "value", stage)
    return {"train": "train", "sanity_check": "eval", "validate": "eval", "test": "eval"}.get(str(stage))


def _patch_transformers_trainer(module: ModuleType, recorder: Recorder) -> None:
    """Name the Trainer's loaders and say what they are for: it draws the first train
    batch before it calls model.train(), while the model is still in eval mode. And
    evaluate within the budget: with eval_strategy="steps", an eval_steps larger than
    --train-steps is lowered to it, or the dry run would end before any evaluation."""
    trainer_class = getattr(module, "Trainer", None)
    if trainer_class is None or hasattr(trainer_class, "_ncclcheck_patched"):
        return
    original_init = trainer_class.__init__
    budget = recorder.train_steps

    def init(self: Any, *args: Any, **kwargs: Any) -> None:
        original_init(self, *args, **kwargs)
        training_args = getattr(self, "args", None)
        strategy = str(getattr(training_args, "eval_strategy", ""))
        steps = getattr(training_args, "eval_steps", None)
        if budget >= UNLIMITED_STEPS or not strategy.lower().endswith("steps"):
            return
        if isinstance(steps, int) and steps > budget:  # a float is a fraction of the run: kept
            try:
                training_args.eval_steps = budget  # type: ignore[union-attr]
            except (AttributeError, TypeError):  # arguments some version keeps frozen
                return
            where = first_user_frame(sys._getframe(1))
            recorder.note_site("framework", f"transformers Trainer eval_steps={budget} (was {steps})", where)

    functools.update_wrapper(init, original_init)
    trainer_class.__init__ = init
    for method, name, role in (
        ("get_train_dataloader", "train_dataloader", "train"),
        ("get_eval_dataloader", "eval_dataloader", "eval"),
        ("get_test_dataloader", "test_dataloader", "eval"),
    ):
        original = getattr(trainer_class, method, None)
        if original is None:
            continue

        def made(self: Any, *args: Any, _original: Any = original, _hint: Any = (name, role)) -> Any:
            loader = _original(self, *args)
            recorder.loader_hints[id(loader)] = _hint
            # accelerate's DataLoaderShard iterates the loader it wraps
            base = getattr(loader, "base_dataloader", None)
            if base is not None:
                recorder.loader_hints[id(base)] = _hint
            return loader

        functools.update_wrapper(made, original)
        setattr(trainer_class, method, made)
    trainer_class._ncclcheck_patched = True


def _patch_functional_collectives(module: ModuleType, recorder: Recorder) -> None:
    import torch.distributed.distributed_c10d as c10d

    resolve_name = getattr(module, "_resolve_group_name", None)
    # One ProcessGroup object per group name, kept: the recorder tells groups apart by
    # object id, and resolving a name may make a new Python object each time.
    pinned: dict[str, Any] = {}

    def process_group_of(group: Any) -> Any:
        """A device mesh, (mesh, dim), a group name or ranks -> the ProcessGroup, so that
        these calls count in the same sequence as torch.distributed's on that group."""
        if resolve_name is None:
            return group
        try:
            name = str(resolve_name(group))
            if name not in pinned:
                pinned[name] = c10d._resolve_process_group(name)
        except Exception:  # an argument the call itself will reject
            return group
        return pinned[name]

    for op in FUNCTIONAL_COLLECTIVES:
        original = getattr(module, op, None)
        if original is None or hasattr(original, "__ncclcheck_wrapped__"):
            continue
        wrapped = recorder.wrap_collective(
            op, original, process_group_of=process_group_of, source="functional"
        )
        setattr(module, op, wrapped)


def install(recorder: Recorder) -> None:
    """Lightning's dry-run budget and deferred reductions, the transformers Trainer's
    loaders, and torch's functional collectives (DTensor's), as each is imported."""
    wanted: list[tuple[str, Callable[[ModuleType, Recorder], None]]] = [
        ("transformers.trainer", _patch_transformers_trainer),
        ("torch.distributed._functional_collectives", _patch_functional_collectives),
    ]
    for package in LIGHTNING_PACKAGES:
        wanted.append((package + _LIGHTNING_RESULT, _patch_lightning_results))
        wanted.append((package + _LIGHTNING_TRAINER, _patch_lightning_trainer))
    patches: dict[str, Callable[[ModuleType], None]] = {}
    for name, patch in wanted:
        loaded = sys.modules.get(name)
        if loaded is not None:
            patch(loaded, recorder)
        else:
            patches[name] = lambda module, patch=patch: patch(module, recorder)  # type: ignore[misc]
    if patches:
        sys.meta_path.insert(0, _PatchAfterImport(patches))
