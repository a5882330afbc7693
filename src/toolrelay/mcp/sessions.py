"""Each agent's, and each owner's, share of the MCP sessions a process holds.

The SDK's session manager caps the sessions open in a process (``MAX_SESSIONS``) and, at
the cap, refuses every new one with 503, whoever asks; an idle session lives 30 minutes.
One agent token could otherwise open them all in a second, and one tenant's agents (an
owner may create any number of them) all of them together, and keep every other tenant
out for that long. Here an agent holds at most ``per_agent`` sessions and an owner, all its
agents together, at most ``per_owner``: opening one more first ends the least recently
used idle session of that agent (at the agent's share), else of that owner, whichever of
its agents holds it (at the owner's share); its client gets 404 on its next request and
opens another, as MCP clients do. When each of those sessions has a request in flight (an
open SSE stream included) the new one is refused instead. Never another tenant's.

The SDK keeps its sessions to itself, so the shares are kept from what passes through
``McpEndpoint``: the session id its opening answer carries, the requests in flight on it,
and how it ends (a DELETE answered, a 404, or the idle timeout the SDK applies, counted
here from the same moment: when its last request in flight ended). Everything runs on the
event loop: no locks.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, NamedTuple
from uuid import UUID

from toolrelay.mcp.limits import DEFAULT_SESSIONS_PER_OWNER

__all__ = ["Admission", "SessionShare", "Victim"]


@dataclass
class _Open:
    agent: UUID
    in_flight: int = 0
    idle_since: float = 0.0  # when its last request in flight ended


class Victim(NamedTuple):
    """A session ended to make room, and the agent that holds it."""

    agent: UUID
    session: str


@dataclass(frozen=True)
class Admission:
    """Whether a session may be opened; the session to end first (or None); and which share
    was full (the one that chose the victim, or refused): "agent" or "owner"."""

    admitted: bool
    victim: Victim | None = None
    full: Literal["agent", "owner"] | None = None


class SessionShare:
    """The sessions each owner's agents have open, least recently used first."""

    def __init__(
        self,
        per_agent: int,
        idle_timeout: float,
        clock: Callable[[], float] = time.monotonic,
        per_owner: int = DEFAULT_SESSIONS_PER_OWNER,
    ) -> None:
        self.per_agent = per_agent
        self.per_owner = per_owner
        self.idle_timeout = idle_timeout
        self._clock = clock
        self._open: dict[UUID, OrderedDict[str, _Open]] = {}  # by owner
        self._opening: dict[UUID, int] = {}  # opening requests not answered yet, by agent
        self._owner_opening: dict[UUID, int] = {}  # the same, by owner

    def admit(self, owner: UUID, agent: UUID) -> Admission:
        """Before a request that opens a session: whether it may (not when every session it
        could take the place of is busy), and the session to end first to make room. An
        admitted request is followed by ``opened`` (or nothing) and then ``settled``."""
        sessions = self._sessions(owner)
        full: Literal["agent", "owner"] | None = None
        held = sum(1 for s in sessions.values() if s.agent == agent)
        if held + self._opening.get(agent, 0) >= self.per_agent:
            full = "agent"
        elif len(sessions) + self._owner_opening.get(owner, 0) >= self.per_owner:
            full = "owner"
        victim: Victim | None = None
        if full is not None:
            sid = next(
                (
                    sid
                    for sid, s in sessions.items()
                    if s.in_flight == 0 and (full == "owner" or s.agent == agent)
                ),
                None,
            )
            if sid is None:
                return Admission(False, None, full)
            victim = Victim(sessions.pop(sid).agent, sid)  # it holds no place from now on
        self._opening[agent] = self._opening.get(agent, 0) + 1
        self._owner_opening[owner] = self._owner_opening.get(owner, 0) + 1
        return Admission(True, victim, full)

    def opened(self, owner: UUID, agent: UUID, session: str) -> None:
        """The opening request was answered with this session id (status below 400)."""
        opened = _Open(agent, idle_since=self._clock())
        self._open.setdefault(owner, OrderedDict())[session] = opened

    def settled(self, owner: UUID, agent: UUID) -> None:
        """The opening request has ended (opened or not)."""
        for counts, key in ((self._opening, agent), (self._owner_opening, owner)):
            left = counts.get(key, 1) - 1
            if left > 0:
                counts[key] = left
            else:
                counts.pop(key, None)

    def begin(self, owner: UUID, agent: UUID, session: str) -> bool:
        """A request on a session: True when it is one of the agent's, now in flight."""
        sessions = self._open.get(owner)
        held = sessions.get(session) if sessions is not None else None
        if held is None or held.agent != agent:
            return False
        held.in_flight += 1
        sessions.move_to_end(session)  # type: ignore[union-attr]
        return True

    def end(self, owner: UUID, agent: UUID, session: str, ended: bool) -> None:
        """That request is over; ``ended``: it ended the session (a DELETE answered, or 404)."""
        sessions: dict[str, _Open] = self._open.get(owner, {})
        held = sessions.get(session)
        if held is None or held.agent != agent:
            return
        held.in_flight -= 1
        if ended:
            del sessions[session]
        elif held.in_flight == 0:
            held.idle_since = self._clock()
        if not sessions:
            del self._open[owner]

    def count(self, owner: UUID, agent: UUID | None = None) -> int:
        """The sessions open now of the owner, or of one of its agents (not counting those
        being opened)."""
        sessions = self._sessions(owner)
        if agent is None:
            return len(sessions)
        return sum(1 for s in sessions.values() if s.agent == agent)

    def _sessions(self, owner: UUID) -> OrderedDict[str, _Open]:
        """The owner's sessions, those the SDK has timed out since dropped (an owner with
        none gets an empty one that is not kept)."""
        sessions = self._open.get(owner, OrderedDict())
        expired = self._clock() - self.idle_timeout
        for sid in [
            sid for sid, s in sessions.items() if s.in_flight == 0 and s.idle_since <= expired
        ]:
            del sessions[sid]
        if not sessions:
            self._open.pop(owner, None)
        return sessions
