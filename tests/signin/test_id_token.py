"""The relying party against a provider that misbehaves on purpose: a real aiohttp.web server
on loopback that this module controls (discovery, JWKS, token and userinfo endpoints), with
RSA and EC keys made here and ID tokens signed with PyJWT. Each test bends one thing a
provider, a network or an attacker could bend (a claim, a header, a key, a document, a
response's size) and checks that OidcClient refuses it with a SignInError that says why, or
accepts exactly what OpenID Connect Core 3.1.3.7 lets through."""

from __future__ import annotations

import base64
import functools
import hashlib
import hmac
import json
import socket
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, Final
from urllib.parse import parse_qs, unquote_plus, urlsplit

import jwt
import pytest
from aiohttp import web
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from jwt.algorithms import ECAlgorithm, RSAAlgorithm

from toolrelay.errors import ConfigurationError
from toolrelay.signin import Identity, OidcClient, OidcSettings, SignInError
from toolrelay.signin.oidc import (
    ID_TOKEN_LEEWAY_S,
    ID_TOKEN_MAX_AGE_S,
    MAX_RESPONSE_BYTES,
    pkce_challenge,
)

CLIENT_ID: Final = "toolrelay web:1"  # a space and a colon: RFC 6749 2.3.1 form-encodes them
CLIENT_SECRET: Final = "web-secret:with+odd/chars & ü=0123456789abcdefghij"
CLI_CLIENT_ID: Final = "toolrelay-cli"
REDIRECT: Final = "http://127.0.0.1:8080/approvals/oidc/callback?x=1&y=2"
NONCE: Final = "nonce-0123456789abcdefghijklmnopqrstuvwxyz"
OMIT: Final[Any] = object()  # a claim left out of the ID token


# --- keys ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Key:
    """A signing key of the provider (or of an attacker): private half here, public in the
    JWKS as ``kid``."""

    kid: str
    alg: str
    private: rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey
    publish_alg: bool = True  # RFC 7517: a JWK's "alg" is optional

    def jwk(self) -> dict[str, Any]:
        public = self.private.public_key()
        if isinstance(public, rsa.RSAPublicKey):
            data = RSAAlgorithm.to_jwk(public, as_dict=True)
        else:
            data = ECAlgorithm.to_jwk(public, as_dict=True)
        data.update(kid=self.kid, use="sig")
        if self.publish_alg:
            data["alg"] = self.alg
        return data

    def sign(self, claims: dict[str, Any], kid: str | None = "", **header: Any) -> str:
        """The claims signed; ``kid`` "" names this key, None names none."""
        fields = dict(header)
        if kid is not None:
            fields["kid"] = kid or self.kid
        return jwt.encode(claims, self.private, algorithm=self.alg, headers=fields)

    def public_pem(self) -> bytes:
        return self.private.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )


@functools.cache
def _rsa(index: int) -> rsa.RSAPrivateKey:
    del index  # one key per index, made once per test run
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


@functools.cache
def _ec(index: int) -> ec.EllipticCurvePrivateKey:
    del index
    return ec.generate_private_key(ec.SECP256R1())


def rsa_key(kid: str = "rsa-1", index: int = 1, alg: str = "RS256", **kw: Any) -> Key:
    return Key(kid, alg, _rsa(index), **kw)


def ec_key(kid: str = "ec-1") -> Key:
    return Key(kid, "ES256", _ec(1))


def b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def compact(header: dict[str, Any], claims: dict[str, Any], sign: Callable[[bytes], bytes]) -> str:
    """A JWS made by hand, for what PyJWT refuses to sign (alg none, HMAC keyed by a PEM)."""
    signing_input = f"{b64(json.dumps(header).encode())}.{b64(json.dumps(claims).encode())}"
    return f"{signing_input}.{b64(sign(signing_input.encode('ascii')))}"


# --- the provider --------------------------------------------------------------------------


@dataclass(frozen=True)
class Seen:
    method: str
    path: str
    headers: dict[str, str]
    form: dict[str, str]


@dataclass
class Grant:
    """An authorization code the provider issued, and what redeeming it must repeat."""

    id_token: str
    challenge: str
    redirect_uri: str
    access_token: str


