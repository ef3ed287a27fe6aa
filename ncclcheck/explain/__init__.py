"""Why the ranks parted: alignment of the per-rank histories, the source around a
call site, and the rules that turn evidence into explanations."""
