"""`python -m toolrelay.cli` runs the CLI (used where the console script is not on PATH)."""

from toolrelay.cli.main import app

app()
