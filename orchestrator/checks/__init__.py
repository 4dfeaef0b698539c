"""doctor's checks: facts in, findings out. Pure, by family: node, parity, network,
collective, and the report that gathers them.
"""
