"""What `orch stacks` makes of the ranks' stacks: pure values and functions, no I/O.

model: py-spy's output (dump JSON, raw samples) and a node's report, parsed.
fold: identical stacks folded across ranks, the ranks that stand apart.
profile: the share of samples spent in communication, and the straggler.
report: the one JSON document a call prints and keeps.
"""
