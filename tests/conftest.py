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


def copy_gguf(src: Path, dst: Path, meta: dict | None = None, tensors: dict | None = None) -> Path:
    """Write src's metadata and tensors to dst, with some metadata values and tensors replaced:
    meta {key: value} (same value type), tensors {name: (uint8 raw bytes, GGML type)}."""
    from gguf import GGUFReader, GGUFValueType, GGUFWriter
    reader = GGUFReader(src)
    arch = (meta or {}).get("general.architecture") or reader.fields["general.architecture"].contents()
    writer = GGUFWriter(dst, arch)
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        value = (meta or {}).get(key, field.contents())
        sub = field.types[1] if field.types[0] == GGUFValueType.ARRAY else None
        writer.add_key_value(key, value, field.types[0], sub)
    for t in reader.tensors:
        if t.name in (tensors or {}):
            raw, qtype = tensors[t.name]
            writer.add_tensor(t.name, raw, raw_dtype=qtype)
        else:
            writer.add_tensor(t.name, t.data)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return dst


@pytest.fixture(scope="session")
def smollm_path() -> Path:
    return model_path("smollm2-135m")


@pytest.fixture(scope="session")
def gemma_path() -> Path:
    return model_path("gemma3-270m")


def pytest_report_header(config):
    state = "present" if FIXTURES.is_dir() and REFERENCE.is_dir() else "MISSING: tests that need it skip"
    return f"llogos reference data: {SHARED} ({state})"
