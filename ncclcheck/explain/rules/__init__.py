"""The rules: one function each, tried in the order of a table, the first that explains
the evidence wins. divergence.py and quiet.py read a dry run's traces (preflight),
stacks.py reads stack classes (doctor), branch.py reads the source for both."""
