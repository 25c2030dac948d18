"""How often the periodic work runs (seconds), read once from the environment.

The Celery beat schedule (``portal.celery``) and whatever reasons about the real loop's clock (the what-if
replay, ``scheduler.whatif_history``) read the same figures here, so neither has to import the other.
"""

from __future__ import annotations

from kernel.env import env_int

# Short heartbeats and grace periods (tests, benchmarks/recovery.py) need a lease check at least as often as a
# heartbeat.
LEASE_CHECK_INTERVAL_S = env_int("GPUPOOL_LEASE_CHECK_INTERVAL_S", 5)
CYCLE_INTERVAL_S = env_int("GPUPOOL_CYCLE_INTERVAL_S", 5)
ETA_INTERVAL_S = env_int("GPUPOOL_ETA_INTERVAL_S", 30)
SERVING_SYNC_S = env_int("GPUPOOL_SERVING_SYNC_S", 15)
