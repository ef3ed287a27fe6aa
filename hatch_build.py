"""Builds the recorder's optional C fast path, ncclcheck/record/_fastcall.c.

Wheels and editable installs (``pip install -e .``, as the Makefile does) compile it
with the C compiler Python was built with, against this Python's headers; where that
fails (no compiler, no headers) the package installs all the same and records in
Python (ncclcheck/record/recorder.py), only slower. NCCLCHECK_NO_EXTENSION=1 skips it.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sysconfig
from typing import Any

from hatchling.builders.hooks.plugin.interface import BuildHookInterface

SOURCE = os.path.join("ncclcheck", "record", "_fastcall.c")


class FastCallBuildHook(BuildHookInterface):  # type: ignore[type-arg]
    PLUGIN_NAME = "custom"

    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        if self.target_name != "wheel" or os.environ.get("NCCLCHECK_NO_EXTENSION") == "1":
            return
        suffix = sysconfig.get_config_var("EXT_SUFFIX") or ".so"
        relative = os.path.join("ncclcheck", "record", "_fastcall" + suffix)
        target = os.path.join(self.root, relative)
        # LDSHARED: the compiler and the flags this Python links its own extensions with
        # ("gcc -shared ..." on Linux; "-bundle -undefined dynamic_lookup" on macOS).
        linker = os.environ.get("LDSHARED") or sysconfig.get_config_var("LDSHARED") or "cc -shared"
        command = [
            *shlex.split(linker),
            "-O2",
            *shlex.split(sysconfig.get_config_var("CCSHARED") or "-fPIC"),
            "-I" + sysconfig.get_paths()["include"],
            os.path.join(self.root, SOURCE),
            "-o",
            target,
        ]
        try:
            subprocess.run(command, check=True, capture_output=True, text=True, timeout=300)
        except (OSError, subprocess.SubprocessError) as error:
            detail = getattr(error, "stderr", None) or str(error)
            self.app.display_warning(
                f"ncclcheck: the C fast path was not built ({detail.strip()[:300]}); "
                "the recorder runs in Python"
            )
            return
        if version == "editable":
            return  # the checkout is on the path: the module built next to its source is found
        build_data["pure_python"] = False
        build_data["infer_tag"] = True
        build_data["force_include"][target] = relative
