"""doctor on real hung jobs: torchrun with gloo and a long backend timeout."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

from ncclcheck.evidence.movement import usage
from ncclcheck.launch.proctree import kill_tree

from ..conftest import (
    JOB_BOUND_S,
    JOB_PG_TIMEOUT_S,
    PLAYBOOKS,
    REPO,
    SCRIPTS,
    WAIT_S,
    line_in,
    run_bounded,
    run_to_its_end,
    torchrun_argv,
)

pytestmark = pytest.mark.ranks


@dataclass
class HungJob:
    shell: subprocess.Popen[bytes]
    script: Path
    launcher: str = "torch.distributed.run"  # the module whose process holds the ranks

    def agent(self) -> psutil.Process:
        return next(
            p
            for p in psutil.Process(self.shell.pid).children(recursive=True)
            if self.launcher in " ".join(p.cmdline())
        )

    def ranks(self) -> list[psutil.Process]:
        return [p for p in self.agent().children() if "RANK" in p.environ()]


def doctor(*pids: int, cwd: Path = REPO, interval: float = 1.0) -> tuple[int, dict]:  # type: ignore[type-arg]
    argv = [sys.executable, "-m", "ncclcheck", "doctor", "--json", "--interval", str(interval)]
    for pid in pids:
        argv += ["--pid", str(pid)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=WAIT_S, cwd=cwd, check=False)
    return done.returncode, json.loads(done.stdout) if done.stdout.strip() else {}


def wait_until(condition: Callable[[], bool], what: str) -> None:
    """Wait for something to be seen, not for a fixed time: on a loaded machine a process
    takes many times longer to start than on an idle one."""
    deadline = time.monotonic() + WAIT_S
    while not condition():
        assert time.monotonic() < deadline, f"not within {WAIT_S:.0f} s: {what}"
        time.sleep(0.2)


def command_of(pid: int) -> list[str]:
    """Process ``pid``'s command line (empty if it cannot be read): what it has exec'd."""
    try:
        return psutil.Process(pid).cmdline()
    except psutil.Error:
        return []


def from_shell(command: str, cwd: Path = REPO) -> subprocess.Popen[bytes]:
    """A job started from a shell in a session of its own, as people start torchrun."""
    return subprocess.Popen(
        ["/bin/sh", "-c", command],
        cwd=cwd,
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


# torchrun's argument that runs a script with NCCL's timing on gloo (record/nccl_timing.py)
NCCL_TIMING = "-m ncclcheck.record.nccl_timing"


def start_hung(
    script: Path,
    nproc: int,
    cwd: Path = REPO,
    env: dict[str, str] | None = None,
    runner: str = "",
    accelerate_config: Path | None = None,
) -> HungJob:
    """torchrun started from a shell, as people do; returns once every rank is stuck.
    ``runner``: what torchrun runs the script with (NCCL_TIMING), if not python;
    ``accelerate_config``: accelerate launch --config_file starts the job instead."""
    assignments = "".join(f"{name}={shlex.quote(value)} " for name, value in (env or {}).items())
    launcher = f"-m torch.distributed.run --standalone --nproc-per-node={nproc}"
    if accelerate_config is not None:
        launcher = (
            f"-m accelerate.commands.launch --config_file {accelerate_config} --num_processes {nproc} "
            "--main_process_port 0"
        )
    command = f"{assignments}REPRO_TIMEOUT_S={JOB_PG_TIMEOUT_S} {sys.executable} {launcher} {runner} {script}"
    module = "accelerate.commands.launch" if accelerate_config is not None else "torch.distributed.run"
    job = HungJob(from_shell(command, cwd), script, module)
    deadline = time.monotonic() + WAIT_S
    previous = None
    moved_before = None
    while time.monotonic() < deadline:
        time.sleep(1)
        try:
            if len(job.ranks()) < nproc:
                continue
            moved = bytes_moved(job.ranks())
        except (StopIteration, psutil.Error):
            continue
        # Ranks that wait move no bytes; ranks that import torch, train, or run a loop of
        # collectives do (files, sockets). Until they are quiet, a look with py-spy would
        # only slow them down.
        quiet = moved_before is not None and moved - moved_before < QUIET_BYTES
        moved_before = moved
        if not quiet:
            previous = None
            continue
        # one look each time: two quiet looks in a row that agree tell it settled
        _code, report = doctor(job.agent().pid, cwd=cwd, interval=0)
        summary = json.dumps(report.get("summary", {}).get("classes"))
        # Every hanging repro ends with at least one rank waiting in a collective; before
        # that, two looks can agree by chance (a rank computing its step, say).
        waiting = any(r.get("state") == "in-collective" for r in report.get("ranks", []))
        if waiting and report.get("findings") and summary == previous:
            return job
        previous = summary
    stop(job)
    raise AssertionError(f"{script} did not settle into a hang")


# What a hung job's ranks may still read or write between two looks (a log line, say)
QUIET_BYTES = 64 * 1024


def bytes_moved(ranks: list[psutil.Process]) -> int:
    """Bytes the ranks and the processes they started read and wrote through system
    calls, sockets included, so far: doctor's own counter (evidence/movement.py)."""
    return sum(used.io_bytes for used in usage({i: p.pid for i, p in enumerate(ranks)}).values())


