"""gpupool's kernel: what every app stands on and that knows none of them.

The one access policy (``kernel.access_rules``), the API's error shape and helpers (``kernel.api``, ``kernel.filters``,
``kernel.pagination``, ``kernel.serializers``, ``kernel.openapi``), the database backends and bulk SQL
(``kernel.db``), request limits, environment parsing, task queueing by name and the beat cadence. It imports no
app of ours; ``portal`` (settings, URLs, ASGI, Celery wiring, the demo) is the roof above every app.
"""
