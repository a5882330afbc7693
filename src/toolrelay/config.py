"""Settings read from the environment, in one place."""

from __future__ import annotations

import os
from pathlib import Path

DEFAULT_HOME = Path.home() / ".local" / "share" / "toolrelay"


def home() -> Path:
    """TOOLRELAY_HOME: where the embedded database, the default owner and keys live."""
    value = os.environ.get("TOOLRELAY_HOME")
    path = Path(value).expanduser() if value else DEFAULT_HOME
    path.mkdir(parents=True, exist_ok=True)
    return path


def database_url_from_env() -> str | None:
    value = os.environ.get("DATABASE_URL", "").strip()
    return value or None
