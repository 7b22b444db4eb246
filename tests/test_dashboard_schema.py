"""The OpenAPI schema describes the API: a bounded schemathesis run against the app
finds no answer the schema does not declare (status, content type, body, headers),
no input outside the schema accepted, no server error.

The schema is FastAPI's, generated from the parameters and models the API validates
with; the run is seeded (derandomized), so it is the same run every time.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import hypothesis
import pytest
import schemathesis
from fastapi import FastAPI
from fastapi.testclient import TestClient
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    negative_data_rejection,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from scrapy_retryqueue.dashboard.app import create_app

TOKEN = "s3cret-token-for-tests"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
    response_headers_conformance,
    negative_data_rejection,
]
#: Examples per operation and mode: 7 operations x 2 modes x this, within about a
#: minute on a loaded 2-core machine (60 when there were 6: the same total).
EXAMPLES = 52


@pytest.fixture
def app(dashboard_data: dict[str, Any]) -> Iterator[FastAPI]:
    app = create_app(
        {
            **dashboard_data["settings"],
            "RETRYQUEUE_DASHBOARD_TOKEN": TOKEN,
            # The name schemathesis's ASGI client sends in Host.
            "RETRYQUEUE_DASHBOARD_ALLOWED_HOSTS": ["testserver"],
        }
    )
    # The run sends the right token every time; nothing it sends should wait.
    app.state.wrong_tokens.free = 10**9
    with TestClient(app):  # the lifespan: the backend is closed at the end
        yield app


@pytest.fixture
def api_schema(app: FastAPI) -> Any:
    return schemathesis.openapi.from_asgi("/openapi.json", app)


def _operations(schema: Any) -> list[Any]:
    return [result.ok() for result in schema.get_all_operations()]


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE])
def test_the_api_answers_as_its_schema_says(api_schema: Any, mode: GenerationMode) -> None:
    operations = _operations(api_schema)
    assert len(operations) == 7, [op.label for op in operations]
    failures: list[str] = []
    for operation in operations:
        raw = operation.definition.raw
        if mode is GenerationMode.NEGATIVE and not (
            raw.get("parameters") or raw.get("requestBody")
        ):
            continue  # no input to break (/metrics)

        @hypothesis.given(case=operation.as_strategy(generation_mode=mode))
        @hypothesis.settings(
            max_examples=EXAMPLES,
            deadline=None,
            derandomize=True,
            database=None,
            suppress_health_check=list(hypothesis.HealthCheck),
            phases=[hypothesis.Phase.explicit, hypothesis.Phase.generate],
        )
        def run(case: Any) -> None:
            case.call_and_validate(headers=AUTH, checks=CHECKS)

        try:
            run()
        except Exception as exc:  # one line per operation that broke its schema
            failures.append(f"{operation.label}: {type(exc).__name__}: {str(exc)[:2000]}")
    assert failures == [], "\n\n".join(failures)


def test_the_schema_says_what_the_api_answers(app: FastAPI) -> None:
    schema = app.openapi()
    action = schema["paths"]["/api/actions/{action}"]["post"]
    assert set(action["responses"]) >= {"200", "400", "401", "403", "404", "422", "429", "503"}
    assert action["parameters"][0]["schema"]["enum"] == ["retry_now", "cancel", "requeue", "purge"]
    error = {"$ref": "#/components/schemas/ErrorAnswer"}
    assert action["responses"]["422"]["content"]["application/json"]["schema"] == error
    metrics = schema["paths"]["/metrics"]["get"]["responses"]["200"]["content"]
    assert list(metrics) == ["text/plain"]
    with TestClient(app, base_url="http://127.0.0.1") as client:
        invalid = client.post(
            "/api/actions/purge",
            content=b'{"ids": 5}',
            headers={**AUTH, "content-type": "application/json"},
        )
        assert invalid.status_code == 422 and set(invalid.json()) == {"detail"}
        assert isinstance(invalid.json()["detail"], str)
        assert client.get("/metrics").headers["content-type"].startswith("text/plain")
        unknown = client.post("/api/actions/explode", json={"ids": ["1"]}, headers=AUTH)
        assert unknown.status_code == 404 and "action 'explode'" in unknown.json()["detail"]
        # A filter no name is that long is refused (it answered 200), naming it.
        for name in ("spider", "node", "domain", "id", "kind", "status"):
            for path in ("/api/tasks", "/api/actions/purge/count", "/api/overview"):
                if path == "/api/overview" and name != "spider":
                    continue
                reply = client.get(path, params={name: "x" * 10_000})
                assert reply.status_code == 400, (path, name, reply.text)
                assert reply.json()["detail"].startswith(f"{name} 'xxx"), reply.text
                assert "10000 characters" in reply.json()["detail"]
