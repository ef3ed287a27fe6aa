"""What a dry run is told: each default in one place, and the timeouts derived from
them (one function each, saying why). The CLI, the pytest plugin and the launch code
read them from here; the ranks get the derived values through their environment and
fall back on the same defaults."""

from __future__ import annotations

import os
from dataclasses import dataclass, replace

from ncclcheck.model import TextEnum

STALL_TIMEOUT_S = 15.0  # seconds with no progress on any rank (and no CPU use): a hang
# inside a pytest test (the ncclcheck marker): the functions are small, a hang ends sooner
TEST_STALL_TIMEOUT_S = 10.0
TOTAL_TIMEOUT_S = 600.0  # a dry run's wall-clock limit
DEFAULT_EVAL_BATCHES = 8  # the last batches of each eval pass run for real
DEFAULT_TRAIN_END_BATCHES = 2  # the last batches of a train epoch run: its last step and the one before
# how long NCCL's collectives wait for their peers when the script sets no timeout (gloo's
# is 30 minutes): the real job's limit for a rank that keeps the others waiting
NCCL_DEFAULT_TIMEOUT_S = 600.0


class Launcher(TextEnum):
    """Who starts the script's ranks (--launcher); preflight starts them the same way."""

    AUTO = "auto"  # spawn where the script calls mp.spawn outside any test of its options, else torchrun
    TORCHRUN = "torchrun"
    SPAWN = "spawn"  # the script starts its own ranks with torch.multiprocessing
    SLURM = "slurm"  # srun's tasks, which know their rank from SLURM_* variables only
    ACCELERATE = "accelerate"  # accelerate launch with the user's config file
    LEGACY_LAUNCH = "torch.distributed.launch"
    DEEPSPEED = "deepspeed"


