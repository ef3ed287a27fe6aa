"""Stack dumps as cluster tooling leaves them, read back into ProcessStacks: py-spy's
text (``Thread N (idle): "MainThread"`` then ``func (file:line)``) and its JSON, and
faulthandler's (``Thread 0x... (most recent call first):`` then ``File "f", line N in
func``), which trainers print on a hang and which a log may hold between other lines;
gdb's py-bt and bt, a stack a signal handler printed, and pystack's.

A ``StackReader`` is fed one line at a time, so a log's interleaved ranks each get
their own, and a file of several dumps is cut at its ``== rank N ==`` (or ``== pid N
==``, or py-spy's ``Process N:``) headers.
"""

from __future__ import annotations

import functools
import os
import re
from dataclasses import dataclass, field
from typing import Any

from ncclcheck.evidence.stacks import ProcessStack, ThreadStack
from ncclcheck.frames import installed_origin, is_user_file
from ncclcheck.model import Frame

_PY_SPY_THREAD = re.compile(r'^Thread (0x[0-9a-fA-F]+|\d+) \(([\w ]+)\)(?:: "(.*)")?\s*$')
_PY_SPY_FRAME = re.compile(r"^    (\S.*?) \((.+):(\d+)\)\s*$")
# py-spy --native's frame of a native library: "    cudaStreamSynchronize (libcudart.so.12)",
# "    0x7f2b8c1a2f9d (libcuda.so.535.129.03)", "    PyThread_acquire_lock_timed (python3.10)"
_PY_SPY_NATIVE_FRAME = re.compile(
    r"^    (\S.*?) \(((?:lib)?[\w.+\-]*?(?:\.so[\w.\-]*|\.dll|\.dylib)|python[\d.]*)\)\s*$"
)
_PY_SPY_LOCAL = re.compile(r"^            (\w+): (.*)$")
_FAULT_THREAD = re.compile(
    r"^(Current thread|Thread) (0x[0-9a-fA-F]+)(?: \[(.*)\])? \(most recent call first\):"
)
_FAULT_FRAME = re.compile(r'^\s+File "(.+)", line (\d+) in (.+?)\s*$')
# gdb's py-bt ("Traceback (most recent call first):", innermost first) and a stack a
# signal handler printed with traceback.print_stack ("-- Thread ID: N ---", outermost
# first): frames as `File "x.py", line 3, in f`, each followed by its source line
_GDB_THREAD = re.compile(r"^\s*Traceback \(most recent call first\):\s*$")
_PRINTED_THREAD = re.compile(r"^\s*-+ ?Thread ID: (\d+) ?-*\s*$")
# pystack's (`pystack remote PID`, `pystack core FILE`), outermost first: "Traceback for
# thread 112 (python3) [Has the GIL] (most recent call last):", then `(Python) File "x.py",
# line 3, in f` frames (`(C) File ...` native ones with --native), each with its source line
_PYSTACK_THREAD = re.compile(
    r"^\s*Traceback for thread (\d+) \(([^)]*)\)(?: \[[^\]]*\])? \(most recent call last\):"
)
# gdb's native backtrace (`bt`): "#3  0x00007f.. in cudaMemcpyAsync () from /lib/libcudart.so"
_GDB_NATIVE_FRAME = re.compile(
    r"^#(\d+)\s+(?:0x[0-9a-fA-F]+ in )?(.+?) \(.*?\)(?:.*? (?:from|at) (\S+))?\s*$"
)
_GDB_CONTINUED = re.compile(r"^\s+(?:from|at) (\S+)\s*$")
_FILE_FRAME = re.compile(r'^\s*(?:\((?:Python|C)\) )?File "(.+)", line (\d+), in (.+?)\s*$')
# A frame of a py-spy dump posted without its header (no "Process", no "Thread" line): as
# `fn (file.py:12)` at any indentation, after a "... " where the poster cut frames or a
# tree's branch marks, with trailing spaces, and the poster's note after it ("→ busy_loop",
# "(tensor.item())", "<-- stuck here"). A file ends .py (or .pyx) or is `<...>`: a line of
# a log with a parenthesis in it is not taken for a frame.
_EXCERPT_FRAME = re.compile(
    r"^(?P<indent>\s*)(?:\.\.\.\s*)?(?:[|`\\+*>\-└├─│┗┣━→•]+\s*)?(?P<function>[\w<>.:$~\[\]-]+)\s+"
    r"\((?P<file>[^()\s]+\.pyx?|<[\w-]+>):(?P<line>\d+)\)(?P<note>.*)$"
)
# headers between the dumps of one file: "== rank 3 ==", "=== pid 123 ===", "rank 3:"
# a poster's heading over one process's dump: "rank 3:", "=== pid 4410 ===", "--- rank 5 (pid
# 2215) ---" (the other id in parentheses, group 4)
HEADER = re.compile(
    r"^\s*(?:[=#*-]+\s*)?(rank|pid)\s*[:#]?\s*(\d+)\s*(?:\((rank|pid)\s*[:=#]?\s*(\d+)\)\s*)?"
    r"(?:[=#*-]+\s*|:\s*)$",
    re.IGNORECASE,
)
PROCESS = re.compile(r"^Process (\d+): (.*)$")