class Provider:
    """An OpenID provider whose every answer the test decides."""

    def __init__(self, issuer: str) -> None:
        self.issuer = issuer
        self.discovery: dict[str, Any] = {
            "issuer": issuer,
            "authorization_endpoint": f"{issuer}/authorize",
            "token_endpoint": f"{issuer}/token",
            "jwks_uri": f"{issuer}/jwks",
            "userinfo_endpoint": f"{issuer}/userinfo",
            "id_token_signing_alg_values_supported": ["RS256", "ES256"],
            "token_endpoint_auth_methods_supported": ["client_secret_basic", "client_secret_post"],
        }
        self.keys: list[Key] = [rsa_key()]
        self.jwks_extra: dict[str, Any] = {}
        self.clients: dict[str, str | None] = {CLIENT_ID: CLIENT_SECRET, CLI_CLIENT_ID: None}
        self.grants: dict[str, Grant] = {}
        self.token_answer: tuple[int, Any] | None = None  # instead of redeeming the code
        self.userinfo: dict[str, Any] = {}
        self.issued: list[str] = []  # access tokens the token endpoint handed out
        self.bodies: dict[str, bytes] = {}  # path -> a raw 200 body, instead of the above
        self.seen: list[Seen] = []

    def at(self, path: str) -> list[Seen]:
        return [s for s in self.seen if s.path == path]

    def claims(self, **changes: Any) -> dict[str, Any]:
        now = int(time.time())
        claims: dict[str, Any] = {
            "iss": self.issuer,
            "sub": "person-1",
            "aud": CLIENT_ID,
            "iat": now,
            "exp": now + 300,
            "nonce": NONCE,
            "email": "ada@example.test",
            "email_verified": True,
            "name": "Ada Lovelace",
        }
        claims.update(changes)
        return {k: v for k, v in claims.items() if v is not OMIT}

    def token(self, key: Key | None = None, **changes: Any) -> str:
        return (key or self.keys[0]).sign(self.claims(**changes))

    async def handle(self, request: web.Request) -> web.StreamResponse:
        form = {k: str(v) for k, v in (await request.post()).items()}
        self.seen.append(Seen(request.method, request.path, dict(request.headers), form))
        if request.path in self.bodies:
            return web.Response(body=self.bodies[request.path], content_type="application/json")
        if request.path == "/endless":
            return await self._endless(request)
        if request.path == "/.well-known/openid-configuration":
            doc = {k: v for k, v in self.discovery.items() if v is not OMIT}
            return web.json_response(doc)
        if request.path == "/jwks":
            return web.json_response({"keys": [k.jwk() for k in self.keys], **self.jwks_extra})
        if request.path == "/token" and request.method == "POST":
            return self._token(request, form)
        if request.path == "/userinfo":
            return self._userinfo(request)
        if request.path == "/moved":
            raise web.HTTPFound(f"{self.issuer}/jwks")
        return web.json_response({"error": "not_found"}, status=404)

    def _token(self, request: web.Request, form: dict[str, str]) -> web.Response:
        if self.token_answer is not None:
            status, body = self.token_answer
            return web.json_response(body, status=status)
        if not self._client_authenticated(request, form):
            return web.json_response({"error": "invalid_client"}, status=401)
        grant = self.grants.pop(form.get("code", ""), None)
        if grant is None or form.get("grant_type") != "authorization_code":
            return _refused("invalid_grant", "unknown or used code")
        if pkce_challenge(form.get("code_verifier", "")) != grant.challenge:
            return _refused("invalid_grant", "PKCE verification failed")
        if form.get("redirect_uri") != grant.redirect_uri:
            return _refused("invalid_grant", "redirect_uri mismatch")
        self.issued.append(grant.access_token)
        return web.json_response(
            {
                "access_token": grant.access_token,
                "token_type": "Bearer",
                "expires_in": 300,
                "id_token": grant.id_token,
            }
        )

    def _client_authenticated(self, request: web.Request, form: dict[str, str]) -> bool:
        auth = request.headers.get("Authorization", "")
        if auth.startswith("Basic "):
            pair = base64.b64decode(auth.removeprefix("Basic ")).decode("ascii")
            client_id, _, secret = pair.partition(":")
            client_id, secret = unquote_plus(client_id), unquote_plus(secret)
            return client_id in self.clients and self.clients[client_id] == secret
        client_id = form.get("client_id", "")
        if client_id not in self.clients:
            return False
        return self.clients[client_id] == form.get("client_secret")  # None: a public client

    def _userinfo(self, request: web.Request) -> web.Response:
        bearer = request.headers.get("Authorization", "").removeprefix("Bearer ")
        if bearer not in self.issued:
            return web.json_response({"error": "invalid_token"}, status=401)
        return web.json_response(self.userinfo)

    async def _endless(self, request: web.Request) -> web.StreamResponse:
        """A body that never ends, written as long as the client reads."""
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        response.enable_chunked_encoding()
        await response.prepare(request)
        await response.write(b'{"keys": [], "pad": "')
        try:
            while True:
                await response.write(b"x" * 65536)
        except (ConnectionError, RuntimeError):
            pass  # the client hung up, as it should
        return response


def _refused(error: str, description: str) -> web.Response:
    return web.json_response({"error": error, "error_description": description}, status=400)


@pytest.fixture
async def provider() -> AsyncIterator[Provider]:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    provider = Provider(f"http://127.0.0.1:{sock.getsockname()[1]}")
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", provider.handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.SockSite(runner, sock).start()
    yield provider
    await runner.cleanup()


def settings(provider: Provider, **changes: Any) -> OidcSettings:
    fields: dict[str, Any] = {
        "issuer": provider.issuer,
        "client_id": CLIENT_ID,
        "client_secret": CLIENT_SECRET,
        "cli_client_id": CLI_CLIENT_ID,
    }
    return OidcSettings(**(fields | changes))


