"""The audit log: one JSON line per retry event, through loguru, when configured.

Only loguru's public API is used, and only once an audit log is opened. The
project's own loguru handlers, if any, keep working as they were: records are
logged at severity 1, below TRACE (5), so a handler at its usual level (DEBUG
and up; TRACE at most) never receives them; and the audit file's handler keeps
only the records bound to its own AuditLog, so it receives no other line.
"""

from __future__ import annotations

import itertools
import json
from typing import Any

from ..exceptions import ConfigError

#: The extra key that marks a record as this package's audit line; its value
#: tells two audit logs of one process (two crawls) apart.
_AUDIT_KEY = "retryqueue_audit"
#: Severity of the audit records: below any level a project's handler uses.
AUDIT_LEVEL = 1
_ids = itertools.count(1)


class AuditLog:
    def __init__(self, path: str, *, rotation: str, retention: str) -> None:
        self.path = path
        self.rotation = rotation
        self.retention = retention
        self._id = next(_ids)
        self._logger: Any = None
        self._handler_id: int | None = None

    def open(self) -> None:
        from loguru import logger

        audit_id = self._id
        try:
            self._handler_id = logger.add(
                self.path,
                level=AUDIT_LEVEL,
                format="{message}",
                rotation=self.rotation,
                retention=self.retention,
                filter=lambda record: record["extra"].get(_AUDIT_KEY) == audit_id,
                # Writes happen on loguru's own thread, never on the reactor's.
                enqueue=True,
                encoding="utf-8",
            )
        except (ValueError, TypeError) as exc:
            raise ConfigError(
                "RETRYQUEUE_AUDIT_LOG / RETRYQUEUE_AUDIT_ROTATION / RETRYQUEUE_AUDIT_RETENTION: "
                f"{exc} (path={self.path!r}, rotation={self.rotation!r}, retention={self.retention!r})"
            ) from None
        self._logger = logger.bind(**{_AUDIT_KEY: audit_id})

    def write(self, event: str, **fields: Any) -> None:
        if self._logger is None:
            return
        self._logger.log(AUDIT_LEVEL, json.dumps({"event": event, **fields}, separators=(",", ":")))

    def close(self) -> None:
        if self._logger is not None and self._handler_id is not None:
            self._logger.remove(self._handler_id)
            self._logger = None