def doctor_on_hung(
    script: Path,
    nproc: int,
    env: dict[str, str] | None = None,
    runner: str = "",
    accelerate_config: Path | None = None,
) -> tuple[int, dict]:  # type: ignore[type-arg]
    """Start ``script`` under torchrun (or accelerate launch), wait until it hangs, run
    doctor on the launcher's process, reap."""
    job = start_hung(script, nproc, env=env, runner=runner, accelerate_config=accelerate_config)
    try:
        return doctor(job.agent().pid)
    finally:
        stop(job)


def stop(job: HungJob) -> None:
    kill_tree(job.shell.pid)
    job.shell.wait(timeout=30)


@pytest.fixture
def hung_conditional() -> Iterator[HungJob]:
    job = start_hung(PLAYBOOKS / "rank-conditional-collective" / "repro.py", 2)
    yield job
    stop(job)


HANGING_CAUSES = [
    "rank-conditional-collective",
    "uneven-eval-batches",
    "missing-distributed-sampler",
    "collective-order-mismatch",
    "rank-early-exit",
    "unsynchronized-decision",
    "rank-exception",
    "straggler",
    "transport-hang",
]
# Where a stack cannot show what a trace does, doctor names another site than preflight:
# the decision on a value each rank computed lies before the wait, and doctor sees the
# wait (the decision is in its evidence only when the source shows it).
DOCTOR_SITES_THE_WAIT = {"unsynchronized-decision"}
# Repros whose hung ranks wait where and as they do under NCCL's timing (a barrier, DDP's
# backward, outside any call, stopped): seen alike rank by rank, state and place, with the
# same verdict, cause and site. test_nccl_timing holds doctor to every hanging repro, so
# these are not hung a second time on gloo's timing.
ALIKE_UNDER_NCCL_TIMING = {"rank-early-exit", "unsynchronized-decision", "straggler", "transport-hang"}


@pytest.mark.parametrize("cause", [cause for cause in HANGING_CAUSES if cause not in ALIKE_UNDER_NCCL_TIMING])
def test_doctor_and_preflight_name_the_same_cause_site_and_ranks(catalogue, cause: str) -> None:
    """doctor on the hung reproducer names what its playbook expects: the cause, the site
    and the ranks that test_preflight's per-repro test holds preflight's dry run to. The
    dry run is not repeated here (xdist runs the two tests on different workers)."""
    playbook = catalogue.get(cause)
    code, report = doctor_on_hung(playbook.repro_path, playbook.repro.nproc)
    # the straggler's rank 0 sleeps in its slow write, outside every collective: doctor's looks
    # cannot time the wait, so it is no hang of the collectives yet (watch times it)
    said = json.dumps({k: report.get(k) for k in ("verdict", "summary", "findings")}, indent=1)
    if cause == "straggler":
        assert (code, report["verdict"]) == (0, "waiting"), said
    else:
        assert code == 1, said
    finding = report["findings"][0]
    assert finding["cause"] == cause, finding
    if cause not in DOCTOR_SITES_THE_WAIT:
        site = f"{playbook.folder.relative_to(REPO) / 'repro.py'}:{playbook.repro.site_line(playbook.folder)}"
        assert finding["site"] == site, finding
    expected = sorted(playbook.repro.ranks + playbook.repro.absent_ranks)
    assert sorted(finding["ranks"] + finding["absent_ranks"]) == expected
    if cause == "transport-hang":  # alike stacks may hide ranks a call apart: say how to tell
        assert any("TORCH_FR_BUFFER_SIZE" in line for line in finding["evidence"]), finding


