"""paramiko, and nothing else of orch talks to it: ssh_config, known hosts, connecting,
sessions, remote processes, and the parallel fan-out that returns one result per node.
"""
