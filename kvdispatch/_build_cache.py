"""Where code built at run time lives, and who may have written it: the one policy for every such build.

A library is loaded from the build cache only when no other user could have written it or swapped it
for another, which the cache's directories decide:

* The cache directory itself (``$KVDISPATCH_CACHE_DIR``, else ``$XDG_CACHE_HOME/kvdispatch``, else
  ``~/.cache/kvdispatch``), and any subdirectory of it a build uses: a real directory, never a symbolic
  link (it is not followed), owned by the current user and writable by no one else (no group or other
  write bit). What is missing is created with mode 0700, and checked the same way after creation (so a
  name another user took first is refused).
* Every directory above it, symbolic links resolved (the resolved path is the one used from then on):
  owned by the current user or root, and writable by no one else unless it is sticky (as ``/tmp``:
  others may add names there but not rename or remove ours). Anyone who can write one of them can
  rename the cache and put their own in its place.
* A built file: a regular file, never a symbolic link, owned by the current user and writable by no
  one else. It is checked right before it is loaded, and loaded by the checked path; with the
  directories above trusted, no other user can replace it in between.

Anything else raises ``UntrustedPathError`` naming the path and the reason; callers fall back to a path
that loads nothing (the compiled launcher: launches stay in Python).

Builds are atomic: the compiler writes a temporary file of its own in the cache directory, which is then
renamed over the final name, so processes that build at once (engine ranks on first use) each load a
complete file and leave one file behind.
"""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from pathlib import Path
from typing import Callable

CACHE_ENV = "KVDISPATCH_CACHE_DIR"
GROUP_OR_OTHER_WRITE = stat.S_IWGRP | stat.S_IWOTH
ROOT_UID = 0


class UntrustedPathError(PermissionError):
    """A directory or file of the build cache that another user could have written."""


def root() -> Path:
    """The configured cache directory, not yet checked: ``$KVDISPATCH_CACHE_DIR``, else
    ``$XDG_CACHE_HOME/kvdispatch``, else ``~/.cache/kvdispatch``."""
    configured = os.environ.get(CACHE_ENV)
    if configured:
        return Path(os.path.abspath(configured))
    return Path(os.path.abspath(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")) / "kvdispatch"


def private_dir(path: str | os.PathLike) -> Path:
    """``path`` as a private directory of the current user (created 0700 with its missing parents), with
    its parents resolved; raises ``UntrustedPathError`` where the rules above refuse it (and ``OSError``
    where it cannot be created)."""
    path = Path(os.path.abspath(path))
    resolved_parent = Path(os.path.realpath(path.parent))
    missing = []  # parents to create, deepest first
    existing = resolved_parent
    while not os.path.lexists(existing):
        missing.append(existing)
        existing = existing.parent
    for ancestor in (*reversed(existing.parents), existing):
        _check_ancestor(ancestor)
    directory = resolved_parent / path.name
    for step in (*reversed(missing), directory):
        with contextlib.suppress(FileExistsError):
            os.mkdir(step, 0o700)
        _check_own(step, os.lstat(step), "directory")
    return directory


def checked_file(path: str | os.PathLike) -> Path:
    """``path`` when it is a regular file of the current user that no one else can write (its directory
    already checked by ``private_dir``); raises ``UntrustedPathError`` otherwise, ``FileNotFoundError``
    where it is missing."""
    path = Path(path)
    _check_own(path, os.lstat(path), "file")
    return path


def build(directory: str | os.PathLike, name: str, produce: Callable[[Path], None]) -> Path:
    """The checked path of ``name`` in the private ``directory``, built first where it is missing:
    ``produce(partial)`` writes the file at ``partial`` (a fresh name in the same directory), which is then
    made 0700 and renamed to ``name``. Raises what ``produce`` raises (leaving no partial file behind), and
    ``UntrustedPathError`` as ``private_dir`` and ``checked_file`` do."""
    directory = private_dir(directory)
    target = directory / name
    if not os.path.lexists(target):
        descriptor, partial = tempfile.mkstemp(prefix=f".{name}.", suffix=".partial", dir=directory)
        os.close(descriptor)
        try:
            produce(Path(partial))
            os.chmod(partial, 0o700)  # a compiler's output follows the umask, which may let the group write
            os.replace(partial, target)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(partial)
    return checked_file(target)


def _check_ancestor(path: Path) -> None:
    status = os.lstat(path)
    if stat.S_ISLNK(status.st_mode) or not stat.S_ISDIR(status.st_mode):
        raise UntrustedPathError(f"{path} (above the build cache) is not a directory")
    if status.st_uid not in (os.geteuid(), ROOT_UID):
        raise UntrustedPathError(f"{path} (above the build cache) is owned by uid {status.st_uid}, neither "
                                 f"the current user (uid {os.geteuid()}) nor root")
    if status.st_mode & GROUP_OR_OTHER_WRITE and not status.st_mode & stat.S_ISVTX:
        raise UntrustedPathError(f"{path} (above the build cache) is writable by group or others and not "
                                 f"sticky (mode {stat.S_IMODE(status.st_mode):o})")


def _check_own(path: Path, status: os.stat_result, kind: str) -> None:
    """``path`` (whose ``lstat`` is ``status``) is a ``kind`` ("directory" or "file") that only the current
    user can write."""
    if stat.S_ISLNK(status.st_mode):
        raise UntrustedPathError(f"{path} is a symbolic link; the build cache does not follow them")
    if not (stat.S_ISDIR if kind == "directory" else stat.S_ISREG)(status.st_mode):
        raise UntrustedPathError(f"{path} is not {'a directory' if kind == 'directory' else 'a regular file'}")
    if status.st_uid != os.geteuid():
        raise UntrustedPathError(f"{path} is owned by uid {status.st_uid}, not by the current user "
                                 f"(uid {os.geteuid()})")
    if status.st_mode & GROUP_OR_OTHER_WRITE:
        raise UntrustedPathError(f"{path} is writable by group or others (mode {stat.S_IMODE(status.st_mode):o}); "
                                 f"the build cache must be private (chmod go-w, or remove it)")
