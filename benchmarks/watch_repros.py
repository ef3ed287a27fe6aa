"""watch on every hanging playbook repro (python benchmarks/watch_repros.py).

Each repro runs under ``ncclcheck watch --after 10 --every 2 --on-hang kill`` on this
machine (torchrun, gloo; the process group's timeout far above watch's); the line per
repro says the cause watch's report gives against the playbook's, whether its site is
the playbook's line, and the seconds from watch's start to its exit (the ranks' start,
the hang, watch's --after, the capture and doctor's two looks all included).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from ncclcheck.catalogue import load_catalogue  # noqa: E402


def main() -> None:
    catalogue = load_catalogue(REPO / "playbooks")
    hanging = [
        catalogue.get(cause) for cause in catalogue.ids if catalogue.get(cause).repro.outcome == "hang"
    ]
    print(
        f"watch --after 10 --every 2 --on-hang kill on {len(hanging)} hanging repros, {os.cpu_count()} CPUs"
    )
    right = 0
    for playbook in hanging:
        with tempfile.TemporaryDirectory(prefix="watch-repro-") as out:
            argv = [sys.executable, "-m", "ncclcheck", "watch", "--json", "--after", "10", "--every", "2"]
            argv += ["--on-hang", "kill", "--out", out, "--nproc-per-node", str(playbook.repro.nproc)]
            start = time.monotonic()
            done = subprocess.run(
                [*argv, str(playbook.repro_path)],
                capture_output=True,
                text=True,
                env={**os.environ, "REPRO_TIMEOUT_S": "300"},
                cwd=REPO,
                timeout=400,
                check=False,
            )
            wall = time.monotonic() - start
        report = json.loads(done.stdout) if done.stdout.strip() else {}
        finding = (report.get("findings") or [{}])[0]
        site_line = next(
            n
            for n, text in enumerate(playbook.repro_path.read_text().splitlines(), 1)
            if playbook.repro.site in text
        )
        site_ok = str(finding.get("site", "")).endswith(f":{site_line}")
        cause_ok = finding.get("cause") == playbook.id
        right += cause_ok and site_ok
        print(
            f"  {playbook.id:<28} exit {done.returncode}  cause {finding.get('cause', '-'):<28} "
            f"{'right' if cause_ok else 'WRONG'}, site {'right' if site_ok else 'other'}  {wall:5.1f} s"
        )
    print(f"  cause and site right on {right} of {len(hanging)}")


if __name__ == "__main__":
    main()
