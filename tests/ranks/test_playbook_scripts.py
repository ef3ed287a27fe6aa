"""The ground truth: every repro.py misbehaves under plain torchrun.

These scripts are what preflight, doctor and lint are tested against, so they are
run for real: torchrun, gloo, CPU. A crash is run here to its end. Every fixed.py
runs to its end with exit 0 on every rank in test_preflight's
test_every_fixed_script_is_aligned (a budget past the script's end, every batch run),
so it is not run a second time here. A hanging repro is
run under plain torchrun by test_doctor, which waits until its ranks are still and
quiet and has doctor call it hung (and by test_nccl_timing on the NCCL timing
emulation), so it is not run a third time here: this file checks that every hanging
playbook is among those. A run is bounded by the process-group timeout the scripts
read from REPRO_TIMEOUT_S, and by a kill at the test's bound.
"""

from __future__ import annotations

import pytest

from ncclcheck.catalogue import load_catalogue

from ..conftest import JOB_BOUND_S, JOB_PG_TIMEOUT_S, PLAYBOOKS, run_bounded, torchrun_argv
from .test_doctor import HANGING_CAUSES

CATALOGUE = load_catalogue(PLAYBOOKS)
PLAYBOOK_IDS = CATALOGUE.ids
CRASHING = [i for i in PLAYBOOK_IDS if CATALOGUE.get(i).repro.outcome != "hang"]
GLOO_TIMEOUT = "Timed out waiting"

pytestmark = pytest.mark.ranks


def test_every_hanging_repro_is_run_hung_under_plain_torchrun_by_test_doctor(catalogue) -> None:
    hanging = {i for i in PLAYBOOK_IDS if catalogue.get(i).repro.outcome == "hang"}
    assert hanging <= set(HANGING_CAUSES), hanging - set(HANGING_CAUSES)


@pytest.mark.parametrize("cause", CRASHING)
def test_a_crashing_repro_crashes_under_plain_torchrun(catalogue, cause: str) -> None:
    playbook = catalogue.get(cause)
    result = run_bounded(
        torchrun_argv(playbook.repro_path, playbook.repro.nproc),
        JOB_BOUND_S,
        env={"REPRO_TIMEOUT_S": str(JOB_PG_TIMEOUT_S)},
    )
    assert result.returncode != 0, result.output[-3000:]
    # a crash is over before any collective times out
    assert not result.timed_out
    assert GLOO_TIMEOUT not in result.output, result.output[-3000:]
