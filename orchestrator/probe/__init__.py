"""The head's half of the node probe: the command that runs remote/probe.py on a node, and
its JSON output parsed into NodeFacts. Pure.
"""