@pytest.fixture
def client(provider: Provider) -> OidcClient:
    return OidcClient.for_page(settings(provider))


async def code_flow(
    client: OidcClient, provider: Provider, key: Key | None = None, **changes: Any
) -> Identity:
    """start() → the provider issues a code for this PKCE challenge (an ID token of
    ``changes`` with the flow's nonce) → finish()."""
    started = await client.start(REDIRECT)
    query = parse_qs(urlsplit(started.url).query)
    code = f"code-{uuid.uuid4().hex}"
    id_token = provider.token(key, **({"nonce": started.nonce} | changes))
    provider.grants[code] = Grant(
        id_token, query["code_challenge"][0], REDIRECT, f"at-{uuid.uuid4().hex}"
    )
    return await client.finish(code, REDIRECT, started.code_verifier, started.nonce)


async def refused(client: OidcClient, id_token: str, match: str, nonce: str = NONCE) -> str:
    with pytest.raises(SignInError, match=match) as caught:
        await client.verify_id_token(id_token, nonce)
    return str(caught.value)


# --- a valid token -------------------------------------------------------------------------


async def test_a_valid_rs256_token_names_the_person(provider: Provider, client: OidcClient) -> None:
    who = await client.verify_id_token(provider.token(), NONCE)
    assert who == Identity(provider.issuer, "person-1", "ada@example.test", True, "Ada Lovelace")


async def test_an_es256_token_verifies_too(provider: Provider, client: OidcClient) -> None:
    provider.keys = [rsa_key(), ec_key()]
    who = await client.verify_id_token(provider.token(ec_key(), sub="ec-person"), NONCE)
    assert (who.subject, who.email_verified) == ("ec-person", True)


async def test_the_code_flow_from_start_to_finish(provider: Provider, client: OidcClient) -> None:
    started = await client.start(REDIRECT)
    query = {k: v[0] for k, v in parse_qs(urlsplit(started.url).query).items()}
    assert started.url.startswith(f"{provider.issuer}/authorize?")
    assert query == {
        "response_type": "code",
        "client_id": CLIENT_ID,
        "redirect_uri": REDIRECT,
        "scope": "openid email profile",
        "state": started.state,
        "nonce": started.nonce,
        "code_challenge": pkce_challenge(started.code_verifier),
        "code_challenge_method": "S256",
    }
    again = await client.start(REDIRECT)
    assert len({started.state, started.nonce, again.state, again.nonce}) == 4
    assert 43 <= len(started.code_verifier) <= 128

    who = await code_flow(client, provider, sub="flow-person")
    assert who.subject == "flow-person"
    # The provider checked PKCE and the redirect; a code redeemed twice is refused.
    [seen] = provider.at("/token")
    with pytest.raises(SignInError, match="invalid_grant: unknown or used code"):
        await client.finish(seen.form["code"], REDIRECT, seen.form["code_verifier"], NONCE)


async def test_a_wrong_pkce_verifier_is_the_providers_to_refuse(
    provider: Provider, client: OidcClient
) -> None:
    started = await client.start(REDIRECT)
    challenge = parse_qs(urlsplit(started.url).query)["code_challenge"][0]
    provider.grants["c1"] = Grant(provider.token(nonce=started.nonce), challenge, REDIRECT, "at-1")
    with pytest.raises(SignInError, match="invalid_grant: PKCE verification failed"):
        await client.finish("c1", REDIRECT, "another-verifier-" + "x" * 40, started.nonce)


# --- claims --------------------------------------------------------------------------------

TOO_OLD: Final = ID_TOKEN_MAX_AGE_S + ID_TOKEN_LEEWAY_S + 30

REFUSED_CLAIMS: Final[dict[str, tuple[dict[str, Any], str]]] = {
    "another audience": ({"aud": "someone-else"}, "not valid: Audience doesn't match"),
    "an audience list without us": ({"aud": ["a", "b"]}, "not valid: Audience doesn't match"),
    "an audience list, azp another client": (
        {"aud": [CLIENT_ID, "other-client"], "azp": "other-client"}, r"another client \(azp\)"),
    "an audience list without azp": (
        {"aud": [CLIENT_ID, "other-client"]}, r"another client \(azp\)"),
    "another issuer": ({"iss": "https://evil.example"}, "not valid: Invalid issuer"),
    "the issuer with a trailing slash": ({"iss": "{issuer}/"}, "not valid: Invalid issuer"),
    "expired": ({"exp": -(ID_TOKEN_LEEWAY_S + 30)}, "not valid: Signature has expired"),
    "issued too long ago": ({"iat": -TOO_OLD}, "too old"),
    "issued in the future": ({"iat": ID_TOKEN_LEEWAY_S + 300}, r"not yet valid \(iat\)"),
    "no nonce": ({"nonce": OMIT}, "nonce does not match"),
    "another nonce": ({"nonce": "replayed-nonce"}, "nonce does not match"),
    "a nonce that is a number": ({"nonce": 12345}, "nonce does not match"),
    "a nonce outside ASCII": ({"nonce": NONCE + "é"}, "nonce does not match"),
    "no subject": ({"sub": OMIT}, 'missing the "sub" claim'),
    "a subject that is a number": ({"sub": 12345}, "Subject must be a string"),
    "no expiry": ({"exp": OMIT}, 'missing the "exp" claim'),
    "no issued-at": ({"iat": OMIT}, 'missing the "iat" claim'),
}  # fmt: skip


