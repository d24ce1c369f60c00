"""Miniature upstream files for the dataset-source tests: archives with given members, checksums, our entries' specs."""

from __future__ import annotations

import hashlib
import io
import tarfile
import zipfile
from pathlib import Path

from omegaconf import OmegaConf

CONF = Path(__file__).resolve().parents[1] / "conf" / "dataset"


def write_tgz(path: Path, members: dict[str, bytes]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, "w:gz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def write_zip(path: Path, members: dict[str, bytes]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w") as zf:
        for name, data in members.items():
            zf.writestr(name, data)
    return path


def md5(path: Path) -> str:
    return hashlib.md5(path.read_bytes()).hexdigest()


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def real_spec(entry: str) -> dict:
    """The `prepare` spec of one of our registry entries, as the pipeline composes it."""
    return OmegaConf.to_container(OmegaConf.load(CONF / f"{entry}.yaml"), resolve=True)["prepare"]
