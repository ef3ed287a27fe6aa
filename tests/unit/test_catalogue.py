"""The catalogue loader on the real playbooks and on broken ones."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from ncclcheck.catalogue import load_catalogue, load_playbook
from ncclcheck.errors import PlaybookError

from ..conftest import PLAYBOOKS, REPO

CAUSES_MD = REPO / "docs" / "causes.md"
EXPECTED_IDS = {
    "rank-conditional-collective",
    "uneven-eval-batches",
    "missing-distributed-sampler",
    "rank-early-exit",
    "unsynchronized-decision",
    "data-dependent-branch",
    "collective-shape-mismatch",
    "collective-order-mismatch",
    "rank-exception",
    "rank-crashed",
    "straggler",
    "transport-hang",
}


def test_catalogue_has_one_playbook_per_cause_id(catalogue) -> None:
    assert set(catalogue.ids) == EXPECTED_IDS
    # docs/causes.md, the reference, has one row per cause
    table_ids = set(re.findall(r"^\| `([a-z-]+)` \|", CAUSES_MD.read_text(), re.M))
    assert table_ids == EXPECTED_IDS


def test_every_playbook_is_complete(catalogue) -> None:
    for playbook in catalogue:
        assert playbook.repro_path.is_file() and playbook.fixed_path.is_file()
        assert playbook.fix.direct and playbook.fix.structural and playbook.fix.ci_guard
        assert playbook.signals.preflight and playbook.signals.doctor
        assert playbook.references, playbook.id
        # the expected site names exactly one line of the reproducer
        assert playbook.repro.site_line(playbook.folder) > 0
        assert set(playbook.repro.ranks).isdisjoint(playbook.repro.absent_ranks)
        assert all(0 <= r < playbook.repro.nproc for r in playbook.repro.ranks)


def test_causes_invisible_in_source_have_no_lint_signal(catalogue) -> None:
    no_source = {p.id for p in catalogue if not p.shows_in_source}
    assert no_source == {"rank-crashed", "straggler", "transport-hang"}


@pytest.fixture
def broken(tmp_path: Path) -> Path:
    """A copy of one real playbook to break in each test."""
    folder = tmp_path / "rank-crashed"
    shutil.copytree(PLAYBOOKS / "rank-crashed", folder)
    return folder


def _edit(folder: Path, old: str, new: str) -> None:
    path = folder / "playbook.toml"
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new, 1))


def test_the_copy_itself_loads(broken: Path) -> None:
    assert load_playbook(broken).id == "rank-crashed"


@pytest.mark.parametrize(
    ("old", "new", "message"),
    [
        ('id = "rank-crashed"', 'id = "rank-crashed"\ncolour = "red"', "unknown key colour"),
        ('title = "A rank process died while the others wait for it"\n', "", "missing key title"),
        ("[fix]\n", "[fix]\nextra = 1\n", "unknown key fix.extra"),
        ("nproc = 2", "nproc = true", "repro.nproc must be a int"),
        ("nproc = 2", "nproc = 1", "repro.nproc must be at least 2"),
        ('outcome = "crash"', 'outcome = "explode"', "repro.outcome must be one of"),
        ('id = "rank-crashed"', 'id = "rank-died"', "differs from its folder"),
        ("[signals]", "[signals", "not valid TOML"),
        ("lint = []", "lint = [1]", "signals.lint must be a list of non-empty strings"),
        ('op = "all_reduce"', 'op = ""', "repro.op is empty"),
    ],
)
def test_broken_playbook_names_file_and_key(broken: Path, old: str, new: str, message: str) -> None:
    _edit(broken, old, new)
    with pytest.raises(PlaybookError) as excinfo:
        load_playbook(broken)
    assert message in str(excinfo.value)
    assert str(broken) in str(excinfo.value)


def test_missing_reproducer_is_an_error(broken: Path) -> None:
    (broken / "fixed.py").unlink()
    with pytest.raises(PlaybookError, match=r"missing fixed\.py"):
        load_playbook(broken)


def test_site_fragment_must_match_one_line(broken: Path) -> None:
    _edit(broken, 'site = "    dist.all_reduce(totals)"', 'site = "torch"')
    playbook = load_playbook(broken)
    with pytest.raises(PlaybookError, match=r"matches \d+ lines"):
        playbook.repro.site_line(broken)


def test_duplicate_ids_are_rejected() -> None:
    # Within one folder the id must equal the folder name, so duplicates arise when
    # catalogues are merged; the merge refuses them.
    from ncclcheck.catalogue import Catalogue

    one = load_playbook(PLAYBOOKS / "straggler")
    with pytest.raises(PlaybookError, match="duplicate id 'straggler'"):
        Catalogue([one, one])


def test_load_catalogue_skips_private_folders_and_rejects_non_folders(tmp_path: Path) -> None:
    root = tmp_path / "catalogue"
    (root / "__pycache__").mkdir(parents=True)
    (root / "_template").mkdir()
    shutil.copytree(PLAYBOOKS / "straggler", root / "straggler")
    assert load_catalogue(root).ids == ["straggler"]
    with pytest.raises(PlaybookError, match="not a folder of playbooks"):
        load_catalogue(tmp_path / "nowhere")


def test_every_cause_has_a_playbook_and_every_playbook_is_a_cause() -> None:
    from ncclcheck.causes import Cause

    assert {cause.value for cause in Cause} == EXPECTED_IDS == set(load_catalogue(PLAYBOOKS).ids)


def test_a_playbook_whose_id_is_no_cause_is_refused(tmp_path: Path) -> None:
    folder = tmp_path / "rank-died"
    shutil.copytree(PLAYBOOKS / "rank-crashed", folder)
    _edit(folder, 'id = "rank-crashed"', 'id = "rank-died"')
    with pytest.raises(PlaybookError, match="'rank-died' is not a cause ncclcheck names"):
        load_playbook(folder)


def test_a_finding_with_an_unknown_cause_is_an_error_not_an_empty_fix() -> None:
    from ncclcheck.causes import Cause
    from ncclcheck.model import Finding, Severity

    with pytest.raises(ValueError, match="rank-died"):
        Finding("rank-died", Severity.ERROR, "a rank died")  # type: ignore[arg-type]
    finding = Finding("straggler", Severity.WARNING, "slow")  # type: ignore[arg-type]
    assert finding.cause is Cause.STRAGGLER
    assert finding.to_dict()["cause"] == "straggler" and finding.playbook == "straggler"
    assert f"{finding.cause}" == "straggler"
