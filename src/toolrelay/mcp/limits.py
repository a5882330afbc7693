"""How long an MCP tools/call waits for the dispatcher's outcome, and how many sessions
are open at once."""

from typing import Final

WAIT_ENV: Final = "TOOLRELAY_MCP_WAIT_SECONDS"
DEFAULT_WAIT_SECONDS: Final = 30.0
MAX_WAIT_SECONDS: Final = 300.0  # the most a configured tools/call bound may be

SESSIONS_PER_AGENT_ENV: Final = "TOOLRELAY_MCP_SESSIONS_PER_AGENT"
DEFAULT_SESSIONS_PER_AGENT: Final = 32  # open at once per agent, in each serve process
MAX_SESSIONS: Final = 1000  # open at once in each serve process, all agents together
