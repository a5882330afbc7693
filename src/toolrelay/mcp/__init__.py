"""MCP for agents: `toolrelay mcp` (stdio) and /mcp on `toolrelay serve` (docs/mcp.md).

The server lives in ``toolrelay.mcp.server``; it is not imported here because the MCP SDK
is slow to import and most commands never need it.
"""
