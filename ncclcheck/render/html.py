"""One self-contained HTML file per report (``--report report.html``): no network, no
script, inline CSS. A lane per rank with its collectives in order (op on the box;
op, tensors, group, call number and site on hover), phases shaded, the first
divergence outlined across the lanes, eval batches per rank as bars, doctor's
stack classes, and the findings with their fixes. Renders; computes nothing."""

from __future__ import annotations

from html import escape

from ncclcheck.model import Report, Severity, format_ranks
from ncclcheck.render.lanes import GROUP_ABOVE, Lanes

_CSS = """
body { font: 14px/1.45 system-ui, sans-serif; margin: 24px; color: #1d1d1f; }
h1 { font-size: 20px; margin: 0 0 4px; } h2 { font-size: 16px; margin: 24px 0 8px; }
.verdict { font-weight: 600; padding: 2px 8px; border-radius: 4px; }
.verdict-aligned, .verdict-progressing { background: #d8f5d8; }
.verdict-error, .verdict-incomplete { background: #fff1c2; }
.verdict-hang, .verdict-crash, .verdict-misaligned { background: #ffd9d9; }
.finding { border-left: 4px solid #d33; padding: 8px 12px; margin: 8px 0; background: #fafafa; }
.finding.warning { border-color: #d9a400; }
.finding .cause { font-weight: 600; font-family: ui-monospace, monospace; }
.finding .fix { color: #135; margin-top: 6px; } .finding ul { margin: 6px 0; padding-left: 20px; }
.lanes { overflow-x: auto; border: 1px solid #ddd; padding: 8px; }
.lane { display: flex; align-items: center; gap: 3px; margin: 4px 0; white-space: nowrap; }
.lane-label { flex: 0 0 110px; font-family: ui-monospace, monospace; font-size: 12px; }
.call { flex: 0 0 auto; font: 11px ui-monospace, monospace; padding: 3px 5px; border-radius: 3px;
        border: 1px solid #9ab; background: #e8f0fb; }
.call.phase-eval { background: #fde9cf; border-color: #d9a066; }
.call.divergent { outline: 3px solid #d33; outline-offset: 1px; font-weight: 700; }
.lane-note { font-size: 12px; color: #a11; margin-left: 8px; }
.legend span { display: inline-block; margin-right: 14px; font-size: 12px; }
.bars .bar-row { display: flex; align-items: center; gap: 8px; margin: 3px 0; }
.bars .bar { background: #6a8fd1; height: 14px; }
.bars .bar.odd { background: #d36a6a; }
.stack-class { margin: 8px 0; } .stack-class pre { margin: 4px 0 0; font-size: 12px; }
.muted { color: #666; font-size: 12px; }
"""


def report_html(report: Report, lanes: Lanes | None = None) -> str:
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>ncclcheck {escape(report.command)}: {escape(report.verdict.value)}</title>",
        f"<style>{_CSS}</style></head><body>",
        f"<h1>ncclcheck {escape(report.command)}</h1>",
        f'<p><span class="verdict verdict-{escape(report.verdict.value)}" id="verdict">'
        f"{escape(report.verdict.value)}</span> {report.world_size} ranks"
        + (
            f' <span class="muted">{escape(str(report.summary.get("stopped", "")))}</span>'
            if report.summary.get("stopped")
            else ""
        )
        + "</p>",
    ]
    parts += _findings(report)
    if lanes is not None and lanes.lanes:
        parts += _lanes(lanes)
    parts += _eval_bars(report)
    parts += _stack_classes(report)
    parts.append(f'<p class="muted">ncclcheck {escape(report.version)}</p></body></html>')
    return "\n".join(parts) + "\n"


