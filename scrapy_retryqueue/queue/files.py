"""Files and directories the package writes secrets to: readable by the user who runs it only.

The spool holds the requests it could not write to Redis (their headers and
cookies too), the embedded server's append-only file holds every task, and
the SQLite store every dead letter: with encryption off, all of them hold
secrets. Each is a 0600 file in a 0700 directory, whatever the umask.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import IO

#: Group and other permission bits: none on what the package writes.
_SHARED = stat.S_IRWXG | stat.S_IRWXO


def private_dir(path: Path) -> Path:
    """*path* as a directory only its owner can enter (0700), created when missing.

    Parents it creates get the usual mode; an existing directory of the
    user's is tightened, one of another user's is left as it is (chmod
    would fail; what matters is that it holds nothing of ours readable).
    """
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    _tighten(path)
    return path


def private_file(path: Path) -> None:
    """Create *path* empty as a 0600 file when missing, or tighten it to owner-only."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except FileExistsError:
        _tighten(path)
    else:
        os.close(fd)


def open_private(path: Path, mode: str = "a+") -> IO[str]:
    """*path* opened for text in *mode* (``a+``, ``r+``, ``w``), created 0600 when missing."""
    flags = {"a+": os.O_RDWR | os.O_CREAT | os.O_APPEND, "r+": os.O_RDWR,
             "w": os.O_WRONLY | os.O_CREAT | os.O_TRUNC}[mode]  # fmt: skip
    fd = os.open(path, flags, 0o600)
    try:
        st = os.fstat(fd)
        if st.st_mode & _SHARED and st.st_uid == os.getuid():
            os.fchmod(fd, stat.S_IMODE(st.st_mode) & ~_SHARED)
        return open(fd, mode, encoding="utf-8")
    except BaseException:
        os.close(fd)
        raise


def _tighten(path: Path) -> None:
    st = path.stat()
    if stat.S_IMODE(st.st_mode) & _SHARED and st.st_uid == os.getuid():
        os.chmod(path, stat.S_IMODE(st.st_mode) & ~_SHARED)