def test_attach_by_agent_rank_or_shell_gives_the_same_diagnosis(hung_conditional: HungJob) -> None:
    job = hung_conditional
    pids = [job.agent().pid, job.ranks()[1].pid, job.shell.pid]
    findings = []
    for pid in pids:
        code, report = doctor(pid)
        assert code == 1
        assert [r["rank"] for r in report["ranks"]] == [0, 1]
        findings.append({k: report["findings"][0][k] for k in ("cause", "site", "ranks")})
    assert findings[0] == findings[1] == findings[2]
    assert findings[0]["cause"] == "rank-conditional-collective"


def test_the_job_is_unchanged_after_doctor(hung_conditional: HungJob) -> None:
    job = hung_conditional
    before = [(p.pid, p.status()) for p in job.ranks()]
    _code, first = doctor(job.agent().pid)
    _code, second = doctor(job.agent().pid)
    after = [(p.pid, p.status()) for p in job.ranks()]
    assert before == after  # still running, nothing signalled or stopped
    assert first["summary"]["classes"] == second["summary"]["classes"]


def test_collective_hidden_in_a_helper_module() -> None:
    project = SCRIPTS / "helper_project"
    job = start_hung(Path("train.py"), 2, cwd=project)
    try:
        _code, report = doctor(job.agent().pid, cwd=project)
    finally:
        stop(job)
    finding = report["findings"][0]
    assert finding["cause"] == "rank-conditional-collective"
    assert finding["site"].startswith("metrics.py:")
    assert any("`if is_main`" in line for line in finding["evidence"])


def rank0_alone_finding(script_name: str, site_fragment: str) -> dict:  # type: ignore[type-arg]
    """Doctor on a hung job in which rank 0 alone reached a collective library code
    issued: a rank-conditional-collective at the user's line holding ``site_fragment``."""
    script = SCRIPTS / script_name
    code, report = doctor_on_hung(script, 2)
    assert code == 1
    finding: dict = report["findings"][0]  # type: ignore[type-arg]
    assert finding["cause"] == "rank-conditional-collective", finding
    assert (finding["ranks"], finding["absent_ranks"]) == ([0], [1])
    assert finding["site"] == f"tests/scripts/{script_name}:{line_in(script, site_fragment)}"
    return finding


def test_rank0_stuck_in_ddp_buffer_broadcast_is_a_rank_conditional_collective() -> None:
    # Rank 0 evaluates alone through DDP: its stack ends in DDP's forward(), whose C++
    # broadcast shows no frame; rank 1 waits in the barrier after the `if`.
    finding = rank0_alone_finding("ddp_buffers_rank0_eval.py", "BatchNorm buffers")
    assert finding["op"].startswith("_broadcast_coalesced (DDP's broadcast of buffers")
    assert any("`if dist.get_rank() == 0`" in e for e in finding["evidence"])


def test_rank0_stuck_in_syncbatchnorm_is_named_with_what_to_do() -> None:
    # Rank 0's model(x) in training mode: the user's line, then torch's Module.__call__,
    # the layer's forward and an autograd Function's forward issue the all_gather.
    finding = rank0_alone_finding("syncbn_rank0_preview_hang.py", "preview = model(")
    assert finding["op"] == "all_gather (SyncBatchNorm's batch statistics, in training mode)"
    assert any(e.startswith("SyncBatchNorm synchronises") for e in finding["evidence"])


def test_rank0_stuck_in_a_distributed_checkpoint_save_is_named_with_what_to_do() -> None:
    # Every frame between the user's dcp.save() and the collective is torch.distributed's
    # own: the checkpoint module's, not the wrappers', names the wait.
    finding = rank0_alone_finding("dcp_rank0_save.py", "dcp.save(")
    assert finding["op"].endswith(
        "(torch.distributed.checkpoint coordinating a save or load across the ranks)"
    )
    assert any(e.startswith("torch.distributed.checkpoint's save() and load()") for e in finding["evidence"])


def test_decoding_stopped_by_one_ranks_own_end_of_sequence_is_found_from_the_stacks() -> None:
    # Rank 0 still decodes (its forward all-gathers the sharded weight), rank 1 has left
    # the decoding loop and waits in the all_reduce after it.
    script = SCRIPTS / "generate_until_eos.py"
    code, report = doctor_on_hung(script, 2)
    assert code == 1
    finding = report["findings"][0]
    assert finding["cause"] == "data-dependent-branch", finding
    stop_line = line_in(script, "break  # out of the loop on this rank alone")
    assert finding["site"] == f"tests/scripts/generate_until_eos.py:{stop_line}"
    assert (finding["ranks"], finding["absent_ranks"]) == ([1], [0])
    # the API the script called, not the all_gather_single that torch calls inside it
    blocking = {c["ranks"]: c["blocking"] for c in report["summary"]["classes"]}
    assert blocking == {"0": "all_gather_into_tensor", "1": "all_reduce"}, blocking


