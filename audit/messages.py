"""Every sentence the audit trail's exports may show a user: a stable code and its English template
(``kernel.messages``).

Raise one as ``DomainError(messages.NAME(param=value))``; the console, the API and e-mail render it in the
reader's language from the template, which is the gettext msgid (translations: frontend/locale).
"""

from __future__ import annotations

from django.utils.translation import gettext_noop

from kernel.messages import Message

WITNESS_LATEST_CHECKPOINT_DATABASE_RUN = Message(
    "audit.witness_latest_checkpoint_database_run",
    gettext_noop("%(stream)s: the witness's latest checkpoint is not in the database; run audit_verify."),
)
WITNESS_CANNOT_READ_EXPORT_MUST = Message(
    "audit.witness_cannot_read_export_must",
    gettext_noop("The witness cannot be read (%(error)s); an export must carry its statement."),
)
EXPORT_RANGE_EMPTY_MUST_AFTER = Message(
    "audit.export_range_empty_must_after",
    gettext_noop("The export range is empty: 'to' must be after 'from'."),
)