def _relative(provider: Provider, changes: dict[str, Any]) -> dict[str, Any]:
    """exp and iat given as offsets from now; {issuer} filled in."""
    now = int(time.time())
    out: dict[str, Any] = {}
    for name, value in changes.items():
        if name in ("exp", "iat") and isinstance(value, int):
            value = now + value
        elif isinstance(value, str):
            value = value.replace("{issuer}", provider.issuer)
        out[name] = value
    return out


@pytest.mark.parametrize("case", list(REFUSED_CLAIMS))
async def test_a_token_with_bad_claims_is_refused(
    provider: Provider, client: OidcClient, case: str
) -> None:
    changes, match = REFUSED_CLAIMS[case]
    await refused(client, provider.token(**_relative(provider, changes)), match)


ACCEPTED_CLAIMS: Final[dict[str, dict[str, Any]]] = {
    "an audience list naming us as azp": {"aud": [CLIENT_ID, "other"], "azp": CLIENT_ID},
    "an audience list of us alone": {"aud": [CLIENT_ID]},
    "expired within the leeway": {"exp": -(ID_TOKEN_LEEWAY_S // 2)},
    "issued almost as long ago as allowed": {"iat": -(ID_TOKEN_MAX_AGE_S - 5)},
    "a subject of digits": {"sub": "12345"},
}


@pytest.mark.parametrize("case", list(ACCEPTED_CLAIMS))
async def test_what_the_rules_let_through(
    provider: Provider, client: OidcClient, case: str
) -> None:
    token = provider.token(**_relative(provider, ACCEPTED_CLAIMS[case]))
    assert (await client.verify_id_token(token, NONCE)).email == "ada@example.test"


@pytest.mark.parametrize(
    ("claim", "verified"),
    [(True, True), ("true", False), (1, False), (OMIT, False), (False, False)],
)
async def test_only_a_json_true_email_verified_is_verified(
    provider: Provider, client: OidcClient, claim: Any, verified: bool
) -> None:
    who = await client.verify_id_token(provider.token(email_verified=claim), NONCE)
    assert (who.email, who.email_verified) == ("ada@example.test", verified)


async def test_an_empty_or_non_string_email_is_no_email(
    provider: Provider, client: OidcClient
) -> None:
    for email in ("", ["ada@example.test"], 7):
        who = await client.verify_id_token(provider.token(email=email, name=""), NONCE)
        assert (who.email, who.name) == (None, None)


# --- the signature -------------------------------------------------------------------------


async def test_alg_none_is_refused_even_when_the_provider_lists_it(
    provider: Provider, client: OidcClient
) -> None:
    provider.discovery["id_token_signing_alg_values_supported"] = ["none", "HS256", "RS256"]
    unsigned = compact({"alg": "none", "typ": "JWT"}, provider.claims(), lambda _: b"")
    await refused(client, unsigned, "signed with 'none', which is not accepted")
    # With the provider's kid too, and with the spelling varied.
    for alg in ("none", "None", "NONE"):
        unsigned = compact({"alg": alg, "kid": "rsa-1"}, provider.claims(), lambda _: b"")
        await refused(client, unsigned, "which is not accepted")


async def test_hs256_keyed_by_the_client_secret_is_refused(
    provider: Provider, client: OidcClient
) -> None:
    """Alg confusion: anyone with the client secret (every replica, a leaked config) could
    mint ID tokens if HS256 were taken; the discovery document offering it does not matter."""
    provider.discovery["id_token_signing_alg_values_supported"] = ["HS256", "RS256"]
    forged = jwt.encode(provider.claims(), CLIENT_SECRET, "HS256", headers={"kid": "rsa-1"})
    await refused(client, forged, "signed with 'HS256', which is not accepted")


async def test_hmac_keyed_by_the_providers_public_key_is_refused(
    provider: Provider, client: OidcClient
) -> None:
    """The classic confusion: the public key (which anyone can fetch) as an HMAC secret."""
    pem = provider.keys[0].public_pem()
    sign = functools.partial(_hmac_sha256, pem)
    for alg in ("HS256", "RS256"):  # the header may even claim RS256
        forged = compact({"alg": alg, "kid": "rsa-1"}, provider.claims(), sign)
        await refused(client, forged, "signed with 'HS256'|Signature verification failed")


def _hmac_sha256(key: bytes, data: bytes) -> bytes:
    return hmac.new(key, data, hashlib.sha256).digest()


async def test_a_token_signed_by_another_key_under_the_providers_kid_is_refused(
    provider: Provider, client: OidcClient
) -> None:
    attacker = rsa_key(kid="rsa-1", index=99)
    await refused(client, attacker.sign(provider.claims()), "Signature verification failed")
    attacker_ec = Key("rsa-1", "ES256", _ec(99))
    await refused(client, attacker_ec.sign(provider.claims()), "not valid")


async def test_an_algorithm_the_provider_does_not_list_is_refused(
    provider: Provider, client: OidcClient
) -> None:
    provider.discovery["id_token_signing_alg_values_supported"] = ["RS256"]
    provider.keys = [rsa_key(), ec_key()]
    await refused(client, provider.token(ec_key()), "signed with 'ES256', which is not accepted")


async def test_a_header_alg_other_than_the_keys_is_refused(
    provider: Provider, client: OidcClient
) -> None:
    """The JWK says RS256; a PS256 signature by the same private key is not that."""
    provider.discovery["id_token_signing_alg_values_supported"] = ["RS256", "PS256"]
    await refused(client, rsa_key(alg="PS256").sign(provider.claims()), "not valid")


@pytest.mark.parametrize("alg", ["PS256", "RS384", "RS512", "ES256"])
async def test_a_jwk_without_alg_verifies_the_headers_algorithm(
    provider: Provider, client: OidcClient, alg: str
) -> None:
    """RFC 7517 4.4: a JWK's "alg" is optional (Azure's keys carry none); the key's type
    and the provider's list decide, not a guess of RS256 for every RSA key."""
    provider.discovery["id_token_signing_alg_values_supported"] = [alg]
    key = (
        Key("k", alg, _ec(1), publish_alg=False)
        if alg == "ES256"
        else rsa_key(kid="k", alg=alg, publish_alg=False)
    )
    provider.keys = [key]
    who = await client.verify_id_token(key.sign(provider.claims()), NONCE)
    assert who.subject == "person-1"


async def test_a_jwk_without_alg_does_not_lend_itself_to_another_key_type(
    provider: Provider, client: OidcClient
) -> None:
    provider.discovery["id_token_signing_alg_values_supported"] = ["RS256", "ES256"]
    provider.keys = [rsa_key(kid="k", publish_alg=False)]
    forged = Key("k", "ES256", _ec(99)).sign(provider.claims())
    await refused(client, forged, "not valid")


@pytest.mark.parametrize(
    "token",
    [
        "not-a-jwt",
        "a.b.c",
        compact({"alg": ["RS256"], "kid": "rsa-1"}, {"sub": "x"}, lambda _: b"sig"),
        compact({"kid": "rsa-1"}, {"sub": "x"}, lambda _: b"sig"),
        compact({"alg": "RS256", "kid": 7}, {"sub": "x"}, lambda _: b"sig"),
    ],
    ids=["garbage", "three-junk-parts", "alg-a-list", "no-alg", "kid-a-number"],
)
async def test_a_malformed_token_is_a_sign_in_error(client: OidcClient, token: str) -> None:
    """Never a TypeError (a 500): whatever the token endpoint hands over is checked."""
    await refused(client, token, "malformed|not accepted")


# --- keys: rotation ------------------------------------------------------------------------


async def test_an_unknown_kid_fetches_the_jwks_again_once(
    provider: Provider, client: OidcClient
) -> None:
    first, second = rsa_key("2024"), rsa_key("2025", index=2)
    provider.keys = [first]
    await client.verify_id_token(first.sign(provider.claims()), NONCE)
    await client.verify_id_token(first.sign(provider.claims()), NONCE)
    assert len(provider.at("/jwks")) == 1  # known keys are kept

    provider.keys = [second]  # the provider rotates between two sign-ins
    who = await client.verify_id_token(second.sign(provider.claims(sub="after")), NONCE)
    assert who.subject == "after"
    assert len(provider.at("/jwks")) == 2

    # A key the provider no longer lists is unknown now (one fetch to be sure), and a kid
    # it never listed is refused after exactly one more fetch.
    await refused(client, first.sign(provider.claims()), r"does not list \(2024\)")
    assert len(provider.at("/jwks")) == 3
    await refused(client, rsa_key("nobody", index=3).sign(provider.claims()), r"\(nobody\)")
    assert len(provider.at("/jwks")) == 4


async def test_a_token_without_kid(provider: Provider, client: OidcClient) -> None:
    """One key: it is the one. Two: which one is not guessed."""
    await client.verify_id_token(provider.keys[0].sign(provider.claims(), kid=None), NONCE)
    provider.keys = [rsa_key(), rsa_key("rsa-2", index=2)]
    fresh = OidcClient.for_page(settings(provider))
    await refused(fresh, provider.keys[0].sign(provider.claims(), kid=None), "does not list")


async def test_jwks_entries_that_are_not_signing_keys_are_skipped(
    provider: Provider, client: OidcClient
) -> None:
    good = rsa_key()
    encryption = {**rsa_key("enc", index=2).jwk(), "use": "enc"}
    odd = [
        {"kty": "XYZ", "kid": "odd"},
        {**good.jwk(), "kid": "none", "alg": "none"},
        {**good.jwk(), "kid": "list", "alg": ["RS256"]},
        {"kty": "RSA", "kid": "broken", "n": "!!", "e": "AQAB"},
        "junk",
    ]
    provider.bodies["/jwks"] = json.dumps({"keys": [encryption, *odd, good.jwk()]}).encode()
    assert (await client.verify_id_token(good.sign(provider.claims()), NONCE)).subject
    await refused(client, rsa_key("enc", index=2).sign(provider.claims()), r"\(enc\)")


# --- the discovery document ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        ({"issuer": "https://evil.example"}, "names issuer 'https://evil.example'"),
        ({"issuer": "{issuer}/"}, "names issuer"),
        ({"issuer": OMIT}, "names issuer None"),
        ({"token_endpoint": "https://127.0.0.1:1/token"}, "token_endpoint is missing or not a http URL"),
        ({"jwks_uri": "file:///etc/passwd"}, "jwks_uri is missing or not a http URL"),
        ({"authorization_endpoint": OMIT}, "authorization_endpoint is missing"),
        ({"userinfo_endpoint": "https://127.0.0.1:1/userinfo"}, "userinfo_endpoint is not a http URL"),
        ({"id_token_signing_alg_values_supported": ["HS256", "none"]}, "signs ID tokens only with"),
    ],
    ids=["another-issuer", "trailing-slash", "no-issuer", "https-token", "file-jwks",
         "no-authorize", "https-userinfo", "only-hs256"],
)  # fmt: skip
async def test_a_discovery_document_that_does_not_fit_is_refused(
    provider: Provider, client: OidcClient, changes: dict[str, Any], match: str
) -> None:
    provider.discovery.update(_relative(provider, changes))
    with pytest.raises(SignInError, match=match):
        await client.start(REDIRECT)
    with pytest.raises(SignInError, match=match):
        await client.verify_id_token(provider.token(), NONCE)