def test_a_rank_that_never_reached_a_loop_is_not_said_to_have_left_it(tmp_path: Path) -> None:
    # Rank 0 broadcasts the resumed step under `if should_resume(...)` (a file check it
    # made after staging the file), above the training loop; rank 1 found no file and
    # waits in the loop's first gradient all_reduce. Rank 0 never reached the loop.
    script = SCRIPTS / "resume_file_race.py"
    code, report = doctor_on_hung(script, 2, env={"CKPT_DIR": str(tmp_path)})
    assert code == 1
    finding = report["findings"][0]
    assert finding["cause"] == "unsynchronized-decision", finding
    assert (
        finding["site"]
        == f"tests/scripts/resume_file_race.py:{line_in(script, 'dist.broadcast(start, src=0)')}"
    )
    assert (finding["ranks"], finding["absent_ranks"]) == ([0], [1])
    assert any("is a file check each rank makes for itself" in line for line in finding["evidence"])


def test_a_new_group_some_ranks_skipped_is_named_from_the_group_being_created() -> None:
    # Ranks 0-1 created the eval group under their membership test, rank 2 did not: the
    # group every rank creates next is "2" on ranks 0-1 and "1" on rank 2. Either all
    # three wait in that new_group (read from py-spy's locals), or rank 2, having found
    # the stale keys of group "1", already waits in its all_reduce.
    from ncclcheck.communicates import OP_ADVICE

    script = SCRIPTS / "new_group_on_members.py"
    code, report = doctor_on_hung(script, 3)
    assert code == 1
    finding = report["findings"][0]
    assert finding["cause"] == "rank-conditional-collective", finding
    if finding["message"].startswith("every rank waits in new_group"):
        site = line_in(script, "everyone = dist.new_group(")
        assert finding["site"] == f"tests/scripts/new_group_on_members.py:{site}"
        assert 'ranks 0-1: name of the group being created = "2"' in finding["evidence"]
        assert 'rank 2: name of the group being created = "1"' in finding["evidence"]
    else:
        assert OP_ADVICE["new_group"] in finding["evidence"], finding


def doctor_once_both_wait(pid: int) -> dict:  # type: ignore[type-arg]
    """doctor on a job of two ranks started without torchrun, once both wait in a collective."""
    deadline, report = time.monotonic() + WAIT_S, {}
    while time.monotonic() < deadline:
        time.sleep(2)
        code, report = doctor(pid)
        waiting = [r for r in report.get("ranks", []) if r.get("state") == "in-collective"]
        if code == 1 and len(waiting) == 2:
            break
    return report


def test_a_job_started_by_mp_spawn_is_read_from_its_stacks() -> None:
    # No RANK in the environment: the ranks are spawn's children, each under
    # torch.multiprocessing.spawn's _wrap(fn, i, ...), whose i is the rank.
    script = SCRIPTS / "spawn_rank0_collective.py"
    # the process group's timeout outlasts the wait for both ranks and doctor's looks
    shell = from_shell(
        f"REPRO_TIMEOUT_S={JOB_PG_TIMEOUT_S} SPAWN_PORT={_free_port()} {sys.executable} {script}"
    )
    try:
        report = doctor_once_both_wait(shell.pid)
        # from one rank's pid: its siblings are found too
        _code, from_rank = doctor(report["ranks"][1]["pid"])
    finally:
        kill_tree(shell.pid)
        shell.wait(timeout=30)
    assert [r["rank"] for r in report["ranks"]] == [0, 1], report
    finding = report["findings"][0]
    assert finding["cause"] == "rank-conditional-collective", finding
    assert finding["site"] == f"tests/scripts/spawn_rank0_collective.py:{line_in(script, '# rank 0 alone')}"
    assert (finding["ranks"], finding["absent_ranks"]) == ([0], [1])
    assert [r["rank"] for r in from_rank["ranks"]] == [0, 1]
    assert from_rank["findings"][0]["site"] == finding["site"]


