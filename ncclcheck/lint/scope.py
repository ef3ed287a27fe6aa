"""Checking one scope (a module's top level, a function): the collectives each statement
reaches, under which guards and loops, and the findings they make."""

from __future__ import annotations

import ast
import builtins

from ncclcheck.causes import Cause
from ncclcheck.communicates import STEP_HOOKS, StepHook

# Point-to-point calls (send/recv, batch_isend_irecv) are rank-dependent by design: each
# side's branch is paired with the other's, so lint leaves them out.
from ncclcheck.lint.findings import (
    CAUGHT,
    Collective,
    Function,
    Guard,
    ParsedModule,
    ProjectIndex,
    lint_finding,
    relative_path,
)
from ncclcheck.lint.rank_sets import negates, same_on_every_rank
from ncclcheck.lint.reaching import reaching_names, reaching_rank_names
from ncclcheck.lint.statements import VISITORS, is_exit, visit_exit
from ncclcheck.lint.syntax import (
    REACHING_NODES,
    called_names,
    calls_in,
    exit_word,
    has_exit,
    names_tested_for_value,
    reaching_nodes_in,
    reads_shape,
    tensor_value_roots,
    tests_membership,
    walk_scope,
)
from ncclcheck.lint.tables import (
    GROUP_POSITION,
    SIZE_SENSITIVE,
    TENSOR_VALUE_CALLS,
    UNSYNCED_CALLS,
)
from ncclcheck.model import Finding, Frame
from ncclcheck.source import origins
from ncclcheck.source.reading import (
    DATA,
    RANK,
    kind_of,
    reads_a_reduction,
    reads_a_total_of_a_loop_it_is_past,
)

_BUILTINS = frozenset(dir(builtins))


