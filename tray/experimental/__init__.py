"""Ray's ``ray.experimental`` names that tray offers (``internal_kv``)."""