_TREE_MARKS = " \t.|`\\+*>-└├─│┗┣━→•"  # what a pasted tree puts before a frame


def excerpt_frame(line: str) -> Frame | None:
    """The frame a line of a headerless py-spy excerpt names, or None."""
    if ".py" not in line and "<" not in line:
        return None  # most lines of a log: one substring test
    match = _EXCERPT_FRAME.match(line)
    if match is None:
        return None
    return Frame(match.group("file"), int(match.group("line")), match.group("function"))


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(_TREE_MARKS))


def is_stack_line(line: str) -> bool:
    """Whether a line opens a thread of a py-spy, faulthandler, gdb py-bt or printed dump."""
    return bool(
        _PY_SPY_THREAD.match(line)
        or _FAULT_THREAD.match(line)
        or _GDB_THREAD.match(line)
        or _PRINTED_THREAD.match(line)
        or _PYSTACK_THREAD.match(line)
        or (line.startswith("#0 ") and _GDB_NATIVE_FRAME.match(line))
    )


@dataclass
class StackReader:
    """Builds one process's stack from the lines of its dump, in either format."""

    threads: list[ThreadStack] = field(default_factory=list)
    pid: int | None = None
    command: str = ""  # py-spy's "Process N: <command line>"
    beside: str = ""  # the folder of the file the dump was read from: source may sit there
    _faulthandler: bool = False  # threads named by no dump: the main one found by its frames
    _current: int | None = None  # faulthandler's "Current thread", by index
    _in_locals: bool = False
    _outermost_first: set[int] = field(default_factory=set)  # printed stacks, by thread index
    _source_line_next: bool = False  # a printed or py-bt frame is followed by its source line
    # threads read from frames with no thread header (excerpts), by index: their order
    # (innermost or outermost first) is decided from the frames, see _excerpt_order
    _excerpts: dict[int, list[int]] = field(default_factory=dict)  # index -> each frame's indent

    @classmethod
    def excerpt(cls, frames: list[Frame]) -> StackReader:
        """One thread from frames in the order a traceback prints them (outermost first),
        unless the script's `<module>` frame comes last (py-bt's order): _outermost_first."""
        reader = cls()
        reader.threads.append(ThreadStack(0, "", list(frames)))
        reader._excerpts[0] = []
        if "<module>" not in [f.function for f in frames]:
            reader.threads[0].frames.reverse()  # a traceback's order: innermost last
        return reader

    def feed(self, line: str) -> bool:
        """Take a line; False when it is no part of a stack dump."""
        line = line.rstrip("\n")
        if match := PROCESS.match(line):
            if self.threads:
                return False  # the next dump (py-spy run again): a stack of its own
            self.pid, self.command = int(match.group(1)), match.group(2)
            return True
        if match := _PY_SPY_THREAD.match(line):
            ident = match.group(1)
            thread_id = int(ident, 16) if ident.startswith("0x") else int(ident)
            self.threads.append(ThreadStack(thread_id, match.group(3), [], "active" in match.group(2)))
            self._in_locals = False
            return True
        if match := _FAULT_THREAD.match(line):
            self._faulthandler = True
            if match.group(1) == "Current thread":
                self._current = len(self.threads)
            self.threads.append(ThreadStack(int(match.group(2), 16), match.group(3), []))
            return True
        native = _GDB_NATIVE_FRAME.match(line) if line.startswith("#") else None
        if native is not None:
            if native.group(1) == "0" or not self.threads:  # a new thread's backtrace
                self._faulthandler = True
                self.threads.append(ThreadStack(len(self.threads), "", []))
            where = native.group(3) or "?"
            self.threads[-1].frames.append(Frame(where, 0, native.group(2).strip()))
            return True
        continued = _GDB_CONTINUED.match(line) if self._faulthandler and self.threads else None
        if continued is not None and self.threads[-1].frames and self.threads[-1].frames[-1].file == "?":
            # gdb wraps a long frame: its "from /lib/x.so" (or "at x.c:3") on the next line
            last = self.threads[-1].frames[-1]
            self.threads[-1].frames[-1] = Frame(continued.group(1), last.line, last.function)
            return True
        if match := _PYSTACK_THREAD.match(line):
            self._faulthandler = True
            self._outermost_first.add(len(self.threads))
            self.threads.append(ThreadStack(int(match.group(1)), "", []))
            self._source_line_next = False
            return True
        printed = _PRINTED_THREAD.match(line)
        if printed is not None or _GDB_THREAD.match(line):
            self._faulthandler = True
            if printed is not None:
                self._outermost_first.add(len(self.threads))
            self.threads.append(ThreadStack(int(printed.group(1)) if printed else len(self.threads), "", []))
            self._source_line_next = False
            return True
        if line.startswith("Python v") or not line.strip():
            return True  # py-spy's header, and the blank lines between threads
        if not self.threads:
            frame = excerpt_frame(line)
            if frame is None:
                return False
            # one thread of one process, cut from its dump: read as the process's only thread
            self._excerpts[0] = []
            self.threads.append(ThreadStack(0, "", []))
        thread = self.threads[-1]
        if self._faulthandler and (match := _FILE_FRAME.match(line)):
            thread.frames.append(Frame(match.group(1), int(match.group(2)), match.group(3)))
            thread.code.extend([""] * (len(thread.frames) - 1 - len(thread.code)))
            self._source_line_next = True
            return True
        if self._source_line_next:
            self._source_line_next = False  # the frame's source line, kept for the sync point
            thread.code.append(line.strip())
            return True
        if self._faulthandler and line.lstrip().startswith("<built-in"):
            return True  # py-bt's native call
        if self._faulthandler and (match := _FAULT_FRAME.match(line)):
            thread.frames.append(Frame(match.group(1), int(match.group(2)), match.group(3)))
            return True
        if (match := _PY_SPY_FRAME.match(line)) and not match.group(1).startswith("..."):
            thread.frames.append(Frame(match.group(2), int(match.group(3)), match.group(1)))
            thread.locals.append({})
            self._in_locals = False
            return True
        if not self._faulthandler and (match := _PY_SPY_NATIVE_FRAME.match(line)):
            thread.frames.append(Frame(match.group(2), 0, match.group(1)))
            thread.locals.append({})
            self._in_locals = False
            return True
        index = len(self.threads) - 1
        # py-spy's frame with what a poster added or cut ("... ", "→ note", a tree's marks)
        if (index in self._excerpts or not self._faulthandler) and (frame := excerpt_frame(line)) is not None:
            thread.frames.append(frame)
            thread.locals.append({})
            self._excerpts.get(index, []).append(_indent(line))
            self._in_locals = False
            return True
        if line.strip() in ("Arguments:", "Locals:"):
            self._in_locals = True
            return True
        if self._in_locals and (match := _PY_SPY_LOCAL.match(line)) and thread.locals:
            thread.locals[-1][match.group(1)] = match.group(2)
            return True
        return False

    def stack(self) -> ProcessStack | None:
        for index in self._outermost_first:
            thread = self.threads[index]
            thread.code.extend([""] * (len(thread.frames) - len(thread.code)))
            thread.frames.reverse()  # innermost first, as every other format
            thread.code.reverse()
        self._outermost_first = set()
        for index, indents in self._excerpts.items():
            if _outermost_first(self.threads[index].frames, indents):
                self.threads[index].frames.reverse()
                self.threads[index].locals.reverse()
        threads = [t for t in self.threads if t.frames]
        if not threads:
            return None
        if self._faulthandler or self._excerpts:
            # faulthandler names no thread: the main one runs the script's <module>, else
            # it is the one that held the interpreter when the dump was taken
            main = next((t for t in threads if t.frames[-1].function == "<module>"), None)
            if main is None and self._current is not None and self.threads[self._current].frames:
                main = self.threads[self._current]
            if main is None and len(threads) == 1:
                main = threads[0]  # one thread dumped (a gdb bt of the thread that hangs): that one
            for thread in threads:  # innermost first already, as py-spy prints them
                thread.name = "MainThread" if thread is main else (thread.name or "Thread")
        for thread in threads:
            if len(thread.locals) != len(thread.frames) or not any(thread.locals):
                thread.locals = []
            thread.frames = [_found(frame, self.command, self.beside) for frame in thread.frames]
            thread.user = [is_user_path(f.file) for f in thread.frames]
        return ProcessStack(pid=self.pid or 0, threads=threads, status="dumped")


