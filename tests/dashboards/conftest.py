from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from dashboards import generate

FOLDER = Path(generate.__file__).parent


def committed() -> dict[str, dict[str, Any]]:
    """The committed dashboards, by file name."""
    return {name: json.loads((FOLDER / name).read_text()) for name in generate.DASHBOARDS}


@pytest.fixture(name="boards", scope="session")
def _boards() -> dict[str, dict[str, Any]]:
    return committed()
