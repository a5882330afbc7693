"""Interoperability: OpenAI function-calling exports and OpenAPI imports (docs/interop.md)."""

from toolrelay.export.openai import openai_name, openai_tools
from toolrelay.export.openapi import ImportPlan, load_openapi, tools_from_openapi

__all__ = ["ImportPlan", "load_openapi", "openai_name", "openai_tools", "tools_from_openapi"]
