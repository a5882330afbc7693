"""A Postiz-compatible HTTP server for tests and the demo, written from
/work/shared/contracts/postiz-public-api.md (Postiz's real backend cannot run here).

    async with postiz_server(front=True, rate_limit=3) as srv:
        key = srv.org("Acme").api_key
        x_id = srv.org("Acme").by_identifier("x").id
        ...  # POST f"{srv.api_base_url}/public/v1/posts" with {"Authorization": key}
        assert srv.state.creations_by_invocation[invocation_id] == 1
"""

from ._app import make_app
from ._models import (
    INVOCATION_HEADER,
    Integration,
    Organization,
    Post,
    RecordedRequest,
    default_organizations,
)
from ._ratelimit import DEFAULT_RATE_LIMIT, DEFAULT_RATE_WINDOW_SECONDS, RateDecision, RateLimiter
from ._server import RunningPostiz, postiz_server, start_postiz
from ._state import PostizState
from ._xtext import weighted_length

__all__ = [
    "DEFAULT_RATE_LIMIT",
    "DEFAULT_RATE_WINDOW_SECONDS",
    "INVOCATION_HEADER",
    "Integration",
    "Organization",
    "Post",
    "PostizState",
    "RateDecision",
    "RateLimiter",
    "RecordedRequest",
    "RunningPostiz",
    "default_organizations",
    "make_app",
    "postiz_server",
    "start_postiz",
    "weighted_length",
]
