"""Transports: how messages move (``sim``: virtual network; ``tcp``: sockets)."""
