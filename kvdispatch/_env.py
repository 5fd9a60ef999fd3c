"""The package's environment variables and their two parsers, booleans (``flag``) and enumerations (``choice``):
every ``KVDISPATCH_*`` switch is read through them (``KVDISPATCH_CACHE_DIR``, a path, is ``_build_cache``'s), and
``check_variables`` reads them all, so that an invalid value is an ``InvalidVariableError`` on every platform,
also for a variable only another vendor's or backend's path reads. ``TRITON_INTERPRET`` is Triton's own
variable and is read as Triton reads it (``triton_flag``)."""

from __future__ import annotations

import os

_ON = frozenset({"1", "true", "yes", "on"})
_OFF = frozenset({"0", "false", "no", "off", ""})
# What Triton takes for true (``knobs.env_bool``, through libtriton's ``getenv_bool`` in 3.9): the value, lowered,
# exactly one of these (no spaces stripped); anything else is false. tests/test_dispatch.py compares this reading
# with the installed Triton's.
_TRITON_ON = frozenset({"1", "y", "yes", "on", "true"})

BACKEND = "KVDISPATCH_BACKEND"
STRICT = "KVDISPATCH_STRICT"
DEBUG = "KVDISPATCH_DEBUG"
PDL = "KVDISPATCH_PDL"
HIP_HOST_PATH = "KVDISPATCH_HIP_HOST_PATH"
TRITON_LAUNCH = "KVDISPATCH_TRITON_LAUNCH"
CUPY_LAUNCH = "KVDISPATCH_CUPY_LAUNCH"
BOOLEANS = (STRICT, DEBUG, PDL, HIP_HOST_PATH)
# The launchers' modes, the default first (``kernels_triton/launch.py``, ``kernels_cupy/native.py``).
# ``KVDISPATCH_BACKEND``'s choices are the backend registry's (``dispatch.CHOICES``).
LAUNCH_MODES = {TRITON_LAUNCH: ("auto", "native", "direct", "fast", "plain"),
                CUPY_LAUNCH: ("auto", "native", "python")}


class InvalidVariableError(ValueError):
    """An environment variable holds a value its parser refuses: the caller's error, never a backend's
    failure (``kvdispatch.dispatch``)."""


def flag(name: str) -> bool:
    """The boolean variable ``name``: ``1``, ``true``, ``yes``, ``on`` are True and ``0``, ``false``, ``no``,
    ``off`` False, in any case and with surrounding spaces; unset or empty is False. Any other value is an
    ``InvalidVariableError`` naming the variable and the accepted values."""
    value = os.environ.get(name, "")
    word = value.strip().lower()
    if word in _ON:
        return True
    if word in _OFF:
        return False
    raise InvalidVariableError(f"{name} must be one of 1/0, true/false, yes/no, on/off (any case; empty or unset "
                               f"is off), got {value!r}")


def normalized(value, choices: tuple[str, ...], source: str) -> str:
    """``value`` as one of ``choices``: surrounding spaces and case ignored, empty meaning ``choices[0]``. Any
    other value (a non-string included) is a ``ValueError`` naming ``source`` and the choices."""
    name = (value.strip().lower() or choices[0]) if isinstance(value, str) else value
    if name not in choices:
        raise ValueError(f"{source} must be one of {', '.join(choices)}; got {value!r}")
    return name


def choice(name: str, choices: tuple[str, ...]) -> str:
    """The enumeration variable ``name``: one of ``choices`` (``normalized``), unset or empty meaning
    ``choices[0]``; any other value is an ``InvalidVariableError``."""
    try:
        return normalized(os.environ.get(name, ""), choices, name)
    except ValueError as exc:
        raise InvalidVariableError(str(exc)) from None


def triton_flag(name: str) -> bool:
    """A Triton boolean variable (``TRITON_INTERPRET``) as Triton reads it: true for ``1``, ``y``, ``yes``,
    ``on``, ``true`` in any case and without spaces around; every other value, unset included, false."""
    return os.environ.get(name, "").lower() in _TRITON_ON


def check_variables(backend_choices: tuple[str, ...]) -> None:
    """Read every ``KVDISPATCH_*`` variable (``KVDISPATCH_BACKEND`` against ``backend_choices``), whichever
    vendor and backend will serve: an invalid one raises ``InvalidVariableError`` here."""
    choice(BACKEND, backend_choices)
    for name in BOOLEANS:
        flag(name)
    for name, modes in LAUNCH_MODES.items():
        choice(name, modes)