async def test_a_discovery_document_that_is_not_an_object(provider: Provider) -> None:
    for body in (b"[1, 2]", b"null", b'"text"'):
        provider.bodies["/.well-known/openid-configuration"] = body
        with pytest.raises(SignInError, match="not a JSON object"):
            await OidcClient.for_page(settings(provider)).metadata()


async def test_discovery_is_fetched_once(provider: Provider, client: OidcClient) -> None:
    for _ in range(3):
        await client.verify_id_token(provider.token(), NONCE)
    await client.start(REDIRECT)
    assert len(provider.at("/.well-known/openid-configuration")) == 1


async def test_a_redirect_is_not_followed(provider: Provider) -> None:
    provider.discovery["jwks_uri"] = f"{provider.issuer}/moved"
    client = OidcClient.for_page(settings(provider))
    await refused(client, provider.token(), "JWKS\\) answered HTTP 302, not JSON")
    assert provider.at("/jwks") == []


async def test_an_unreachable_provider() -> None:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))  # bound, never listening: connections are refused
    try:
        closed = OidcSettings(f"http://127.0.0.1:{sock.getsockname()[1]}", "c", None, "c")
        with pytest.raises(SignInError, match="could not be reached: Client"):
            await OidcClient.for_page(closed).metadata()
    finally:
        sock.close()


