"""Boolean environment variables: the one reading every switch of the package goes through."""

from __future__ import annotations

import os

_ON = frozenset({"1", "true", "yes", "on"})
_OFF = frozenset({"0", "false", "no", "off", ""})


def flag(name: str) -> bool:
    """The boolean variable ``name``: ``1``, ``true``, ``yes``, ``on`` are True and ``0``, ``false``, ``no``,
    ``off`` False, in any case and with surrounding spaces; unset or empty is False. Any other value is a
    ``ValueError`` naming the variable and the accepted values."""
    value = os.environ.get(name, "")
    word = value.strip().lower()
    if word in _ON:
        return True
    if word in _OFF:
        return False
    raise ValueError(f"{name} must be one of 1/0, true/false, yes/no, on/off (any case; empty or unset is off), "
                     f"got {value!r}")
