"""System checks: audit configuration errors stop ``migrate``/``runserver`` with the fix in the message."""

from __future__ import annotations

from django.core.checks import Error, register
from django.core.exceptions import ImproperlyConfigured

from audit import conf
from audit.crypto import sm4_gcm_available


@register("gpupool")
def audit_configuration(app_configs, **kwargs) -> list[Error]:
    errors: list[Error] = []
    for index, read in enumerate((conf.master_keys, conf.signing_seed, conf.cipher, conf.retention_days), start=1):
        try:
            read()
        except ImproperlyConfigured as exc:
            errors.append(Error(str(exc), id=f"audit.E00{index}"))
    if not errors and conf.cipher() == "sm4-gcm" and not sm4_gcm_available():
        errors.append(
            Error(
                "GPUPOOL_AUDIT_CIPHER=sm4-gcm, but this cryptography/OpenSSL build has no SM4-GCM; install an "
                "OpenSSL with SM4 or use aes-256-gcm.",
                id="audit.E005",
            )
        )
    return errors
