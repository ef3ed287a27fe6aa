"""source/origins.py on files written here: a value followed back through assignments and
parameters, and what it is (a set's order, a size the data gives)."""

from __future__ import annotations

import ast
import functools
from pathlib import Path

from ncclcheck.model import Frame
from ncclcheck.source import origins

SOURCE = """\
import torch

def sync(stats, extra):
    for name, value in stats.items():
        reduce(value)

def main(options):
    names = set(options) | {"loss"}
    if options.get("sorted"):
        names = sorted(names)
    stats = {name: torch.zeros(3) for name in names}
    sync(stats, None)
    kept = torch.arange(8)[torch.arange(8) > 3]
    reduce(kept)
    for step in range(3):
        kept = kept + step
"""


def _stack(tmp_path: Path, *lines: tuple[str, int]) -> list[Frame]:
    path = tmp_path / "train.py"
    path.write_text(SOURCE)
    return [Frame(str(path), line, function) for function, line in lines]


def test_a_loop_is_followed_through_the_parameter_to_the_set_it_was_built_from(tmp_path: Path) -> None:
    stack = _stack(tmp_path, ("main", 12), ("sync", 5))
    chain = origins.bindings(stack, ast.parse("stats.items()", mode="eval").body, origins.is_unordered)
    assert [str(b) for b in chain] == [
        "`stats` passed to sync() as stats",
        "`stats = {name: torch.zeros(3) for name in names}`",
        "`names = set(options) | {'loss'}`",
    ]
    assert [b.frame.line for b in chain] == [12, 11, 8]


def test_without_a_wish_the_latest_assignment_is_followed(tmp_path: Path) -> None:
    stack = _stack(tmp_path, ("main", 12), ("sync", 5))
    chain = origins.bindings(stack, ast.parse("stats", mode="eval").body)
    assert str(chain[-1]) == "`names = sorted(names)`"
    assert not origins.is_unordered(chain[-1].value)


def test_a_name_also_bound_by_a_loop_is_not_followed(tmp_path: Path) -> None:
    stack = _stack(tmp_path, ("main", 17))
    assert origins.bindings(stack, ast.parse("kept", mode="eval").body) == []


def test_what_a_set_is_and_what_the_data_sizes() -> None:
    def expr(text: str) -> ast.expr:
        return ast.parse(text, mode="eval").body

    assert all(origins.is_unordered(expr(t)) for t in ("{1, 2}", "set(x)", "a - set(b)", "{k for k in x}"))
    assert not any(origins.is_unordered(expr(t)) for t in ("sorted(set(x))", "[1, 2]", "a - b", "dict(x)"))
    assert all(
        origins.sized_by_data(expr(t)) for t in ("x[mask]", "x[x > 0]", "torch.cat(parts)", "x.nonzero()")
    )
    assert not any(origins.sized_by_data(expr(t)) for t in ("x[0]", "x[i]", "x[:4]", "torch.zeros(3)"))


def _filling(path: Path, line: int, text: str) -> str | None:
    """The first line of where the dict read as ``text`` at ``path:line`` is filled on first sight."""
    found = origins.filled_on_first_sight(str(path), line, ast.parse(text, mode="eval").body)
    return None if found is None else ast.unparse(found).splitlines()[0]


FIRST_SIGHT = """\
import collections

class Bank:
    def __init__(self):
        self.sums = {}
        self.fixed = {name: 0 for name in ("loss", "acc")}

    def add(self, name, value):
        if name not in self.sums:
            self.sums[name] = value
        self.fixed[name] += value

    def sync(self):
        for name, total in self.sums.items():
            reduce(total)
        for name, total in self.fixed.items():
            reduce(total)

def evaluate(batches):
    counts = {}
    tallies = collections.defaultdict(float)
    listed = {}
    for head, x in batches:
        counts.setdefault(head, []).append(x)
        tallies[head] += 1
        listed[head] = x
    for head in counts:
        reduce(counts[head])
    for head in tallies.keys():
        reduce(tallies[head])
    for head in listed:
        reduce(listed[head])
"""


def test_a_dict_filled_on_first_sight_is_told_from_one_filled_in_a_fixed_order(tmp_path: Path) -> None:
    """``if k not in d: d[k] = ...``, ``d.setdefault(k, ...)`` and a defaultdict's ``d[k]``
    add each key when the process first meets it; a dict built from a fixed list, or whose
    keys are set unconditionally, is not read as one (its order may still be the data's,
    but the source does not say so)."""
    path = tmp_path / "bank.py"
    path.write_text(FIRST_SIGHT)
    filling = functools.partial(_filling, path)
    assert filling(15, "self.sums.items()") == "if name not in self.sums:"
    assert filling(17, "self.fixed.items()") is None
    assert filling(29, "counts") == "counts.setdefault(head, [])"
    assert filling(31, "tallies.keys()") == "tallies[head]"
    assert filling(33, "listed") is None


PASSED_TO_A_FILLER = """\
def fill(state, names):
    for task in dict.fromkeys(names):
        state.setdefault(task, 0)

def show(state, names):
    for task in names:
        print(state.get(task))

def evaluate(batches):
    state = {}
    seen = {}
    for names in batches:
        fill(state, names)
        show(seen, names)
    for task, total in state.items():
        reduce(total)
    for task, total in seen.items():
        reduce(total)
"""


