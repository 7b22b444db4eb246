"""Whether a path a setting names can be written, checked at start without creating anything.

A crawl writes its audit log, its spool, the embedded server's data and the
SQLite store long after it started; a path that cannot take them (a directory
named as a file, a file of /proc, a directory that does not exist, a name too
long for the filesystem) would fail then, in the middle of the crawl, or not at
all visibly. These checks only look (stat, access, the mount table): nothing is
created, so a refused path leaves the disk as it was.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

#: Filesystems whose files are the kernel's, not data: nothing the package
#: writes may go there.
PSEUDO_FILESYSTEMS = frozenset(
    {
        "proc",
        "sysfs",
        "devtmpfs",
        "devpts",
        "cgroup",
        "cgroup2",
        "debugfs",
        "tracefs",
        "securityfs",
        "configfs",
        "pstore",
        "bpf",
        "efivarfs",
        "fusectl",
        "mqueue",
        "binfmt_misc",
        "hugetlbfs",
        "autofs",
    }
)
#: Longest path the usual filesystems take, and longest name of one part, bytes.
_PATH_MAX = 4096
_NAME_MAX = 255


def _pseudo_filesystem(path: Path) -> str | None:
    """The type of the pseudo filesystem *path* (which exists) is on; None for a real one,
    or where the mount table cannot be read (not Linux)."""
    try:
        device = os.stat(path).st_dev
        table = Path("/proc/self/mountinfo").read_text()
    except OSError:
        return None
    wanted = f"{os.major(device)}:{os.minor(device)}"
    for line in table.splitlines():
        fields = line.split()
        if len(fields) < 3 or fields[2] != wanted or " - " not in line:
            continue
        fstype = line.split(" - ", 1)[1].split()[0]
        return fstype if fstype in PSEUDO_FILESYSTEMS else None
    return None


def _length_problem(path: Path) -> str | None:
    if "\0" in str(path):
        return "it holds a NUL character"
    try:
        raw = os.fsencode(path)
    except UnicodeEncodeError:
        return "it is not a name the filesystem can hold"
    if len(raw) > _PATH_MAX:
        return f"the path is {len(raw)} bytes long (at most {_PATH_MAX})"
    for part in path.parts:
        size = len(os.fsencode(part))
        if size > _NAME_MAX:
            return f"a name in it is {size} bytes long (at most {_NAME_MAX})"
    return None


def _existing_ancestor(path: Path) -> Path:
    for candidate in (path, *path.parents):
        if os.path.lexists(candidate):
            return candidate
    return Path(path.anchor or ".")


def _directory_problem(directory: Path) -> str | None:
    """Why files cannot be made in *directory* (which exists); None when they can."""
    if not directory.is_dir():
        return f"{directory} is not a directory"
    fstype = _pseudo_filesystem(directory)
    if fstype:
        return f"{directory} is on the kernel's {fstype} filesystem"
    if not os.access(directory, os.W_OK | os.X_OK):
        return f"{directory} is not writable"
    return None


def directory_problem(path: str | os.PathLike[str]) -> str | None:
    """Why *path* cannot be (or become) a directory the package writes in; None when it can.

    It may not exist yet (the package creates it), but the nearest part of it that
    exists must be a writable directory on a real filesystem.
    """
    path = Path(os.path.abspath(path))
    problem = _length_problem(path)
    if problem:
        return problem
    return _directory_problem(_existing_ancestor(path))


def file_problem(path: str | os.PathLike[str]) -> str | None:
    """Why *path* cannot be a file the package appends to; None when it can.

    The file may not exist yet, but its directory must: nothing is created to
    make room for it. An existing one must be a regular, writable file (not a
    directory, a device, a FIFO or a file of /proc).
    """
    path = Path(os.path.abspath(path))
    problem = _length_problem(path)
    if problem:
        return problem
    if os.path.lexists(path):
        try:
            mode = os.stat(path).st_mode
        except OSError as exc:
            return f"{path} cannot be read ({exc.strerror})"
        if stat.S_ISDIR(mode):
            return f"{path} is a directory"
        if not stat.S_ISREG(mode):
            return f"{path} is not a regular file"
        fstype = _pseudo_filesystem(path)
        if fstype:
            return f"{path} is a file of the kernel's {fstype} filesystem"
        if not os.access(path, os.W_OK):
            return f"{path} is not writable"
        return None
    if not os.path.lexists(path.parent):
        return f"its directory {path.parent} does not exist"
    return _directory_problem(path.parent)
