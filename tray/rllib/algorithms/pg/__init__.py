from .pg import PG, PGConfig

__all__ = ["PG", "PGConfig"]
