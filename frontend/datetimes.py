"""One way to write a moment on every console page, per language (docs/console.md, "Dates and times").

Every timestamp the console shows is UTC and reads ``2026-11-27 14:05 UTC`` (with seconds where the order of
events within a minute matters: ``2026-11-27 14:05:09 UTC``) in English and in Chinese alike: the ISO order is
what the date filters take in both languages, sorts as text, and is read the same in both. Templates write it
with ``{{ value|when }}`` (``|when:"seconds"``), tables with ``WhenColumn``, and the charts' script with the
pattern base.html puts in ``<html data-datetime-format>``, so a language that wants another order changes it
here, once.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

from django.utils import dateformat
from django.utils.translation import get_language


@dataclass(frozen=True)
class MomentFormat:
    #: ``django.utils.dateformat`` patterns (the server's pages), to the minute and to the second.
    minutes: str
    seconds: str
    #: The same to the minute in uPlot's ``fmtDate`` tokens (the charts' script).
    script: str
    #: Written after every moment: the console shows UTC only.
    zone: str = "UTC"


ISO_UTC = MomentFormat(minutes="Y-m-d H:i", seconds="Y-m-d H:i:s", script="{YYYY}-{MM}-{DD} {HH}:{mm} UTC")

#: Language code → its one format; a language missing here uses ``ISO_UTC``.
MOMENT_FORMATS: dict[str, MomentFormat] = {"en": ISO_UTC, "zh-hans": ISO_UTC}


def moment_format(language: str | None = None) -> MomentFormat:
    return MOMENT_FORMATS.get((language or get_language() or "en").lower(), ISO_UTC)


def format_moment(value: datetime | None, *, seconds: bool = False, language: str | None = None) -> str:
    """``value`` in UTC in the language's one format (``""`` for None, so ``|default:"—"`` still applies)."""
    if value is None:
        return ""
    chosen = moment_format(language)
    if value.tzinfo is not None:
        value = value.astimezone(UTC)
    text = dateformat.format(value, chosen.seconds if seconds else chosen.minutes)
    return f"{text} {chosen.zone}"
