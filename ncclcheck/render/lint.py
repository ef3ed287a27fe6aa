"""lint's three outputs: compiler-style text, the contract's JSON report, and SARIF 2.1.0
for code-scanning tools (GitHub code scanning, GitLab, VS Code's SARIF viewer)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from ncclcheck import __version__
from ncclcheck.catalogue import Catalogue
from ncclcheck.commands.lint.findings import located
from ncclcheck.model import Finding, Report, Severity, Verdict

SARIF_SCHEMA = "https://json.schemastore.org/sarif-2.1.0.json"
HOME = "https://github.com/ncclcheck/ncclcheck"


def text_lines(findings: list[Finding]) -> list[str]:
    """``path:line:col: cause: message``, as compilers and ruff print, warnings marked."""
    return [
        f"{located(f).path}:{located(f).line}:{located(f).col}: {f.cause}: "
        + ("" if f.severity is Severity.ERROR else "(warning) ")
        + f.message
        for f in findings
    ]


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
