"""Shared test fixtures: reference data from ../shared and the installed real models."""

import json
from pathlib import Path

import pytest

from llogos_cli.errors import LlogosError

SHARED = Path(__file__).resolve().parents[2] / "shared"
FIXTURES = SHARED / "fixtures"
REFERENCE = SHARED / "reference"


def need(path: Path) -> Path:
    if not path.exists():
        pytest.skip(f"reference data not present: {path}")
    return path


def reference(name: str) -> dict:
    return json.loads(need(REFERENCE / f"{name}.json").read_text())


def model_path(name: str) -> Path:
    from llogos_cli.registry import resolve_model
    try:
        return resolve_model(name)[0]
    except LlogosError as e:  # `make test` pulls both models before running the suite
        pytest.fail(f"{e} (or run: make models)")


@pytest.fixture(scope="session")
def smollm_path() -> Path:
    return model_path("smollm2-135m")


@pytest.fixture(scope="session")
def gemma_path() -> Path:
    return model_path("gemma3-270m")


def pytest_report_header(config):
    state = "present" if FIXTURES.is_dir() and REFERENCE.is_dir() else "MISSING: tests that need it skip"
    return f"llogos reference data: {SHARED} ({state})"
