"""The one error hierarchy of the service, mapped once to GraphQL codes and REST statuses."""

from __future__ import annotations


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