def test_a_single_python_process_is_not_a_distributed_job() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", "import time\nprint('ready', flush=True)\nwhile True: time.sleep(1)"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "ready\n"  # in its loop
        result = run_bounded(
            [sys.executable, "-m", "ncclcheck", "doctor", "--pid", str(proc.pid)], WAIT_S, cwd=REPO
        )
    finally:
        proc.kill()
        proc.wait()
    assert result.returncode == 2
    assert "not a distributed job" in result.output
    assert "<module>" in result.output  # its stack


def test_a_launcher_whose_ranks_have_not_started_is_named_as_such() -> None:
    # the first of two torchrun "nodes" waits in the rendezvous for the second: no rank yet
    agent = subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--nnodes=2", "--nproc-per-node=1",
         "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{_free_port()}",
         str(PLAYBOOKS / "rank-conditional-collective" / "repro.py")],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=REPO, start_new_session=True,
    )  # fmt: skip
    try:
        wait_until(lambda: "torch.distributed.run" in command_of(agent.pid), "the agent started")
        result = run_bounded(
            [sys.executable, "-m", "ncclcheck", "doctor", "--pid", str(agent.pid)], WAIT_S, cwd=REPO
        )
    finally:
        kill_tree(agent.pid)
        agent.wait(timeout=30)
    assert result.returncode == 2, result.output
    assert f"pid {agent.pid} (torch.distributed.run) has not started its ranks" in result.output


@pytest.mark.parametrize("kind", ["missing", "not-python"])
def test_bad_pids_are_exit_2(kind: str) -> None:
    helper = None
    if kind == "missing":
        pid = 4_000_000  # above pid_max
    else:
        helper = subprocess.Popen(["sleep", "3600"])  # killed below
        pid = helper.pid
    try:
        result = run_bounded(
            [sys.executable, "-m", "ncclcheck", "doctor", "--pid", str(pid)], WAIT_S, cwd=REPO
        )
    finally:
        if helper is not None:
            helper.kill()
            helper.wait()
    assert result.returncode == 2, result.output
    assert ("no process with pid" if kind == "missing" else "no Python process") in result.output
    assert "Traceback" not in result.output


@pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("setpriv") is None or not Path("/usr/bin/python3").exists(),
    reason="needs root and setpriv: a rank of another user, read without CAP_SYS_PTRACE",
)
def test_no_permission_to_read_a_rank_is_explained_with_exit_2() -> None:
    # A "rank" owned by nobody, and doctor as root without CAP_SYS_PTRACE: what an
    # engineer meets who is not the job's user, or in a container without the capability.
    target = subprocess.Popen(
        [
            "setpriv",
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "/usr/bin/python3",
            "-c",
            "import time; time.sleep(3600)",  # killed below; outlasts doctor on a loaded machine
        ],
        env={"RANK": "0", "WORLD_SIZE": "2", "PATH": "/usr/bin:/bin"},
    )
    try:
        wait_until(lambda: command_of(target.pid)[:1] == ["/usr/bin/python3"], "setpriv ran python3")
        result = run_bounded(
            [
                "setpriv",
                "--inh-caps=-sys_ptrace",
                "--bounding-set=-sys_ptrace",
                sys.executable,
                "-m",
                "ncclcheck",
                "doctor",
                "--pid",
                str(target.pid),
            ],
            WAIT_S,
            cwd=REPO,
        )
    finally:
        target.kill()
        target.wait(timeout=10)
    assert result.returncode == 2, result.output
    assert f"no permission to read the stack of pid {target.pid}" in result.output
    assert "SYS_PTRACE" in result.output and "ptrace_scope" in result.output
    assert "Traceback" not in result.output


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_dumps_from_two_nodes_are_merged_with_from(tmp_path: Path) -> None:
    """Two torchrun agents (nodes) on this machine, one rank each: each host's doctor
    sees half the job; their dumps together give the diagnosis."""
    script = PLAYBOOKS / "rank-conditional-collective" / "repro.py"
    port = _free_port()
    shells = []
    for node in (0, 1):
        command = (
            f"REPRO_TIMEOUT_S={JOB_PG_TIMEOUT_S} {sys.executable} -m torch.distributed.run --nnodes=2 "
            f"--node-rank={node} --nproc-per-node=1 --rdzv-backend=c10d "
            f"--rdzv-endpoint=localhost:{port} --rdzv-id=doctor-two-nodes {script}"
        )
        shells.append(from_shell(command))
    jobs = [HungJob(shell, script) for shell in shells]
    try:
        deadline = time.monotonic() + WAIT_S
        while time.monotonic() < deadline:
            time.sleep(2)
            try:
                if all(len(job.ranks()) == 1 for job in jobs):
                    break
            except (StopIteration, psutil.Error):
                continue
        # past start-up: rank 0 in its all_reduce, rank 1 in its barrier
        waiting = [False, False]
        while not all(waiting) and time.monotonic() < deadline:
            for index, job in enumerate(jobs):
                _code, seen = doctor(job.agent().pid)
                waiting[index] = any(r.get("state") == "in-collective" for r in seen.get("ranks", []))
            time.sleep(1)
        assert all(waiting), "the two-node job did not settle into its hang"
        code, alone = doctor(jobs[0].agent().pid)
        assert code == 1
        # From one "host" the other rank runs elsewhere (c10d rendezvous, not --node-rank,
        # decides which agent gets rank 0): nothing here says where it is, so it is never
        # called crashed; what decides is its stack
        hosted = [r["rank"] for r in alone["ranks"]]
        (finding,) = alone["findings"]
        assert (finding["severity"], finding["absent_ranks"]) == ("warning", []), finding
        assert f"rank {1 - hosted[0]} runs on other hosts" in finding["message"], finding["message"]
        assert alone["summary"]["not_on_this_host"].startswith(f"rank {1 - hosted[0]} runs on other hosts")
        for job in jobs:
            result = run_bounded(
                [
                    sys.executable,
                    "-m",
                    "ncclcheck",
                    "doctor",
                    "--pid",
                    str(job.agent().pid),
                    "--dump-to",
                    str(tmp_path),
                ],
                WAIT_S,
                cwd=REPO,
            )
            assert result.returncode == 0, result.output
    finally:
        for job in jobs:
            stop(job)
    dumps = sorted(p.name for p in tmp_path.iterdir())
    assert dumps == [f"{socket.gethostname()}-node0.json", f"{socket.gethostname()}-node1.json"]
    # private: the stacks carry local variables' values
    assert all(stat.S_IMODE((tmp_path / name).stat().st_mode) == 0o600 for name in dumps)
    argv = [sys.executable, "-m", "ncclcheck", "doctor", "--json", "--from", str(tmp_path)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=WAIT_S, cwd=REPO, check=False)
    assert done.returncode == 1, done.stderr
    finding = json.loads(done.stdout)["findings"][0]
    assert (finding["cause"], finding["ranks"], finding["absent_ranks"]) == (
        "rank-conditional-collective",
        [0],
        [1],
    )
    assert finding["site"].startswith("playbooks/rank-conditional-collective/repro.py:")


@pytest.mark.parametrize("content", ["", "{not json", '{"format": "something-else"}'])
def test_from_a_directory_without_good_dumps_is_exit_2(tmp_path: Path, content: str) -> None:
    if content:
        (tmp_path / "host-node0.json").write_text(content)
    argv = [sys.executable, "-m", "ncclcheck", "doctor", "--from", str(tmp_path)]
    result = run_bounded(argv, WAIT_S, cwd=REPO)
    assert result.returncode == 2, result.output
    assert "doctor dump" in result.output and "Traceback" not in result.output


def test_a_flight_recorder_dump_is_read_as_extra_evidence(tmp_path: Path) -> None:
    """Both ranks wait in work.wait() at one line: the stacks alone look like a transport
    hang; the JSON dumps the ranks wrote show rank 0 issued an all_reduce where rank 1
    issued a barrier."""
    prefix = tmp_path / "fr_rank_"
    command = (
        f"TORCH_FR_BUFFER_SIZE=200 TORCH_FR_DUMP_TEMP_FILE={prefix} REPRO_TIMEOUT_S={JOB_PG_TIMEOUT_S} "
        f"{sys.executable} -m torch.distributed.run --standalone --nproc-per-node=2 "
        f"{SCRIPTS / 'flight_recorder_dump.py'}"
    )
    job = HungJob(from_shell(command), SCRIPTS / "flight_recorder_dump.py")
    try:
        wait_until(lambda: all(Path(f"{prefix}{r}").exists() for r in (0, 1)), "the ranks wrote their dumps")
        # then into work.wait(): until doctor sees both ranks there (not a fixed pause, which
        # a loaded machine outlasts)
        deadline = time.monotonic() + WAIT_S
        while True:
            code, report = doctor(job.agent().pid)
            waiting = [r for r in report.get("ranks", []) if r.get("state") == "in-collective"]
            if len(waiting) == 2 or time.monotonic() > deadline:
                break
            time.sleep(1)
    finally:
        stop(job)
    assert code == 1
    finding = report["findings"][0]
    assert finding["cause"] == "collective-order-mismatch", finding
    assert (finding["ranks"], finding["absent_ranks"]) == ([0], [1])
    assert (
        "Flight Recorder: the ranks disagree on group 0 (default_pg): rank 0: #4 gloo:all_reduce; "
        "rank 1: #4 gloo:barrier" in finding["evidence"]
    )


