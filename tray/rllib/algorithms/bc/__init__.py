from .bc import BC, BCConfig

__all__ = ["BC", "BCConfig"]
