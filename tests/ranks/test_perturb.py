"""preflight --perturb: decisions on values no rank shares (a local early-stopping loss, a
local clock) stay hidden on identical data and show once the values differ on purpose."""

from __future__ import annotations

import pytest

from ..conftest import SCRIPTS, ncclcheck

SCRIPT = SCRIPTS / "local_decision.py"
pytestmark = [pytest.mark.ranks, pytest.mark.warm_start]  # preflight forks its ranks warm (conftest)


def line_of(fragment: str) -> int:
    lines = SCRIPT.read_text().splitlines()
    return next(number for number, text in enumerate(lines, 1) if fragment in text)


def preflight(mode: str, *flags: str) -> dict:  # type: ignore[type-arg]
    options = ("--json", "--eval-passes=8", "--train-steps=3", *flags)
    result, report = ncclcheck("preflight", *options, str(SCRIPT), env={"MODE": mode})
    assert result.returncode in (0, 1, 5), result.output  # 5: partial, a decision not checked
    return report  # type: ignore[no-any-return]


@pytest.mark.parametrize("mode", ["early_stop", "clock"])
def test_identical_data_hides_the_local_decision_which_is_then_said_not_checked(mode: str) -> None:
    # every rank reads the same value: the ranks never part, and the run is not `aligned`
    # but `partial`, the decision listed as not checked (--perturb checks it, below; so
    # does the forced run, left out here)
    report = preflight(mode, "--no-force-decisions")
    assert report["verdict"] == "partial"
    assert "perturbed" not in report["summary"]
    assert any(
        "a decision each rank takes on a value of its own" in gap for gap in report["summary"]["not_run"]
    )


def test_perturbed_losses_show_an_unsynchronised_early_stop() -> None:
    report = preflight("early_stop", "--perturb")
    finding = report["findings"][0]
    assert finding["cause"] == "unsynchronized-decision"
    stop = line_of("break  # this rank's own loss")
    assert finding["site"] == f"tests/scripts/local_decision.py:{stop}"
    assert "decided differently at `if patience >= 1`" in finding["message"]
    item = line_of(").item()")
    assert report["summary"]["perturbed"] == [
        f".item() (eval) at tests/scripts/local_decision.py:{item} (rank 1)"
    ]


def test_a_faster_clock_shows_an_unsynchronised_budget() -> None:
    report = preflight("clock", "--perturb")
    finding = report["findings"][0]
    assert finding["cause"] == "unsynchronized-decision"
    budget = line_of("break  # this rank's budget")
    assert (
        f"`break` under `if time.time() - start > 3600` at tests/scripts/local_decision.py:{budget}"
        in " ".join(finding["evidence"])
    )
    assert any(
        line.startswith("time.time() at tests/scripts/local_decision.py:")
        for line in report["summary"]["perturbed"]
    )
