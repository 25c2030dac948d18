"""The services' refusals in the reader's language, wherever the console shows them.

A service refuses with a message of its app's catalogue (``tenants.messages``, ``scheduler.messages``,
``audit.messages``; see ``kernel.messages``): the refusal is the English sentence and carries its code and
parameters, so ``localize`` renders the translated template with the refusal's own data. A sentence that arrives
as plain text (an approval's stored result, a refusal still written as an f-string) is recognised by the pattern
``kernel.messages.pattern`` derives from the catalogue's template; nothing here types a sentence again. A
message no template knows stays as it was; tests/frontend/test_service_text.py walks the services' source and
fails on a refusal no template knows.
"""

from __future__ import annotations

import re

from django.utils.translation import gettext

from audit import messages as audit_messages  # noqa: F401  (registers the audit trail's messages)
from kernel.messages import CATALOGUE, Text, labelled, pattern, specificity
from scheduler import message_text as scheduler_text
from scheduler import messages as scheduler_messages  # noqa: F401  (registers the scheduler's messages)
from tenants import messages as tenants_messages  # noqa: F401  (registers the tenants' messages)

# (the pattern of the sentences a template writes, the template). Where two templates could both match a
# sentence, the one with more words is tried first.
PATTERNS: list[tuple[re.Pattern[str], str]] = [
    (pattern(message.template), message.template)
    for message in sorted(CATALOGUE.values(), key=specificity, reverse=True)
]


def _shown(params: dict[str, str]) -> dict[str, str]:
    """The data of a sentence as the reader sees them: stored values as labels, quoted sentences localized."""
    data = labelled(params)
    if "reason" in data:  # a service's refusal quoted in a result ("Approved, but it no longer fits: ...")
        data["reason"] = localize(data["reason"])
    for name in ("sentences", "fix"):  # the scheduler's own sentences, in its own patterns
        if name in data:
            data[name] = scheduler_text.localize(data[name])
    return data


def localize(message: str) -> str:
    """``message`` in the active language: from its code and parameters, or, for plain text, when a template's
    pattern knows it; else as it is."""
    if isinstance(message, Text):
        return gettext(message.message.template) % _shown(message.params)
    for regex, template in PATTERNS:
        match = regex.fullmatch(message)
        if match:
            return gettext(template) % _shown(match.groupdict())
    return message
