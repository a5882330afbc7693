"""Supabase-style JWTs, per-token rate limits, and the limiter itself."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import jwt
import pytest

from tests.api.conftest import settings
from tests.api.servers import serve_app
from toolrelay.api import create_app
from toolrelay.api.limits import RateLimiter
from toolrelay.credentials import Keyring
from toolrelay.db import Database
from toolrelay.registry import Registry
from toolrelay.tokens import TokenStore

JWT_SECRET = "a-test-jwt-secret-of-at-least-32-characters"


@pytest.fixture(scope="module")
def jwt_api(database_url: str) -> Iterator[str]:
    """No worker and no master key; Supabase-style JWTs accepted."""
    app = create_app(settings(database_url, None, run_worker=False, jwt_secret=JWT_SECRET))
    with serve_app(app) as url:
        yield url


@pytest.fixture(scope="module")
def strict_api(database_url: str, keyring: Keyring) -> Iterator[str]:
    """No worker and a tiny rate limit: 1 request/s, 3 at once."""
    app = create_app(
        settings(database_url, keyring, run_worker=False, rate_per_second=1.0, rate_burst=3)
    )
    with serve_app(app) as url:
        yield url


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def supabase_jwt(sub: str, **claims: Any) -> str:
    payload = {"sub": sub, "role": "authenticated", "aud": "authenticated",
               "exp": int(time.time()) + 600} | claims  # fmt: skip
    return jwt.encode(payload, JWT_SECRET, algorithm="HS256")


def test_rate_limit_answers_429_with_retry_after_per_token(strict_api: str, db: Database) -> None:
    _, first = TokenStore(db).create(uuid.uuid4())
    _, second = TokenStore(db).create(uuid.uuid4())
    with httpx.Client(base_url=strict_api) as http:
        codes = [http.get("/v1/me", headers=bearer(first)).status_code for _ in range(4)]
        assert codes == [200, 200, 200, 429]
        limited = http.get("/v1/me", headers=bearer(first))
        assert limited.json()["error"]["code"] == "rate_limited"
        assert int(limited.headers["Retry-After"]) >= 1
        said = limited.json()["error"]["message"]  # the body's hint is the header's
        assert said.endswith(f"retry in {limited.headers['Retry-After']} s"), said
        assert http.get("/v1/me", headers=bearer(second)).status_code == 200  # its own bucket
        time.sleep(1.1)
        assert http.get("/v1/me", headers=bearer(first)).status_code == 200
        failures = [http.get("/v1/me", headers=bearer("trk_wrong")).status_code for _ in range(4)]
        assert failures == [401, 401, 401, 429]  # failed sign-ins count per client address


def test_supabase_jwt_acts_as_its_subject(jwt_api: str, db: Database) -> None:
    owner = uuid.uuid4()
    Registry(db, owner).create_agent("jwt-bot")
    with httpx.Client(base_url=jwt_api, headers=bearer(supabase_jwt(str(owner)))) as http:
        assert http.get("/v1/me").json() == {"kind": "owner", "owner": str(owner), "agent_id": None,
                                             "member_id": None, "role": "admin"}  # fmt: skip
        assert [a["name"] for a in http.get("/v1/agents").json()["items"]] == ["jwt-bot"]
        no_key = http.post("/v1/credentials", json={"kind": "api_key", "name": "k", "secret": "s"})
        assert no_key.status_code == 503
        assert no_key.json()["error"]["code"] == "configuration_error"
    agent = Registry(db, owner).get_agent("jwt-bot")["id"]
    as_agent = bearer(supabase_jwt(str(owner), agent_id=str(agent)))
    me = httpx.get(f"{jwt_api}/v1/me", headers=as_agent).json()
    assert (me["kind"], me["agent_id"]) == ("agent", str(agent))


@pytest.mark.parametrize(
    ("token", "reason"),
    [
        (jwt.encode({"role": "service_role", "exp": int(time.time()) + 600}, JWT_SECRET), "sub"),
        (supabase_jwt(str(uuid.uuid4()), role="service_role"), "role"),
        (supabase_jwt(str(uuid.uuid4()), exp=int(time.time()) - 3600), "expired"),
        (supabase_jwt("not-a-uuid"), "uuid"),
        (supabase_jwt(str(uuid.uuid4()), aud="anon"), "audience"),
        (
            jwt.encode({"sub": str(uuid.uuid4()), "exp": int(time.time()) + 60}, "x" * 40),
            "Signature",
        ),
    ],
)
def test_jwts_that_are_not_an_owners_are_refused(jwt_api: str, token: str, reason: str) -> None:
    response = httpx.get(f"{jwt_api}/v1/tools", headers=bearer(token))
    assert response.status_code == 401
    assert reason in response.json()["error"]["message"]


def test_token_bucket_refills_at_its_rate() -> None:
    now = [100.0]
    limiter = RateLimiter(rate=2.0, burst=2, clock=lambda: now[0])
    assert [limiter.take("k") for _ in range(2)] == [0.0, 0.0]
    assert limiter.take("k") == pytest.approx(0.5)
    now[0] += 0.5
    assert limiter.take("k") == 0.0
    assert limiter.take("other") == 0.0
