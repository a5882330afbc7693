"""The README's walk-through and the docs' runnable blocks work when pasted into a fresh
shell (issue 13, item 10), and every relative link in them points at a file that exists.

A block is runnable when the line before its ```bash fence is ``<!-- test: run … -->``.
Each runs from the repository's root in ``bash -euo pipefail`` with nothing of ours in the
environment (no DATABASE_URL, no TOOLRELAY_*): the embedded database, as a new user has it.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
MARK = re.compile(r"^<!-- test: run\b.*-->\s*\n```bash\n(?P<code>.*?)^```", re.M | re.S)
LINK = re.compile(r"\]\((?!https?:|mailto:|#)(?P<target>[^)#\s]+)(?:#[^)]*)?\)")
RUN_TIMEOUT = 300  # seconds for one block (the embedded server starts once per block)
# Whatever a block leaves running is stopped, even when it fails half-way.
CLEANUP = (
    "trap 'kill ${POSTIZ_PID:-} 2>/dev/null || true;"
    " command -v toolrelay >/dev/null && toolrelay db stop >/dev/null 2>&1 || true' EXIT\n"
)


def blocks() -> list[tuple[str, str]]:
    found = []
    for doc in DOCS:
        for n, match in enumerate(MARK.finditer(doc.read_text("utf-8"))):
            found.append((f"{doc.relative_to(ROOT)}#{n + 1}", match.group("code")))
    return found


BLOCKS = blocks()


@pytest.fixture
def scratch() -> Iterator[Path]:
    # Not under pytest's tmp: the embedded server runs as its own user and must reach it.
    path = Path(tempfile.mkdtemp(prefix="toolrelay-docs-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def run_block(code: str, scratch: Path) -> subprocess.CompletedProcess[str]:
    ours = ("DATABASE_URL", "TOOLRELAY_", "VIRTUAL_ENV", "PG")
    env = {k: v for k, v in os.environ.items() if not k.startswith(ours)}
    env["TMPDIR"] = str(scratch)  # mktemp -d lands here, readable by the embedded server
    env["PATH"] = os.pathsep.join(
        p for p in env.get("PATH", "").split(os.pathsep) if ".venv" not in p
    )
    return subprocess.run(
        ["bash", "-euo", "pipefail", "-c", CLEANUP + code],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT,
    )  # fmt: skip


def test_the_readme_has_a_runnable_walk_through() -> None:
    assert any(name.startswith("README.md") for name, _ in BLOCKS)


@pytest.mark.parametrize(("name", "code"), BLOCKS, ids=[name for name, _ in BLOCKS])
def test_runnable_block_works_as_written(name: str, code: str, scratch: Path) -> None:
    result = run_block(code, scratch)
    assert result.returncode == 0, (
        f"{name} failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    )
    assert "Traceback" not in result.stderr, result.stderr
    if name.startswith("README.md"):  # the walk-through ends with the post Postiz created
        shown = result.stdout[result.stdout.rindex('"status"') :]
        assert shown.startswith('"status": "completed"'), result.stdout[-2000:]
        assert '"postId"' in result.stdout and '"Authorization": "••••"' in result.stdout


@pytest.mark.parametrize("doc", DOCS, ids=[str(d.relative_to(ROOT)) for d in DOCS])
def test_relative_links_point_at_files_that_exist(doc: Path) -> None:
    text = doc.read_text("utf-8")
    broken = [
        m.group("target")
        for m in LINK.finditer(text)
        if not (doc.parent / m.group("target")).resolve().is_relative_to(ROOT)
        or not (doc.parent / m.group("target")).exists()
    ]
    assert broken == [], f"{doc.name}: links to nothing in the repository: {broken}"
