"""Raising an alert: what the audit trail does when something an operator must see goes wrong (a record that
cannot be written, a checkpoint that cannot be signed, a witness that refuses). The lowest module of the package:
appending itself raises alerts, so this one imports no other service."""

from __future__ import annotations

import logging

from django.utils.module_loading import import_string

from audit import conf
from audit.alerts import alert_store

alert_logger = logging.getLogger("audit.alert")


def raise_alert(*, event: str, message: str, details: dict | None = None) -> None:
    """Log at CRITICAL, keep the alert for the console's alerts page (``audit.alerts``) and call the optional hook
    (``GPUPOOL_AUDIT_ALERT_HOOK``: a dotted path to a callable ``hook(event: str, message: str, details: dict)``).
    A broken hook or store is logged, never raised."""
    alert_logger.critical("%s: %s", event, message, extra={"audit_event": event, "audit_details": details or {}})
    alert_store(event=event, message=message, details=details)
    path = conf.alert_hook_path()
    if not path:
        return
    try:
        import_string(path)(event, message, details or {})
    except Exception:
        alert_logger.exception("audit alert hook %s failed", path)
