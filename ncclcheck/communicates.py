"""What communicates: the one table of the calls that make the ranks wait for each other.

The recorder wraps the torch ops named here, lint flags the library calls named
here, doctor reads a stack against the frames named here, and the diagnosis names
a collective by the library code that issued it from here. A call that learns to
communicate (a new torch op, a framework's method) is added once, here.

Pure data and two look-ups: this module is imported inside every rank of a dry
run, before the user's script, so it imports nothing but the standard library.
"""

from __future__ import annotations

from dataclasses import dataclass

# -- torch.distributed ----------------------------------------------------------------

# Every public collective and p2p operation of torch.distributed that a user or
# a library calls through the module. Object collectives call tensor
# collectives inside; those inner calls are not recorded twice (see _Depth).
COLLECTIVES = (
    "all_reduce",
    "all_gather",
    "all_gather_into_tensor",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "all_to_all",
    "all_to_all_single",
    "broadcast",
    "reduce",
    "gather",
    "scatter",
    "barrier",
    "monitored_barrier",
    "all_gather_object",
    "broadcast_object_list",
    "gather_object",
    "scatter_object_list",
    "all_gather_single",  # FSDP2's parameter all-gather (torch >= 2.12)
    "reduce_scatter_single",  # FSDP2's gradient reduce-scatter
    "all_gather_coalesced",
    "all_reduce_coalesced",
    "_broadcast_coalesced",  # DDP's parameter and buffer broadcasts
)
P2P = ("send", "recv", "isend", "irecv", "batch_isend_irecv", "send_object_list", "recv_object_list")

# The sequence group creations are aligned in: every rank of the job enters new_group.
GROUP_CREATION = "new_group"

# torch.distributed._functional_collectives: what DTensor (full_tensor(), redistribute,
# tensor parallelism) and compiled code communicate with, outside torch.distributed's
# module-level functions. Each returns at once with a tensor that waits when used.
FUNCTIONAL_COLLECTIVES = (
    "broadcast",
    "all_reduce",
    "all_gather_single",
    "all_gather_single_autograd",
    "all_gather_tensor",
    "all_gather_tensor_autograd",
    "reduce_scatter_single",
    "reduce_scatter_single_autograd",
    "reduce_scatter_tensor",
    "reduce_scatter_tensor_autograd",
    "all_reduce_coalesced",
    "all_gather_single_coalesced",
    "all_gather_into_tensor_coalesced",
    "reduce_scatter_single_coalesced",
    "reduce_scatter_tensor_coalesced",
    "all_to_all_single",
    "all_to_all_single_autograd",
    "permute_tensor",
)

# -- library calls a user writes that communicate (lint) ------------------------------

# accelerate's Accelerator methods that communicate (docs/causes.md)
ACCELERATE_METHODS = frozenset(
    {"gather", "gather_for_metrics", "reduce", "pad_across_processes", "wait_for_everyone"}
)
# save_state waits for every rank only with automatic checkpoint naming, and saves
# collectively under FSDP or DeepSpeed (huggingface/accelerate#1171): under plain DDP
# rank 0 alone may call it, so lint warns rather than errs
ACCELERATE_SAVE_STATE = (
    "save_state() (it waits for every rank with automatic checkpoint naming, and saves "
    "collectively under FSDP or DeepSpeed)"
)
ZERO_CONSOLIDATE = "(ZeroRedundancyOptimizer broadcasts every rank's shard)"
# a model whose parameters FSDP (FSDP(...), fully_shard) or ZeRO-3 shard: its forward
# all-gathers them from every rank
SHARDED_FORWARD = "forward of a sharded model (FSDP or ZeRO-3 all-gathers its parameters from every rank)"
# torch.distributed.checkpoint's entry points: each plans the save or load across the
# ranks with collectives (unless no_dist=True)
DCP_MODULE = "torch.distributed.checkpoint"
DCP_FUNCTIONS = frozenset({"save", "load", "async_save", "save_state_dict", "load_state_dict"})
# its state_dict helpers, which gather sharded (FSDP, DTensor) state: "call on every rank"
STATE_DICT_MODULE = "torch.distributed.checkpoint.state_dict"
STATE_DICT_FUNCTIONS = frozenset(
    {
        "get_model_state_dict",
        "get_optimizer_state_dict",
        "get_state_dict",
        "set_model_state_dict",
        "set_optimizer_state_dict",
        "set_state_dict",
    }
)
# Lightning's Strategy (trainer.strategy) and Fabric methods that communicate, besides barrier
LIGHTNING_COLLECTIVES = frozenset(
    {"broadcast", "reduce", "reduce_boolean_decision", "all_gather", "all_reduce"}
)


