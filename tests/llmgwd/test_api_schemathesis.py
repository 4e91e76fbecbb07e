"""schemathesis against /api/v1/openapi.json, served in-process with an admin key: for every
route, generated requests (valid and not) never get a 5xx, and every error is the one error
body (llmgw.api_types.ErrorAnswer). A bounded run; bench/api/schemathesis_run.py runs longer."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, cast

import msgspec
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis import GenerationMode
from schemathesis.checks import (
    negative_data_rejection,
    not_a_server_error,
    response_schema_conformance,
    status_code_conformance,
)

from bench.api.fuzz_app import Served, serving
from llmgw.api_types import ErrorAnswer


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    with serving(tmp_path_factory.mktemp("api")) as s:
        yield s


# What llmgwd answers 503 by design when a part is not kept here: the harness gives it no
# control planes (ControlPlanes needs an etcd or its tokens' store), so no backup either.
NOT_HERE = {"no_planes", "no_backup"}


def no_server_error(ctx: Any, response: Any, case: Any) -> bool | None:
    """No 5xx, but for a 503 saying a part is not kept by this llmgwd."""
    if response.status_code == 503:
        code = msgspec.json.decode(response.content, type=ErrorAnswer).error.code
        assert code in NOT_HERE, f"503 {code}"
        return None
    return not_a_server_error(ctx, response, case)


def one_error_shape(ctx: Any, response: Any, case: Any) -> bool | None:
    """Every answer from 400 on is JSON that decodes into ErrorAnswer."""
    if response.status_code < 400:
        return None
    kind = response.headers.get("content-type", [""])[0]
    assert kind.startswith("application/json"), f"an error as {kind!r}"
    msgspec.json.decode(response.content, type=ErrorAnswer)
    return None


CHECKS = [
    no_server_error,
    one_error_shape,
    status_code_conformance,
    response_schema_conformance,
    negative_data_rejection,
]


def fuzz(served: Served, mode: GenerationMode, examples: int) -> list[str]:
    """Each operation's generated cases sent once; what failed, one line each."""
    schema = schemathesis.openapi.from_url(
        served.url + "/api/v1/openapi.json", headers=served.headers
    )
    failed: list[str] = []
    for result in schema.get_all_operations():
        op = cast(Any, result).ok()  # an InvalidSchema raises here

        @given(case=op.as_strategy(mode))
        @settings(max_examples=examples, deadline=None, suppress_health_check=list(HealthCheck))
        def check(case: Any) -> None:
            response = case.call(base_url=served.url, headers=served.headers, timeout=10)
            case.validate_response(response, checks=CHECKS)

        try:
            check()
        except (AssertionError, BaseExceptionGroup) as e:  # schemathesis's failures
            failed.append(f"{op.label}: {type(e).__name__}: {str(e)[:600]}")
    return failed


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE])
def test_no_5xx_and_every_error_in_the_one_shape(served: Served, mode: GenerationMode) -> None:
    assert fuzz(served, mode, 5) == []
