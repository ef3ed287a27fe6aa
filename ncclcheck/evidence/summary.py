"""Stacks that people summarise instead of pasting: one line per thread, the thread's
name, then the calls it sits in from the innermost out, as a forum post or an issue
writes them::

    - `MainThread`: `dist.barrier` (`torch/distributed/distributed_c10d.py`) from `Trainer.save`
    - `AsyncCheckpointExecutor_0`: `all_gather` / `gather_object` from `_save_state_dict`
      (`torch/distributed/checkpoint/state_dict_saver.py`)

A summary holds what the writer chose to keep: function names, some files, rarely a
line number. It becomes a ``ProcessStack`` like any dump, with line 0 where none was
given, so the rules read it as they read py-spy's; what it lacks (locals, lines, the
frames left out) the rules then cannot use, and nothing is invented for it. Calls named
with a ``dist.`` prefix, or bare names of torch.distributed's collectives, are placed in
torch.distributed, which is where such a call lives.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from ncclcheck.communicates import WAITABLE_OPS
from ncclcheck.evidence.dumps import is_user_path
from ncclcheck.evidence.stacks import ProcessStack, ThreadStack
from ncclcheck.model import Frame

# "- `MainThread`: `dist.barrier` ...", "* MainThread: `x` ...": a thread's name (backticked,
# or a bare word that says it names a thread) and a colon, then code in backticks
_THREAD_LINE = re.compile(
    r"^\s*(?:[-*\u2022]\s+)?(?:`(?P<quoted>[^`\s]+)`|(?P<bare>\w*(?:Thread|Executor)[\w\-]*))\s*:\s+(?P<calls>.*`.*)$"
)
# the words that lead from a call to its caller
_CALLER = re.compile(r"\s+(?:called from|from|via|<-|\u2190|in)\s+")
_CODE = re.compile(r"`([^`]+)`")
_PATH = re.compile(r"^(?P<file>[\w.\-/\\]+\.py)(?::(?P<line>\d+))?$")
_NAME = re.compile(r"[A-Za-z_<][\w.<>]*")  # a function, method or module name, not a value
_API_HOME = "torch/distributed/distributed_c10d.py"  # where dist.<collective> lives
_DIST_PREFIXES = ("dist.", "torch.distributed.", "c10d.", "distributed.")


def is_summary_line(line: str) -> bool:
    return "`" in line and ":" in line and _THREAD_LINE.match(line) is not None


@dataclass
class SummaryReader:
    """The threads of one process's summary, as lines come; ``stack()`` when done."""

    threads: list[ThreadStack] = field(default_factory=list)
    pid: int | None = None

    def feed(self, line: str) -> bool:
        """Take a line; False when it is no thread's summary."""
        match = _THREAD_LINE.match(line)
        if match is None:
            return False
        frames = [frame for part in _CALLER.split(match.group("calls")) if (frame := _frame(part))]
        if not any(frame.file for frame in frames):
            return False  # a setting's name and value ("`optimizer`: `AdamW`"), no call
        name = match.group("quoted") or match.group("bare")
        self.threads.append(
            ThreadStack(
                thread_id=len(self.threads) + 1,
                name=name,
                frames=frames,
                user=[bool(f.file) and is_user_path(f.file) for f in frames],
            )
        )
        return True

    def stack(self) -> ProcessStack | None:
        if not self.threads:
            return None
        return ProcessStack(pid=0, threads=self.threads)


def _frame(part: str) -> Frame | None:
    """One call of a summary: its function (the first of alternatives written ``a`` / ``b``)
    and its file, where the text gives them."""
    codes = [code.strip().removesuffix("()") for code in _CODE.findall(part)]
    paths = [m for code in codes if (m := _PATH.match(code)) and ("/" in code or code.endswith(".py"))]
    functions = [code for code in codes if not _PATH.match(code) and _NAME.fullmatch(code)]
    if not functions and not paths:
        return None
    file = paths[0].group("file").replace("\\", "/") if paths else ""
    line = int(paths[0].group("line")) if paths and paths[0].group("line") else 0
    if not functions:
        return Frame(file, line, "?")
    function = functions[0]
    if function.startswith(_DIST_PREFIXES) or (not file and function in WAITABLE_OPS):
        function = function.rsplit(".", 1)[-1]
        if not file and function in WAITABLE_OPS:
            file = _API_HOME
    return Frame(file, line, function)
