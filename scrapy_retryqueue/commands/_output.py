"""Where ``scrapy deadletters export`` writes: stdout, or FILE replaced (-O) or appended to (-o).

As Scrapy's feed exports (``scrapy crawl -o / -O``). A file is complete or as
it was: rows go to a temporary file beside it first. What cannot be written or
appended to is refused by :meth:`Destination.check` before the store is read,
and only looked at (lstat, a csv file's first line) to be refused.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import sys
import tempfile
from pathlib import Path
from typing import Any

from ._common import EXIT_ERROR, CommandFailed


class Destination:
    """Where ``export`` writes, following Scrapy's feed exports: ``-O`` overwrites, ``-o`` appends."""

    def __init__(self, path: Path | None, fmt: str, *, append: bool) -> None:
        #: None: stdout.
        self.path = path
        self.fmt = fmt
        self.append = append
        #: The option that named FILE, for the errors about it.
        self.option = "-o" if append else "-O"

    @classmethod
    def from_options(
        cls, output: str | None, overwrite: str | None, fmt: str | None
    ) -> Destination:
        from ..store.export import FORMATS

        name = overwrite or output or "-"
        path = None if name == "-" else Path(name)
        if fmt is None:
            suffix = path.suffix.lower().lstrip(".") if path is not None else ""
            fmt = suffix if suffix in FORMATS else "csv"
        return cls(path, fmt, append=path is not None and overwrite is None)

    def check(self) -> None:
        """Refuse, before reading the store, what cannot be written or appended to."""
        if self.path is not None:
            self._refuse_special()
            self._refuse_unwritable()
        if not self.append or self.path is None:
            return
        if self.fmt == "json":
            raise CommandFailed(
                f"-o appends, and a json file ({self.path}) holds one array that cannot take "
                "more rows: use -O to overwrite it, or the jsonl format (one object per line) "
                "to append",
                EXIT_ERROR,
            )
        if self.fmt == "csv" and self._has_content():
            from ..store.export import csv_header

            # errors="replace": a binary file is "another file", not a traceback.
            with open(self.path, encoding="utf-8", errors="replace", newline="") as existing:
                first = existing.readline()
            if first.rstrip("\r\n") != csv_header().rstrip("\r\n"):
                raise CommandFailed(
                    f"-o appends, and {self.path} does not start with this export's csv "
                    "header (another file, or another version's columns): use -O to "
                    "overwrite it, or another file",
                    EXIT_ERROR,
                )

    def _refuse_special(self) -> None:
        """A symlink, FIFO, device or directory at FILE: refused, never replaced nor followed.

        Replacing one (-O renames a temporary file over FILE) would swap a
        device node such as /dev/null for a regular file, or a symlink for a
        copy; following one writes where the link points, unseen.
        """
        assert self.path is not None
        try:
            st = os.lstat(self.path)
        except FileNotFoundError:
            return
        if stat.S_ISLNK(st.st_mode):
            raise CommandFailed(
                f"{self.option} {self.path} is a symbolic link (to {os.readlink(self.path)}): "
                "export neither follows nor replaces one; give the path it points to, or "
                "another file",
                EXIT_ERROR,
            )
        if not stat.S_ISREG(st.st_mode):
            what = "a directory" if stat.S_ISDIR(st.st_mode) else "not a regular file"
            raise CommandFailed(
                f"{self.option} {self.path} is {what} (a FIFO, a device, a socket?): export "
                "writes regular files only; leave out -o / -O to write to stdout",
                EXIT_ERROR,
            )

    def _refuse_unwritable(self) -> None:
        """A FILE whose directory is missing, or that this user cannot write: refused
        now rather than once every row was read."""
        assert self.path is not None
        parent = self.path.parent
        if not parent.is_dir():
            raise CommandFailed(
                f"{self.option} {self.path}: its directory {str(parent)!r} does not exist",
                EXIT_ERROR,
            )
        # The rows go to a temporary file beside FILE: its directory must take one.
        if not os.access(parent, os.W_OK | os.X_OK) or (
            self.path.exists() and not os.access(self.path, os.W_OK)
        ):
            raise CommandFailed(
                f"{self.option} {self.path} cannot be written (permission denied)", EXIT_ERROR
            )

    def _has_content(self) -> bool:
        assert self.path is not None
        try:
            return self.path.stat().st_size > 0
        except FileNotFoundError:
            return False

    def write(self, rows: Any, secret: frozenset[str], advance: Any) -> int:
        """Write *rows*; returns how many. A file is complete or untouched on failure."""
        from ..store.export import write_rows

        if self.path is None:
            written = write_rows(rows, self.fmt, sys.stdout, advance, secret=secret)
            sys.stdout.flush()
            return written
        header = not (self.append and self._has_content())
        # A fresh name (O_EXCL): a FILE.part planted as a symlink is never followed.
        fd, name = tempfile.mkstemp(
            dir=self.path.parent, prefix=f".{self.path.name}.", suffix=".part"
        )
        part = Path(name)
        try:
            with open(fd, "w", encoding="utf-8", newline="") as out:
                written = write_rows(rows, self.fmt, out, advance, secret=secret, header=header)
                if not self.append:
                    # mkstemp's 0600; the file gets the mode a new one would.
                    umask = os.umask(0)
                    os.umask(umask)
                    os.fchmod(out.fileno(), 0o666 & ~umask)
            self._refuse_special()  # again: FILE may have changed while rows were read
            if self.append:
                self._append_part(part)
            else:
                os.replace(part, self.path)
        finally:
            with contextlib.suppress(OSError):
                part.unlink()
        return written

    def _append_part(self, part: Path) -> None:
        # The rows were written to FILE.part first: a failure while reading the
        # store leaves FILE as it was; only this local copy appends.
        assert self.path is not None
        with open(self.path, "ab") as target, open(part, "rb") as source:
            if self.fmt == "jsonl" and target.tell() and not _ends_with_newline(self.path):
                target.write(b"\n")
            shutil.copyfileobj(source, target)


def _ends_with_newline(path: Path) -> bool:
    with open(path, "rb") as existing:
        existing.seek(-1, os.SEEK_END)
        return existing.read(1) == b"\n"
