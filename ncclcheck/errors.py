"""One error hierarchy: each error knows its exit code and the help a user needs.

The CLI prints ``str(error)`` and, on a second line, ``error.hint``; nothing else
maps errors to exit codes (see docs/contract.md: 0 clean, 1 findings, 2 could not
run, 3 ncclcheck's own bug).
"""

from __future__ import annotations

ISSUES_URL = "https://github.com/ncclcheck/ncclcheck/issues"


class NcclcheckError(Exception):
    """Base of every error ncclcheck reports on purpose."""

    exit_code = 2
    default_hint = ""

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.hint = self.default_hint if hint is None else hint


class UsageError(NcclcheckError):
    """The command line asks for something that cannot be done."""


class InputError(NcclcheckError):
    """A file, script or directory given to ncclcheck is missing or unreadable."""


class PlaybookError(NcclcheckError):
    """A playbook file is malformed: the message names the file and the key."""

    default_hint = "Each playbooks/<id>/playbook.toml must follow the fields listed in README.md."


class StackPermissionError(NcclcheckError):
    """py-spy may not read another process's memory."""

    default_hint = (
        "Run as the job's user or as root; in Docker add --cap-add=SYS_PTRACE, in Kubernetes "
        "add SYS_PTRACE to securityContext.capabilities; check /proc/sys/kernel/yama/ptrace_scope."
    )


class InternalError(NcclcheckError):
    """ncclcheck itself failed: a bug."""

    exit_code = 3
    default_hint = f"This is a bug in ncclcheck; rerun with --debug and report it at {ISSUES_URL}."
