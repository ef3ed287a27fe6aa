"""A non-editable install carries the catalogue inside the package."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from ..conftest import REPO


def test_wheel_install_ships_the_playbooks(tmp_path: Path) -> None:
    wheels, target = tmp_path / "wheels", tmp_path / "site"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--quiet",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(wheels),
            str(REPO),
        ],
        check=True,
        timeout=300,
        capture_output=True,
    )
    (wheel,) = wheels.glob("ncclcheck-*.whl")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-deps",
            "--target",
            str(target),
            str(wheel),
        ],
        check=True,
        timeout=300,
        capture_output=True,
    )
    # Run from outside the checkout with only the installed copy on the path.
    env = {**os.environ, "PYTHONPATH": str(target)}
    result = subprocess.run(
        [sys.executable, "-m", "ncclcheck", "playbooks", "--json"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    playbooks = json.loads(result.stdout)
    assert len(playbooks) == 12
    for playbook in playbooks:
        assert Path(playbook["repro"]).is_relative_to(target / "ncclcheck" / "_playbooks")
        assert Path(playbook["repro"]).is_file() and Path(playbook["fixed"]).is_file()


def test_without_a_c_compiler_the_wheel_is_pure_and_records_in_python(tmp_path: Path) -> None:
    wheels, target = tmp_path / "wheels", tmp_path / "site"
    # a linker that fails, as on a machine without a C compiler
    env = {**os.environ, "LDSHARED": "false"}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(wheels),
            str(REPO),
        ],
        timeout=300,
        capture_output=True,
        text=True,
        env=env,
    )
    assert done.returncode == 0, done.stderr
    (wheel,) = wheels.glob("ncclcheck-*.whl")
    assert wheel.name.endswith("-py3-none-any.whl")  # no compiled module in it
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(target), str(wheel)],
        check=True,
        timeout=300,
        capture_output=True,
    )
    assert not list((target / "ncclcheck" / "record").glob("_fastcall*"))
    probe = (
        "import tempfile; from ncclcheck.record import hotstate; "
        "from ncclcheck.record.recorder import Recorder; "
        "r = Recorder(tempfile.mkdtemp(), 0, 5, 1, 10); "
        "wrapped = r.wrap_collective('barrier', lambda group=None: 0); "
        "print(hotstate.fastcall, type(r.state).__name__, wrapped.__name__)"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(target)},
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert result.stdout.split() == ["None", "PyState", "<lambda>"]


def _name(requirement: str) -> str:
    """A requirement's distribution name, normalised as pip compares them (PEP 503)."""
    import re

    bare = re.split(r"[\s<>=!~;\[]", requirement.strip(), maxsplit=1)[0]
    return re.sub(r"[-_.]+", "-", bare).lower()


def test_every_dependency_but_torch_is_pinned_for_the_suite() -> None:
    """`make install` installs with -c constraints.txt: a dependency added to pyproject.toml
    without a pin would be resolved anew on every machine, which is what broke a new
    machine's `make test` (a framework's newest release)."""
    try:
        import tomllib
    except ImportError:  # Python 3.10
        import tomli as tomllib

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    wanted = {_name(r) for r in [*project["dependencies"], *project["optional-dependencies"]["test"]]}
    wanted -= {"torch", "tomli"}  # torch: TORCH_SPEC's; tomli: Python < 3.11 only
    pins = {}
    for line in (REPO / "constraints.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, _, version = line.partition("==")
            assert version, f"constraints.txt pins exact versions only: {line!r}"
            pins[_name(name)] = version
    assert sorted(wanted - pins.keys()) == []
    assert "torch" not in pins and "ncclcheck" not in pins
