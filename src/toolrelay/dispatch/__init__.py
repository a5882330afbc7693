"""Outbound dispatch of tool invocations."""