# --- the token endpoint --------------------------------------------------------------------


async def test_a_token_response_without_id_token(provider: Provider, client: OidcClient) -> None:
    provider.token_answer = (200, {"access_token": "at-1", "token_type": "Bearer"})
    with pytest.raises(SignInError, match="token response has no ID token"):
        await client.finish("c", REDIRECT, "v" * 43, NONCE)
    provider.token_answer = (200, ["not", "an", "object"])
    with pytest.raises(SignInError, match="token response is not a JSON object"):
        await client.finish("c", REDIRECT, "v" * 43, NONCE)


async def test_a_token_endpoint_error_names_the_oauth_error(
    provider: Provider, client: OidcClient
) -> None:
    provider.token_answer = (400, {"error": "invalid_grant", "error_description": "code expired"})
    with pytest.raises(SignInError) as caught:
        await client.finish("c", REDIRECT, "v" * 43, NONCE)
    assert str(caught.value) == "the provider's token endpoint refused: invalid_grant: code expired"
    provider.token_answer = (503, {"message": "down"})
    with pytest.raises(SignInError, match="token endpoint refused: HTTP 503$"):
        await client.finish("c", REDIRECT, "v" * 43, NONCE)
    provider.token_answer = (400, {"error": "invalid_request", "error_description": "x" * 5000})
    with pytest.raises(SignInError) as caught:
        await client.finish("c", REDIRECT, "v" * 43, NONCE)
    assert len(str(caught.value)) < 400  # a provider's essay is cut short


