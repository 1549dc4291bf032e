from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

FIXTURES = Path(__file__).parent / "fixtures"


def fixture_config(name: str) -> dict[str, Any]:
    """A verbatim config.json from tests/fixtures/models/<org>__<name>/."""
    data: dict[str, Any] = json.loads((FIXTURES / "models" / name / "config.json").read_text())
    return data


@pytest.fixture(name="fixtures")
def _fixtures() -> Path:
    return FIXTURES