# Methods whose name alone says nothing, on an object whose variable's name holds the
# word (fabric, accelerator, model_engine): what each does across the ranks.
RECEIVER_METHODS = {
    ("fabric", "barrier"): "Fabric waits for every rank",
    ("fabric", "save"): "Fabric waits for every rank in it and saves collectively under FSDP or DeepSpeed",
    ("fabric", "backward"): "under DDP, FSDP or DeepSpeed the gradients are reduced across the ranks",
    ("accelerator", "backward"): "the prepared model's gradients are reduced across the ranks",
    ("engine", "backward"): "DeepSpeed reduces the gradients across the ranks",
}


# -- library code that issues a collective the user never wrote (diagnosis, doctor) ---

# Collectives a user never wrote, named for what issued them.
# DDP broadcasts rank 0's parameters when it is built and its buffers (BatchNorm's
# running stats) at every forward() with broadcast_buffers=True, in eval too.
OP_ORIGINS = {
    "_broadcast_coalesced": "DDP's broadcast of parameters and buffers from rank 0",
    "new_group": "a process group's creation, which every rank enters, members or not",
}
# Collectives libraries issue for the model's parameters, as NCCL and DETAIL's check name
# their ops: ZeRO-3's and FSDP's parameter all-gathers and gradient reduce-scatters (flat
# buffers of the modules a forward or backward runs). Other sizes of one of these on two
# ranks at one number: the ranks ran other modules (diagnosis of the sizes, doctor).
PARAMETER_OPS = frozenset(
    {
        "_ALLGATHER_BASE",
        "ALLGATHER_COALESCED",
        "ALLGATHER_INTO_TENSOR_COALESCED",
        "_REDUCE_SCATTER_BASE",
        "REDUCE_SCATTER_TENSOR_COALESCED",
    }
)
# The library modules that gather a sharded model's parameters (and reduce its gradients)
# module by module, FSDP 1 and 2 and ZeRO-3, as an issuer ("module:function") begins: two
# ranks in two such calls at one line of the user's (a backward) ran other modules.
PARAMETER_SHARDING_MODULES = (
    "torch.distributed.fsdp.",
    "deepspeed.runtime.zero.partition_parameters",
    "deepspeed.runtime.zero.parameter_offload",
    "deepspeed.runtime.zero.partitioned_param_coordinator",
    "deepspeed.runtime.zero.stage3",
)
# An all-reduce of a flat tensor this large is a gradient bucket (DDP's are 25 MiB, its first
# 1 MiB; ZeRO-1/2 reduce in buckets of millions of elements), not a metric a user reduces.
GRADIENT_BUCKET_MIN_NUMEL = 1_000_000
# What to do about a call the user wrote, by op, where the op itself is the surprise.
OP_ADVICE = {
    "new_group": (
        "create every group on every rank, in the same order, and test membership only where "
        "it is used: `eval_group = dist.new_group([0, 1])` before the `if`, then "
        "`if rank in eval_ranks: dist.all_reduce(x, group=eval_group)` (non-members get "
        "GroupMember.NON_GROUP_MEMBER). Groups are named by a count of new_group calls: a "
        "rank that skipped one names every later group differently and waits for peers that "
        "never come (with TORCH_DIST_INIT_BARRIER=1 it waits in new_group itself)"
    ),
}