async def test_the_client_secret_goes_as_http_basic_form_encoded(
    provider: Provider, client: OidcClient
) -> None:
    await code_flow(client, provider)
    [seen] = provider.at("/token")
    assert seen.headers["Content-Type"] == "application/x-www-form-urlencoded"
    scheme, _, value = seen.headers["Authorization"].partition(" ")
    assert scheme == "Basic"
    pair = base64.b64decode(value).decode("ascii")  # ASCII: form-encoding came first
    assert (
        pair
        == "toolrelay+web%3A1:web-secret%3Awith%2Bodd%2Fchars+%26+%C3%BC%3D0123456789abcdefghij"
    )
    assert set(seen.form) == {"grant_type", "code", "redirect_uri", "code_verifier"}
    assert seen.form["grant_type"] == "authorization_code"
    assert seen.form["redirect_uri"] == REDIRECT
    assert len(seen.form["code_verifier"]) >= 43
    assert seen.headers["Accept"] == "application/json"


async def test_client_secret_post_when_the_provider_offers_only_that(
    provider: Provider, client: OidcClient
) -> None:
    provider.discovery["token_endpoint_auth_methods_supported"] = ["client_secret_post"]
    await code_flow(client, provider)
    [seen] = provider.at("/token")
    assert "Authorization" not in seen.headers
    assert (seen.form["client_id"], seen.form["client_secret"]) == (CLIENT_ID, CLIENT_SECRET)


async def test_the_cli_client_is_public_and_sends_no_secret(provider: Provider) -> None:
    cli = OidcClient.for_cli(settings(provider))
    assert cli.client_id == CLI_CLIENT_ID
    await code_flow(cli, provider, aud=CLI_CLIENT_ID)
    [seen] = provider.at("/token")
    assert "Authorization" not in seen.headers
    assert seen.form["client_id"] == CLI_CLIENT_ID
    assert CLIENT_SECRET not in json.dumps(seen.form)
    # Sharing the page's client id, it is that confidential client, secret and all.
    same = OidcClient.for_cli(settings(provider, cli_client_id=CLIENT_ID))
    await code_flow(same, provider)
    assert provider.at("/token")[-1].headers["Authorization"].startswith("Basic ")


async def test_the_client_secret_is_in_no_error_message(
    provider: Provider, client: OidcClient
) -> None:
    messages: list[str] = []

    async def failing(**changes: Any) -> None:
        with pytest.raises(SignInError) as caught:
            await code_flow(client, provider, **changes)
        messages.append(str(caught.value))

    provider.clients[CLIENT_ID] = "another secret"  # the provider no longer knows ours
    await failing()
    provider.clients[CLIENT_ID] = CLIENT_SECRET
    await failing(aud="other")
    await failing(nonce="x")
    await failing(iss="https://evil.example")
    await failing(key=rsa_key("unlisted", index=2))
    for answer in [(400, {"error": "invalid_client"}), (500, "oops"), (200, {})]:
        provider.token_answer = answer
        await failing()
    provider.bodies["/token"] = b"{" * (MAX_RESPONSE_BYTES + 10)
    await failing()
    assert len(messages) == 9
    for message in messages:
        assert CLIENT_SECRET not in message
        assert "web-secret" not in message
        assert base64.b64encode(CLIENT_SECRET.encode()).decode()[:12] not in message


# --- userinfo ------------------------------------------------------------------------------


async def test_userinfo_fills_in_an_email_the_id_token_lacks(
    provider: Provider, client: OidcClient
) -> None:
    provider.userinfo = {
        "sub": "person-1",
        "email": "ada@corp.test",
        "email_verified": True,
        "name": "Userinfo Name",
    }
    who = await code_flow(client, provider, email=OMIT, email_verified=OMIT)
    assert who == Identity(provider.issuer, "person-1", "ada@corp.test", True, "Ada Lovelace")
    [seen] = provider.at("/userinfo")
    assert seen.method == "GET"
    assert seen.headers["Authorization"] == f"Bearer {provider.issued[-1]}"


async def test_userinfo_is_not_asked_when_the_id_token_has_an_email(
    provider: Provider, client: OidcClient
) -> None:
    provider.userinfo = {"sub": "person-1", "email": "other@corp.test", "email_verified": True}
    who = await code_flow(client, provider, email_verified=False)
    assert (who.email, who.email_verified) == ("ada@example.test", False)
    assert provider.at("/userinfo") == []


async def test_userinfo_about_another_subject_is_refused(
    provider: Provider, client: OidcClient
) -> None:
    for info in (
        {"sub": "someone-else", "email": "victim@example.test", "email_verified": True},
        {"email": "victim@example.test", "email_verified": True},
    ):
        provider.userinfo = info
        with pytest.raises(SignInError, match="userinfo is about another subject"):
            await code_flow(client, provider, email=OMIT)


