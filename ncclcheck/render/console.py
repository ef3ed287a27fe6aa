"""Console rendering with rich: reports, the catalogue, one playbook."""

from __future__ import annotations

import io
import math
import os
import sys

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from ncclcheck.catalogue import Playbook
from ncclcheck.model import Report, Severity, Verdict, format_ranks
from ncclcheck.render.lanes import GROUP_ABOVE

_VERDICT_STYLE = {
    Verdict.ALIGNED: "bold green",
    Verdict.MISALIGNED: "bold red",
    Verdict.HANG: "bold red",
    Verdict.PROGRESSING: "bold green",
    Verdict.WAITING: "bold yellow",
    Verdict.CRASH: "bold red",
    Verdict.ERROR: "bold yellow",
    Verdict.INCOMPLETE: "bold yellow",
    Verdict.PARTIAL: "bold yellow",
}


def silence_stdout() -> None:
    """The reader of stdout went away (``ncclcheck lint . | head``): what is left to print
    goes to /dev/null, so that the command still ends with its own exit code and
    Python's last flush at exit does not fail again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):  # no stdout to speak of
        pass


class _Console(Console):
    def on_broken_pipe(self) -> None:
        # rich's own exits with 1, which would read as "errors found" (docs/contract.md)
        self.quiet = True
        silence_stdout()


def _console() -> Console:
    # soft_wrap keeps long paths on one line when the output is piped to a file;
    # tables get room for their sites there too (a terminal keeps its own width).
    console = _Console(highlight=False, soft_wrap=True)
    if not console.is_terminal:
        console.width = 160
    return console


def print_catalogue(playbooks: list[Playbook]) -> None:
    out = _console()
    width = max(len(p.id) for p in playbooks)
    out.print(f"[bold]{len(playbooks)} causes[/] (ncclcheck playbooks <cause id> shows one)\n")
    for playbook in playbooks:
        out.print(f"  [bold cyan]{playbook.id:<{width}}[/]  {escape(playbook.title)}")


def print_playbook(playbook: Playbook) -> None:
    out = _console()
    out.print(f"[bold cyan]{playbook.id}[/]: [bold]{escape(playbook.title)}[/]\n")
    out.print(escape(playbook.summary), "\n")
    out.print("[bold]Why it happens[/]")
    out.print(escape(playbook.why), "\n")
    out.print("[bold]How ncclcheck recognises it[/]")
    for name, signals in (
        ("preflight", playbook.signals.preflight),
        ("doctor", playbook.signals.doctor),
        ("lint", playbook.signals.lint),
    ):
        if not signals:
            out.print(f"  [cyan]{name}[/]: not visible this way")
        for signal in signals:
            out.print(f"  [cyan]{name}[/]: {escape(signal)}")
    out.print()
    out.print("[bold]Fix[/]")
    out.print(f"  [green]1. direct[/]      {escape(playbook.fix.direct)}")
    out.print(f"  [green]2. structural[/]  {escape(playbook.fix.structural)}")
    out.print(f"  [green]3. CI guard[/]    {escape(playbook.fix.ci_guard)}")
    for framework, text in sorted(playbook.fix.frameworks.items()):
        out.print(f"  [green]with {framework}[/]  {escape(text)}")
    out.print()
    launch = f"torchrun --nproc-per-node {playbook.repro.nproc}"
    out.print(f"[bold]Reproducer[/]  {launch} {playbook.repro_path}")
    out.print(f"[bold]Fixed[/]       {launch} {playbook.fixed_path}")
    if playbook.references:
        out.print(f"[bold]Seen in[/]     {', '.join(playbook.references)}")


def report_text(report: Report) -> str:
    """The console report as plain text (no colour, 160 columns): for pytest's failure
    messages and other places that are not a terminal."""
    out = Console(file=io.StringIO(), width=160, no_color=True, highlight=False, soft_wrap=True)
    print_report(report, out)
    return out.file.getvalue()  # type: ignore[attr-defined,no-any-return]


def print_report(report: Report, out: Console | None = None) -> None:
    out = out or _console()
    style = _VERDICT_STYLE[report.verdict]
    out.print(
        f"[bold]ncclcheck {report.command}[/]: [{style}]{report.verdict.value}[/] "
        + (f"({report.world_size} ranks)" if report.world_size else "(ranks unknown)")
    )
    if report.ranks:
        table = Table(show_edge=False, pad_edge=False)
        # doctor reads stacks, not traces: it knows no phase, call count or eval batches
        traced = report.command == "preflight"
        columns = ["rank", "host", "pid", "state"]
        columns += ["phase", "collectives", "eval batches"] if traced else []
        for column in [*columns, "where"]:
            table.add_column(column, no_wrap=column != "where")
        grouped = len(report.ranks) > GROUP_ABOVE  # consecutive ranks alike share one row ("1-254")
        rows: list[tuple[list[int], list[str], list[str]]] = []  # ranks, own cells, shared cells
        for rank in report.ranks:
            cells = [
                rank.host,
                "" if rank.pid is None else str(rank.pid),
                rank.state.value + ("" if rank.exit_code is None else f" ({rank.exit_code})"),
            ]
            if traced:
                cells += [rank.phase or "", str(rank.collectives), _eval_batches(rank.eval_batches)]
            cells.append(escape(rank.where or ""))
            shared = [cells[0], "", *cells[2:]]  # a group of ranks has no one pid
            if grouped and rows and rows[-1][2] == shared:
                rows[-1][0].append(rank.rank)
            else:
                rows.append(([rank.rank], cells, shared))
        for ranks, cells, shared in rows:
            table.add_row(format_ranks(ranks), *(cells if len(ranks) == 1 else shared))
        out.print(table)
    _print_probe_summary(out, report)
    classes = report.summary.get("classes")
    if isinstance(classes, list) and classes:
        out.print("\n[bold]Stack classes[/]")
        for cls in classes:
            out.print(f"  ranks [bold]{cls['ranks']}[/]: {escape(str(cls['blocking']))}")
            for frame in cls["frames"]:
                out.print(f"    {escape(str(frame))}")
    for finding in report.findings:
        colour = "red" if finding.severity is Severity.ERROR else "yellow"
        out.print()
        out.print(
            f"[bold {colour}]{finding.severity.value}[/] [bold cyan]{finding.cause}[/]"
            + (f" at [bold]{escape(finding.site)}[/]" if finding.site else "")
        )
        out.print(f"  {escape(finding.message)}")
        if finding.ranks or finding.absent_ranks:
            out.print(
                f"  ranks that did it: {format_ranks(finding.ranks) or '-'}; "
                f"ranks that did not: {format_ranks(finding.absent_ranks) or '-'}"
            )
        for line in finding.evidence:
            out.print(f"  [dim]-[/] {escape(line)}")
        if finding.fix:
            out.print(f"  [green]fix:[/] {escape(finding.fix)}")
        out.print(f"  [dim]more: ncclcheck playbooks {finding.playbook}[/]")
    for key, title in (
        ("cpu", "--cpu ran CUDA calls on CPU"),
        ("perturbed", "--perturb made these rank-local values differ (rank 0 kept its own)"),
        ("framework", "the dry run set the framework's own budget"),
        ("read", "read"),
        ("skipped", "not read"),
        ("movement", "two looks at every rank"),
        ("stacks_of_no_known_rank", "stack dumps that name no rank, merged into classes"),
        ("gpus", "the ranks' GPUs (NVML)"),
        ("virtual", "virtual ranks that ran, and why"),
        ("eval_fast_forward", "eval passes fast-forwarded (--eval-batches)"),
        ("forced", "decisions on a rank's own value, forced on one rank in a run of their own"),
        ("not_run", "not run, so not checked"),
        ("covered", "what ran of the train loops and their periodic actions"),
    ):
        noted = report.summary.get(key)
        if isinstance(noted, list) and noted:
            out.print(f"\n[bold]{title}[/]")
            for line in noted:
                out.print(f"  {escape(str(line))}")
    for key in (
        "stopped",
        "note",
        "partial",
        "virtual_note",
        "line_evidence",
        "incomplete",
        "launcher",
        "unexplained",
    ):
        if report.summary.get(key):
            out.print(f"\n[dim]{escape(str(report.summary[key]))}[/]")
    if report.summary.get("decided_by") and not report.findings:  # else a finding's evidence says it
        out.print(f"\n{escape(str(report.summary['decided_by']))}")


def _eval_batches(value: object) -> str:
    if value is None:
        return ""
    if isinstance(value, dict):
        return ", ".join(f"{name}={count}" for name, count in value.items())
    return str(value)


def _print_probe_summary(out: Console, report: Report) -> None:
    """probe's checks, subgroups and bandwidth table (figures computed by probe.py)."""
    if report.command != "probe":
        return
    checks = report.summary.get("checks") or []
    if checks:
        table = Table(title="checks on known values", show_edge=False, pad_edge=False)
        for column in ("op", "ok on", "failed on", "note"):
            table.add_column(column)
        for row in checks:
            table.add_row(
                row["op"],
                format_ranks(row["ok_on"]),
                format_ranks(row["failed_on"]),
                escape(row["skipped"] or ""),
            )
        out.print(table)
    for name, entry in (report.summary.get("layout") or {}).items():
        groups = " ".join(str(g) for g in entry["groups"])
        out.print(f"  subgroups {name}: {groups}: {'ok' if entry['ok'] else '[red]FAILED[/]'}")
    rows = report.summary.get("performance") or []
    if rows:
        backend = report.summary.get("backend")
        table = Table(
            title=f"bandwidth ({backend}, {report.world_size} ranks; busbw as nccl-tests computes it)",
            show_edge=False,
            pad_edge=False,
        )
        for column in ("op", "bytes", "time us", "algbw GB/s", "busbw GB/s", "slowest"):
            table.add_column(column, justify="left" if column in ("op", "slowest") else "right")
        for row in rows:
            table.add_row(
                row["op"],
                str(row["bytes"]),
                f"{row['time_us']:.1f}",
                _four_digits(row["algbw_GBps"]),
                _four_digits(row["busbw_GBps"]),
                f"rank {row['slowest_rank']} ({row['slowest_host']})",
            )
        out.print(table)


def _four_digits(value: float) -> str:
    """Four significant digits without an exponent: a CPU's 0.00006670 GB/s and a
    fabric's 24.13 GB/s read in one column."""
    if value <= 0:
        return "0"
    return f"{value:.{max(0, 3 - math.floor(math.log10(value)))}f}"
