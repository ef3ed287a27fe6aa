"""The report model: JSON round trip and the published schema."""

from __future__ import annotations

import json

import jsonschema
import pytest

from ncclcheck.model import (
    CollectiveCall,
    Finding,
    Frame,
    RankState,
    RankStatus,
    Report,
    Severity,
    Verdict,
    format_ranks,
)

from ..conftest import REPO

SCHEMA = json.loads((REPO / "ncclcheck" / "schemas" / "report.schema.json").read_text())


def sample_report() -> Report:
    return Report(
        command="preflight",
        verdict=Verdict.HANG,
        world_size=4,
        ranks=[
            RankState(
                0,
                "node1",
                1234,
                None,
                "eval",
                42,
                4,
                RankStatus.IN_COLLECTIVE,
                "dist_utils.py:13 in mean",
            ),
            RankState(1, "node1", 1235, 0, "train", 41, {"val": 3, "test": 2}, RankStatus.EXITED),
        ],
        findings=[
            Finding(
                cause="rank-conditional-collective",
                severity=Severity.ERROR,
                message="rank 0 all-reduces in evaluate(); ranks 1-3 never do",
                ranks=[0],
                absent_ranks=[1, 2, 3],
                op="all_reduce",
                site="dist_utils.py:13",
                evidence=["rank 0: all_reduce float32[2] at dist_utils.py:13"],
                fix="call evaluate() on every rank",
            )
        ],
        summary={"stopped": "hang after 15 s without progress"},
    )


def test_report_round_trips_through_json() -> None:
    report = sample_report()
    again = Report.from_json(report.to_json())
    assert again == report
    assert again.findings[0].playbook == "rank-conditional-collective"


def test_report_validates_against_the_schema() -> None:
    jsonschema.validate(sample_report().to_dict(), SCHEMA)


def test_schema_rejects_a_wrong_verdict_and_unknown_rank_field() -> None:
    data = sample_report().to_dict()
    data["verdict"] = "maybe"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(data, SCHEMA)
    data = sample_report().to_dict()
    data["ranks"][0]["colour"] = "red"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(data, SCHEMA)


def test_every_verdict_is_in_the_schema() -> None:
    for verdict in Verdict:
        data = sample_report().to_dict()
        data["verdict"] = verdict.value
        jsonschema.validate(data, SCHEMA)


def test_exit_code_follows_errors_not_warnings() -> None:
    report = Report(command="preflight", verdict=Verdict.ALIGNED, world_size=2)
    assert report.exit_code == 0
    report.findings.append(Finding("missing-distributed-sampler", Severity.WARNING, "no sampler"))
    assert report.exit_code == 0
    report.verdict = Verdict.INCOMPLETE  # stopped before its budget: neither a pass nor a finding
    assert report.exit_code == 4
    report.findings.append(Finding("rank-crashed", Severity.ERROR, "rank 1 died"))
    assert report.exit_code == 1


def test_collective_call_round_trip_and_signature() -> None:
    call = CollectiveCall(
        rank=1,
        seq=3,
        op="all_gather",
        group="0",
        group_ranks=[0, 1],
        shapes=[[7]],
        dtypes=["int64"],
        phase="eval",
        site=Frame("repro.py", 62, "main"),
        user_stack=[Frame("repro.py", 62, "main")],
    )
    again = CollectiveCall.from_dict(json.loads(json.dumps(call.to_dict())))
    assert again == call
    assert again.signature == ("all_gather", ((7,),), ("int64",))


@pytest.mark.parametrize(
    ("ranks", "text"),
    [
        ([], ""),
        ([3], "3"),
        ([0, 1, 2, 3], "0-3"),
        ([0, 1, 2, 3, 4, 5, 6, 8], "0-6,8"),
        ([5, 1, 2], "1-2,5"),
    ],
)
def test_format_ranks(ranks: list[int], text: str) -> None:
    assert format_ranks(ranks) == text


def test_a_signature_holds_what_must_agree_across_ranks() -> None:
    def call(op: str, shapes: list[list[int]], dtypes: list[str]) -> CollectiveCall:
        return CollectiveCall(
            rank=0, seq=0, op=op, group="0", group_ranks=[0, 1], shapes=shapes, dtypes=dtypes
        )

    # gather/scatter: the root alone passes the list
    assert (
        call("gather", [[1], [1], [1]], ["float32"] * 3).signature
        == call("gather", [[1]], ["float32"]).signature
    )
    assert call("gather", [[2]], ["float32"]).signature != call("gather", [[1]], ["float32"]).signature
    # all_to_all_single's splits may differ per rank; its dtype may not
    assert call("all_to_all_single", [[6], [3]], ["float32"] * 2).signature == (
        call("all_to_all_single", [[6], [6]], ["float32"] * 2).signature
    )
    assert (
        call("all_to_all_single", [[6]], ["float32"]).signature
        != call("all_to_all_single", [[6]], ["int64"]).signature
    )
    # object collectives pickle whatever each rank holds
    assert (
        call("all_gather_object", [[1]], ["float32"]).signature == call("all_gather_object", [], []).signature
    )
    # everything else: every tensor
    assert (
        call("all_gather", [[1], [1]], ["float32"] * 2).signature
        != call("all_gather", [[1], [2]], ["float32"] * 2).signature
    )
