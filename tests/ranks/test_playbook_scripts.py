"""The ground truth: every repro.py misbehaves under plain torchrun, every fixed.py completes.

These scripts are what preflight, doctor and lint are tested against, so they are
run for real: torchrun, gloo, CPU. A hang is bounded by the process-group
timeout the scripts read from REPRO_TIMEOUT_S, and by a kill at the test's bound.
"""

from __future__ import annotations

import pytest

from ncclcheck.catalogue import load_catalogue

from ..conftest import PLAYBOOKS, run_bounded, run_to_its_end, torchrun_argv

PG_TIMEOUT_S = 6
REPRO_BOUND_S = 40
FIXED_BOUND_S = 90
PLAYBOOK_IDS = load_catalogue(PLAYBOOKS).ids
GLOO_TIMEOUT = "Timed out waiting"

pytestmark = pytest.mark.ranks


@pytest.mark.parametrize("cause", PLAYBOOK_IDS)
def test_repro_misbehaves_under_plain_torchrun(catalogue, cause: str) -> None:
    playbook = catalogue.get(cause)
    result = run_bounded(
        torchrun_argv(playbook.repro_path, playbook.repro.nproc),
        REPRO_BOUND_S,
        env={"REPRO_TIMEOUT_S": str(PG_TIMEOUT_S)},
    )
    assert result.returncode != 0, result.output[-3000:]
    if playbook.repro.outcome == "hang":
        # either gloo's timeout fired in a rank, or nothing moved until our bound
        assert result.timed_out or GLOO_TIMEOUT in result.output, result.output[-3000:]
    else:
        # a crash is over before any collective times out
        assert not result.timed_out
        assert GLOO_TIMEOUT not in result.output, result.output[-3000:]
        assert result.elapsed < REPRO_BOUND_S


@pytest.mark.parametrize("cause", PLAYBOOK_IDS)
def test_fixed_completes(catalogue, cause: str) -> None:
    playbook = catalogue.get(cause)
    argv = torchrun_argv(playbook.fixed_path, playbook.repro.nproc)
    env = {"REPRO_TIMEOUT_S": str(PG_TIMEOUT_S)}
    result = run_to_its_end(argv, FIXED_BOUND_S, env=env)
    assert result.returncode == 0, result.output[-3000:]
