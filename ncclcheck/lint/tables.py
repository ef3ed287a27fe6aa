"""What lint itself knows beyond the shared table of what communicates (communicates.py):
where a collective takes its group, which names and calls hint at evaluation or at a
rank, the layers and ops whose sizes matter."""

from __future__ import annotations

import ast
import re

from ncclcheck.communicates import (
    COLLECTIVES,
    P2P,
)
from ncclcheck.source.reading import (
    RANK_CALLS,
    RANK_LOCAL_CALLS,
    RANK_NAMES,
)

# Point-to-point calls (send/recv, batch_isend_irecv) are rank-dependent by design: each
# side's branch is paired with the other's, so lint leaves them out.


# Point-to-point calls (send/recv, batch_isend_irecv) are rank-dependent by design: each
# side's branch is paired with the other's, so lint leaves them out.
DIST_OPS = frozenset(COLLECTIVES) - frozenset(P2P) | {"new_group"}


# Every rank of the job enters new_group, members or not: groups are named by a count of
# the calls (with use_local_synchronization=True only the members do, and it is not flagged)
NEW_GROUP = (
    "new_group (every rank enters it, members or not: groups are named by a count of "
    "new_group calls, so a rank that skips one names every later group differently)"
)


RANK_ZERO_DECORATORS = frozenset(
    {"rank_zero_only", "main_process_only", "on_main_process", "on_local_main_process"}
)


# conditions on values that differ between ranks by construction
UNSYNCED_CALLS = frozenset(RANK_LOCAL_CALLS)

# Python's numbers made of a tensor (`int(mask.sum())`, `float(loss.mean())`): what
# `.item()` gives, each rank its own, where the tensor is a reduction of its own values
NUMBER_OF = frozenset({"int", "float", "bool"})


EVAL_NAMES = re.compile(
    r"(^|_)(val|valid|validation|eval|evaluation|test|dev)(_|$|loader|set|data)", re.IGNORECASE
)


# the words that make a scope worth reading for rank tests (an environment read of a
# rank variable names none of the others)
RANK_WORDS = RANK_NAMES | RANK_CALLS | {"environ", "getenv"}


# where the group goes among a collective's positional arguments
GROUP_POSITION = {
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
ROOTED = frozenset({"reduce", "gather", "gather_object", "scatter", "scatter_object_list"})


# tests on a tensor's values: what differs between ranks that hold different data
TENSOR_VALUE_CALLS = frozenset({"isfinite", "isnan", "isinf", "item", "nonzero", "numel", "count_nonzero"})


IGNORE = re.compile(r"#\s*ncclcheck:\s*ignore(?:\[([a-z0-9\-, ]+)\])?")


# Layers that register no buffer: a DDP model made of these alone broadcasts nothing
# at forward(). (BatchNorm's running statistics are the buffers that matter.)
BUFFERLESS_LAYERS = frozenset(
    {
        "Linear", "Bilinear", "Conv1d", "Conv2d", "Conv3d", "ConvTranspose1d", "ConvTranspose2d",
        "Embedding", "LayerNorm", "GroupNorm", "RMSNorm", "Dropout", "Dropout1d", "Dropout2d",
        "ReLU", "GELU", "SiLU", "Tanh", "Sigmoid", "LeakyReLU", "Softmax", "LogSoftmax",
        "Flatten", "Identity", "MultiheadAttention", "MaxPool1d", "MaxPool2d", "AvgPool1d",
        "AvgPool2d", "AdaptiveAvgPool1d", "AdaptiveAvgPool2d",
    }
)  # fmt: skip


SIZE_SENSITIVE = frozenset(
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


SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)


CHILD_FIELDS: dict[type, tuple[str, ...]] = {}
