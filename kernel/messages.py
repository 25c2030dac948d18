"""Messages as codes with parameters, rendered in the reader's language where they are shown.

A service refuses with a :class:`Message` from its app's catalogue (``tenants/messages.py``,
``scheduler/messages.py``, ``audit/messages.py``): ``raise DomainError(messages.QUOTA_LIMIT_BELOW_GUARANTEE(
where=..., limit=..., guaranteed=...))``. The call gives a :class:`Text`, which *is* the English sentence (a
``str``: the audit trail, logs, tests and old callers read it as before) and also carries its message's code and
parameters, so each edge renders it in the reader's language from the same template (``localize``): the console
(``frontend.service_text``), the API (``kernel.api.exception_handler``: ``detail`` in the request's
language, ``message`` with the code and parameters for programs), e-mail and the CLI. The template is the
gettext msgid; nothing types the sentence a second time.

A message stored as text (an approval's result, an old row) is still recognised: ``pattern()`` turns a template
into the regular expression of the sentences it writes, derived from the catalogue, not typed again.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from django.utils.translation import gettext

#: Every message by its code, in the order the catalogues define them.
CATALOGUE: dict[str, Message] = {}

#: Values a placeholder holds as stored (``running``, ``parent_tenant_admin``) to their label in the active
#: language, by placeholder name; the apps register theirs from ``AppConfig.ready()`` (``labels_register``).
_LABELS: dict[str, Callable[[], Mapping[str, object]]] = {}
#: Placeholders that hold a sentence of their own, rendered by a function of the app that writes it (the
#: scheduler's ``sentences`` and ``fix``; ``reason`` is a catalogue message quoted in another).
_RENDERERS: dict[str, Callable[[str], str]] = {}


class DuplicateMessage(ValueError):
    pass


@dataclass(frozen=True)
class Message:
    """One sentence a user may be shown: a stable ``code`` and its English ``template`` (``%(name)s``
    placeholders; the template is the msgid the translations key on)."""

    code: str
    template: str

    def __post_init__(self) -> None:
        existing = CATALOGUE.get(self.code)
        if existing is not None and existing.template != self.template:
            raise DuplicateMessage(f"message code {self.code!r} is already {existing.template!r}")
        CATALOGUE[self.code] = self

    @property
    def placeholders(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(re.findall(r"%\((\w+)\)s", self.template)))

    def __call__(self, **params: Any) -> Text:
        missing = set(self.placeholders) - set(params)
        unknown = set(params) - set(self.placeholders)
        if missing or unknown:
            raise TypeError(f"{self.code}: missing {sorted(missing)}, unknown {sorted(unknown)}")
        # A parameter that is itself a catalogue message stays one (rendered in the reader's language too).
        return Text(self, {name: value if isinstance(value, Text) else str(value) for name, value in params.items()})


class Text(str):
    """A message with its parameters: the English sentence as a ``str``, and ``message`` / ``params`` for the
    edges that render it in another language."""

    message: Message
    params: dict[str, str]

    def __new__(cls, message: Message, params: dict[str, str]) -> Text:
        text = super().__new__(cls, message.template % params)
        text.message = message
        text.params = params
        return text

    def __reduce__(self):  # pickled (Celery, caches) as the plain sentence
        return (str, (str(self),))

    @property
    def code(self) -> str:
        return self.message.code

    def render(self, translate: Callable[[str], str]) -> str:
        """The sentence through ``translate`` (``gettext``: the active language), stored values as labels."""
        return translate(self.message.template) % labelled(self.params)


def labels_register(name: str, labels: Callable[[], Mapping[str, object]]) -> None:
    """Show a placeholder called ``name`` as ``labels()[value]`` (a lazy label) where the value is known."""
    _LABELS[name] = labels


def renderer_register(name: str, render: Callable[[str], str]) -> None:
    """Show a placeholder called ``name`` (a sentence in itself) as ``render(value)`` in the active language."""
    _RENDERERS[name] = render


def labelled(params: Mapping[str, str]) -> dict[str, str]:
    """``params`` as the reader sees them: each stored value a registered placeholder knows as its label, each
    quoted sentence in the active language."""
    shown = {}
    for name, value in params.items():
        labels = _LABELS.get(name)
        if isinstance(value, Text):
            shown[name] = localize(value)
        elif labels is not None:
            shown[name] = str(labels().get(value, value))
        elif name == "reason":  # a refusal quoted in a result ("Approved, but it no longer fits: ...")
            shown[name] = localize(value)
        elif name in _RENDERERS:
            shown[name] = _RENDERERS[name](value)
        else:
            shown[name] = value
    return shown


_patterns: tuple[int, list[tuple[re.Pattern[str], Message]]] = (0, [])


def patterns() -> list[tuple[re.Pattern[str], Message]]:
    """(pattern, message) of every catalogue message, the more specific first (``specificity``)."""
    global _patterns
    if _patterns[0] != len(CATALOGUE):
        ordered = sorted(CATALOGUE.values(), key=specificity, reverse=True)
        _patterns = (len(CATALOGUE), [(pattern(message.template), message) for message in ordered])
    return _patterns[1]


def localize(message: str) -> str:
    """``message`` in the active language: from its code and parameters (a :class:`Text`), or, for a sentence
    stored as text, from the catalogue message whose pattern it matches; else as it is."""
    if isinstance(message, Text):
        return gettext(message.message.template) % labelled(message.params)
    for regex, known in patterns():
        match = regex.fullmatch(message)
        if match:
            return gettext(known.template) % labelled(match.groupdict())
    return message


# What a placeholder's data look like in a stored sentence, by its name; any other name stands for any text (the
# words around it keep the pattern precise, and a pattern must match the whole sentence).
_SLUG = r"[\w.-]+"
_INT = r"-?\d+"
PLACEHOLDER_SHAPES = {
    "flavor": _SLUG,
    "total": r"\d+",
    "guaranteed": r"\d+",
    "limit": r"\d+",
    "where": r"[\w./-]+",
    "role": r"[a-z ]+",
    "pk": r"\d+",
    "n": r"\d+",
    "max": r"\d+",
    "low": _INT,
    "high": _INT,
    "step": r"\d+",
    "depth": _INT,
    "height": r"\d+",
    "days": r"\d+",
    "ttl": _INT,
    "least": r"\d+",
    "most": r"\d+",
    "jobs": r"[\d,]+",
    "cap": r"[\d,]+",
    "state": r"\w+",
    "to_state": r"\w+",
    "status": r"\w+",
    "job_kind": r"\w+",
    "type": r"\w+",
    # a job spec field path: resources.gpus, env.MY_VAR, command[3], or a field the user sent (no colon)
    "field": r"[^:]+?",
    "setting": r"\w+",  # a what-if setting: grace_period_s
}


def pattern(template: str, shapes: Mapping[str, str] = PLACEHOLDER_SHAPES) -> re.Pattern[str]:
    """The regular expression of the sentences ``template`` writes (match it whole: ``fullmatch``): its words as
    they are, each placeholder as the data ``shapes`` says it holds, a placeholder used again as the same text."""
    parts = re.split(r"%\((\w+)\)s", template)
    regex, seen = [], set()
    for index, part in enumerate(parts):
        if index % 2 == 0:
            regex.append(re.escape(part.replace("%%", "%")))
        elif part in seen:
            regex.append(f"(?P={part})")
        else:
            seen.add(part)
            regex.append(f"(?P<{part}>{shapes.get(part, '.+?')})")
    return re.compile("".join(regex), re.DOTALL)


def specificity(message: Message) -> int:
    """How many characters of the template are words, not placeholders: where two templates could both match a
    stored sentence, the one with more words is the more specific and is tried first."""
    return len(re.sub(r"%\(\w+\)s", "", message.template))
