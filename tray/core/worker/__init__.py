"""The core worker and its components (see ``core_worker``'s docstring)."""
