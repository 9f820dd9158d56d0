"""The global control store and its tables (see ``gcs_server``'s docstring)."""
