"""Offline RL: recording sampled transitions to files and reading them back."""

from .io import OfflineWriter, read_transitions, write_transitions

__all__ = ["OfflineWriter", "read_transitions", "write_transitions"]