def test_a_dead_jobs_py_spy_dumps_are_diagnosed_after_the_fact(tmp_path: Path) -> None:
    """What cluster tooling keeps of a hung job: py-spy's text dump of one rank (under an
    ``== rank N ==`` header) and its JSON dump of the other, taken while it hung; the job
    is then gone, and doctor --from reads what is left."""
    playbook_repro = PLAYBOOKS / "rank-conditional-collective" / "repro.py"
    job = start_hung(playbook_repro.relative_to(REPO), 2)
    try:
        by_rank = {int(p.environ()["RANK"]): p.pid for p in job.ranks()}
        py_spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
        text = subprocess.run(
            [py_spy, "dump", "--pid", str(by_rank[0])], capture_output=True, text=True, timeout=WAIT_S
        )
        as_json = subprocess.run(
            [py_spy, "dump", "--json", "--pid", str(by_rank[1])],
            capture_output=True,
            text=True,
            timeout=WAIT_S,
        )
    finally:
        stop(job)
    (tmp_path / "dumps.txt").write_text("== rank 0 ==\n" + text.stdout)
    (tmp_path / "rank1.json").write_text(as_json.stdout)
    argv = [sys.executable, "-m", "ncclcheck", "doctor", "--json", "--from", str(tmp_path)]
    result = run_bounded(argv, WAIT_S, cwd=REPO)
    assert result.returncode == 1, result.output
    finding = json.loads(result.output[result.output.index("{") :])["findings"][0]
    assert finding["cause"] == "rank-conditional-collective", finding
    site_line = line_in(playbook_repro, "dist.all_reduce(totals)")
    assert finding["site"] == f"playbooks/rank-conditional-collective/repro.py:{site_line}"
    assert (finding["ranks"], finding["absent_ranks"]) == ([0], [1])


def test_a_job_of_srun_tasks_is_read_from_their_slurm_variables() -> None:
    """Tasks as srun starts them: SLURM_PROCID / SLURM_NTASKS / SLURM_LOCALID, no RANK,
    no torchrun; rank 0 alone all-reduces, rank 1 waits in the barrier."""
    script = SCRIPTS / "slurm_rank0_collective.py"
    port = _free_port()
    tasks = " & ".join(
        f"SLURM_JOB_ID=77 SLURM_PROCID={rank} SLURM_LOCALID={rank} SLURM_NODEID=0 SLURM_NTASKS=2 "
        f"MASTER_ADDR=127.0.0.1 MASTER_PORT={port} REPRO_TIMEOUT_S={JOB_PG_TIMEOUT_S} "
        f"{sys.executable} {script}"
        for rank in (0, 1)
    )
    shell = from_shell(f"{tasks} & wait")
    try:
        report = doctor_once_both_wait(shell.pid)
    finally:
        kill_tree(shell.pid)
        shell.wait(timeout=30)
    assert [r["rank"] for r in report["ranks"]] == [0, 1], report
    finding = report["findings"][0]
    assert finding["cause"] == "rank-conditional-collective", finding
    assert finding["site"] == f"tests/scripts/slurm_rank0_collective.py:{line_in(script, '# rank 0 alone')}"
    assert (finding["ranks"], finding["absent_ranks"]) == ([0], [1])


@pytest.mark.parametrize("mode", ["broken", "fixed"])
def test_an_error_swallowed_around_a_helpers_collective_is_named_at_the_handler(mode: str) -> None:
    """The loop runs six passes on every rank (range(6)); rank 1's third pass raised in the
    helper and the caller's handler swallowed it: the ranks are a call apart, not at passes
    of different counts. doctor names the handler; the fixed twin runs to its end."""
    script = SCRIPTS / "scores_skip_bad_records.py"
    if mode == "fixed":
        result = run_to_its_end(torchrun_argv(script, 2), JOB_BOUND_S, env={"MODE": "fixed"})
        assert result.returncode == 0, result.output[-3000:]
        return
    code, report = doctor_on_hung(script, 2)
    assert code == 1
    finding = report["findings"][0]
    assert finding["cause"] == "rank-exception", finding
    handler = line_in(script, "except ValueError as err:  # a bad shard")
    assert f"handler at tests/scripts/scores_skip_bad_records.py:{handler}" in finding["message"], finding
    assert (finding["ranks"], finding["absent_ranks"]) == ([0], [1])


