"""doctor --from on evidence people posted of real hangs (../shared/evidence: stack dumps
and job logs from public issue threads, with the answers their threads support). Read
from there, never copied here; skipped where the folder is absent. The whole set is
scored by its own score.py; these tests hold the invariants no case may break."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ncclcheck.commands.doctor import run_doctor_from
from ncclcheck.errors import InputError
from ncclcheck.model import Severity

from ..conftest import REPO

EVIDENCE = REPO.parent / "shared" / "evidence"
CASES = sorted(p.parent for p in EVIDENCE.glob("*/*/meta.json")) if EVIDENCE.is_dir() else []

pytestmark = pytest.mark.skipif(not CASES, reason=f"no real evidence at {EVIDENCE}")


def _evidence_files(case: Path) -> list[Path]:
    return sorted(p for p in case.iterdir() if p.name != "meta.json")


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_a_case_is_diagnosed_or_refused_in_one_line(case: Path) -> None:
    try:
        report = run_doctor_from(_evidence_files(case))
    except InputError as refused:  # nothing usable: a clear line, never a traceback
        assert "\n" not in str(refused)
        return
    assert report.command == "doctor"


@pytest.mark.parametrize(
    "case",
    [c for c in CASES if json.loads((c / "meta.json").read_text()).get("expected_odd_ranks") == []],
    ids=lambda c: c.name,
)
def test_where_the_evidence_sets_no_rank_apart_neither_does_doctor(case: Path) -> None:
    # every rank the evidence shows waits in the same collective: a report that accuses
    # some ranks of never issuing it says what the evidence does not
    try:
        report = run_doctor_from(_evidence_files(case))
    except InputError:
        return
    accusing = [f for f in report.findings if f.severity is Severity.ERROR and f.ranks and f.absent_ranks]
    assert not accusing, [(f.cause, f.ranks, f.absent_ranks, f.message) for f in accusing]