class ScopeChecker:
    """Walks one function (or a module's top level) with the conditions around each statement."""

    def __init__(
        self,
        linter: ProjectIndex,
        module: ParsedModule,
        function: Function | None,
        derived: set[str],
        ddp: set[str],
    ) -> None:
        self.linter = linter
        self.module = module
        self.function = function
        self.derived = derived
        self.ddp = ddp
        self.findings: list[Finding] = []
        self.path = relative_path(module.path)
        # an exit under a diverging condition, waiting for a later collective: (guard, statement, loop)
        self.pending_exits: list[tuple[Guard, ast.stmt, ast.stmt | None]] = []
        self.reported_exits: set[int] = set()  # one finding per exit: the first call it skips
        scope = function.node if function is not None else module.tree
        self.scope = scope
        self._scope_collectives: list[tuple[ast.expr, Collective]] | None = None
        self.complementary: set[int] = set()  # ifs balanced by a sibling with the negated test
        self._filled_lines: dict[str, list[int]] = {}  # container -> lines of its rank-dependent filling
        # computed on first use: most scopes never need them
        self._rank_local: set[str] | None = None
        self._rank_ordered: set[str] | None = None
        self._variable_size: set[str] | None = None
        self._maybe_unordered: set[str] | None = None

    @property
    def maybe_unordered(self) -> set[str]:
        """Names this scope or its module assigns a set (`heads = set(HEADS) - frozen`, `b = a`
        of such a name): the arguments worth following into the helpers they are given to."""
        if self._maybe_unordered is None:
            found: set[str] = set()
            assignments = [
                node
                for scope in (self.module.tree, self.scope)
                for node in (scope.body if scope is self.module.tree else self.linter.nodes(scope))
                if isinstance(node, ast.Assign)
            ]
            grew = True
            while grew:
                grew = False
                for node in assignments:
                    value = node.value
                    if origins.is_unordered(value) or (isinstance(value, ast.Name) and value.id in found):
                        for target in node.targets:
                            if isinstance(target, ast.Name) and target.id not in found:
                                found.add(target.id)
                                grew = True
            self._maybe_unordered = found
        return self._maybe_unordered

    @property
    def rank_local(self) -> set[str]:
        if self._rank_local is None:
            self._rank_local = self.linter.rank_local_names(self.scope, self.module, self.function)
        return self._rank_local

    def rank_local_reaching(self, line: int) -> set[str]:
        linter, module = self.linter, self.module
        synced = set(linter.sync_points(self.scope, module))

        def local(value: ast.expr, names: set[str]) -> bool:
            return linter.is_rank_local(value, module, self.function, synced, names)

        return reaching_names(
            self.scope, self.rank_local, line, linter.sync_points(self.scope, module), local
        )

    @property
    def rank_ordered(self) -> set[str]:
        if self._rank_ordered is None:
            self._rank_ordered = self._filled_under_rank_conditions(self.scope)
        return self._rank_ordered

    @rank_ordered.setter
    def rank_ordered(self, names: set[str]) -> None:
        self._rank_ordered = names

    @property
    def variable_size(self) -> set[str]:
        if self._variable_size is None:
            padded = any("pad" in name for name in called_names(self.linter.nodes(self.scope)))
            self._variable_size = (
                set() if padded else self.linter.variable_size_names(self.scope, self.module, self.function)
            )
        return self._variable_size

    def _filled_under_rank_conditions(self, scope: ast.AST) -> set[str]:
        """Containers that only some ranks add to (``if local_rank == 0: metrics["x"] = ...``):
        their order or length differs per rank."""
        filled: set[str] = set()
        if not (self.derived or self.linter.mentions_rank(scope)):
            return filled
        for node in self.linter.nodes(scope):
            if not (isinstance(node, ast.If) and kind_of(node.test, self.derived) == RANK):
                continue
            for inner in (n for statement in node.body + node.orelse for n in walk_scope(statement)):
                if isinstance(inner, ast.Assign):
                    for target in inner.targets:
                        if isinstance(target, ast.Subscript) and isinstance(target.value, ast.Name):
                            filled.add(target.value.id)
                            self._filled_lines.setdefault(target.value.id, []).append(inner.lineno)
                elif (
                    isinstance(inner, ast.Call)
                    and isinstance(inner.func, ast.Attribute)
                    and inner.func.attr in ("setdefault", "update", "add", "append", "insert", "extend")
                    and isinstance(inner.func.value, ast.Name)
                ):
                    filled.add(inner.func.value.id)
                    self._filled_lines.setdefault(inner.func.value.id, []).append(inner.lineno)
        return filled

    def order_of_loop(self, loop: ast.For | ast.AsyncFor) -> str | None:
        """Why the iteration order of ``loop`` may differ between ranks, or None."""
        iterable = _container(loop.iter)
        if (
            isinstance(iterable, ast.Name)
            and iterable.id in self.rank_ordered
            and not self._rebound(iterable.id, loop)
        ):
            return f"{iterable.id} is filled under a rank-dependent condition, so its order differs per rank"
        if isinstance(iterable, (ast.Set, ast.SetComp)):
            return "a set's iteration order is not the same in every process"
        if isinstance(iterable, ast.Call):
            name = ast.unparse(iterable.func)
            if name in ("set", "frozenset"):
                return "a set's iteration order is not the same in every process"
            if name.split(".")[-1] in ("listdir", "scandir", "glob", "iglob", "rglob", "iterdir"):
                return f"{name}() lists files in file-system order, which differs between hosts"
        # what it iterates, followed back: `self.states` built in __init__ from a module's set
        chain = origins.bindings(
            [Frame(str(self.module.path), loop.lineno, "")], loop.iter, origins.is_unordered
        )
        unordered = next((b for b in chain if origins.is_unordered(b.value)), None)
        if unordered is not None:
            return (
                f"its items come from a set (`{unordered.name} = {unordered.text[:60]}`, line "
                f"{unordered.frame.line}), and a set's iteration order is not the same in every process"
            )
        return None

    def _rebound(self, name: str, loop: ast.stmt) -> bool:
        """Is ``name`` assigned anew (``ret = broadcast_list[0]``) after its rank-dependent
        filling and before ``loop``? Then the loop sees the new value."""
        filled_at = max((line for line in self._filled_lines.get(name, []) if line < loop.lineno), default=0)
        return any(
            isinstance(node, ast.Assign)
            and filled_at < node.lineno < loop.lineno
            and any(isinstance(t, ast.Name) and t.id == name for t in node.targets)
            for node in self.linter.nodes(self.scope)
        )

    def check_ordered_loop(self, loop: ast.For | ast.AsyncFor) -> None:
        reason = self.order_of_loop(loop)
        if reason is None:
            return
        found = self.collectives(loop.body)
        if found:
            call, collective = found[0]
            self.add(
                Cause.COLLECTIVE_ORDER_MISMATCH,
                "warning",
                call,
                f"{collective.label} in a loop over {ast.unparse(loop.iter)} (line {loop.lineno}): "
                f"{reason}; iterate sorted(...) so every rank issues the same sequence",
                collective,
            )

    def check_passed_containers(self, call: ast.Call) -> None:
        """A container whose order differs per rank (filled under a rank-dependent condition,
        or a set) handed to a helper that loops over it with a collective."""
        worth = self.rank_ordered | self.maybe_unordered
        if not any(
            isinstance(a, ast.Name) and a.id in worth for a in [*call.args, *(k.value for k in call.keywords)]
        ):
            return
        target = self.linter.resolve_call(call, self.module, self.function)
        if target is None:
            return
        params = [a.arg for a in (*target.node.args.posonlyargs, *target.node.args.args)]
        if params and params[0] in ("self", "cls"):
            params = params[1:]
        passed: dict[str, ast.Name] = {}
        for index, arg in enumerate(call.args):
            if isinstance(arg, ast.Name) and index < len(params):
                passed[params[index]] = arg
        for keyword in call.keywords:
            if isinstance(keyword.value, ast.Name) and keyword.arg:
                passed[keyword.arg] = keyword.value
        loops = [
            (node, name)
            for node in self.linter.nodes(target.node)
            if isinstance(node, (ast.For, ast.AsyncFor)) and (name := _iterated_name(node)) in passed
        ]
        if not loops:
            return
        helper = ScopeChecker(
            self.linter, target.module, target, set(), self.linter.ddp_names_of(target.node)
        )
        for loop, name in loops:
            found = helper.collectives(loop.body)
            argument = passed[name]
            reason = self._order_of_argument(call, argument) if found else None
            if found and reason is not None:
                _inner_call, collective = found[0]
                self.add(
                    Cause.COLLECTIVE_ORDER_MISMATCH,
                    "warning",
                    call,
                    f"{collective.label} in a loop over {ast.unparse(loop.iter)} in {target.name}() (line "
                    f"{loop.lineno}), which gets {argument.id}: {reason}; iterate sorted(...)",
                    collective,
                )
                return

    def _order_of_argument(self, call: ast.Call, argument: ast.Name) -> str | None:
        """Why the order of the container ``argument`` names may differ per rank, or None."""
        if argument.id in self.rank_ordered:
            return "filled under a rank-dependent condition, its order differs per rank"
        chain = origins.bindings(
            [Frame(str(self.module.path), call.lineno, "")], argument, origins.is_unordered
        )
        unordered = next((b for b in chain if origins.is_unordered(b.value)), None)
        if unordered is None:
            return None
        return (
            f"a set (`{unordered.name} = {unordered.text[:60]}`, line {unordered.frame.line}), whose "
            "iteration order is not the same in every process"
        )

    def check_shapes(self, call: ast.expr, collective: Collective) -> None:
        if (
            not isinstance(call, ast.Call)
            or not collective.label.startswith("dist.")
            or len(collective.chain) != 1
        ):
            return
        if collective.label.split(".")[-1] not in SIZE_SENSITIVE or not self.variable_size:
            return
        sized = [
            a.id
            for a in [*call.args, *(k.value for k in call.keywords)]
            if isinstance(a, ast.Name) and a.id in self.variable_size
        ]
        if sized:
            # all_gather(outputs, input): name the input, the outputs are sized after it
            named = sized[-1] if collective.label.split(".")[-1].startswith("all_gather") else sized[0]
            self.add(
                Cause.COLLECTIVE_SHAPE_MISMATCH,
                "warning",
                call,
                f"{collective.label} of {named}, whose size depends on the data (boolean indexing, "
                f"nonzero, masked_select, cat of a list): ranks pass tensors of different sizes; pad "
                f"to a common size (gather the sizes first) or use all_gather_object",
                collective,
            )

    def kind(self, test: ast.expr, branches: list[ast.stmt]) -> str:
        if any(
            isinstance(call, ast.Call)
            and self.linter.returns_what_it_synced(call, self.module, self.function)
            for call in ast.walk(test)
        ):
            # `budget.exhausted(rank)` broadcasts rank 0's verdict and returns it: the rank it
            # is given decides nothing, every rank gets the same answer
            return "other"
        kind = kind_of(test, self.derived)
        if kind == RANK and kind_of(test, set()) != RANK:
            # rank-dependent only through names: those whose rank value reaches the test
            synced_at = self.linter.sync_points(self.scope, self.module)
            kind = kind_of(test, reaching_rank_names(self.scope, self.derived, test.lineno, synced_at))
        if kind == RANK and same_on_every_rank(test):
            return "other"  # `local_rank != -1`: "is this job distributed", true on every rank
        if kind != RANK and self.collectives_within(test):
            # a test that communicates to be answered (`if any_rank(not finite):`, a helper
            # that all-reduces the flag): every rank gets the same answer
            return "other"
        if kind == DATA and not (
            called_names(test) & TENSOR_VALUE_CALLS or reads_shape(test) or reads_a_reduction(test)
        ):
            kind = "other"  # len() of a list, any() of flags: the same on every rank as a rule
        if kind == DATA:
            names = {n.id for n in ast.walk(test) if isinstance(n, ast.Name)}
            if names & self.linter.rooted_names(self.scope, self.module).keys():
                return "unsynced"  # dist.reduce's result, read on ranks that are not its dst
            # synchronised before the test, not by the collective the branch itself holds
            # (`if loss.item() > cap: dist.all_reduce(loss)` tests each rank's own loss)
            synced = self.synchronised_before(test.lineno)
            read = tensor_value_roots(test) or names
            if read and read <= synced:
                kind = "other"  # the value of a tensor that was all-reduced or broadcast first
            elif self.judged_by_own_function(test) or reads_a_total_of_a_loop_it_is_past(
                self.scope, test, synced
            ):
                # `stopper.should_stop(loss.item())`: the data goes into the project's own
                # judgement (a patience count, a best so far), which decides on what this
                # rank has seen: a decision, not a test of the batch at hand; so does a
                # total over a loop it is past (`if epoch_loss < target: break`)
                return "unsynced"
        if kind in (RANK, DATA):
            return kind
        if called_names(test) & UNSYNCED_CALLS:
            return "unsynced"
        if self.collectives(branches) or has_exit(branches):
            # a function of the project's that returns such a value: `if should_resume(path)`
            for call in (n for n in ast.walk(test) if isinstance(n, ast.Call)):
                target = self.linter.resolve_call(call, self.module, self.function)
                if target is not None and self.linter.returns_local_number(target):
                    return "unsynced"
            if self.asks_a_tracker_fed_local_values(test):
                return "unsynced"
        names = names_tested_for_value(test)
        # rank-local values take an analysis of the scope: only worth it where the branch
        # could skip something (a collective or an exit)
        # and of those, the ones whose rank-local value reaches the test: not one replaced by
        # an all-reduced mean on the way (`train_loss = mean.item() / world`)
        if (
            names
            and (self.collectives(branches) or has_exit(branches))
            and names & self.rank_local
            and names & self.rank_local_reaching(test.lineno)
        ):
            return "unsynced"
        # an attribute the module only ever sets from a rank's own value (a token count, a
        # best loss), read in the test: `if self.tokens_seen >= budget: break`
        attributes = {n.attr for n in ast.walk(test) if isinstance(n, ast.Attribute)}
        if (self.collectives(branches) or has_exit(branches)) and any(
            self.linter.attribute_is_local(self.module, attribute) for attribute in sorted(attributes)
        ):
            return "unsynced"
        return kind

    @property
    def scope_collectives(self) -> list[tuple[ast.expr, Collective]]:
        """Every call of this scope that communicates, found in one pass (most scopes: none)."""
        if self._scope_collectives is None:
            found = [
                (node, collective)
                for node in self.linter.nodes(self.scope)
                if isinstance(node, REACHING_NODES)
                and (collective := self.linter.collective_of_node(node, self.module, self.function, self.ddp))
                is not None
            ]
            self._scope_collectives = sorted(found, key=lambda pair: (pair[0].lineno, pair[0].col_offset))
        return self._scope_collectives

    def collectives_within(self, node: ast.AST) -> list[tuple[ast.expr, Collective]]:
        start = (getattr(node, "lineno", 0), getattr(node, "col_offset", 0))
        end = (getattr(node, "end_lineno", 0) or 0, getattr(node, "end_col_offset", 0) or 0)
        return [
            (call, collective)
            for call, collective in self.scope_collectives
            if start <= (call.lineno, call.col_offset)
            and (call.end_lineno or 0, call.end_col_offset or 0) <= end
        ]

    def collectives(self, statements: list[ast.stmt]) -> list[tuple[ast.expr, Collective]]:
        if not self.scope_collectives:
            return []
        found = []
        for statement in statements:
            if not isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                found += self.collectives_within(statement)
        return found

    def block(self, statements: list[ast.stmt], guards: list[Guard], loop: ast.stmt | None = None) -> None:
        self._mark_complementary(statements)
        for statement in statements:
            self.statement(statement, guards, loop)

    def _mark_complementary(self, statements: list[ast.stmt]) -> None:
        """``if not is_main: barrier()`` ... ``if is_main: barrier()`` in one block (the
        "main process first" idiom): every rank makes the call once, in one of the two."""
        ifs = [s for s in statements if isinstance(s, ast.If) and not s.orelse]
        if len(ifs) < 2 or not self.scope_collectives:
            return
        for i, first in enumerate(ifs):
            for second in ifs[i + 1 :]:
                if negates(first.test, second.test):
                    labels_first = [c.label for _call, c in self.collectives(first.body)]
                    labels_second = [c.label for _call, c in self.collectives(second.body)]
                    if labels_first and labels_first == labels_second:
                        self.complementary |= {id(first), id(second)}

    def statement(self, node: ast.stmt, guards: list[Guard], loop: ast.stmt | None) -> None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            return  # checked as scopes of their own
        visitor = visit_exit if is_exit(node) else VISITORS.get(type(node))
        if visitor is None:
            self.calls_here(node, guards)
        else:
            visitor(self, node, guards, loop)

    def branches_differ(self, node: ast.If) -> bool:
        """Do the two sides of the if issue different collectives? (same on both: fine)"""
        body = [c.label for _call, c in self.collectives(node.body)]
        orelse = [c.label for _call, c in self.collectives(node.orelse)]
        return body != orelse

    def calls_here(self, node: ast.AST, guards: list[Guard]) -> None:
        for call in calls_in(node):
            self.check_passed_containers(call)
        for reached, collective in self.collectives_within(node) if self.scope_collectives else []:
            self.check_shapes(reached, collective)
            if (
                collective.label.endswith("generate() without synced_gpus=True")
                and len(collective.chain) == 1
            ):
                self.add(
                    Cause.DATA_DEPENDENT_BRANCH,
                    "warning",
                    reached,
                    f"{collective.label}: generation runs one forward per new token and, with FSDP "
                    f"or ZeRO-3, every forward all-gathers sharded parameters; ranks whose sequences "
                    f"end sooner stop gathering and the others wait. Pass synced_gpus=True",
                    collective,
                )
            for guard, exit_node, _loop in self.pending_exits:
                if not isinstance(exit_node, (ast.Break, ast.Continue)):
                    self.report_exit(guard, exit_node, reached, collective)
            diverging = [
                g
                for g in guards
                if g.kind != "other"
                and not g.balanced
                and not self.members_of_its_group(g, reached, collective)
            ]
            if diverging:
                self.report_branch(diverging[-1], reached, collective)

    def members_of_its_group(self, guard: Guard, call: ast.expr, collective: Collective) -> bool:
        """``if rank in ranks: dist.all_reduce(x, group=group)`` where ``group =
        dist.new_group(ranks)``, or a test on ``get_process_group_ranks(group)`` or
        ``get_rank(group)``: only the group's members call it, and they are all its ranks."""
        if (
            guard.kind != RANK
            or guard.test is None
            or len(collective.chain) != 1
            or not isinstance(call, ast.Call)
        ):
            return False
        group = next((k.value for k in call.keywords if k.arg == "group"), None)
        position = GROUP_POSITION.get(collective.label.rpartition(".")[2])
        if group is None and position is not None and len(call.args) > position:
            group = call.args[position]
        if group is None:
            return False
        group_text = ast.unparse(group)
        members = self.ranks_of_group(group_text) | {
            f"{prefix}get_process_group_ranks({group_text})" for prefix in ("", "dist.", "torch.distributed.")
        }
        return any(tests_membership(node, group_text, members) for node in ast.walk(guard.test))

    def ranks_of_group(self, group_text: str) -> set[str]:
        """The expressions a group of this name was made from: ``ranks`` for
        ``group = dist.new_group(ranks)`` (or ``new_group(ranks=ranks)``), in this scope or
        at module level."""
        found: set[str] = set()
        for scope in (self.scope, self.module.tree):
            for node in self.linter.nodes(scope):
                if not (isinstance(node, ast.Assign) and isinstance(node.value, ast.Call)):
                    continue
                if getattr(node.value.func, "attr", getattr(node.value.func, "id", "")) != "new_group":
                    continue
                if not any(ast.unparse(target) == group_text for target in node.targets):
                    continue
                made_from = [
                    *node.value.args[:1],
                    *(k.value for k in node.value.keywords if k.arg == "ranks"),
                ]
                found |= {ast.unparse(ranks) for ranks in made_from}
        return found

    def at(self, line: int, collective: Collective) -> str:
        """A line of the checked file, named so that it reads right next to the finding's site."""
        return f"line {line}" if collective.path == self.path else f"{self.path}:{line}"

    def report_branch(self, guard: Guard, call: ast.expr, collective: Collective) -> None:
        if guard.kind == RANK:
            cause, severity, why = Cause.RANK_CONDITIONAL_COLLECTIVE, "error", "rank-dependent"
        elif guard.kind == CAUGHT:
            cause, severity, why = (
                Cause.RANK_EXCEPTION,
                "warning",
                "caught-error (a rank whose try failed alone runs it)",
            )
        elif guard.kind == DATA:
            cause, severity, why = (
                Cause.DATA_DEPENDENT_BRANCH,
                "warning",
                "data-dependent (a tensor's value or size)",
            )
        else:
            cause, severity, why = (
                Cause.UNSYNCHRONIZED_DECISION,
                "warning",
                "rank-local (a clock, a file check, a random draw, a metric of the rank's own)",
            )
        if not collective.certain or guard.peer:
            severity = "warning"
        self.add(
            cause,
            severity,
            call,
            f"{collective.label} is reached only where `{guard.text}` "
            f"({self.at(guard.line, collective)}) holds, a {why} condition: the other ranks never "
            f"make this call",
            collective,
            guard,
        )

    def check_while_test(self, loop: ast.While) -> None:
        """``while time.time() - start < budget:`` around a collective: a test whose value
        differs per rank ends the loop after a different number of passes on each."""
        if isinstance(loop.test, ast.Constant) or self.collectives_within(loop.test):
            return  # a test that communicates (broadcasts rank 0's decision) is agreed on
        in_loop = sorted(self.collectives(loop.body), key=lambda pair: (pair[0].lineno, pair[0].col_offset))
        if not in_loop:
            return
        kind = self.kind(loop.test, loop.body)
        if kind == "other":
            return
        certain = [pair for pair in in_loop if pair[1].certain]
        call, collective = (certain or in_loop)[0]
        # every rank runs the loop; its passes differ: those whose test turns false first
        # leave it early (a bound computed from the rank or its shard's length)
        cause = {RANK: Cause.RANK_EARLY_EXIT, DATA: Cause.DATA_DEPENDENT_BRANCH}.get(
            kind, Cause.UNSYNCHRONIZED_DECISION
        )
        guard = Guard(kind, loop.lineno, ast.unparse(loop.test))
        self.add(
            cause,
            "error" if kind == RANK and collective.certain else "warning",
            call,
            f"{collective.label} runs in every pass of the `while` at line {loop.lineno}, whose test "
            f"`{guard.text}` can differ per rank: ranks that leave the loop sooner never make "
            "the others' last calls",
            collective,
            guard,
        )

    def asks_a_tracker_fed_local_values(self, test: ast.expr) -> bool:
        """``if logger.improved("val_loss"):`` where ``logger`` is an instance of the project's
        class that this scope fed the rank's own numbers before the test
        (``logger.accumulate(val_loss=loss.item())``) and whose methods issue no collective:
        a tracker (a meter, a logger, a stopper) answers from what this rank gave it."""
        asked = {
            call.func.value.id
            for call in ast.walk(test)
            if isinstance(call, ast.Call)
            and isinstance(call.func, ast.Attribute)
            and isinstance(call.func.value, ast.Name)
        }
        if not asked:
            return False
        built = self.linter.constructions(self.scope)
        classes = {n.name: n for n in self.module.all_nodes if isinstance(n, ast.ClassDef)}
        for name in asked:
            cls = classes.get(built.get(name, ""))
            if cls is None or self.collectives_in_class(cls):
                continue
            fed = any(
                isinstance(call, ast.Call)
                and isinstance(call.func, ast.Attribute)
                and isinstance(call.func.value, ast.Name)
                and call.func.value.id == name
                and call.lineno < test.lineno
                and any(
                    called_names(arg) & TENSOR_VALUE_CALLS
                    for arg in [*call.args, *(k.value for k in call.keywords)]
                )
                for call in ast.walk(self.scope)
            )
            if fed:
                return True
        return False

    def collectives_in_class(self, cls: ast.ClassDef) -> bool:
        methods = [m for m in cls.body if isinstance(m, ast.FunctionDef | ast.AsyncFunctionDef)]
        return any(
            self.linter.collective_of_function(Function(m, self.module, cls.name)) is not None
            for m in methods
        )

    def synchronised_before(self, line: int) -> set[str]:
        """The names that hold an all-reduced or broadcast value at ``line``: synchronised
        before it, or assigned from one after its synchronisation (``mean = (totals[0] /
        totals[1]).item()`` after ``dist.all_reduce(totals)``), in the order written."""
        points = self.linter.sync_points(self.scope, self.module)
        synced = {name for name, lines in points.items() if any(at < line for at in lines)}
        first = {name: min(lines) for name, lines in points.items() if name in synced}
        assigns = sorted(
            (n for n in ast.walk(self.scope) if isinstance(n, ast.Assign) and n.lineno < line),
            key=lambda n: n.lineno,
        )
        imported = {
            (alias.asname or alias.name).split(".")[0]
            for node in ast.walk(self.module.tree)
            if isinstance(node, ast.Import | ast.ImportFrom)
            for alias in node.names
        }
        for node in assigns:
            # every value it reads synchronised (modules and builtins are no values)
            read = {n.id for n in ast.walk(node.value) if isinstance(n, ast.Name)} - imported - _BUILTINS
            if read and all(first.get(name, line) < node.lineno for name in read):
                targets = {
                    t.id for target in node.targets for t in ast.walk(target) if isinstance(t, ast.Name)
                }
                synced |= targets
                first.update({name: node.lineno for name in targets})
        return synced

    def judged_by_own_function(self, test: ast.expr) -> bool:
        """Whether a call to a function of the project takes a tensor's value in ``test``."""
        for call in (n for n in ast.walk(test) if isinstance(n, ast.Call)):
            reads_value = any(
                called_names(arg) & TENSOR_VALUE_CALLS
                for arg in [*call.args, *(k.value for k in call.keywords)]
            )
            if reads_value and self.linter.resolve_call(call, self.module, self.function) is not None:
                return True
        return False

    def report_exit(
        self, guard: Guard, exit_node: ast.stmt, call: ast.expr | ast.stmt, collective: Collective
    ) -> None:
        if id(exit_node) in self.reported_exits:
            return  # one finding per exit: the first call it skips
        self.reported_exits.add(id(exit_node))
        statement = exit_word(exit_node)
        cause = {
            RANK: Cause.RANK_EARLY_EXIT,
            DATA: Cause.DATA_DEPENDENT_BRANCH,
            CAUGHT: Cause.RANK_EXCEPTION,
        }.get(guard.kind, Cause.UNSYNCHRONIZED_DECISION)
        severity = "error" if guard.kind == RANK and collective.certain else "warning"
        self.add(
            cause,
            severity,
            call,
            f"{collective.label} is skipped by the `{statement}` at line {exit_node.lineno} under "
            f"`{guard.text}` ({self.at(guard.line, collective)}): ranks that take it never make "
            f"this call",
            collective,
            guard,
        )

    def step_hook(self) -> StepHook | None:
        """The framework hook this function is, where the framework communicates with what
        it returns (communicates.STEP_HOOKS): a LightningModule's training_step under
        automatic optimisation."""
        function = self.function
        if function is None or function.class_name is None:
            return None
        hook = next((h for h in STEP_HOOKS if h.method == function.name), None)
        owner = next(
            (
                node
                for node in self.module.all_nodes
                if isinstance(node, ast.ClassDef) and node.name == function.class_name
            ),
            None,
        )
        if hook is None or owner is None:
            return None
        if not any(ast.unparse(base).rsplit(".", 1)[-1] == hook.base for base in owner.bases):
            return None
        for node in ast.walk(owner):
            if (
                isinstance(node, ast.Assign)
                and isinstance(node.value, ast.Constant)
                and node.value.value is False
                and any(isinstance(t, ast.Attribute) and t.attr == hook.manual_switch for t in node.targets)
            ):
                return None  # the user calls backward (manual_backward) in the body, seen there
        return hook

    def returns_without_a_value(self) -> None:
        """At the end of a step hook: a `return` (or `return None`) under a test on a rank's
        own value skips what the framework does with the returned loss, on that rank only."""
        hook = self.step_hook()
        if hook is None:
            return
        for guard, exit_node, _loop in self.pending_exits:
            if not isinstance(exit_node, ast.Return):
                continue
            if exit_node.value is not None and not (
                isinstance(exit_node.value, ast.Constant) and exit_node.value.value is None
            ):
                continue
            after = Collective(
                hook.what,
                [f"{hook.method}() returns to the framework at {self.path}:{exit_node.lineno}"],
                self.path,
                exit_node.lineno,
                exit_node.col_offset,
            )
            self.report_exit(guard, exit_node, exit_node, after)

    def rooted_reason(self, guard: Guard) -> str:
        """Why a condition is rank-local when it reads what dist.reduce left on a rank: said,
        since the value came out of a collective and looks synchronised."""
        if guard.kind != "unsynced":
            return ""
        try:
            read = {n.id for n in ast.walk(ast.parse(guard.text, mode="eval")) if isinstance(n, ast.Name)}
        except SyntaxError:
            return ""
        rooted = self.linter.rooted_names(self.scope, self.module)
        for name in sorted(read & rooted.keys()):
            label, line = rooted[name]
            return (
                f"; `{name}` holds the result of {label}() at line {line}, which only its "
                "destination rank receives: the others test their own partial value"
            )
        return ""

    def attribute_reason(self, guard: Guard) -> str:
        """Where the attribute a rank-local test reads was set, when another function set it
        (a callback's ``trainer.should_stop = True`` under its patience count, read by the
        trainer's ``if self.should_stop: break``): that line decided."""
        if guard.kind != "unsynced":
            return ""
        try:
            tree = ast.parse(guard.text, mode="eval")
        except SyntaxError:
            return ""
        for node in ast.walk(tree):
            if not (
                isinstance(node, ast.Attribute) and self.linter.attribute_is_local(self.module, node.attr)
            ):
                continue
            site = self.linter.attribute_site(self.module, node.attr)
            if site is None or (
                site.path == self.module.path
                and self.function
                and site.line in range(self.function.node.lineno, (self.function.node.end_lineno or 0) + 1)
            ):
                continue
            under = f" under {site.test}" if site.test else " from a value of its own"
            return (
                f"; `{node.attr}` is set at {relative_path(site.path)}:{site.line} in {site.function}()"
                f"{under}, on each rank from what that rank computed"
            )
        return ""

    def decorated_rank_zero(self) -> None:
        assert self.function is not None
        for call in reaching_nodes_in(self.function.node):
            collective = self.linter.collective_of_node(call, self.module, self.function, self.ddp)
            if collective is not None:
                self.add(
                    Cause.RANK_CONDITIONAL_COLLECTIVE,
                    "error" if collective.certain else "warning",
                    call,
                    f"{collective.label} in {self.function.name}(), which runs on rank 0 only "
                    f"(decorated with a rank-zero decorator)",
                    collective,
                )

    def add(
        self,
        cause: Cause,
        severity: str,
        call: ast.expr | ast.stmt,
        message: str,
        collective: Collective,
        guard: Guard | None = None,
    ) -> None:
        where = f" (in {self.function.name}()" if self.function else " (at module level"
        evidence = [f"call chain: {' -> '.join(collective.chain)}"]
        if guard is not None:
            evidence.append(f"condition at {self.path}:{guard.line}: {guard.text}")
            message += self.rooted_reason(guard) + self.attribute_reason(guard)
        if len(collective.chain) > 1:
            where += f", through {' -> '.join(collective.chain[:-1])}"
        where += ")"
        self.findings.append(
            lint_finding(
                cause,
                severity,
                collective.path,
                collective.line,
                collective.col,
                message + where,
                evidence,
                guard.line if guard is not None else None,
                call.lineno,
                self.path,
                collective.label,
            )
        )


def _container(iterable: ast.expr) -> ast.expr:
    """What a loop's iterable iterates: ``metrics`` of ``metrics.items()`` (``keys``,
    ``values``), else the iterable itself."""
    if (
        isinstance(iterable, ast.Call)
        and isinstance(iterable.func, ast.Attribute)
        and iterable.func.attr in ("items", "keys", "values")
    ):
        return iterable.func.value
    return iterable


def _iterated_name(loop: ast.For | ast.AsyncFor) -> str | None:
    """The name of the container a loop iterates (``tasks``, ``metrics`` of ``metrics.items()``)."""
    container = _container(loop.iter)
    return container.id if isinstance(container, ast.Name) else None
