"""Chromium for the tests that drive the approvals page (Playwright): where it is, how it is
launched, and a browser for a module's fixture that skips, saying what was not tested, when
Chromium is not installed (.ci/run installs it)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Final

import pytest
from playwright.sync_api import Browser, sync_playwright

CHROMIUM: Final = os.environ.get("TOOLRELAY_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS: Final = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]  # fmt: skip


def chromium() -> str | None:
    return CHROMIUM if Path(CHROMIUM).exists() else shutil.which("chromium")


def launch(untested: str) -> Iterator[Browser]:
    """A headless Chromium, closed at the end; a skip naming ``untested`` without one."""
    executable = chromium()
    if executable is None:
        pytest.skip(f"Chromium is not installed at {CHROMIUM} (Debian: apt-get install "
                    f"chromium); {untested} was NOT tested in a browser")  # fmt: skip
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS)
        yield browser
        browser.close()
