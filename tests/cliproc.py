"""A `toolrelay` command running as a process that prints a sign-in address on stderr and
waits for the provider (`login`, `credential connect`): the address, then its outcome."""

from __future__ import annotations

import subprocess
import sys
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Final

CLI: Final = Path(sys.executable).parent / "toolrelay"
WAIT_S: Final = 60


class Waiting:
    """``toolrelay *args`` with ``stdin`` written and closed; stderr read as it comes."""

    def __init__(self, args: list[str], env: Mapping[str, str], stdin: str = "") -> None:
        self.process = subprocess.Popen(
            [str(CLI), *args],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env=dict(env),
        )  # fmt: skip
        assert self.process.stdin is not None
        self.process.stdin.write(stdin)
        self.process.stdin.close()
        self.err: list[str] = []
        self.shown = ""  # the address it sends the person to, once printed
        self._found = threading.Event()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stderr is not None
        for line in self.process.stderr:
            self.err.append(line)
            if line.startswith("http") and not self.shown:
                self.shown = line.strip()
                self._found.set()
        self._found.set()

    def url(self) -> str:
        assert self._found.wait(WAIT_S) and self.shown, "".join(self.err)
        return self.shown

    def finish(self) -> tuple[int, str, str]:
        """Exit code, stdout, stderr. Not communicate(): it would read stderr too, racing
        the reader for its last lines."""
        assert self.process.stdout is not None
        out = self.process.stdout.read()
        self.process.wait(WAIT_S)
        self._reader.join(WAIT_S)
        return self.process.returncode, out, "".join(self.err)
