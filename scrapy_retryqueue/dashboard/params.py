"""What a request's query and path parameters may be: declared for FastAPI, and the words of a refusal.

Each parameter is declared with the bounds FastAPI checks, so that the OpenAPI schema
is what the API validates with (and the tests know every parameter); a value FastAPI
refuses is answered in the words of the filters' own checks, naming the parameter and
its value: a 400 for a query parameter, a 404 for a path, a 422 for a body.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Annotated, Any, Literal

from fastapi import Query
from fastapi.exceptions import RequestValidationError
from pydantic import StringConstraints

from ..settings.defaults import TASK_STATUSES
from ..store.queries import TASK_ID_LENGTH
from .actions import ACTIONS
from .filters import MAX_URL_SUBSTRING
from .overview import WINDOWS
from .settings import MAX_PAGE_SIZE
from .tasks import SORTABLE

STATUSES = ("all", *TASK_STATUSES)
#: Highest page number of the tasks table: its row offset always fits the database's integers.
MAX_PAGE = 1_000_000
#: Longest value of one query parameter, characters: a comma-separated list of
#: names fits; a value past it is no name of anything.
MAX_QUERY_VALUE = 1000
#: Longest row id or task id in a path, characters: the store's task id column.
MAX_IDENT = TASK_ID_LENGTH
#: One value of a query parameter (one repeat of it).
QueryValue = Annotated[str, StringConstraints(max_length=MAX_QUERY_VALUE)]
Sort = Literal[SORTABLE]  # type: ignore[valid-type]
Order = Literal["asc", "desc"]
Window = Literal[tuple(WINDOWS)]  # type: ignore[valid-type]
Action = Literal[ACTIONS]  # type: ignore[valid-type]
#: One HTTP status a filter may name.
_HTTP_STATUS = "[1-5][0-9][0-9]"


def comma_list(item: str) -> str:
    """A pattern of comma-separated items matching *item*, blanks and empty items
    allowed, as :func:`~.filters.parse_filters` reads a list: ``"dead, waiting"``, ``""``."""
    return rf"^[ \t]*({item})?[ \t]*(,[ \t]*({item})?[ \t]*)*$"


def one_of(names: Sequence[str]) -> str:
    return comma_list("|".join(re.escape(name) for name in names))


HTTP_STATUSES = comma_list(_HTTP_STATUS)


def names(values: Sequence[str] | None) -> list[str]:
    """The names of a repeated, comma-separated parameter: ``["a, b", "c"]`` -> a, b, c."""
    return [n.strip() for value in values or () for n in value.split(",") if n.strip()]


def filter_query_for(known_kinds: Sequence[str]) -> Callable[..., dict[str, list[str]]]:
    """The filters of the query string as a dependency, by name (as
    :func:`~.filters.parse_filters` takes them); the kind filter takes *known_kinds*.

    Its signature is built here from real objects, not annotations in the source:
    an app's kinds are a local value, which FastAPI cannot read back from a string
    annotation (this module's annotations are strings).
    """

    def many(description: str, *, alias: str | None = None, **bounds: Any) -> Any:
        # The bounds hold for each value (each repeat of the parameter).
        value = (
            Annotated[str, StringConstraints(max_length=MAX_QUERY_VALUE, **bounds)]
            if bounds
            else QueryValue
        )
        return Annotated[list[value], Query(description=description, alias=alias)]  # type: ignore[valid-type]

    def single(description: str, longest: int) -> Any:
        return Annotated[str, Query(description=description, max_length=longest)]

    declared: dict[str, Any] = {
        "spider": many("spider name (repeat or comma-separate)"),
        "status": many(
            f"{', '.join(TASK_STATUSES)} or all (the default)", pattern=one_of(STATUSES)
        ),
        "kind": many(f"failure kind: {', '.join(known_kinds)}", pattern=one_of(known_kinds)),
        "domain": many("host name; its subdomains match too"),
        "http_status": many("HTTP status of the last failure (100-599)", pattern=HTTP_STATUSES),
        "node": many("node that wrote the last event"),
        "since": single("ISO 8601 time, today, yesterday or 7d / 12h / 30m (ago)", 64),
        "until": single("as since", 64),
        "ids": many("row id or task id", alias="id"),
        "q": single("a substring of the URL", MAX_URL_SUBSTRING),
    }
    singles = ("since", "until", "q")

    def filter_query(**given: Any) -> dict[str, list[str]]:
        return {
            ("id" if name == "ids" else name): (
                [given[name]] if name in singles and given[name] else list(given[name] or ())
            )
            for name in declared
        }

    filter_query.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
        [
            # No null in the schema: a query string cannot tell it from a value.
            inspect.Parameter(
                name,
                inspect.Parameter.KEYWORD_ONLY,
                default="" if name in singles else [],
                annotation=kind,
            )
            for name, kind in declared.items()
        ]
    )
    return filter_query


def page_query(
    sort: Annotated[Sort | None, Query(description="the column to sort by (id by default)")] = None,
    order: Annotated[Order | None, Query(description="asc or desc (the default)")] = None,
    page: Annotated[int | None, Query(description=f"1-{MAX_PAGE}", ge=1, le=MAX_PAGE)] = None,
    per_page: Annotated[
        int | None, Query(description=f"1-{MAX_PAGE_SIZE}", ge=1, le=MAX_PAGE_SIZE)
    ] = None,
) -> dict[str, Any]:
    return {"sort": sort, "order": order, "page": page, "per_page": per_page}


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else f"{text[:40]}… ({len(str(value))} characters)"


#: Whole-number query parameters and their largest value.
_WHOLE = {"page": MAX_PAGE, "per_page": MAX_PAGE_SIZE}


def _parameter_refusal(name: str, value: Any, choices: Mapping[str, Sequence[str]]) -> str | None:
    """The message of a query parameter FastAPI refused, in the words of the filters'
    own checks (the first item of a list that is none of its choices); None: FastAPI's."""
    if name in _WHOLE:
        return f"{name} must be a positive whole number 1-{_WHOLE[name]}, got {_shown(value)}"
    if not isinstance(value, str) or len(value) > MAX_QUERY_VALUE:
        return None
    items = [item.strip(" \t") for item in value.split(",")]
    if name == "http_status":
        bad = next((i for i in items if i and not re.fullmatch(_HTTP_STATUS, i)), value)
        return f"http_status {_shown(bad)} is not an HTTP status (100-599)"
    if name in choices:
        bad = next((i for i in items if i and i not in choices[name]), value)
        what = "a status" if name == "status" else f"a {name}"
        return f"{name} {_shown(bad)} is not {what}; known: {', '.join(choices[name])}"
    return None


def validation_message(
    exc: RequestValidationError, choices: Mapping[str, Sequence[str]] | None = None
) -> str:
    """Where and what: a parameter with its value (cut short), a body's field alone
    (a body may be anything)."""
    parts = []
    for error in exc.errors():
        loc = [str(part) for part in error.get("loc", ())]
        msg = error.get("msg", "invalid")
        if loc and loc[0] in ("query", "path") and len(loc) > 1:
            value = error.get("input")
            refusal = loc[0] == "query" and _parameter_refusal(loc[1], value, choices or {})
            parts.append(refusal or f"{loc[1]} {_shown(value)}: {msg}")
        else:
            where = ".".join(part for part in loc if part != "body") or "body"
            parts.append(f"{where}: {msg}")
    return "; ".join(parts[:5]) or "invalid request"


def validation_status(exc: RequestValidationError) -> int:
    """A bad path is no such resource (404), a bad query parameter bad input (400), a
    body FastAPI cannot read 422."""
    places = {str(error.get("loc", ("",))[0]) for error in exc.errors()}
    if "path" in places:
        return 404
    return 400 if "body" not in places else 422
