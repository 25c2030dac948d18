"""Tasks of the portal itself: the round-trip probe used by /healthz and the integration tests."""

from __future__ import annotations

from celery import shared_task


@shared_task(name="portal.echo")
def echo(payload: str) -> dict:
    """Return the payload with the worker's hostname, so a caller can see a real worker answered."""
    from celery import current_task

    return {"payload": payload, "worker": current_task.request.hostname}
