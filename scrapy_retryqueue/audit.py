"""The audit log: one JSON line per retry event, through loguru, when configured.

A private loguru logger is used so that the project's own loguru handlers (if
any) do not receive these lines, and ours do not receive theirs.
"""

from __future__ import annotations

import json
from typing import Any

from loguru._logger import Core, Logger

_AUDIT_FLAG = "retryqueue_audit"


class AuditLog:
    def __init__(self, path: str, *, rotation: str, retention: str) -> None:
        self.path = path
        self.rotation = rotation
        self.retention = retention
        self._logger: Any = None
        self._handler_id: int | None = None

    def open(self) -> None:
        # A logger with its own core: loguru's documented deepcopy recipe fails
        # once the global logger has a stderr handler.
        audit_logger = Logger(
            core=Core(),
            exception=None,
            depth=0,
            record=False,
            lazy=False,
            colors=False,
            raw=False,
            capture=True,
            patchers=[],
            extra={},
        )
        try:
            self._handler_id = audit_logger.add(
                self.path,
                format="{message}",
                rotation=self.rotation,
                retention=self.retention,
                filter=lambda record: record["extra"].get(_AUDIT_FLAG, False),
                # Writes happen on loguru's own thread, never on the reactor's.
                enqueue=True,
                encoding="utf-8",
            )
        except (ValueError, TypeError) as exc:
            raise ValueError(
                "RETRYQUEUE_AUDIT_LOG / RETRYQUEUE_AUDIT_ROTATION / RETRYQUEUE_AUDIT_RETENTION: "
                f"{exc} (path={self.path!r}, rotation={self.rotation!r}, retention={self.retention!r})"
            ) from None
        self._logger = audit_logger.bind(**{_AUDIT_FLAG: True})

    def write(self, event: str, **fields: Any) -> None:
        if self._logger is None:
            return
        self._logger.info(json.dumps({"event": event, **fields}, separators=(",", ":")))

    def close(self) -> None:
        if self._logger is not None and self._handler_id is not None:
            self._logger.remove(self._handler_id)
            self._logger = None
