"""The tool registry: tools, agents, assignments, invocations and approvals."""

from toolrelay.registry.models import ToolSpec
from toolrelay.registry.service import Registry

__all__ = ["Registry", "ToolSpec"]
