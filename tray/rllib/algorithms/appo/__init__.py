from .appo import APPO, IMPALA, APPOConfig, IMPALAConfig

__all__ = ["APPO", "APPOConfig", "IMPALA", "IMPALAConfig"]