# Library code that issues collectives inside a call that looks local, keyed by module
# and function name (Python 3.10 records no class name): what it is, and what to do.
_SYNCBN_ADVICE = (
    "SyncBatchNorm synchronises its statistics across the ranks in training mode only: "
    "call model.eval() before a forward that not every rank runs, or let every rank run it"
)
_ZERO_ADVICE = (
    "ZeRO-3 gathers each module's parameters with a collective in every forward and backward: "
    "every rank must run the same forwards and backwards. A rank that would skip a batch (a bad "
    "sample, a NaN loss) runs it on a dummy batch with the loss zeroed instead; generate() under "
    "ZeRO-3 needs synced_gpus=True; a forward under a rank test (rank-0 evaluation) runs on every rank"
)
_FSDP_ADVICE = (
    "FSDP all-gathers each unit's parameters in forward and backward: every rank must run the "
    "same forwards and backwards. A rank that would skip a batch runs it on a dummy batch with the "
    "loss zeroed; evaluation, generation or a state_dict under a rank test run on every rank"
)
# Library layers between the issuer and torch.distributed, passed through when naming it.
COMM_LAYERS = ("torch/distributed/", "deepspeed/comm/")

# The collectives a library issues as a loader's pass begins: a rank waiting in one has
# run out of its batches of the pass before, while ranks in another collective at the same
# position are still stepping through theirs.
_PASS_START = ("accelerate.utils.random", "synchronize_rng_state")
PASS_STARTS = frozenset({_PASS_START})

