"""DVC's run cache, read without running anything: DVC has no public API that returns a run-cache entry (`dvc repro`
restores one through `StageCache.restore`, which returns nothing), and `vlbench plan` needs the entry itself, to say
whether its outputs are in the local cache and to ask the remote about them (its `cached.local` and `cached.remote`).

Private surface used (tests/test_adapters.py): `dvc.stage.cache._can_hash(stage)`, `StageCache._load(stage)` and
`StageCache._create_stage(cache, wdir)`, the three steps `StageCache.restore` takes before it checks out."""

from __future__ import annotations

from dvc.stage.cache import _can_hash


def run_cache_entry(repo, stage):
    """The stage as DVC's run cache of `repo` recorded it for `stage`'s current dependencies and params (its outputs
    are the recorded ones), or None: DVC cannot cache the stage (no outputs, `always_changed`, a dependency outside
    the repository, ...) or never ran it with these inputs. Hashes the current dependencies in memory first
    (`stage.save_deps`, as `dvc repro` does): a missing dependency raises DVC's error."""
    stage.save_deps()
    if not _can_hash(stage):
        return None
    entry = repo.stage_cache._load(stage)
    return repo.stage_cache._create_stage(entry, wdir=stage.wdir) if entry else None
