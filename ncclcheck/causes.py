"""The cause ids: one name for each way the ranks stop calling the same collectives.

Every finding names one, every playbook folder is one (``playbooks/<id>/``), and
the catalogue refuses a folder or an id the other lacks. Code names a cause as
``Cause.X``: a misspelt member fails at import, where a misspelt string would have
given a finding with no fix.
"""

from __future__ import annotations

from enum import Enum


class Cause(str, Enum):
    # the histories part: a rank makes a collective the others do not
    RANK_CONDITIONAL_COLLECTIVE = "rank-conditional-collective"
    DATA_DEPENDENT_BRANCH = "data-dependent-branch"
    UNSYNCHRONIZED_DECISION = "unsynchronized-decision"
    UNEVEN_EVAL_BATCHES = "uneven-eval-batches"
    MISSING_DISTRIBUTED_SAMPLER = "missing-distributed-sampler"
    # the ranks meet, but not in the same call
    COLLECTIVE_ORDER_MISMATCH = "collective-order-mismatch"
    COLLECTIVE_SHAPE_MISMATCH = "collective-shape-mismatch"
    # a rank leaves: returns, raises, dies
    RANK_EARLY_EXIT = "rank-early-exit"
    RANK_EXCEPTION = "rank-exception"
    RANK_CRASHED = "rank-crashed"
    # every rank in the same call, and still no progress
    STRAGGLER = "straggler"
    TRANSPORT_HANG = "transport-hang"

    def __str__(self) -> str:  # the id, in f-strings and messages, on every Python
        return self.value