def _findings(report: Report) -> list[str]:
    if not report.findings:
        return [
            '<h2>Findings</h2><p id="no-findings">No finding: every rank called the same collectives.</p>'
        ]
    out = ["<h2>Findings</h2>"]
    for index, finding in enumerate(report.findings):
        level = "warning" if finding.severity is Severity.WARNING else "error"
        ranks = (
            f"<p>ranks that did it: {escape(format_ranks(finding.ranks) or '-')}; "
            f"ranks that did not: {escape(format_ranks(finding.absent_ranks) or '-')}</p>"
            if finding.ranks or finding.absent_ranks
            else ""
        )
        evidence = "".join(f"<li>{escape(line)}</li>" for line in finding.evidence)
        out.append(
            f'<div class="finding {level}" id="finding-{index}" data-cause="{escape(finding.cause)}">'
            f'<div><span class="cause">{escape(finding.cause)}</span> ({level})'
            + (f" at <code>{escape(finding.site)}</code>" if finding.site else "")
            + f"</div><p>{escape(finding.message)}</p>{ranks}"
            + (f"<ul>{evidence}</ul>" if evidence else "")
            + (f'<div class="fix"><b>fix:</b> {escape(finding.fix)}</div>' if finding.fix else "")
            + f'<div class="muted">more: ncclcheck playbooks {escape(finding.playbook)}</div></div>'
        )
    return out


def _lanes(lanes: Lanes) -> list[str]:
    out = [
        "<h2>Collectives per rank</h2>",
        f'<p class="muted">{escape(lanes.window)}'
        + (f"; first divergence: {escape(lanes.divergence)} (outlined)" if lanes.divergence else "")
        + "</p>",
        '<p class="legend"><span class="call">train</span><span class="call phase-eval">eval</span>'
        '<span class="call divergent">first divergence</span></p>',
        '<div class="lanes" id="lanes">',
    ]
    for lane in lanes.lanes:
        boxes = []
        for call in lane.calls:
            classes = f"call phase-{escape(call.phase)}" + (" divergent" if call.divergent else "")
            title = (
                f"{call.op} {call.tensors} | group {call.group}, call #{call.seq + 1} | "
                f"rank call #{call.n} | {call.phase} | {call.site}"
            )
            boxes.append(f'<span class="{classes}" title="{escape(title)}">{escape(call.op)}</span>')
        note = f'<span class="lane-note">{escape(lane.note)}</span>' if lane.note else ""
        shared = format_ranks(lane.ranks or [lane.rank])
        out.append(
            f'<div class="lane" data-rank="{lane.rank}" data-ranks="{escape(shared)}">'
            f'<span class="lane-label">{escape(lane.label)} ({lane.total})</span>{"".join(boxes)}{note}</div>'
        )
    out.append("</div>")
    return out


def _eval_bars(report: Report) -> list[str]:
    counts = {r.rank: r.eval_batches for r in report.ranks if isinstance(r.eval_batches, int)}
    if not counts:
        return []
    most = max(counts.values()) or 1
    common = max(set(counts.values()), key=list(counts.values()).count)
    out = ['<h2>Eval batches per rank</h2><div class="bars" id="eval-batches">']
    rows: list[tuple[list[int], int]] = []  # in a large world, consecutive ranks alike share a row
    for rank, count in sorted(counts.items()):
        if len(counts) > GROUP_ABOVE and rows and rows[-1][1] == count and rows[-1][0][-1] == rank - 1:
            rows[-1][0].append(rank)
        else:
            rows.append(([rank], count))
    for ranks, count in rows:
        odd = " odd" if count != common else ""
        label = f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {format_ranks(ranks)}"
        out.append(
            f'<div class="bar-row" data-rank="{ranks[0]}" data-batches="{count}"><span class="lane-label">'
            f'{label}</span><div class="bar{odd}" style="width:{240 * count // most}px"></div>'
            f"<span>{count}</span></div>"
        )
    out.append("</div>")
    return out


def _stack_classes(report: Report) -> list[str]:
    classes = report.summary.get("classes")
    if not isinstance(classes, list) or not classes:
        return []
    out = ['<h2>Stack classes</h2><div id="stack-classes">']
    for cls in classes:
        frames = "\n".join(str(frame) for frame in cls.get("frames", []))
        out.append(
            f'<div class="stack-class"><b>ranks {escape(str(cls.get("ranks")))}</b>: '
            f"{escape(str(cls.get('blocking')))}<pre>{escape(frames)}</pre></div>"
        )
    out.append("</div>")
    return out
