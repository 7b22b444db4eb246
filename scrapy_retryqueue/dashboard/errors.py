"""The dashboard's one error: something a person can fix, with the HTTP status it answers.

A bad filter is a 400, a task or action that names nothing a 404, a store or Redis
that does not answer a 503. The backend raises it; the app answers it as JSON on
the API and as the error page elsewhere.
"""

from __future__ import annotations

from ..exceptions import RetryQueueError


class DashboardError(RetryQueueError):
    """Something a person can fix (bad filter, store or Redis down); status for HTTP."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status
