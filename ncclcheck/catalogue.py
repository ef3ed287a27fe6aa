"""The catalogue of causes: loads and validates ``playbooks/<id>/playbook.toml``.

Every finding names a cause id; the catalogue gives each id its explanation,
its signals and its fix in three layers. A malformed playbook is a clear error
that names the file and the key, never a half-loaded catalogue.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ncclcheck.causes import Cause
from ncclcheck.errors import PlaybookError

_CAUSE_IDS = [cause.value for cause in Cause]

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib  # type: ignore[import-not-found,unused-ignore]

PLAYBOOK_FILE = "playbook.toml"
REPRO_FILE = "repro.py"
FIXED_FILE = "fixed.py"
OUTCOMES = ("hang", "crash")


@dataclass(frozen=True)
class Signals:
    """How each way in recognises the cause; an empty list: it cannot see it."""

    preflight: list[str]
    doctor: list[str]
    lint: list[str]


@dataclass(frozen=True)
class Fix:
    """The fix in the three layers of the seed write-up."""

    direct: str
    structural: str
    ci_guard: str
    # The direct fix in a framework's own terms, by lower-case framework name
    # ("lightning"): said beside the finding when the collective came from it.
    frameworks: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class ReproExpectation:
    """What ``repro.py`` does under plain torchrun, and where it goes wrong.

    ``site`` is a fragment of the source line the finding must point at (line
    numbers move when a script is edited; the fragment does not), in
    ``site_file`` relative to the playbook folder.
    """

    nproc: int
    outcome: str
    op: str
    site: str
    site_file: str
    ranks: list[int]
    absent_ranks: list[int]
    # where `ncclcheck lint` reports repro.py (a fragment, like site); empty where the
    # cause does not show in source (a straggler, a transport hang, a crashed rank)
    lint_site: str = ""

    def site_line(self, folder: Path, fragment: str | None = None) -> int:
        """The 1-based line of ``site`` (or ``fragment``) in ``site_file``; exactly one must match."""
        wanted = self.site if fragment is None else fragment
        path = folder / self.site_file
        lines = path.read_text(encoding="utf-8").splitlines()
        hits = [n for n, text in enumerate(lines, 1) if wanted in text]
        if len(hits) != 1:
            raise PlaybookError(
                f"{folder / PLAYBOOK_FILE}: repro fragment {wanted!r} matches {len(hits)} lines "
                f"of {self.site_file}, expected exactly one"
            )
        return hits[0]


@dataclass(frozen=True)
class Playbook:
    id: str
    title: str
    summary: str
    why: str
    signals: Signals
    fix: Fix
    repro: ReproExpectation
    references: list[str] = field(default_factory=list)
    folder: Path = Path()

    @property
    def repro_path(self) -> Path:
        return self.folder / REPRO_FILE

    @property
    def fixed_path(self) -> Path:
        return self.folder / FIXED_FILE

    @property
    def shows_in_source(self) -> bool:
        return bool(self.signals.lint)


# The schema of playbook.toml: table -> {key: type}. Kept next to the loader so
# an unknown or missing key is reported by the same code that reads it.
_TOP: dict[str, type] = {
    "id": str,
    "title": str,
    "summary": str,
    "why": str,
    "references": list,
    "signals": dict,
    "fix": dict,
    "repro": dict,
}
_SIGNALS: dict[str, type] = {"preflight": list, "doctor": list, "lint": list}
_FIX: dict[str, type] = {"direct": str, "structural": str, "ci_guard": str, "frameworks": dict}
_REPRO: dict[str, type] = {
    "nproc": int,
    "outcome": str,
    "op": str,
    "site": str,
    "site_file": str,
    "ranks": list,
    "absent_ranks": list,
    "lint_site": str,
}
_REPRO_OPTIONAL = {"site_file", "lint_site"}


def default_root() -> Path:
    """The catalogue shipped with this installation.

    A wheel carries it as ``ncclcheck/_playbooks``; a source checkout (editable
    install) has it at the top of the repository.
    """
    package = Path(__file__).resolve().parent
    for candidate in (package / "_playbooks", package.parent / "playbooks"):
        if candidate.is_dir():
            return candidate
    raise PlaybookError(
        f"no playbooks folder next to {package}",
        hint="Reinstall ncclcheck: the wheel ships its catalogue inside the package.",
    )


def _paragraphs(text: str) -> str:
    """TOML multi-line strings keep their line breaks; text is re-wrapped when shown."""
    blocks = [" ".join(block.split()) for block in text.strip().split("\n\n")]
    return "\n\n".join(block for block in blocks if block)


def _check_table(
    data: dict[str, Any], spec: dict[str, type], where: str, path: Path, optional: set[str]
) -> None:
    unknown = sorted(set(data) - set(spec))
    if unknown:
        raise PlaybookError(f"{path}: unknown key {where}{unknown[0]}")
    for key, expected in spec.items():
        if key not in data:
            if key in optional:
                continue
            raise PlaybookError(f"{path}: missing key {where}{key}")
        value = data[key]
        # bool is an int in Python; a playbook saying `nproc = true` is still wrong.
        if not isinstance(value, expected) or (expected is int and isinstance(value, bool)):
            raise PlaybookError(
                f"{path}: {where}{key} must be a {expected.__name__}, not {type(value).__name__}"
            )
        if isinstance(value, str) and not value.strip():
            raise PlaybookError(f"{path}: {where}{key} is empty")


def _string_list(value: list[Any], key: str, path: Path) -> list[str]:
    if not all(isinstance(item, str) and item.strip() for item in value):
        raise PlaybookError(f"{path}: {key} must be a list of non-empty strings")
    return list(value)


def _int_list(value: list[Any], key: str, path: Path) -> list[int]:
    if not all(isinstance(item, int) and not isinstance(item, bool) for item in value):
        raise PlaybookError(f"{path}: {key} must be a list of integers")
    return list(value)


def load_playbook(folder: Path) -> Playbook:
    """Read and validate one playbook folder."""
    path = folder / PLAYBOOK_FILE
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise PlaybookError(f"{folder}: no {PLAYBOOK_FILE}") from None
    except tomllib.TOMLDecodeError as exc:
        raise PlaybookError(f"{path}: not valid TOML ({exc})") from None

    _check_table(data, _TOP, "", path, set())
    _check_table(data["signals"], _SIGNALS, "signals.", path, set())
    _check_table(data["fix"], _FIX, "fix.", path, {"frameworks"})
    frameworks = data["fix"].get("frameworks", {})
    _check_table(frameworks, dict.fromkeys(frameworks, str), "fix.frameworks.", path, set())
    _check_table(data["repro"], _REPRO, "repro.", path, _REPRO_OPTIONAL)

    if data["id"] != folder.name:
        raise PlaybookError(f"{path}: id {data['id']!r} differs from its folder {folder.name!r}")
    if data["id"] not in _CAUSE_IDS:
        raise PlaybookError(
            f"{path}: id {data['id']!r} is not a cause ncclcheck names",
            hint=f"Add it to ncclcheck/causes.py, or use one of: {', '.join(_CAUSE_IDS)}.",
        )
    for required in (REPRO_FILE, FIXED_FILE):
        if not (folder / required).is_file():
            raise PlaybookError(f"{folder}: missing {required}")

    raw_repro = data["repro"]
    if raw_repro["outcome"] not in OUTCOMES:
        raise PlaybookError(f"{path}: repro.outcome must be one of {', '.join(OUTCOMES)}")
    if raw_repro["nproc"] < 2:
        raise PlaybookError(f"{path}: repro.nproc must be at least 2")
    repro = ReproExpectation(
        nproc=raw_repro["nproc"],
        outcome=raw_repro["outcome"],
        op=raw_repro["op"],
        site=raw_repro["site"],
        site_file=raw_repro.get("site_file", REPRO_FILE),
        ranks=_int_list(raw_repro["ranks"], "repro.ranks", path),
        absent_ranks=_int_list(raw_repro["absent_ranks"], "repro.absent_ranks", path),
        lint_site=raw_repro.get("lint_site", ""),
    )
    signals = data["signals"]
    return Playbook(
        id=data["id"],
        title=_paragraphs(data["title"]),
        summary=_paragraphs(data["summary"]),
        why=_paragraphs(data["why"]),
        references=_string_list(data["references"], "references", path),
        signals=Signals(
            preflight=_string_list(signals["preflight"], "signals.preflight", path),
            doctor=_string_list(signals["doctor"], "signals.doctor", path),
            lint=_string_list(signals["lint"], "signals.lint", path),
        ),
        fix=Fix(
            **{key: _paragraphs(data["fix"][key]) for key in ("direct", "structural", "ci_guard")},
            frameworks={name.lower(): _paragraphs(text) for name, text in frameworks.items()},
        ),
        repro=repro,
        folder=folder,
    )


class Catalogue:
    """All playbooks of one folder, by id, in a stable order."""

    def __init__(self, playbooks: list[Playbook]) -> None:
        self._by_id: dict[str, Playbook] = {}
        for playbook in playbooks:
            if playbook.id in self._by_id:
                raise PlaybookError(
                    f"{playbook.folder / PLAYBOOK_FILE}: duplicate id {playbook.id!r} "
                    f"(also in {self._by_id[playbook.id].folder / PLAYBOOK_FILE})"
                )
            self._by_id[playbook.id] = playbook

    def __iter__(self) -> Iterator[Playbook]:
        return iter(self._by_id.values())

    def __len__(self) -> int:
        return len(self._by_id)

    def __contains__(self, cause: object) -> bool:
        return cause in self._by_id

    @property
    def ids(self) -> list[str]:
        return list(self._by_id)

    def get(self, cause: str) -> Playbook:
        try:
            return self._by_id[cause]
        except KeyError:
            raise PlaybookError(
                f"no playbook {cause!r}",
                hint=f"Known causes: {', '.join(self._by_id)}.",
            ) from None


def load_catalogue(root: Path | None = None) -> Catalogue:
    """Load every ``<root>/<id>/playbook.toml``, skipping folders that start with ``_`` or ``.``."""
    root = default_root() if root is None else root
    if not root.is_dir():
        raise PlaybookError(f"{root}: not a folder of playbooks")
    folders = sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith(("_", ".", "__")))
    return Catalogue([load_playbook(folder) for folder in folders])
