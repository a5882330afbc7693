"""The in-memory model behind the server, open to tests for setup and assertions."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from ._models import Organization, Post, RecordedRequest
from ._ratelimit import RateLimiter


@dataclass
class PostizState:
    """Organizations, every post ever created (deleted ones flagged), and every request.

    `creations_by_invocation` counts, per `X-Toolrelay-Invocation` header value, the POST
    /posts requests that created posts: a value above 1 means an invocation's write was
    carried out twice. Requests without the header are not counted there.
    """

    organizations: list[Organization]
    limiter: RateLimiter = field(default_factory=RateLimiter)
    posts: dict[str, Post] = field(default_factory=dict)
    requests: list[RecordedRequest] = field(default_factory=list)
    creations_by_invocation: Counter[str] = field(default_factory=Counter)

    def org(self, name: str) -> Organization:
        return next(o for o in self.organizations if o.name == name)

    def org_by_key(self, api_key: str) -> Organization | None:
        return next((o for o in self.organizations if o.api_key == api_key), None)

    def add_posts(self, posts: list[Post], invocation_id: str | None) -> None:
        for post in posts:
            self.posts[post.id] = post
        if invocation_id is not None:
            self.creations_by_invocation[invocation_id] += 1

    def live_posts(self, organization_id: str) -> list[Post]:
        return [
            p for p in self.posts.values() if p.organization_id == organization_id and not p.deleted
        ]

    def delete_post_group(self, organization_id: str, post_id: str) -> bool:
        """Deletes the post's whole group, as Postiz does; False if the org has no such post."""
        target = next((p for p in self.live_posts(organization_id) if p.id == post_id), None)
        if target is None:
            return False
        for post in self.live_posts(organization_id):
            if post.group == target.group:
                post.deleted = True
        return True

    def reset_rate_limit(self, organization_id: str | None = None) -> None:
        self.limiter.reset(organization_id)

    def requests_to(self, method: str, path_suffix: str) -> list[RecordedRequest]:
        """Requests with this method whose path ends with `path_suffix` (any proxy prefix)."""
        return [r for r in self.requests if r.method == method and r.path.endswith(path_suffix)]
