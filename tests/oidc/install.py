"""Install the test OpenID Connect provider: ``python -m tests.oidc.install [--quiet]``.

``npm ci`` of package.json and package-lock.json here (oidc-provider and its three
dependencies, every tarball checked by npm against the lock's sha512) into
``tests.oidc.provider_dir()``, outside the repository. A directory already installed from
this very lock file (a stamp holds its sha256) is left as it is: a second run takes
milliseconds. Standard library only (runs before the venv exists). Exit 1, saying why, when
npm is missing or the install fails.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
from typing import Final

from tests.oidc import HERE, installed, provider_dir

STAMP: Final = ".lock-sha256"
NPM_TIMEOUT_S: Final = 300


def main(argv: list[str]) -> int:
    quiet = "--quiet" in argv
    home = provider_dir()
    lock = (HERE / "package-lock.json").read_bytes()
    digest = hashlib.sha256(lock + (HERE / "package.json").read_bytes()).hexdigest()
    stamp = home / STAMP
    if installed() and stamp.is_file() and stamp.read_text().strip() == digest:
        return 0
    npm = shutil.which("npm")
    if npm is None:
        print("error: npm is not installed; the OpenID Connect tests need oidc-provider from npm",
              file=sys.stderr)  # fmt: skip
        return 1
    home.mkdir(parents=True, exist_ok=True)
    for name in ("package.json", "package-lock.json"):
        shutil.copyfile(HERE / name, home / name)
    done = subprocess.run(
        [npm, "ci", "--ignore-scripts", "--no-audit", "--no-fund", "--loglevel=error"],
        cwd=home, capture_output=True, text=True, timeout=NPM_TIMEOUT_S, check=False,
    )  # fmt: skip
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["?"])[-1]
        print(f"error: npm ci in {home} failed: {last}", file=sys.stderr)
        return 1
    stamp.write_text(digest + "\n")
    if not quiet:
        print(f"oidc-provider installed in {home}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
