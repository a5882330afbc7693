"""What every request handler needs, built once per app and kept on ``app.state``."""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field

from fastapi import Request

from toolrelay.api.limits import (
    DEFAULT_BURST,
    DEFAULT_MAX_BODY_BYTES,
    DEFAULT_RATE_PER_SECOND,
    RateLimiter,
)
from toolrelay.credentials import CredentialStore, Keyring
from toolrelay.db import Database
from toolrelay.dispatch.egress import EgressPolicy
from toolrelay.dispatch.handoff import HandOff
from toolrelay.dispatch.outcomes import Outcomes
from toolrelay.dispatch.worker import WorkerSettings
from toolrelay.registry import Registry
from toolrelay.signin import OidcClient, OidcSettings, SignIns
from toolrelay.tokens import Authenticator, Caller, TokenStore

DB_TIMEOUT = 1.5  # seconds a request waits for a database connection before 503


@dataclass
class ApiSettings:
    """How to build the app. ``database_url`` None means DATABASE_URL or the embedded server."""

    database_url: str | None = None
    keyring: Keyring | None = None
    egress: EgressPolicy | None = None  # the in-process worker's; None: TOOLRELAY_EGRESS_ALLOW
    jwt_secret: str | None = None
    run_worker: bool = True
    worker: WorkerSettings = field(default_factory=WorkerSettings)
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    rate_per_second: float = DEFAULT_RATE_PER_SECOND
    rate_burst: int = DEFAULT_BURST
    # seconds between reads of a waited-on call while nobody listens; None: the environment
    wait_poll_seconds: float | None = None
    # people's sign-in through OpenID Connect (docs/approvals.md); None: tokens only
    oidc: OidcSettings | None = field(default_factory=OidcSettings.from_env)


@dataclass
class ApiContext:
    settings: ApiSettings
    db: Database
    authenticator: Authenticator
    credentials: CredentialStore
    tokens: TokenStore
    limiter: RateLimiter
    outcomes: Outcomes
    signins: SignIns
    oidc: OidcClient | None = None
    # the in-process worker's door for this process's calls (dispatch/handoff.py)
    handoff: HandOff = field(default_factory=HandOff)
    csrf_key: bytes = field(default_factory=lambda: secrets.token_bytes(32))

    @classmethod
    def build(cls, settings: ApiSettings) -> ApiContext:
        # Fail fast when the database is gone: a request answers 503 within the timeout.
        db = Database(settings.database_url, timeout=DB_TIMEOUT)
        authenticator = Authenticator(db, settings.jwt_secret)
        # LISTEN needs a direct connection: the worker's, or none behind a pooler (poll)
        listen = settings.worker.listen_url or (None if settings.worker.pooler else db.url)
        return cls(
            settings=settings,
            db=db,
            authenticator=authenticator,
            credentials=CredentialStore(db, settings.keyring),
            tokens=authenticator.tokens,
            limiter=RateLimiter(settings.rate_per_second, settings.rate_burst),
            outcomes=Outcomes(listen, settings.wait_poll_seconds),
            signins=SignIns(db),
            oidc=OidcClient.for_page(settings.oidc)
            if settings.oidc and settings.oidc.client_id
            else None,
        )

    def registry(self, caller: Caller) -> Registry:
        """The caller's view: every transaction runs as the owner, with the agent's or the
        member's claims. A caller whose token is unchecked (Caller.unchecked) gets a
        registry whose calls check the token in their own transaction (migration 0039);
        its door does nothing else with it before that check (agent_routes.invoke)."""
        return Registry(
            self.db, caller.owner, agent_id=caller.agent_id, member_id=caller.member_id,
            token_check=caller.token_check,
        )  # fmt: skip


def get_context(request: Request) -> ApiContext:
    context: ApiContext = request.app.state.toolrelay
    return context


async def request_context(request: Request) -> ApiContext:
    """``get_context`` as a dependency: async, so FastAPI runs it in the event loop instead
    of handing it to a thread (it does no I/O), as it does every plain ``def`` dependency."""
    return get_context(request)
