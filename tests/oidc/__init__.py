"""A real OpenID Connect provider for the tests: the npm package ``oidc-provider`` (an
OpenID-certified implementation, pinned in package.json/package-lock.json here), installed
by ``python -m tests.oidc.install`` into ``provider_dir()`` (outside the repository) and run
by ``start_provider`` on a free loopback port with a small config: its development login and
consent pages accept any login and password, so Playwright signs in as whoever a test names.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

HERE: Final = Path(__file__).parent
START_TIMEOUT_S: Final = 30.0
DIR_ENV: Final = "TOOLRELAY_OIDC_PROVIDER_DIR"


def provider_dir() -> Path:
    value = os.environ.get(DIR_ENV)
    return Path(value) if value else Path.home() / ".cache" / "toolrelay-oidc-provider"


def installed() -> bool:
    return (provider_dir() / "node_modules" / "oidc-provider" / "package.json").is_file()


@dataclass
class Provider:
    issuer: str
    process: subprocess.Popen[str]
    output: list[str] = field(default_factory=list)

    def log(self) -> str:
        return "".join(self.output)


def require() -> None:
    """Skip, saying what was not tested, when node or the package is missing (.ci/run and
    scripts/test install it)."""
    import pytest  # here: install.py imports this module before the venv exists

    if shutil.which("node") is None:
        pytest.skip("node is not installed: the OpenID Connect flows were NOT tested")
    if not installed():
        pytest.skip(
            f"oidc-provider is not installed in {provider_dir()} (python -m tests.oidc.install):"
            " the OpenID Connect flows were NOT tested"
        )


@contextmanager
def start_provider(
    clients: list[dict[str, Any]],
    accounts: dict[str, dict[str, Any]] | None = None,
    **extra: Any,
) -> Iterator[Provider]:
    """oidc-provider on 127.0.0.1 with these clients and accounts (login → claims)."""
    require()
    home = provider_dir()
    shutil.copyfile(HERE / "provider.mjs", home / "provider.mjs")  # resolves node_modules there
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as config:
        json.dump({"clients": clients, "accounts": accounts or {}, **extra}, config)
    process = subprocess.Popen(
        ["node", str(home / "provider.mjs"), config.name],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=home,
    )
    assert process.stdout is not None
    ready = threading.Event()
    provider = Provider("", process)

    def read() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            provider.output.append(line)
            if line.startswith("ready "):
                provider.issuer = line.split()[1]
                ready.set()
        ready.set()  # it ended: wake the waiter, which sees no issuer

    threading.Thread(target=read, name="oidc-provider", daemon=True).start()
    try:
        if not ready.wait(START_TIMEOUT_S) or not provider.issuer:
            raise RuntimeError(f"oidc-provider did not start:\n{provider.log()}")
        yield provider
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
        os.unlink(config.name)
