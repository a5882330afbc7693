"""The HTTP API (`toolrelay serve`): /v1 for owners and agents, and the approvals page."""

from toolrelay.api.app import create_app
from toolrelay.api.context import ApiSettings

__all__ = ["ApiSettings", "create_app"]