@dataclass(frozen=True)
class DryRunSettings:
    """What a dry run is told, resolved once by its command; every timeout derived from
    the stall timeout is a property below, with why."""

    train_steps: int = 5
    eval_passes: int = 1
    max_train_passes: int = 10
    stall_timeout: float = STALL_TIMEOUT_S
    probe_timeout: float = 30.0  # 0 skips the rendezvous check-in
    total_timeout: float = TOTAL_TIMEOUT_S
    # how long ranks outside every collective (a download, a disk, a subprocess) may keep
    # the others waiting before the dry run stops; None: the job's own collective timeout
    outside_wait: float | None = None
    cpu: bool = False  # run a CUDA/NCCL script on CPU ranks with gloo (record/cpu_map.py)
    perturb: bool = False  # make rank-local values differ on purpose (record/perturb.py)
    nccl_timing: bool = False  # collectives return at once, ranks wait at sync points (record/nccl_timing.py)
    # the ranks forked from one interpreter that imported torch once (launch/replay.py's server),
    # where torchrun would start them on this node alone; torchrun otherwise (--warm-start, or
    # WARM_START_ENV for the CLI and the pytest plugin alike)
    warm_start: bool = False
    # quiet seconds after which records that already disagree are a hang (the full
    # stall_timeout where they agree or could still pair)
    disagree_grace: float = 2.0
    # the last batches of each eval pass run for real, the ones before skipped alike on
    # every rank (record/fastforward.py); None: every batch
    eval_batches: int | None = DEFAULT_EVAL_BATCHES
    # the last batches of a train loader's first pass run after its --train-steps, the ones
    # between skipped alike on every rank, so the epoch's end runs; 0: the pass is cut
    train_end_batches: int = DEFAULT_TRAIN_END_BATCHES
    launcher: Launcher = Launcher.AUTO
    accelerate_config: str | None = None  # --launcher accelerate: accelerate launch's --config_file
    line_evidence: bool = True  # replay up to a divergence the source cannot explain (explain/lines.py)
    lines_plan: str | None = None  # set for that replay: what to trace, where to stop (record/lines.py)
    # periodic actions (file, line of the if) made to fire once within the budget (record/firing.py)
    fire_periodic: bool = True
    fire_actions: tuple[tuple[str, int], ...] = ()  # found by preflight where fire_periodic
    # decisions on a rank's own value (lint/decisions.py): watched in the dry run, and each
    # one the ranks took alike forced on one rank in a run of its own (record/firing.py)
    force_decisions: bool = True
    watch_decisions: tuple[tuple[str, int], ...] = ()  # (file, line of the test), found by preflight
    watch_handlers_in: tuple[str, ...] = ()  # the user's files whose except handlers note what they catch
    forced_decision: tuple[str, int, int] | None = None  # (file, line, rank) in a forcing run

    # -- timeouts derived from the stall timeout -----------------------------------------

    @property
    def busy_limit_s(self) -> float:
        """A rank busy without writing a record is forgiven this long: computing forever
        while the others wait in a collective (a straggler) is still caught."""
        return 4 * self.stall_timeout

    @property
    def disagree_quiet_s(self) -> float:
        """Quiet this long, records that already disagree are read as a hang: nothing a
        busy rank computes mends a divergence the live alignment holds as final."""
        return min(self.stall_timeout, self.disagree_grace)

    @property
    def lone_rank_quiet_s(self) -> float:
        """A virtual world's rank runs alone and waits on no one: quiet this long, it is
        busy on its own (a slow write, a wait outside torch.distributed), not hung."""
        return max(60.0, self.busy_limit_s)

    @property
    def eval_agree_wait_s(self) -> float:
        """How long a rank waits for the others' eval loader lengths (record/fastforward.py):
        a rank that never starts the pass (only rank 0 evaluates) costs this, well inside
        the stall timeout, so the wait itself is never taken for a hang."""
        return min(5.0, self.stall_timeout / 3)

    @property
    def eval_read_ahead_s(self) -> float:
        """How long a rank reads a loader without a length ahead: it writes a record a
        second, forgiven like a busy rank's work."""
        return 2 * self.stall_timeout

    # -- the settings of the runs one preflight makes -------------------------------------

    def without_probe(self) -> DryRunSettings:
        """No rendezvous check-in: ranks that do not go through torchrun's agent (a
        virtual world's, a replay's, those a script starts itself)."""
        return replace(self, probe_timeout=0.0)

    def for_replay(self, plan: str) -> DryRunSettings:
        """The replay up to a divergence: the plan of explain/lines.py, no check-in."""
        return replace(self, lines_plan=plan, probe_timeout=0.0)

    def forcing(self, path: str, line: int, rank: int) -> DryRunSettings:
        """A run with the test at ``path:line`` turned to its other side on ``rank`` at its
        first evaluation: no check-in (the first run made it), no replay (the forced test
        is the deciding line), no further forcing."""
        forced = (path, line, rank)
        return replace(
            self, forced_decision=forced, probe_timeout=0.0, line_evidence=False, force_decisions=False
        )

    def started_by(self, launcher: Launcher) -> DryRunSettings:
        """The settings for ranks that ``launcher`` starts: no store to check in through
        before rank 0's init (deepspeed) or at all (ranks a script starts itself), and no
        replay for line evidence where the replay, run through torchrun, cannot follow
        (ranks a script starts itself)."""
        if launcher is Launcher.SPAWN:
            return replace(self, launcher=launcher, probe_timeout=0.0, line_evidence=False)
        if launcher is Launcher.DEEPSPEED:
            return replace(self, launcher=launcher, probe_timeout=0.0)
        return replace(self, launcher=launcher)


# preflight's --warm-start from the environment: the CLI's option and the pytest plugin's runs
WARM_START_ENV = "NCCLCHECK_WARM_START"


def warm_start_from_environment() -> bool:
    """NCCLCHECK_WARM_START as click reads a flag's environment variable: 1, true, yes, on."""
    return os.environ.get(WARM_START_ENV, "").strip().lower() in ("1", "true", "t", "yes", "y", "on")
