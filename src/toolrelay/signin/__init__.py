"""Sign-in for people: OpenID Connect for the approvals page and ``toolrelay login``
(issue 16, item 2; docs/approvals.md)."""

from toolrelay.signin.oidc import (
    Identity,
    Metadata,
    OidcClient,
    OidcSettings,
    SignInError,
    Started,
)
from toolrelay.signin.sessions import AmbiguousMember, Match, Session, SignIns

__all__ = [
    "AmbiguousMember",
    "Identity",
    "Match",
    "Metadata",
    "OidcClient",
    "OidcSettings",
    "Session",
    "SignInError",
    "SignIns",
    "Started",
]
