"""What this process last read of the tools it invokes, so that the next call is one round
trip (migration 0020): the input is validated against the schema kept here, and the insert
(``agents.invoke_seen``) happens only while the tool is still the row version it came from.

Nothing here decides who may call what: the database does, on every insert. Entries are
keyed by the database, who read them (owner, acting agent) and how they named the agent and
the tool, so one caller's reads never serve another. A stale entry costs one more round trip: the
insert refuses, the entry is dropped and the tool read again. Input that the kept schema
refuses is checked again against a fresh read before it is refused.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any
from uuid import UUID

from toolrelay.db.connect import Row

__all__ = ["SEEN", "Seen", "SeenTools"]

MAX_ENTRIES = 4096  # least recently used go first


@dataclass(frozen=True)
class Seen:
    agent_id: UUID
    tool_id: UUID
    schema: Any  # the tool's schema_input as read
    version: str  # agents.tool_version of the row read
    row: Row  # what else the caller read with it (Registry.call: the tool as the agent sees it)


class SeenTools:
    def __init__(self, size: int = MAX_ENTRIES) -> None:
        self._size = size
        self._entries: OrderedDict[Hashable, Seen] = OrderedDict()
        self._lock = threading.Lock()  # Registry runs in worker threads

    def get(self, key: Hashable) -> Seen | None:
        with self._lock:
            seen = self._entries.get(key)
            if seen is not None:
                self._entries.move_to_end(key)
            return seen

    def put(self, key: Hashable, seen: Seen) -> None:
        with self._lock:
            self._entries[key] = seen
            self._entries.move_to_end(key)
            while len(self._entries) > self._size:
                self._entries.popitem(last=False)

    def drop(self, key: Hashable) -> None:
        with self._lock:
            self._entries.pop(key, None)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()


SEEN = SeenTools()
