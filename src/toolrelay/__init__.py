"""toolrelay: a tool registry and dispatcher for AI agents, on PostgreSQL."""

from toolrelay.db import Database, migrate
from toolrelay.errors import ToolrelayError
from toolrelay.registry import Registry, ToolSpec

__all__ = ["Database", "Registry", "ToolSpec", "ToolrelayError", "migrate"]
__version__ = "0.1.0"
