"""MCP for agents: `toolrelay mcp` (stdio) and /mcp on `toolrelay serve` (docs/mcp.md)."""

from toolrelay.mcp.server import STATUS_TOOL, McpSettings, build_server, token_caller

__all__ = ["STATUS_TOOL", "McpSettings", "build_server", "token_caller"]
