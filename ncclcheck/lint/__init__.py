"""lint: collectives that not every rank will reach, from source alone (ast).

What PARCOACH and MPI-Checker do for MPI in C, for PyTorch in Python: find every
collective (torch.distributed, the library calls that issue one, and the user's
own functions that reach one, across the user's modules), then the conditions
and early exits that depend on the rank, on a tensor's value, or on something
else that differs between ranks, and report each collective that only some
ranks would reach.

Nothing is imported or run: files are parsed, names are resolved by their
imports within the project. Calls the resolver cannot follow (a function passed
as an argument, ``getattr``) are not followed: lint errs on the side of silence."""

from ncclcheck.lint.findings import located
from ncclcheck.lint.run import python_files, run_lint

__all__ = ["located", "python_files", "run_lint"]