ISSUERS = {
    # PyTorch's SyncBatchNorm, and preflight --cpu's stand-in for it (record/cpu_syncbn.py)
    **{
        (module, function): (what, _SYNCBN_ADVICE)
        for module in ("torch.nn.modules._functions", "ncclcheck.record.cpu_syncbn")
        for function, what in (
            ("forward", "SyncBatchNorm's batch statistics, in training mode"),
            ("backward", "SyncBatchNorm's gradient statistics"),
        )
    },
    # torch.distributed.checkpoint plans every save and load across the ranks: its
    # _DistWrapper issues them all (gather_object, scatter_object, all_reduce, ...)
    ("torch.distributed.checkpoint.utils", "*"): (
        "torch.distributed.checkpoint coordinating a save or load across the ranks",
        "torch.distributed.checkpoint's save() and load() are collective: call them on every "
        "rank (each writes or reads its own shards); for a file rank 0 alone writes, use "
        "torch.save(model.state_dict()) under the rank test",
    ),
    # DTensor (FSDP2's parameters, tensor parallelism) gathers or redistributes shards
    # through functional collectives: full_tensor(), a full state_dict, redistribute()
    **{
        (module, "*"): (
            "DTensor gathering or redistributing its shards, in full_tensor() or redistribute()",
            "a DTensor's full_tensor() and redistribute() communicate: call them on every rank "
            "and keep only torch.save or the printing under the rank test (or gather the state "
            "with get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, "
            "cpu_offload=True)) on every rank: rank 0 receives the full tensors)",
        )
        for module in (
            "torch.distributed.tensor.placement_types",
            "torch.distributed.tensor._collective_utils",
            "torch.distributed.tensor._redistribute",
        )
    },
    # accelerate's barrier: the user's own wait_for_everyone(), or the one inside
    # save_state() with automatic checkpoint naming (huggingface/accelerate#1171)
    ("accelerate.state", "wait_for_everyone"): (
        "accelerate's wait_for_everyone",
        "accelerate waits for every process in wait_for_everyone() and inside save_state() "
        "with automatic checkpoint naming (under FSDP or DeepSpeed, save_state(), save_model() "
        "and get_state_dict() gather the state as well): call them on every process, and keep "
        "only your own file writes under accelerator.is_main_process",
    ),
    # Lightning's strategy barrier: inside trainer.save_checkpoint() (before and after the
    # write, which global zero alone does), or the user's own strategy.barrier()
    **{
        (f"{package}.strategies.{strategy}", "barrier"): (
            "Lightning's strategy barrier",
            "Lightning's trainer.save_checkpoint() waits for every rank (and gathers sharded "
            "state under FSDP or DeepSpeed) and writes the file on global zero alone: call it "
            "on every rank, without the is_global_zero test",
        )
        for package in ("lightning.pytorch", "pytorch_lightning")
        for strategy in ("ddp", "fsdp", "deepspeed", "model_parallel")
    },
    # ZeroRedundancyOptimizer.consolidate_state_dict() broadcasts every rank's shard of
    # the optimizer state, each rank in turn: called where only the checkpoint is written
    ("torch.distributed.optim.zero_redundancy_optimizer", "_broadcast_object"): (
        "ZeroRedundancyOptimizer gathering its state shards, in consolidate_state_dict()",
        "ZeroRedundancyOptimizer.consolidate_state_dict(to=0) broadcasts every rank's shard: "
        "call it on every rank, then save optimizer.state_dict() on rank 0 alone",
    ),
    # DeepSpeed ZeRO: stage 3 gathers each module's parameters in its forward and backward
    # (pre-forward hooks, on the autograd engine's threads in backward) and reduce-scatters
    # the gradients; stages 1 and 2 reduce the gradients from backward hooks
    # before deepspeed 0.5 stage3.py held forward's parameter gathers too: named before its "*"
    **{
        ("deepspeed.runtime.zero.stage3", function): (
            "DeepSpeed ZeRO-3 gathering a module's parameters (forward hook)",
            _ZERO_ADVICE,
        )
        for function in ("fetch_sub_module", "pre_sub_module_forward_function", "_synchronize_communication")
    },
    **{
        (f"deepspeed.runtime.zero.{module}", "*"): (what, _ZERO_ADVICE)
        for module, what in (
            ("partition_parameters", "DeepSpeed ZeRO-3 gathering a module's parameters"),
            ("parameter_offload", "DeepSpeed ZeRO-3 gathering a module's parameters (forward hook)"),
            ("partitioned_param_coordinator", "DeepSpeed ZeRO-3 prefetching parameters"),
            ("stage3", "DeepSpeed ZeRO-3 reducing gradients in backward"),
            ("stage_1_and_2", "DeepSpeed ZeRO-1/2 reducing gradients in backward"),
        )
    },
    # FSDP (1: the flat parameter's unshard and reduce-scatter; 2: fully_shard's param groups)
    **{
        (f"torch.distributed.fsdp.{module}", "*"): (what, _FSDP_ADVICE)
        for module, what in (
            ("_runtime_utils", "FSDP unsharding parameters or reducing gradients"),
            ("_flat_param", "FSDP unsharding a flat parameter"),
            ("_fully_shard._fsdp_collectives", "FSDP2 (fully_shard) gathering or reducing a parameter group"),
            ("_fully_shard._fsdp_param_group", "FSDP2 (fully_shard) gathering or reducing a parameter group"),
        )
    },
    # Megatron's pipeline: each stage sends activations to the next and receives gradients
    ("megatron.core.pipeline_parallel.p2p_communication", "*"): (
        "Megatron's pipeline send/recv between stages",
        "every pipeline stage must run the same number of microbatches in the same order: the "
        "same num_microbatches (global batch / micro batch / data-parallel size) on every rank, "
        "and no stage that skips a batch or leaves the loop early on its own data",
    ),
    # the transformers Trainer gathers predictions and labels at every eval step (through
    # accelerate): a process with fewer eval batches leaves the others waiting. The
    # playbooks give both libraries' fixes in their own terms (fix.frameworks): no advice here
    **{
        (module, function): ("the transformers Trainer gathering eval predictions across processes", "")
        for module, function in (
            ("transformers.trainer", "_nested_gather"),
            ("transformers.trainer", "gather_function"),
            ("transformers.trainer_pt_utils", "*"),
        )
    },
    ("accelerate.utils.operations", "*"): ("accelerate gathering or padding tensors across processes", ""),
    # accelerate's prepared DataLoader broadcasts the main process's RNG state each time its
    # iterator starts (rng_types): a new epoch, a new evaluation pass
    _PASS_START: (
        "accelerate synchronising the RNG state as a prepared DataLoader starts a new pass "
        "(an epoch or an evaluation)",
        "a prepared DataLoader broadcasts the RNG state as each pass begins, so every rank must "
        "run the same number of batches per pass: a rank that starts the next pass while the "
        "others still step had fewer batches (a dataset split unevenly by hand, even_batches=False, "
        "a `break` or `continue` of its own). Shard with a DistributedSampler (drop_last=True for "
        "training) or accelerate's prepare(), and leave the loop on every rank at once",
    ),
    # the playbooks give torchmetrics' fix in its own terms (fix.frameworks): no advice here
    ("torchmetrics.utilities.distributed", "gather_all_tensors"): (
        "torchmetrics' gather of every rank's metric state, in compute()",
        "",
    ),
}

