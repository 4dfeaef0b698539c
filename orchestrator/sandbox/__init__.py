"""`orch sandbox`: a cluster of real OpenSSH nodes on this machine's loopback addresses.

Node K is the system sshd listening on its own 127.a.b.K address. Where the
machine allows it (root and unshare), each node runs in its own UTS, mount and
PID namespace: `hostname` prints the node's name, /etc/hosts names every node,
and killing the namespace's first process ends everything that ran on the node.
With shared PIDs the nodes keep their own hostname and /etc/hosts but share this
machine's process table, as two hostfile entries on one machine would. Every
session also carries ORCH_SANDBOX_ID (sshd's SetEnv), so `down` finds what a node
started even without a PID namespace of its own.

The sandbox owns everything under its state directory: per-node host keys, one
client key, a known_hosts that trusts exactly its nodes, an ssh_config, a
DeepSpeed hostfile. The only thing it adds outside is a marked `Include` block
at the top of ~/.ssh/config, removed again by `down`.

The parts: `cluster` (the `Sandbox`: up, status, down, faults), `state` (its values
and state file), `render` (keys, sshd_config, ssh_config, known_hosts, hostfile,
/etc/hosts), `nodes` (starting and stopping each node's sshd, in its namespaces),
`ports`, `processes` (what runs on a node, from /proc), `faults` (freeze, thaw),
`include` (the block in ~/.ssh/config) and `slurm` (munged, slurmctld, slurmd).
"""
