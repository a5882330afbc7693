"""From a validated ID token to a member's session (migration 0031): which member the person
is, binding their subject on the first sign-in, and the session token that signs them in.

All of it runs as the dispatcher role: nobody is signed in yet.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from datetime import datetime
from typing import Final
from uuid import UUID

import psycopg

from toolrelay.db import Database, translate_db_error
from toolrelay.db.connect import Row
from toolrelay.signin.oidc import Identity, SignInError, Started
from toolrelay.tokens import hash_token, new_token

FLOW_TTL_S: Final = 600  # seconds a person has to finish signing in at the provider
PAGE_SESSION_S: Final = 8 * 3600
CLI_SESSION_S: Final = 12 * 3600


@dataclass(frozen=True)
class Match:
    owner: UUID
    member_id: UUID
    name: str
    role: str
    bound: bool


@dataclass(frozen=True)
class Flow:
    owner: UUID | None
    nonce: str
    code_verifier: str
    redirect_uri: str


@dataclass(frozen=True)
class Session:
    """A signed-in member: the token (shown once, kept by the browser or the CLI)."""

    token: str
    token_id: UUID
    owner: UUID
    member_id: UUID
    name: str
    role: str
    expires_at: datetime


class AmbiguousMember(SignInError):
    """The person is a member of several organizations and did not name one."""

    def __init__(self, message: str, matches: list[Match]) -> None:
        super().__init__(message)
        self.matches = matches


def state_hash(state: str) -> bytes:
    return hashlib.sha256(b"signin-state:" + state.encode("utf-8")).digest()


class SignIns:
    def __init__(self, db: Database) -> None:
        self._db = db

    def remember(self, started: Started, owner: UUID | None, purpose: str = "page") -> None:
        """Keep a page's flow (state hashed) until its callback, for FLOW_TTL_S seconds."""
        self._run(
            "SELECT agents.fn_signin_begin(%s, %s, %s, %s, %s, %s, %s)",
            (state_hash(started.state), purpose, owner, started.nonce, started.code_verifier,
             started.redirect_uri, FLOW_TTL_S),
        )  # fmt: skip

    def consume(self, state: str, purpose: str = "page") -> Flow:
        """The flow for ``state``, used up; SignInError when unknown, used or expired."""
        rows = self._run(
            "SELECT * FROM agents.fn_signin_consume(%s, %s)", (state_hash(state), purpose)
        )
        return Flow(**rows[0])

    def members_for(self, who: Identity, owner: UUID | None) -> list[Match]:
        rows = self._run(
            "SELECT * FROM agents.fn_oidc_members(%s, %s, %s, %s, %s)",
            (who.issuer, who.subject, who.email, who.email_verified, owner),
        )
        return [Match(**row) for row in rows]

    def sign_in(self, who: Identity, owner: UUID | None, session: str) -> Session:
        """The member ``who`` is (in ``owner`` when named), bound on the first sign-in, with a
        new session token; SignInError saying why when there is no such member."""
        matches = self.members_for(who, owner)
        if not matches:
            raise SignInError(_nobody(who))
        if len(matches) > 1:
            raise AmbiguousMember(
                f"you are a member of {len(matches)} organizations here: choose one", matches
            )
        match = matches[0]
        # Always: a member an admin added by subject alone is bound, but to no issuer yet;
        # this records it (and, for a member bound to both, changes nothing).
        [row] = self._run(
            "SELECT agents.fn_oidc_bind(%s, %s, %s) AS bound",
            (match.member_id, who.issuer, who.subject),
        )
        if not row["bound"]:
            raise SignInError("this member was bound to another sign-in meanwhile")
        token = new_token()
        ttl = PAGE_SESSION_S if session == "page" else CLI_SESSION_S
        [made] = self._run(
            "SELECT * FROM agents.fn_signin_session(%s, %s, %s, %s)",
            (match.member_id, hash_token(token), session, ttl),
        )
        return Session(
            token=token,
            token_id=made["token_id"],
            owner=made["owner"],
            member_id=match.member_id,
            name=match.name,
            role=match.role,
            expires_at=made["expires_at"],
        )

    def page_session(self, pasted: str) -> str | None:
        """A page session's token for the tenant and member ``pasted`` stands for (the page's
        cookie never holds a pasted token, migration 0055); None when it does not
        authenticate now or is an agent's."""
        token = new_token()
        rows = self._run(
            "SELECT * FROM agents.fn_page_session(%s, %s, %s)",
            (hash_token(pasted), hash_token(token), PAGE_SESSION_S),
        )
        return token if rows else None

    def sign_out(self, token: str) -> bool:
        """Revoke a session's token (True); a token that is no session is left alone."""
        [row] = self._run("SELECT agents.fn_signout(%s) AS done", (hash_token(token),))
        return bool(row["done"])

    def _run(self, sql: str, params: tuple[object, ...]) -> list[Row]:
        try:
            with self._db.as_dispatcher() as conn:
                rows = conn.execute(sql, params).fetchall()
        except psycopg.Error as exc:
            error = translate_db_error(exc)
            if exc.sqlstate == "TR010":
                raise SignInError(error.message) from None
            raise error from None
        return rows


def _nobody(who: Identity) -> str:
    if who.email and not who.email_verified:
        return (
            f"the provider has not verified {who.email}, so it cannot name a member: verify"
            " the address at the provider, then sign in again"
        )
    if who.email:
        return (
            f"no member here signs in as {who.email}: ask an admin to add you"
            f" (`toolrelay member add NAME --role ROLE --email {who.email}`)"
        )
    return "the provider did not share an email address and no member has this subject"