# -- what a rank's stack shows while it waits (doctor, preflight's watchdog) ----------

# the torch.distributed functions a rank can wait in (what the recorder wraps)
# Group creation waits on peers too: every rank enters new_group, members or not.
WAITABLE_OPS = frozenset(COLLECTIVES) | frozenset(P2P) | {"new_group", "new_subgroups", "split_group"}
# DDP's own broadcasts: the C++ _broadcast_coalesced shows no Python frame, the
# method that calls it does. (file fragment, function) -> what the rank waits in.
DDP_BROADCASTS = {
    ("torch/nn/parallel/distributed.py", "_distributed_broadcast_coalesced"): (
        "_broadcast_coalesced (DDP's broadcast of buffers from rank 0, in forward())"
    ),
    ("torch/distributed/utils.py", "_sync_params_and_buffers"): (
        "_broadcast_coalesced (DDP's broadcast of parameters from rank 0, as it is built)"
    ),
}
# DDP's native calls that communicate, seen as the Python method that makes them when that
# method is the innermost frame: in forward() after the first backward, the reducer
# broadcasts the order of its rebuilt gradient buckets from rank 0 (_rebuild_buckets), the
# one call of _pre_forward's own that waits on peers.
DDP_NATIVE_WAITS = {
    ("torch/nn/parallel/distributed.py", "_pre_forward"): (
        "broadcast (DDP's rebuilt gradient buckets, from rank 0, in the forward after the first backward)"
    ),
}


# -- where a rank waits for its GPU (doctor; the NCCL timing emulation) -------------

# NCCL collectives are asynchronous: a rank whose collective has no partner runs on
# and blocks at the next point where the host waits for the device. Tensor methods
# that read a value on the host, by name:
DEVICE_SYNC_METHODS = {
    "item": ".item()",
    "tolist": ".tolist()",
    "cpu": ".cpu()",
    "numpy": ".numpy()",
}
# library functions whose own line reads a value on the host, by file and function, with
# the read: a stack whose innermost Python frame is one of them waits for the device there
# (py-spy shows no frame for the C++ .item()). GradScaler.step reads the found-inf flags
# (`sum(v.item() for v in found_inf_per_device.values())`) in _maybe_opt_step.
LIBRARY_SYNC_FRAMES = {
    ("torch/cuda/amp/grad_scaler.py", "_maybe_opt_step"): "GradScaler's found_inf .item()",
    ("torch/amp/grad_scaler.py", "_maybe_opt_step"): "GradScaler's found_inf .item()",
}
# builtins that read a tensor's value (float(loss), print(loss)), and the dunder
# method each calls on the tensor
DEVICE_SYNC_BUILTINS = {
    "float": "__float__",
    "int": "__int__",
    "bool": "__bool__",
    "print": "__repr__",
    "format": "__format__",
}
# torch.cuda.synchronize(), stream.synchronize(), event.synchronize()
DEVICE_SYNC_CALL = "synchronize"
# native frames (py-spy --native) of a host thread waiting for the device or inside NCCL
NATIVE_DEVICE_WAITS = (
    "_local_scalar_dense",  # what .item() runs on a CUDA tensor: a copy to the host
    "cudaStreamSynchronize",
    "cudaDeviceSynchronize",
    "cudaEventSynchronize",
    "cuStreamSynchronize",
    "cuCtxSynchronize",
    "cuEventSynchronize",
    "cudaMemcpy",
    "cuMemcpy",
    "WorkNCCL::synchronize",
    "WorkNCCL::wait",
    "ncclGroupEnd",
    "ncclAllReduce",
    "ncclAllGather",
    "ncclReduceScatter",
    "ncclBroadcast",
    "ncclSend",
    "ncclRecv",
)
# backward() enqueues the gradient collectives of DDP's buckets (and FSDP's
# reduce-scatter, ZeRO's reduce) from autograd hooks
BACKWARD_COLLECTIVE = "the gradient all_reduce that backward() enqueues (DDP's buckets)"


