"""orch: pdsh-driven cluster orchestrator for multi-node PyTorch training."""

__version__ = "0.1.0"
