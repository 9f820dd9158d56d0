"""Not imported: this directory goes first on a job driver's PYTHONPATH so
that its ``sitecustomize.py`` runs (see there). Being a package is what
ships that file in tray's wheel."""
