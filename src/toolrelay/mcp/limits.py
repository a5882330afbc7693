"""How long an MCP tools/call waits for the dispatcher's outcome."""

from typing import Final

WAIT_ENV: Final = "TOOLRELAY_MCP_WAIT_SECONDS"
DEFAULT_WAIT_SECONDS: Final = 30.0
MAX_WAIT_SECONDS: Final = 300.0  # the most a configured tools/call bound may be
