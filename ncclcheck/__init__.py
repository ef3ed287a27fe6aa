"""ncclcheck: find the collective that not every rank reaches."""

__version__ = "0.1.0"
