"""The records a Postiz-compatible server keeps: organizations, channels, posts, requests."""

from __future__ import annotations

import secrets
import string
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from multidict import CIMultiDict

INVOCATION_HEADER = "X-Toolrelay-Invocation"
_ID_ALPHABET = string.ascii_lowercase + string.digits
_ID_LENGTH = 25  # Postiz ids are cuids: 25 lowercase alphanumerics starting with "c"


def new_id() -> str:
    """A random cuid-looking id, like the ones Postiz's database hands out."""
    return "c" + "".join(secrets.choice(_ID_ALPHABET) for _ in range(_ID_LENGTH - 1))


def new_api_key() -> str:
    """A random key shaped like a real Postiz key: 64 hex characters."""
    return secrets.token_hex(32)


@dataclass
class Integration:
    """A connected channel; `identifier` is the provider (`x`, `linkedin`)."""

    id: str
    name: str
    identifier: str
    picture: str = ""
    disabled: bool = False
    profile: str = ""

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "name": self.name,
            "identifier": self.identifier,
            "picture": self.picture,
            "disabled": self.disabled,
            "profile": self.profile,
        }


@dataclass
class Organization:
    id: str
    name: str
    api_key: str
    integrations: list[Integration]

    def integration(self, integration_id: str) -> Integration | None:
        return next((i for i in self.integrations if i.id == integration_id), None)

    def by_identifier(self, identifier: str) -> Integration:
        """The first channel of a provider; handy in tests (`org.by_identifier("x").id`)."""
        return next(i for i in self.integrations if i.identifier == identifier)

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "name": self.name,
            "api_key": self.api_key,
            "integrations": [i.to_json() for i in self.integrations],
        }


@dataclass
class Post:
    """One entry of a POST /posts body; `values` holds the thread, the first is the post."""

    id: str
    organization_id: str
    integration: Integration
    group: str
    values: list[dict[str, Any]]
    publish_date: datetime  # timezone-aware
    state: str
    settings: dict[str, Any]
    invocation_id: str | None = None
    deleted: bool = False

    @property
    def content(self) -> str:
        return str(self.values[0].get("content", ""))


@dataclass
class RecordedRequest:
    """Everything a test may want to check about one request the server received."""

    method: str
    path: str
    query: dict[str, str]
    headers: CIMultiDict[str]
    body: Any  # parsed JSON, or None when the body is empty or not JSON
    raw_body: bytes
    status: int | None = None  # filled in once the response is decided

    @property
    def invocation_id(self) -> str | None:
        return self.headers.get(INVOCATION_HEADER)


def default_organizations() -> list[Organization]:
    """Two organizations, each with an X and a LinkedIn channel, with fresh keys and ids."""
    return [_seed_org("Acme"), _seed_org("Globex")]


def _seed_org(name: str) -> Organization:
    handle = name.lower()
    channels = [("x", f"{name} on X"), ("linkedin", f"{name} on LinkedIn")]
    integrations = [
        Integration(
            id=new_id(),
            name=channel_name,
            identifier=identifier,
            picture=f"https://uploads.postiz.test/avatars/{handle}-{identifier}.png",
            profile=handle,
        )
        for identifier, channel_name in channels
    ]
    return Organization(id=new_id(), name=name, api_key=new_api_key(), integrations=integrations)
