"""The head side of the log path: per-node log files from the wire, and the live view.
"""
