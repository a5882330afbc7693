"""`toolrelay export openai --strict` over real documents (issue 15): three documents of the
OpenAPI corpus (tests/corpus/), quick to import, each with what the strict conversion has to
get right: box.com (allOf on most request bodies), asana.com (a required member with no
schema), @readme/oas-examples' discriminators (properties beside an anyOf/oneOf).

For each, the document's tools as ``toolrelay import openapi`` plans them go through
``strict_figures`` (tests/corpus/strict.py), which has no problems: every exported tool
validates with the ``openai`` SDK's types, every ``strict: true`` tool keeps OpenAI's
documented strict rules, and sampled strict calls (nulls for what they leave out) come back
from ``from_strict_call`` as the sample input, valid for the tool's own schema. The figures
over the whole corpus are the corpus test's (tests/export/test_openapi_corpus.py).

Without the corpus installed (``python -m tests.corpus.install``) this test fails, saying so,
unless ``TOOLRELAY_CORPUS_OPTIONAL=1``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Final

import pytest

from tests.corpus import ALL, Document, installed
from tests.corpus.strict import SAMPLED, strict_figures
from toolrelay.export.openapi import load_openapi, plan_openapi

NAMES: Final = (
    "directory:box.com.json",
    "directory:asana.com.json",
    "oas-examples:3.0/json/discriminators.json",
)
DOCUMENTS: Final = tuple(doc for doc in ALL if doc.name in NAMES)


@pytest.fixture(scope="module")
def root() -> Path:
    return installed(DOCUMENTS)


def test_the_documents_are_in_the_corpus() -> None:
    assert [doc.name for doc in DOCUMENTS] == list(NAMES)


@pytest.mark.parametrize("doc", DOCUMENTS, ids=[doc.name for doc in DOCUMENTS])
def test_strict_export_of_a_real_document(doc: Document, root: Path) -> None:
    plan = plan_openapi(load_openapi(doc.path(root)), server=doc.server, auth=doc.auth)
    figures, problems = strict_figures(plan.tools)
    print(f"{doc.name}: {figures}")
    assert figures["tools"] == len(plan.tools) > 0
    assert figures["strict"] + figures["not_strict"] == figures["tools"]
    assert sum(figures["not_strict_by_reason"].values()) == figures["not_strict"]
    sampled = min(SAMPLED, figures["strict"] - figures["round_trip_unsampled"])
    assert figures["round_trips"] == sampled > 0, figures
    assert not problems, f"{len(problems)} problems, first: " + "\n".join(problems[:10])
