"""Each agent's share of the MCP sessions a process holds.

The SDK's session manager caps the sessions open in a process (``MAX_SESSIONS``) and, at
the cap, refuses every new one with 503, whoever asks; an idle session lives 30 minutes.
One agent token could otherwise open them all in a second and keep every other agent (any
tenant's) out for that long. Here an agent holds at most ``per_agent`` sessions: opening one
more first ends that agent's least recently used idle session (its client gets 404 on its
next request and opens another, as MCP clients do), and when each of them has a request in
flight (an open SSE stream included) the new one is refused instead.

The SDK keeps its sessions to itself, so the share is kept from what passes through
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
from uuid import UUID

__all__ = ["SessionShare"]


@dataclass
class _Open:
    in_flight: int = 0
    idle_since: float = 0.0  # when its last request in flight ended


class SessionShare:
    """The sessions each agent has open, least recently used first."""

    def __init__(
        self,
        per_agent: int,
        idle_timeout: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.per_agent = per_agent
        self.idle_timeout = idle_timeout
        self._clock = clock
        self._open: dict[UUID, OrderedDict[str, _Open]] = {}
        self._opening: dict[UUID, int] = {}  # opening requests not answered yet

    def admit(self, agent: UUID) -> tuple[bool, str | None]:
        """Before a request that opens a session: whether it may (False: every one of the
        agent's sessions is busy), and the session to end first to make room (or None).
        An admitted request is followed by ``opened`` (or nothing) and then ``settled``."""
        sessions = self._sessions(agent)
        victim: str | None = None
        if len(sessions) + self._opening.get(agent, 0) >= self.per_agent:
            victim = next((sid for sid, s in sessions.items() if s.in_flight == 0), None)
            if victim is None:
                return False, None
            del sessions[victim]  # from now on it holds no place, whatever the SDK says
        self._opening[agent] = self._opening.get(agent, 0) + 1
        return True, victim

    def opened(self, agent: UUID, session: str) -> None:
        """The opening request was answered with this session id (status below 400)."""
        self._open.setdefault(agent, OrderedDict())[session] = _Open(idle_since=self._clock())

    def settled(self, agent: UUID) -> None:
        """The opening request has ended (opened or not)."""
        left = self._opening.get(agent, 1) - 1
        if left > 0:
            self._opening[agent] = left
        else:
            self._opening.pop(agent, None)

    def begin(self, agent: UUID, session: str) -> bool:
        """A request on a session: True when it is one of the agent's, now in flight."""
        sessions = self._open.get(agent)
        held = sessions.get(session) if sessions is not None else None
        if held is None:
            return False
        held.in_flight += 1
        sessions.move_to_end(session)  # type: ignore[union-attr]
        return True

    def end(self, agent: UUID, session: str, ended: bool) -> None:
        """That request is over; ``ended``: it ended the session (a DELETE answered, or 404)."""
        sessions: dict[str, _Open] = self._open.get(agent, {})
        held = sessions.get(session)
        if held is None:
            return
        held.in_flight -= 1
        if ended:
            del sessions[session]
        elif held.in_flight == 0:
            held.idle_since = self._clock()
        if not sessions:
            del self._open[agent]

    def count(self, agent: UUID) -> int:
        """The agent's sessions open now (not counting those being opened)."""
        return len(self._sessions(agent))

    def _sessions(self, agent: UUID) -> OrderedDict[str, _Open]:
        """The agent's sessions, those the SDK has timed out since dropped (an agent with
        none gets an empty one that is not kept)."""
        sessions = self._open.get(agent, OrderedDict())
        expired = self._clock() - self.idle_timeout
        for sid in [
            sid for sid, s in sessions.items() if s.in_flight == 0 and s.idle_since <= expired
        ]:
            del sessions[sid]
        return sessions