async def test_userinfo_email_verified_as_a_string_is_not_verified(
    provider: Provider, client: OidcClient
) -> None:
    provider.userinfo = {"sub": "person-1", "email": "ada@corp.test", "email_verified": "true"}
    who = await code_flow(client, provider, email=OMIT, email_verified=OMIT)
    assert (who.email, who.email_verified) == ("ada@corp.test", False)


async def test_no_access_token_no_userinfo(provider: Provider, client: OidcClient) -> None:
    started = await client.start(REDIRECT)
    provider.token_answer = (200, {"id_token": provider.token(nonce=started.nonce, email=OMIT)})
    who = await client.finish("c", REDIRECT, started.code_verifier, started.nonce)
    assert who.email is None
    assert provider.at("/userinfo") == []


# --- sizes ---------------------------------------------------------------------------------


async def test_a_response_larger_than_1_mib_is_refused(
    provider: Provider, client: OidcClient
) -> None:
    pad = "x" * (MAX_RESPONSE_BYTES + 1)
    provider.bodies["/.well-known/openid-configuration"] = json.dumps(
        {**provider.discovery, "pad": pad}
    ).encode()
    with pytest.raises(SignInError, match="discovery document answered with more than 1 MiB"):
        await client.metadata()


async def test_an_endless_response_is_cut_at_1_mib(provider: Provider) -> None:
    provider.discovery["jwks_uri"] = f"{provider.issuer}/endless"
    client = OidcClient.for_page(settings(provider))
    await refused(client, provider.token(), r"signing keys \(JWKS\) answered with more than 1 MiB")


async def test_a_large_response_under_1_mib_is_read_whole(
    provider: Provider, client: OidcClient
) -> None:
    """A body arriving in many pieces (it is larger than one socket read) is read to its
    end, not cut at the first piece and then called "not JSON"."""
    provider.jwks_extra = {"pad": "x" * (MAX_RESPONSE_BYTES - 20_000)}
    who = await client.verify_id_token(provider.token(), NONCE)
    assert who.subject == "person-1"


# --- configuration -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "issuer",
    [
        "http://idp.example.com",
        "http://127.0.0.1.nip.io",
        "http://localhost.evil.example",
        "ftp://127.0.0.1",
        "https://",
        "idp.example.com",
        "https://idp.example.com?tenant=1",
        "https://idp.example.com#x",
    ],
)
def test_an_issuer_that_is_not_https_or_loopback_is_a_configuration_error(issuer: str) -> None:
    env = {"TOOLRELAY_OIDC_ISSUER": issuer, "TOOLRELAY_OIDC_CLIENT_ID": "c"}
    with pytest.raises(ConfigurationError, match="TOOLRELAY_OIDC_ISSUER"):
        OidcSettings.from_env(env)


@pytest.mark.parametrize(
    "issuer", ["http://127.0.0.1:5556", "http://localhost:5556/", "https://idp.example.com/"]
)
def test_an_https_or_loopback_issuer_is_taken(issuer: str) -> None:
    env = {"TOOLRELAY_OIDC_ISSUER": issuer, "TOOLRELAY_OIDC_CLIENT_ID": "c"}
    got = OidcSettings.from_env(env)
    assert got is not None
    assert got.issuer == issuer.rstrip("/")
    assert (got.cli_client_id, got.client_secret) == ("c", None)


@pytest.mark.parametrize("scopes", ["email profile", "openid-connect email", "OPENID"])
def test_scopes_without_openid_are_a_configuration_error(scopes: str) -> None:
    env = {
        "TOOLRELAY_OIDC_ISSUER": "https://idp.example.com",
        "TOOLRELAY_OIDC_CLIENT_ID": "c",
        "TOOLRELAY_OIDC_SCOPES": scopes,
    }
    with pytest.raises(ConfigurationError, match="must include 'openid'"):
        OidcSettings.from_env(env)


def test_no_issuer_no_sign_in_and_no_client_id_is_an_error() -> None:
    assert OidcSettings.from_env({}) is None
    assert OidcSettings.from_env({"TOOLRELAY_OIDC_ISSUER": "  "}) is None
    with pytest.raises(ConfigurationError, match="TOOLRELAY_OIDC_CLIENT_ID is not"):
        OidcSettings.from_env({"TOOLRELAY_OIDC_ISSUER": "https://idp.example.com"})


async def test_a_response_naming_another_issuer_is_refused(
    provider: Provider, client: OidcClient
) -> None:
    """RFC 9207 mix-up defence at the callback."""
    meta = await client.metadata()
    client.check_response_issuer(meta, provider.issuer)
    client.check_response_issuer(meta, None)  # the provider does not promise iss
    with pytest.raises(SignInError, match="came from issuer 'https://evil.example'"):
        client.check_response_issuer(meta, "https://evil.example")
    provider.discovery["authorization_response_iss_parameter_supported"] = True
    promised = await OidcClient.for_page(settings(provider)).metadata()
    with pytest.raises(SignInError, match="did not name its issuer"):
        client.check_response_issuer(promised, None)
