"""The services' refusals in the reader's language, wherever the console shows them.

A service refuses with a message of its app's catalogue (``tenants.messages``, ``scheduler.messages``,
``audit.messages``; see ``kernel.messages``): the refusal is the English sentence and carries its code and
parameters, so ``localize`` renders the translated template with the refusal's own data. A sentence that arrives
as plain text (an approval's stored result, a row older than the catalogue) is recognised by the pattern
``kernel.messages.pattern`` derives from the catalogue's template; nothing here types a sentence again. A
message no template knows stays as it was; tests/frontend/test_service_text.py walks the services' source and
fails on a refusal that is not a catalogue message.
"""

from __future__ import annotations

import re

from audit import messages as audit_messages  # noqa: F401  (registers the audit trail's messages)
from kernel.messages import localize, patterns
from scheduler import messages as scheduler_messages  # noqa: F401  (registers the scheduler's messages)
from tenants import messages as tenants_messages  # noqa: F401  (registers the tenants' messages)

__all__ = ["PATTERNS", "localize"]

# (the pattern of the sentences a template writes, the template), the more specific first.
PATTERNS: list[tuple[re.Pattern[str], str]] = [(regex, message.template) for regex, message in patterns()]