def _outermost_first(frames: list[Frame], indents: list[int]) -> bool:
    """Whether an excerpt's frames run from the outermost call in: py-spy prints the
    innermost first, but a poster may paste a tree (each call indented under its caller) or
    copy a traceback's order. The script's `<module>` frame, where the excerpt holds it, is
    the outermost; else indentation that grows down the excerpt is a tree's; else a
    library frame (torch's own) first and the user's last means innermost first, as py-spy."""
    if len(frames) < 2:
        return False
    functions = [f.function for f in frames]
    if "<module>" in functions:
        return functions.index("<module>") < len(functions) / 2
    # a tree: each call indented further than its caller
    return len(indents) == len(frames) and indents[-1] > indents[0] and indents == sorted(indents)


def _found(frame: Frame, command: str, beside: str = "") -> Frame:
    """py-spy's text names the user's files by their base name (``repro.py``): found again
    next to the script its command line ran, or next to the dump itself (``beside``: a
    poster's folder with the dumps and the source), where such a file is."""
    if os.path.isabs(frame.file) or os.path.exists(frame.file):
        return frame
    if beside and _FOREIGN_LIBRARY.search(frame.file.replace("\\", "/")) is None:
        candidate = os.path.join(beside, frame.file)
        if os.path.isfile(candidate):
            return Frame(candidate, frame.line, frame.function)
    for word in command.split():
        if word.endswith(".py") and os.path.basename(word) != frame.file:
            candidate = os.path.join(os.path.dirname(word), frame.file)
            if os.path.exists(candidate):
                return Frame(candidate, frame.line, frame.function)
        elif word.endswith(".py") and os.path.exists(word):
            return Frame(word, frame.line, frame.function)
    return frame


