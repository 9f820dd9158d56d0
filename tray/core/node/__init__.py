"""The node manager and its components (see ``node_manager``'s docstring)."""
