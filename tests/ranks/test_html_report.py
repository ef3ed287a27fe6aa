"""--report report.html: one self-contained file with a lane per rank, the first
divergence marked across the lanes, eval batches as bars and the finding with its fix.
Read back through the DOM (html.parser); a real browser, where installed, loads it too."""

from __future__ import annotations

import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest

from ncclcheck.evidence.traces import load_traces
from ncclcheck.model import Report, Verdict
from ncclcheck.render.html import report_html
from ncclcheck.render.lanes import build_lanes

from ..conftest import PLAYBOOKS, WAIT_S, ncclcheck


class Dom(HTMLParser):
    """The elements of a page as (tag, attributes) in document order, and its text."""

    def __init__(self) -> None:
        super().__init__()
        self.elements: list[tuple[str, dict[str, str]]] = []
        self.text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.elements.append((tag, {k: v or "" for k, v in attrs}))

    def handle_data(self, data: str) -> None:
        self.text.append(data)

    def having(self, css_class: str) -> list[dict[str, str]]:
        return [a for _, a in self.elements if css_class in a.get("class", "").split()]


def parse(html: str) -> Dom:
    dom = Dom()
    dom.feed(html)
    return dom


@pytest.mark.ranks
@pytest.mark.warm_start  # what the report shows of the ranks, not how torchrun starts them
def test_a_preflight_report_shows_the_lanes_the_divergence_and_the_fix(tmp_path: Path) -> None:
    page = tmp_path / "report.html"
    repro = PLAYBOOKS / "uneven-eval-batches" / "repro.py"
    result, _ = ncclcheck("preflight", "--nproc-per-node=4", "--report", str(page), str(repro))
    assert result.returncode == 1, result.output
    html = page.read_text()
    dom = parse(html)
    lanes = dom.having("lane")
    assert [lane["data-rank"] for lane in lanes] == ["0", "1", "2", "3"]
    # rank 0's fourth eval all_reduce against the barrier ranks 1-3 went on to
    marked = [a["title"] for a in dom.having("divergent") if "title" in a]
    assert len(marked) == 4
    assert "playbooks/uneven-eval-batches/repro.py:35 in mean_across_ranks()" in marked[0]
    assert marked[0].startswith("all_reduce float32[scalar]") and "| eval |" in marked[0]
    assert all(title.startswith("barrier") for title in marked[1:])
    bars = {a["data-rank"]: a["data-batches"] for a in dom.having("bar-row")}
    assert bars == {"0": "4", "1": "3", "2": "3", "3": "3"}
    assert next(a["data-cause"] for a in dom.having("finding")) == "uneven-eval-batches"
    assert "DistributedSampler(val_set, shuffle=False)" in html  # its fix
    # self-contained: nothing fetched from anywhere
    assert not [a for _, a in dom.elements if any(k in a for k in ("src", "href"))]
    assert "http://" not in html and "https://" not in html


def write_traces(folder: Path, calls: int, rank_one_calls: int) -> None:
    """Two ranks of all_reduces at train.py:9; rank 1 stops after rank_one_calls."""
    for rank, count in ((0, calls), (1, rank_one_calls)):
        lines = [
            f'{{"t":"hello","rank":{rank},"world_size":2,"host":"h","pid":{rank + 1},"script":"train.py"}}'
        ]
        lines += [
            f'{{"t":"call","n":{n},"seq":{n - 1},"time":{n}.0,"op":"all_reduce","group":"0",'
            f'"group_ranks":[0,1],"shapes":[[1]],"dtypes":["float32"],"phase":"train",'
            f'"stack":[["train.py",9,"main"]]}}'
            for n in range(1, count + 1)
        ]
        (folder / f"rank-0000{rank}.jsonl").write_text("\n".join(lines) + "\n")


def test_an_aligned_report_says_so_and_windows_a_long_run(tmp_path: Path) -> None:
    write_traces(tmp_path, 500, 500)
    lanes = build_lanes(load_traces(tmp_path))
    assert [len(lane.calls) for lane in lanes.lanes] == [40, 40]  # the end of the run
    assert lanes.lanes[0].total == 500 and lanes.divergence == ""
    html = report_html(Report("preflight", Verdict.ALIGNED, 2), lanes)
    dom = parse(html)
    assert len(dom.having("call")) == 80 + 3  # the lanes and the legend
    assert dom.having("divergent") == [{"class": "call divergent"}]  # only the legend's
    assert "No finding: every rank called the same collectives." in html


@pytest.mark.skipif(shutil.which("chromium") is None, reason="no chromium here (apt install chromium)")
def test_a_browser_renders_the_report(tmp_path: Path) -> None:
    write_traces(tmp_path, 60, 59)  # rank 1 never makes the 60th call
    page = tmp_path / "report.html"
    page.write_text(report_html(Report("preflight", Verdict.HANG, 2), build_lanes(load_traces(tmp_path))))
    browser = ["chromium", "--headless", "--no-sandbox", "--disable-gpu"]
    shot = tmp_path / "report.png"
    subprocess.run(
        [*browser, f"--screenshot={shot}", page.as_uri()], capture_output=True, timeout=WAIT_S, check=True
    )
    assert shot.stat().st_size > 1000
    dom = parse(
        subprocess.run(
            [*browser, "--dump-dom", page.as_uri()],
            capture_output=True,
            text=True,
            timeout=WAIT_S,
            check=True,
        ).stdout
    )
    assert [lane["data-rank"] for lane in dom.having("lane")] == ["0", "1"]
    assert any("rank call #60" in a.get("title", "") for a in dom.having("divergent"))
    assert "made no call #60 on group 0" in dom.text


def test_a_doctor_report_shows_its_stack_classes() -> None:
    classes = [
        {"ranks": "1-7", "blocking": "barrier at train.py:88", "frames": ["main (train.py:88)"]},
        {"ranks": "0", "blocking": "all_reduce at metrics.py:42", "frames": ["evaluate (train.py:60)"]},
    ]
    report = Report("doctor", Verdict.HANG, 8, summary={"classes": classes})
    dom = parse(report_html(report))
    assert len(dom.having("stack-class")) == 2
    assert "ranks 1-7" in dom.text and ": barrier at train.py:88" in dom.text
    assert dom.having("lane") == []  # doctor reads stacks, not traces
