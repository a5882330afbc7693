"""A failed connection tells the agent no address (threat model row 6).

An allow entry may name a host (``TOOLRELAY_EGRESS_ALLOW=api.internal``) whose addresses are
internal. When the connection to it fails, asyncio words the error with the address it
tried (``Connect call failed ('10.0.0.5', 8443)``, one per address after ``Multiple
exceptions:``), and that text was the agent's ``error``: calling a tool whose upstream is
down told the agent where the host lives inside the network. The agent now reads the
message without the address; the owner's attempt row keeps the whole of it.

On loopback: ``localhost`` is allowed by name, its port closed, so nothing leaves the
machine.
"""

from __future__ import annotations

import socket
from collections.abc import Callable, Iterator

import pytest

from tests.api.conftest import Client, agent_client, keyring, make_owner, settings
from tests.api.servers import serve_app
from toolrelay.api import create_app
from toolrelay.credentials import Keyring
from toolrelay.dispatch.egress import EgressPolicy
from toolrelay.dispatch.outcome import Outcome

__all__ = ["api", "keyring", "make_owner"]  # fixtures


@pytest.fixture(scope="module")
def api(database_url: str, keyring: Keyring) -> Iterator[str]:
    """The API with its in-process worker, which may reach ``localhost`` (by name only)."""
    egress = EgressPolicy.from_env({"TOOLRELAY_EGRESS_ALLOW": "localhost"})
    with serve_app(create_app(settings(database_url, keyring, egress=egress))) as url:
        yield url


def closed_port() -> int:
    """A loopback port nobody listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def test_the_agent_is_not_told_the_address_a_host_name_resolved_to(
    make_owner: Callable[[], Client], api: str
) -> None:
    owner = make_owner()
    port = closed_port()
    tool = {"name": "read", "endpoint_url": f"http://localhost:{port}/items",
            "http_method": "GET", "egress_class": "read_only", "max_attempts": 1}  # fmt: skip
    assert owner.put("/v1/tools/read", json=tool).status_code == 200
    bot = agent_client(api, owner, "bot")
    assert owner.put("/v1/assignments/bot/read").status_code == 200

    made = bot.post("/v1/agent/invocations?wait=30", json={"tool": "read", "input": {}})
    assert made.status_code == 202, made.text
    call = made.json()
    assert (call["status"], call["error_code"]) == ("failed", "network_error")
    seen = bot.get(f"/v1/agent/invocations/{call['id']}").json()
    for text in (call["error"], seen["error"]):
        assert "127.0.0.1" not in text, text  # where localhost lives: not the agent's to know
        assert f"localhost:{port}" in text and "could not connect" in text  # still useful

    # The owner's attempt row has the whole account, address included.
    [attempt] = owner.get(f"/v1/invocations/{call['id']}").json()["attempts"]
    assert f"('127.0.0.1', {port})" in attempt["error"]


@pytest.mark.parametrize(
    "said",
    [
        "could not connect: api.internal:8443: Connect call failed ('10.0.0.5', 8443)",
        "could not connect: api.internal:80: Multiple exceptions: [Errno 111] Connect call"
        " failed ('10.0.0.5', 80), [Errno 111] Connect call failed ('fd00::5', 80, 0, 0)",
    ],
)
def test_every_address_of_a_connection_error_is_the_owners_alone(said: str) -> None:
    for outcome in (
        Outcome.failed("network_error", said),
        Outcome.retry(1.0, "network_error", said, never_left=True),
    ):
        assert outcome.error is not None and outcome.detail == said
        assert "10.0.0.5" not in outcome.error and "fd00::5" not in outcome.error
        assert outcome.error.startswith("could not connect: api.internal:")
