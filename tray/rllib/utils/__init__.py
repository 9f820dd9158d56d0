"""Helpers shared by tray.rllib's components: spaces, postprocessing, metrics."""
