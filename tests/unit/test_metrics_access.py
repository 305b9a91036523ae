"""Who may read the API's /metrics (``services.auth.check_scraper``): its search counters move with
the candidates the access check refuses, so they are operators' data, never the API's users'."""

from __future__ import annotations

import pytest
from pydantic import SecretStr

from services.auth import check_scraper
from services.errors import Forbidden, Unauthenticated
from services.settings import Settings


def settings(env: str, token: str | None = None) -> Settings:
    return Settings.model_validate({"env": env, "metrics_token": None if token is None else SecretStr(token)})


@pytest.mark.parametrize("env", ["local", "test"])
def test_without_a_token_a_direct_client_of_this_host_reads_them_elsewhere(env: str) -> None:
    check_scraper(settings(env), None, "127.0.0.1", proxied=False)
    check_scraper(settings(env), None, "::1", proxied=False)
    with pytest.raises(Forbidden):
        check_scraper(settings(env), None, "203.0.113.9", proxied=False)
    with pytest.raises(Forbidden):  # a proxy on this host that says it forwards someone
        check_scraper(settings(env), None, "127.0.0.1", proxied=True)


def test_in_production_nobody_reads_them_without_the_token() -> None:
    """A proxy on the same host that adds no forwarding header (nginx's bare proxy_pass, a TCP
    proxy) makes every request a direct client of this host: in production the token is needed."""
    with pytest.raises(Forbidden):
        check_scraper(settings("production"), None, "127.0.0.1", proxied=False)


@pytest.mark.parametrize("env", ["local", "production"])
def test_with_a_token_only_a_request_bearing_it_reads_them(env: str) -> None:
    guarded = settings(env, "metrics-secret-7")
    check_scraper(guarded, "Bearer metrics-secret-7", "203.0.113.9", proxied=True)
    for wrong in (
        None,
        "",
        "Bearer metrics-secret-8",
        "metrics-secret-7",
        "Basic metrics-secret-7",
        "Bearer ",
    ):
        with pytest.raises(Unauthenticated):
            check_scraper(guarded, wrong, "127.0.0.1", proxied=False)
