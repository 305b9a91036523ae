"""Bearer-token authentication: the admin token from settings, person tokens, platform tokens."""

from __future__ import annotations

import hmac

from graph import identity
from graph.driver import autocommit
from services.domain import Principal
from services.errors import Forbidden, Unauthenticated
from services.ids import hash_token
from services.runtime import Runtime, now_ms


async def authenticate(runtime: Runtime, authorization: str | None) -> Principal:
    """Resolve an ``Authorization: Bearer <token>`` header to a principal, or raise Unauthenticated."""
    if not authorization:
        raise Unauthenticated("missing bearer token")
    scheme, _, token = authorization.strip().partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token or len(token) > 512:
        raise Unauthenticated("malformed Authorization header; expected 'Bearer <token>'")
    admin = runtime.settings.admin_token
    if admin is not None and hmac.compare_digest(token.encode(), admin.get_secret_value().encode()):
        return Principal("admin")
    digest = hash_token(token)
    now = now_ms()
    # Every request's first statement: an auto-commit transaction, one round trip.
    row = await autocommit(runtime.driver, lambda s: identity.token_by_hash(s, hash=digest, now=now))
    if row is None or row["organizationId"] is None:
        raise Unauthenticated("invalid, expired or revoked token")
    kind = "person" if row["kind"] == "person" else "platform"
    return Principal(
        kind,
        token_id=row["tokenId"],
        person_id=row["personId"],
        organization_id=row["organizationId"],
        expires_at=row["expiresAt"],
    )


def require_admin(principal: Principal) -> None:
    if principal.kind != "admin":
        raise Forbidden("this operation needs the admin token")


def require_person(principal: Principal) -> str:
    """The person id of a person token; platform and admin tokens are refused."""
    if principal.kind != "person" or principal.person_id is None:
        raise Forbidden("this operation needs a person's token")
    return principal.person_id
