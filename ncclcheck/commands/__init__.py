"""The command pipelines: each gathers its inputs into evidence, has it explained,
and hands back a Report (preflight, doctor, lint, probe)."""