@dataclass(frozen=True)
class DeferredFrame:
    """Framework code that runs a collective for a call the user made earlier, so the
    user's frames on the stack (``trainer.fit``) do not show which call it was."""

    file: str  # a path fragment of the framework's frame
    function: str
    what: str  # said in the evidence
    library: str  # for the playbook's fix in that framework's terms
    marker: str  # the label lint gives the user's call that asked for it contains this


DEFERRED_FRAMES = (
    DeferredFrame(
        "logger_connector/result.py",
        "compute",
        "Lightning's epoch-end reduction of the values logged with self.log(..., sync_dist=True)",
        "lightning",
        "sync_dist=True",
    ),
)


@dataclass(frozen=True)
class StepHook:
    """A method a framework calls every step and communicates with what it returns: a rank
    on which it returns no value skips that collective while the others make it."""

    method: str
    base: str  # the method's class derives from a class of this name
    # the attribute which, set to False in the class, hands backward to the user's code
    manual_switch: str
    what: str  # the collective, said in lint's finding


STEP_HOOKS = (
    StepHook(
        "training_step",
        "LightningModule",
        "automatic_optimization",
        "Lightning's backward of the loss training_step returns (DDP's gradient all-reduce; "
        "under DDP, Lightning raises on a rank whose training_step returns None)",
    ),
)

# ncclcheck's own wrappers around a collective (the recorder's, the watchdog's); the
# recorder's DataLoader wrapper is not one: a rank stuck in its data is not in a collective.
OWN_WRAPPERS = {
    "ncclcheck/record/recorder.py": ("recorded", "ddp_hook"),
    "ncclcheck/runtime/watchdog.py": ("watched", "tracked"),
}


def issuer_of(module: str, function: str) -> tuple[str, str] | None:
    """(what issued it, what to do) for library code by module and function name."""
    return ISSUERS.get((module, function.rpartition(".")[2])) or ISSUERS.get((module, "*"))


def shards_parameters(issuer: str | None, op: str) -> bool:
    """Whether the library code that gathers a sharded model's parameters issued a
    collective (PARAMETER_SHARDING_MODULES): by its issuer ("module:function", a recorded
    call), or by that issuer's name in the op a stack dump's class gives
    (`all_gather_single (FSDP2 (fully_shard) gathering or reducing a parameter group)`)."""
    if issuer:
        return issuer.startswith(PARAMETER_SHARDING_MODULES)
    return any(
        f"({what})" in op
        for (module, _), (what, _) in ISSUERS.items()
        if module.startswith(PARAMETER_SHARDING_MODULES)
    )


def issued_at(file: str, function: str) -> tuple[str, str] | None:
    """The same, for a frame of a stack dump (a path; py-spy's "Class.method" name)."""
    key = _issuer_key(file, function)
    return ISSUERS[key] if key is not None else None


def starts_a_pass(file: str, function: str) -> bool:
    """Whether this frame is a library's collective as a loader's pass begins (PASS_STARTS)."""
    return _issuer_key(file, function) in PASS_STARTS


def _issuer_key(file: str, function: str) -> tuple[str, str] | None:
    path = file.replace("\\", "/")
    for module, name in ISSUERS:
        if path.endswith(module.replace(".", "/") + ".py") and name in ("*", function.rpartition(".")[2]):
            return module, name
    return None
