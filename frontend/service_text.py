"""The tenants services' refusals in the reader's language, where the console shows them.

The services write their messages in English with the data in them, for the API, the CLI and the audit trail
alike (as the scheduler writes its sentences; ``scheduler.message_text`` localizes those). The console shows
some of them at a form field (a system admin setting a quota, a tenant admin asking for one); ``localize``
recognises such a message by its pattern and formats the translated template with the message's own data. A
message no pattern knows stays as it was.
"""

from __future__ import annotations

import re

from django.utils.translation import gettext, gettext_noop

from tenants.models import ApprovalStepRole

_SLUG = r"[\w.-]+"

# (the whole message, its English template with the same named groups). The template is the msgid.
PATTERNS: list[tuple[re.Pattern[str], str]] = [
    (
        re.compile(
            rf"Quota for (?P<flavor>{_SLUG}): the guarantees under (?P<parent>{_SLUG}) add up to (?P<total>\d+) "
            r"millis \((?P<parts>[^)]*)\) but (?P=parent) is guaranteed only (?P<guaranteed>\d+); raise "
            r"(?P=parent)'s guarantee or lower the others\."
        ),
        gettext_noop(
            "Quota for %(flavor)s: the guarantees under %(parent)s add up to %(total)s millis (%(parts)s) but "
            "%(parent)s is guaranteed only %(guaranteed)s; raise %(parent)s's guarantee or lower the others."
        ),
    ),
    (
        re.compile(
            r"Quota (?P<where>[\w./-]+): limit_millis (?P<limit>\d+) is below guaranteed_millis (?P<guaranteed>\d+); "
            r"the limit must be at least the guarantee\."
        ),
        gettext_noop(
            "Quota %(where)s: limit_millis %(limit)s is below guaranteed_millis %(guaranteed)s; the limit must be "
            "at least the guarantee."
        ),
    ),
    (
        re.compile(
            r"This step waits for a (?P<role>[a-z ]+); a system admin deciding it instead must say why \(comment\)\."
        ),
        gettext_noop("This step waits for a %(role)s; a system admin deciding it instead must say why (comment)."),
    ),
]

# An approver role as the services write it in a sentence (the stored value with spaces) -> its label.
_ROLE_WORDS = {role.value.replace("_", " "): role.label for role in ApprovalStepRole}


def localize(message: str) -> str:
    """``message`` in the active language when a pattern knows it, else as it is."""
    for pattern, template in PATTERNS:
        match = pattern.fullmatch(message)
        if match:
            data = match.groupdict()
            if "role" in data:
                data["role"] = str(_ROLE_WORDS.get(data["role"], data["role"]))
            return gettext(template) % data
    return message
