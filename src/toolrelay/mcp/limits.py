"""How long an MCP tools/call waits for the dispatcher's outcome, and how many sessions
are open at once (per agent, per owner, per process)."""

from typing import Final

WAIT_ENV: Final = "TOOLRELAY_MCP_WAIT_SECONDS"
DEFAULT_WAIT_SECONDS: Final = 30.0
MAX_WAIT_SECONDS: Final = 300.0  # the most a configured tools/call bound may be

SESSIONS_PER_AGENT_ENV: Final = "TOOLRELAY_MCP_SESSIONS_PER_AGENT"
DEFAULT_SESSIONS_PER_AGENT: Final = 32  # open at once per agent, in each serve process
MAX_SESSIONS: Final = 1000  # open at once in each serve process, all agents together

SESSIONS_PER_OWNER_ENV: Final = "TOOLRELAY_MCP_SESSIONS_PER_OWNER"
# Open at once per owner (tenant), all its agents together, in each serve process. Agents
# are not capped, so without it one tenant's agents fill the process and the SDK refuses
# every other tenant's new session (503). A quarter: one tenant leaves three quarters to
# the others, and still holds ~8 agents' full shares.
DEFAULT_SESSIONS_PER_OWNER: Final = MAX_SESSIONS // 4
# The most it may be configured to: never the whole process, always half for the others.
MAX_SESSIONS_PER_OWNER: Final = MAX_SESSIONS // 2
