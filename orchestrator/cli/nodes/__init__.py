"""The node commands: sandbox, doctor, hostfile and config, env push."""
