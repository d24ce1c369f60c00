"""Your own data: data/own, a git-ignored link to your data root (`vlbench data-root`, $VLBENCH_DATA_ROOT), so that
params.yaml and dvc.lock hold the same relative paths in every clone."""

from __future__ import annotations

import os
from pathlib import Path

from vlbench.params import OWN_DATA, ParamsError

DATA_ROOT_VARIABLE = "VLBENCH_DATA_ROOT"


def link_data_root(target: str | Path | None = None, link: Path | None = None) -> Path:
    """Make `link` (default: data/own of the project this is run in, git-ignored) point at your data root: `target`,
    else $VLBENCH_DATA_ROOT. Entries name your data as data/own/<...>, so params.yaml and dvc.lock hold the same
    relative paths in every clone while DVC hashes the data itself through the link (a changed image still makes
    prepare@ stale). A root that would hold the link itself (the project, data/, data/own) is refused."""
    target = target or os.environ.get(DATA_ROOT_VARIABLE)
    if not target:
        raise ParamsError(f"no data root given: pass its path or set {DATA_ROOT_VARIABLE}")
    link = link or project_root() / OWN_DATA
    target = Path(target).expanduser().resolve()
    if not target.is_dir():
        raise ParamsError(f"data root {str(target)!r} is not a folder")
    where = link.parent.resolve() / link.name
    if where == target or where.is_relative_to(target) or target.is_relative_to(where):
        raise ParamsError(f"data root {str(target)!r} would hold the link {str(where)!r} itself (a loop): give the "
                          f"folder of your data, outside {str(where.parent)!r}")
    if link.exists() and not link.is_symlink():
        raise ParamsError(f"{str(link)!r} is a real folder, not a link: keep your data there, or move it away and "
                          f"run `vlbench data-root {target}` again")
    link.parent.mkdir(parents=True, exist_ok=True)
    tmp = link.with_name(f".{link.name}.tmp")
    tmp.unlink(missing_ok=True)
    tmp.symlink_to(target, target_is_directory=True)
    tmp.replace(link)  # atomic: a concurrent reader sees the old link or the new one
    return target


def project_root(start: Path | None = None) -> Path:
    """The project folder this is run in: the nearest of the current folder and its parents with a dvc.yaml."""
    here = (start or Path.cwd()).resolve()
    for folder in (here, *here.parents):
        if (folder / "dvc.yaml").is_file():
            return folder
    raise ParamsError(f"{str(here)!r} is not inside a vlbench project (no dvc.yaml here or above): run it in your "
                      f"clone")


def check_data_root(path: str | Path, name: str) -> None:
    """A dataset whose input lies under data/own needs the link made first; say how instead of 'not found'."""
    path = Path(path)
    if path.parts[:2] != OWN_DATA.parts or OWN_DATA.exists():
        return
    if OWN_DATA.is_symlink():
        raise ParamsError(f"dataset {name!r} reads {str(path)!r} but {str(OWN_DATA)!r} points at "
                          f"{os.readlink(OWN_DATA)!r}, which does not exist (moved, renamed or not mounted?): "
                          f"mount it, or run `vlbench data-root /path/to/your/data` again")
    raise ParamsError(f"dataset {name!r} reads {str(path)!r} but {str(OWN_DATA)!r} does not exist in this clone: "
                      f"run `vlbench data-root /path/to/your/data` (or set {DATA_ROOT_VARIABLE} and run "
                      f"`vlbench data-root`) once per clone")
