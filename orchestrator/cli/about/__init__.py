"""What orch says of itself: its version, the CLI reference and the man pages."""
