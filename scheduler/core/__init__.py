"""The scheduling algorithm: pure Python, deterministic, no Django import. See ``plan``."""
