"""A plain script: never initialises a process group."""

print("hello from a single process")
