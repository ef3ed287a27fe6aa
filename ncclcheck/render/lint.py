"""lint's three outputs: compiler-style text, the contract's JSON report, and SARIF 2.1.0
for code-scanning tools (GitHub code scanning, GitLab, VS Code's SARIF viewer)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from ncclcheck import __version__
from ncclcheck.catalogue import Catalogue
from ncclcheck.lint.findings import located
from ncclcheck.model import Finding, Report, Severity, Verdict

SARIF_SCHEMA = "https://json.schemastore.org/sarif-2.1.0.json"
HOME = "https://github.com/ncclcheck/ncclcheck"


def text_lines(findings: list[Finding]) -> list[str]:
    """``path:line:col: cause: message``, as compilers and ruff print, warnings marked;
    where the collective is reached through a call of the checked file, that call too, as
    a compiler's ``note:`` line: the place the fix goes, for an editor to jump to."""
    lines = []
    for f in findings:
        where = located(f)
        lines.append(
            f"{where.path}:{where.line}:{where.col}: {f.cause}: "
            + ("" if f.severity is Severity.ERROR else "(warning) ")
            + f.message
        )
        guarded = guarded_call(f)
        if guarded is not None:
            lines.append(f"{guarded[0]}:{guarded[1]}:1: note: the call that reaches it{guarded[2]}")
    return lines


def guarded_call(finding: Finding) -> tuple[str, int, str] | None:
    """(path, line, ' under the test at line N') of the call in the checked file that leads
    to a collective elsewhere; None where the collective is itself in the checked line."""
    where = located(finding)
    if where.call_line is None or not where.checked_path:
        return None
    if (where.checked_path, where.call_line) == (where.path, where.line):
        return None
    under = f", under the test at line {where.condition_line}" if where.condition_line else ""
    return where.checked_path, where.call_line, under


def report(findings: list[Finding], catalogue: Catalogue) -> Report:
    errors = any(f.severity is Severity.ERROR for f in findings)
    result = Report(command="lint", verdict=Verdict.MISALIGNED if errors else Verdict.ALIGNED, world_size=0)
    for f in findings:
        result.findings.append(
            replace(
                f,
                evidence=[f"column {located(f).col}", *f.evidence],
                fix=catalogue.get(f.cause).fix.direct.strip() if f.cause in catalogue else "",
                location=None,
            )
        )
    return result


def _related(finding: Finding) -> dict[str, Any]:
    guarded = guarded_call(finding)
    if guarded is None:
        return {}
    return {
        "relatedLocations": [
            {
                "id": 1,
                "message": {"text": f"the call that reaches the collective{guarded[2]}"},
                "physicalLocation": {
                    "artifactLocation": {"uri": guarded[0].replace("\\", "/")},
                    "region": {"startLine": guarded[1]},
                },
            }
        ]
    }


def sarif(findings: list[Finding], catalogue: Catalogue) -> dict[str, Any]:
    causes = sorted({f.cause for f in findings} | {p.id for p in catalogue})
    rules = []
    for cause in causes:
        rule: dict[str, Any] = {"id": cause, "helpUri": f"{HOME}/tree/main/playbooks/{cause}"}
        if cause in catalogue:
            playbook = catalogue.get(cause)
            rule["shortDescription"] = {"text": playbook.title}
            rule["fullDescription"] = {"text": " ".join(playbook.summary.split())}
            rule["help"] = {"text": " ".join(playbook.fix.direct.split())}
        rules.append(rule)
    results = [
        {
            "ruleId": f.cause,
            "ruleIndex": causes.index(f.cause),
            "level": "error" if f.severity is Severity.ERROR else "warning",
            "message": {"text": f.message},
            "locations": [
                {
                    "physicalLocation": {
                        "artifactLocation": {"uri": located(f).path.replace("\\", "/")},
                        "region": {"startLine": located(f).line, "startColumn": located(f).col},
                    }
                }
            ],
            **_related(f),
        }
        for f in findings
    ]
    return {
        "$schema": SARIF_SCHEMA,
        "version": "2.1.0",
        "runs": [
            {
                "tool": {
                    "driver": {
                        "name": "ncclcheck",
                        "version": __version__,
                        "informationUri": HOME,
                        "rules": rules,
                    }
                },
                "results": results,
            }
        ],
    }