# Shapes in which the line that decided is not on the waiting ranks' common path: each
# broken script's hang as doctor reads it live (cause; site: the call the odd side
# skipped; the deciding line named in the message), and its fixed twin, which preflight
# (forcing the untaken sides of what lint reads as each rank's own decision) calls aligned.
SOURCE_SHAPES = {
    # a step that returns from its handler before backward: the rank that raised waits in
    # the fit loop's next broadcast, out of the step, which the other is still in
    "step_swallows_a_crop_error.py": (
        "rank-exception",
        "loss.backward()",
        "except RuntimeError as err:",
        (
            "            return None\n",
            "            loss = self.model(torch.zeros(len(documents), CROP)).sum() * 0.0\n",
        ),
    ),
    # training data each rank cut for itself, of other lengths: a training loop, whose
    # uneven length is a sampler's business (not uneven eval batches)
    "per_rank_shard_files.py": (
        "missing-distributed-sampler",
        "F.cross_entropy(model(features), labels).backward()",
        "for features, labels in train_loader:",
        (
            "    train_set = load(files[rank::world_size])\n"
            "    train_loader = DataLoader(train_set, batch_size=4, shuffle=True)\n",
            "    train_set = load(files)\n"
            "    sampler = torch.utils.data.DistributedSampler(train_set)\n"
            "    train_loader = DataLoader(train_set, batch_size=4, sampler=sampler)\n",
        ),
    ),
    # a step that returns under a test of the data before its backward, called from a loop
    # over a sharded loader: the rank that took it is a call ahead, at the epoch's barrier
    "step_gives_up_on_a_nan_loss.py": (
        "data-dependent-branch",
        "loss.backward()",
        "return None  # a corrupt batch",
        (
            "        loss = F.mse_loss(self.model(x), y)\n"
            "        if not torch.isfinite(loss):\n"
            "            return None  # a corrupt batch: keep the optimizer state clean\n",
            # every rank steps on every batch: a corrupt value is cleaned, not skipped
            "        loss = F.mse_loss(self.model(x.nan_to_num(0.0)), y)\n",
        ),
    ),
    # both ranks at one backward, in other FSDP collectives: their forwards skipped other
    # blocks on a draw each rank made for itself
    "fsdp2_layerdrop.py": (
        "unsynchronized-decision",
        "x = x + block(x)",
        "if self.training and random.random() < self.layerdrop:",
        (
            "        for block in self.blocks:\n"
            "            if self.training and random.random() < self.layerdrop:\n",
            "        draws = torch.tensor([random.random() for _ in self.blocks])\n"
            "        dist.broadcast(draws, src=0)  # rank 0's draws on every rank\n"
            "        for block, draw in zip(self.blocks, draws.tolist(), strict=True):\n"
            "            if self.training and draw < self.layerdrop:\n",
        ),
    ),
}


@pytest.mark.parametrize("mode", ["broken", "fixed"])
@pytest.mark.parametrize("name", sorted(SOURCE_SHAPES))
def test_doctor_names_the_line_that_sent_a_rank_elsewhere_and_the_twin_is_aligned(
    name: str, mode: str, tmp_path: Path
) -> None:
    from .test_preflight import preflight

    script = SCRIPTS / name
    cause, call, deciding, (broken_text, fixed_text) = SOURCE_SHAPES[name]
    if mode == "fixed":
        fixed = tmp_path / name
        text = script.read_text()
        assert broken_text in text
        fixed.write_text(text.replace(broken_text, fixed_text))
        proc, report = preflight("--nproc-per-node=2", str(fixed))
        assert (proc.returncode, report["verdict"]) == (0, "aligned"), (proc.stderr[-2000:], report)
        return
    code, report = doctor_on_hung(script, 2)
    assert code == 1, report
    finding = report["findings"][0]
    assert finding["cause"] == cause, finding
    assert finding["site"] == f"tests/scripts/{name}:{line_in(script, call)}", finding
    said = json.dumps(finding)
    assert f"tests/scripts/{name}:{line_in(script, deciding)}" in said, finding