_FOREIGN_LIBRARY = re.compile(
    # a native library or the interpreter (py-spy --native's "libcudart.so.12", "python3.10")
    r"/(?:site|dist)-packages/|/lib/python\d+\.\d+/|^<|\.so(?:\.[\w.\-]+)?$|\.dll$|\.dylib$|^python[\d.]*$"
)


# libraries whose files py-spy prints below their site-packages in posted dumps, which need
# not be installed where the dump is read: a path under one is theirs, not the user's. Not
# the repositories people run from a checkout (Megatron-LM, torchtitan): those are the user's
POSTED_LIBRARIES = frozenset(
    {
        "accelerate",
        "apex",
        "datasets",
        "deepspeed",
        "fairscale",
        "grpc",
        "huggingface_hub",
        "lightning",
        "lightning_fabric",
        "numpy",
        "pandas",
        "peft",
        "pytorch_lightning",
        "ray",
        "safetensors",
        "tensorboard",
        "timm",
        "torchaudio",
        "torchmetrics",
        "torchvision",
        "transformers",
        "triton",
        "trl",
        "vllm",
        "wandb",
    }
)


@functools.cache
def is_user_path(path: str) -> bool:
    """Whether a dumped frame's file is the user's, for a dump taken on another machine:
    there, libraries live under its own site-packages and standard library, whatever
    this interpreter's are. py-spy's text prints library files by their path below
    those (``torch/distributed/...``, ``threading.py``): a relative path whose first part
    is a module found there is not the user's either."""
    if _FOREIGN_LIBRARY.search(path.replace("\\", "/")):
        return False
    if os.path.isabs(path):
        return is_user_file(path)
    if path.replace("\\", "/").split("/", 1)[0].removesuffix(".py") in POSTED_LIBRARIES:
        return False
    origin = installed_origin(path)
    return origin is None or is_user_file(origin)


def looks_like_py_spy_json(data: Any) -> bool:
    return (
        isinstance(data, list)
        and bool(data)
        and all(isinstance(t, dict) and "frames" in t and "thread_id" in t for t in data)
    )