def test_a_dict_passed_to_a_function_that_fills_it_on_first_sight_is_read_as_one(tmp_path: Path) -> None:
    """Fresh w08: the eval state is a dict made in evaluate() and filled by a helper it is
    passed to (`state.setdefault(task, ...)` on its parameter), then iterated in evaluate's
    order: the helper's filling is where the order comes from. A dict passed to a helper
    that only reads it is not."""
    path = tmp_path / "metrics.py"
    path.write_text(PASSED_TO_A_FILLER)
    filling = functools.partial(_filling, path)
    assert filling(15, "state.items()") == "state.setdefault(task, 0)"
    assert filling(17, "seen.items()") is None


ITERATIONS_OF_SETS = {
    "a module's set read in a function": (
        "NAMES = {'a', 'b'}\ndef f():\n    for n in NAMES:\n        pass\n",
        3,
    ),
    "a set a method binds, iterated in another": (
        "class T:\n    def __init__(self):\n        self.heads = set(['x'])\n"
        "    def step(self):\n        return [h for h in self.heads]\n",
        5,
    ),
    "joined": ("def f(xs):\n    return ','.join(set(xs))\n", 2),
    "a difference of sets": ("def f(a, b):\n    for k in set(a) - set(b):\n        pass\n", 2),
    "a list of it": ("def f(xs):\n    names = {x.name for x in xs}\n    return list(names)\n", 3),
    "sorted first": ("def f(xs):\n    s = set(xs)\n    for n in sorted(s):\n        pass\n", None),
    "membership only": ("def f(xs):\n    seen = set()\n    if 'a' in seen:\n        seen.add('a')\n", None),
    "a set in one function, a list of that name in another": (
        "def f(xs):\n    names = set(xs)\n    return len(names)\n"
        "def g(names):\n    for n in names:\n        pass\n",
        None,
    ),
}


def test_the_first_iteration_of_a_set_is_found_and_sorted_or_membership_is_not(tmp_path: Path) -> None:
    """What --warm-start leaves to torchrun: an order only each interpreter's string
    hashing decides (commands/preflight.py)."""
    for name, (source, line) in ITERATIONS_OF_SETS.items():
        path = tmp_path / f"{len(list(tmp_path.iterdir()))}.py"
        path.write_text(source)
        found = origins.first_iteration_of_a_set([str(path)])
        assert (found[1] if found else None) == line, (name, found)


GATHERED = """\
import torch

def gather(t):
    all_gather(t)

def collect(loader):
    kept, seen = [], 0
    for batch in loader:
        scores = batch.sum(1)
        kept.append(scores[scores > 0])
        seen += 1
    return torch.cat(kept), seen

def evaluate(loader):
    scores, count = collect(loader)
    gather(scores)
"""


def test_a_tensor_is_followed_into_the_function_that_returned_it_and_to_the_pieces_it_joined(
    tmp_path: Path,
) -> None:
    """``scores, count = collect(loader)``: the element of collect's ``return``, a
    ``torch.cat`` of a list filled with ``append``, each piece cut by a mask."""
    path = tmp_path / "evaluate.py"
    path.write_text(GATHERED)
    stack = [Frame(str(path), 16, "evaluate"), Frame(str(path), 4, "gather")]
    chain = origins.bindings(stack, ast.parse("t", mode="eval").body, origins.sized_by_data)
    assert [str(b) for b in chain] == [
        "`scores` passed to gather() as t",
        "`scores, count = collect(loader)`",
        "`torch.cat(kept)` returned by collect()",
        "`kept.append(scores[scores > 0])`",
    ]
    assert [b.frame.line for b in chain] == [16, 15, 12, 10]
    assert origins.sized_by_data(chain[-1].value)


def test_an_unpacked_call_of_a_function_the_file_does_not_define_ends_the_chain(tmp_path: Path) -> None:
    path = tmp_path / "evaluate.py"
    path.write_text(GATHERED.replace("collect(loader)\n    gather", "library.collect(loader)\n    gather"))
    stack = [Frame(str(path), 16, "evaluate"), Frame(str(path), 4, "gather")]
    chain = origins.bindings(stack, ast.parse("t", mode="eval").body)
    assert [str(b) for b in chain] == [
        "`scores` passed to gather() as t",
        "`scores, count = library.collect(loader)`",
    ]


def test_an_attribute_is_followed_into_its_classs_methods_and_a_name_to_the_modules_constant(
    tmp_path: Path,
) -> None:
    path = tmp_path / "meters.py"
    path.write_text(
        "import torch\n"
        "\n"
        "HEADS = {'box', 'cls', 'mask'}\n"
        "\n"
        "class Losses:\n"
        "    def __init__(self):\n"
        "        self.parts = {head: torch.zeros(2) for head in HEADS}\n"
        "\n"
        "    def sync(self):\n"
        "        for head, part in self.parts.items():\n"
        "            reduce(part)\n"
    )
    stack = [Frame(str(path), 11, "sync")]
    chain = origins.bindings(stack, ast.parse("self.parts.items()", mode="eval").body, origins.is_unordered)
    assert [str(b) for b in chain] == [
        "`self.parts = {head: torch.zeros(2) for head in HEADS}`",
        "`HEADS = {'box', 'cls', 'mask'}`",
    ]
    assert [b.frame.line for b in chain] == [7, 3]
