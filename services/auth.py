"""Bearer-token authentication: the admin token from settings, person tokens, platform tokens."""

from __future__ import annotations

import hmac

from graph import identity
from graph.driver import autocommit
from services.domain import Principal
from services.errors import Forbidden, Unauthenticated
from services.ids import hash_token
from services.runtime import Runtime, now_ms
from services.settings import Settings


def bearer_token(authorization: str | None) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header (None: none, or another scheme)."""
    scheme, _, token = (authorization or "").strip().partition(" ")
    token = token.strip()
    return token if scheme.lower() == "bearer" and token else None


async def authenticate(runtime: Runtime, authorization: str | None) -> Principal:
    """Resolve an ``Authorization: Bearer <token>`` header to a principal, or raise Unauthenticated."""
    if not authorization:
        raise Unauthenticated("missing bearer token")
    token = bearer_token(authorization)
    if token is None or len(token) > 512:
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


#: The addresses of a client on this host.
_LOOPBACK = frozenset({"127.0.0.1", "::1"})


def check_scraper(settings: Settings, authorization: str | None, client: str | None, proxied: bool) -> None:
    """Who may read the API's ``/metrics``: a request bearing the metrics token when one is set
    (``BOTMEMORY_METRICS_TOKEN``); without one, in production nobody, elsewhere (a local or test
    stack) only a client on this host that no proxy forwarded — a proxy on the same host that
    adds no forwarding header looks like one. Metrics are operators' data: a search's candidates
    refused by the access check are counted, so anyone who could read the counters could ask
    whether another organization's memory holds a word (search for it, see the refusals move).
    Raises Unauthenticated or Forbidden."""
    expected = settings.metrics_token
    if expected is not None:
        given = bearer_token(authorization)
        if given is None or not hmac.compare_digest(given.encode(), expected.get_secret_value().encode()):
            raise Unauthenticated(
                "/metrics needs the metrics token (BOTMEMORY_METRICS_TOKEN) as a bearer token"
            )
        return
    if settings.env == "production":
        raise Forbidden("/metrics needs BOTMEMORY_METRICS_TOKEN in production; scrape it with that token")
    if proxied or client not in _LOOPBACK:
        raise Forbidden(
            "/metrics answers this host only; set BOTMEMORY_METRICS_TOKEN to scrape it from elsewhere"
        )
