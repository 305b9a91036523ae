"""Which failures are UNAVAILABLE (503, sent again) and which stay INTERNAL (services.errors)."""

from __future__ import annotations

from neo4j.exceptions import (
    ClientError,
    ConnectionAcquisitionTimeoutError,
    DatabaseUnavailable,
    ForbiddenOnReadOnlyDatabase,
    IncompleteCommit,
    NotALeader,
    ServiceUnavailable,
    SessionExpired,
)
from redis.exceptions import AuthenticationError as RedisAuthenticationError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from services.errors import unavailable


def test_neo4j_and_redis_out_of_reach_are_unavailable_and_nothing_else_is() -> None:
    for down in (
        ServiceUnavailable("x"),
        SessionExpired("x"),
        DatabaseUnavailable("x"),
        NotALeader("x"),
        ForbiddenOnReadOnlyDatabase("x"),
        RedisConnectionError("x"),
        RedisTimeoutError("x"),
    ):
        said = unavailable(down)
        assert said is not None and said.code == "UNAVAILABLE" and said.status == 503
        assert "try again" in said.message
    unknown = unavailable(IncompleteCommit("x"))
    assert unknown is not None and "may have been saved" in unknown.message
    # A wrong Redis password is the deployment's fault (redis-py makes it a ConnectionError).
    for other in (
        ClientError("x"),
        ResponseError("x"),
        RedisAuthenticationError("x"),
        ValueError("x"),
        KeyError("x"),
    ):
        assert unavailable(other) is None


def test_a_pool_whose_connections_stay_busy_is_unavailable() -> None:
    """No free connection within the pool's wait (graph.driver.CONNECT_SECONDS, which also bounds
    the opening of one that a silent Neo4j never answers) is an outage to be sent again, not an
    INTERNAL bug."""
    said = unavailable(ConnectionAcquisitionTimeoutError("failed to obtain a connection from the pool"))
    assert said is not None and said.code == "UNAVAILABLE" and "try again" in said.message
