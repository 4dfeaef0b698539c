"""I/O that carries out a plan: pre-flight, sync, launch (executor + pure verdict), pdsh,
teardown, log collection and the job records.
"""
