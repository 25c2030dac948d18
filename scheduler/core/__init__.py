"""The scheduling algorithm: pure Python, deterministic, no Django import. See ``plan``."""

from .engine import plan, validate
from .order import decay_usage

__all__ = ["decay_usage", "plan", "validate"]
