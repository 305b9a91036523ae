"""The one error hierarchy of the service, mapped once to GraphQL codes and REST statuses."""

from __future__ import annotations

from neo4j.exceptions import (
    ConnectionAcquisitionTimeoutError,
    DatabaseUnavailable,
    ForbiddenOnReadOnlyDatabase,
    IncompleteCommit,
    NotALeader,
    ServiceUnavailable,
    SessionExpired,
    TransientError,
)
from redis.exceptions import AuthenticationError as RedisAuthenticationError
from redis.exceptions import AuthorizationError as RedisAuthorizationError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError


class ServiceError(Exception):
    """An expected failure whose message is safe to show to the caller (never content or secrets)."""

    code = "INTERNAL"
    status = 500

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.field = field

    @property
    def extensions(self) -> dict[str, str]:
        """graphql-core copies this onto the GraphQLError, on every path (queries and subscriptions)."""
        return {"code": self.code} | ({"field": self.field} if self.field else {})


class Unauthenticated(ServiceError):
    code = "UNAUTHENTICATED"
    status = 401


class Forbidden(ServiceError):
    code = "FORBIDDEN"
    status = 403


class NotFound(ServiceError):
    code = "NOT_FOUND"
    status = 404


class Conflict(ServiceError):
    code = "CONFLICT"
    status = 409


class TooSlow(ServiceError):
    """A subscriber fell too far behind its events: the stream ends rather than skip any (the
    client subscribes again and re-reads)."""

    code = "TOO_SLOW"
    status = 503


class BadInput(ServiceError):
    code = "BAD_INPUT"
    status = 422


class Unavailable(ServiceError):
    """Neo4j or Redis did not answer (after the driver's retries): nothing is wrong with the
    request, and the caller may send it again (503 with ``Retry-After``)."""

    code = "UNAVAILABLE"
    status = 503


#: Seconds a caller is asked to wait before sending a request again after UNAVAILABLE.
RETRY_AFTER_SECONDS = 1


def outage(exc: BaseException) -> bool:
    """Whether ``exc`` says Neo4j or Redis did not answer (or a deadlock outlasted the retries):
    work that meets one is to be done again later, not recorded as failed."""
    return unavailable(exc) is not None or isinstance(exc, TransientError)


def unavailable(exc: BaseException) -> Unavailable | None:
    """The refusal that a failure to reach Neo4j or Redis is said as, or None for any other error.
    A commit whose outcome is unknown says so: sent again blindly (without an idempotency key,
    ``services.idempotency``), a change could be made twice."""
    if isinstance(exc, IncompleteCommit):
        return Unavailable(
            "the database went away during the commit: the change may have been saved; read before sending it "
            "again, or send it again with the same idempotency key where the operation takes one"
        )
    # Unreachable, or a cluster member that is not (or no longer) the leader.
    neo4j_away = (
        ServiceUnavailable | SessionExpired | DatabaseUnavailable | NotALeader | ForbiddenOnReadOnlyDatabase
    )
    if isinstance(exc, neo4j_away):
        return Unavailable("the database is unavailable; try again")
    if isinstance(exc, ConnectionAcquisitionTimeoutError):  # every connection busy past CONNECT_SECONDS
        return Unavailable("the database is busy; try again")
    if isinstance(exc, RedisAuthenticationError | RedisAuthorizationError):
        return None  # a wrong password or ACL: the deployment's fault, not an outage
    if isinstance(exc, RedisConnectionError | RedisTimeoutError):
        return Unavailable("the event store (Redis) is unavailable; try again")
    return None
