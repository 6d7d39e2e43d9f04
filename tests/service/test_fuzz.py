"""A schema-driven fuzz of `embedcache serve`'s /openapi.json (schemathesis): no 5xx,
no status, content type or body the schema does not declare. Bounded examples."""

from __future__ import annotations

import pytest

schemathesis = pytest.importorskip("schemathesis")
from hypothesis import HealthCheck, given, settings
from schemathesis import checks

from tests.service.conftest import Server

CHECKS = [
    checks.not_a_server_error,
    checks.status_code_conformance,
    checks.content_type_conformance,
    checks.response_schema_conformance,
]


@pytest.fixture(scope="module")
def kmer_server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("fuzz")
    server = Server(
        ["--store", tmp / "store", "--model", "kmer-4", "--max-sequences", "50"],
        log_path=tmp / "server.log",
    )
    yield server
    assert server.stop() == 0, server.log()
    assert "Traceback" not in server.log()


def test_no_server_errors_and_replies_match_the_schema(kmer_server):
    schema = schemathesis.openapi.from_url(f"{kmer_server.url}/openapi.json")
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) == 6  # every route but /openapi.json itself
    for operation in operations:

        @given(case=operation.as_strategy())
        @settings(
            max_examples=12,
            deadline=None,
            suppress_health_check=list(HealthCheck),
            derandomize=True,
            database=None,
        )
        def call(case):
            case.call_and_validate(checks=CHECKS)

        call()
