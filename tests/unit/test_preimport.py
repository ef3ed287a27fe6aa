"""record/preimport.py: what a forked rank imported beyond its server, noted and imported."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch.utils.data  # noqa: F401  (a package with submodules, loaded here)

from ncclcheck.record import preimport


def test_only_the_outermost_new_torch_modules_are_noted(tmp_path: Path) -> None:
    before = {name for name in sys.modules if not name.startswith("torch.utils")}
    preimport.note_new_imports(before, str(tmp_path))
    noted = json.loads((tmp_path / preimport.FILE_NAME).read_text(encoding="utf-8"))
    assert noted == ["torch.utils"]  # not torch.utils.data, which comes with it


def test_what_was_noted_is_imported_and_what_cannot_be_is_left(tmp_path: Path) -> None:
    name = "torch.utils.bundled_inputs"
    sys.modules.pop(name, None)
    (tmp_path / preimport.FILE_NAME).write_text(json.dumps(["torch.no_such_module", name]), encoding="utf-8")
    preimport.import_noted(str(tmp_path))
    assert name in sys.modules and "torch.no_such_module" not in sys.modules


def test_a_folder_where_nothing_was_noted_imports_nothing(tmp_path: Path) -> None:
    loaded = set(sys.modules)
    preimport.import_noted(str(tmp_path))
    assert set(sys.modules) == loaded
