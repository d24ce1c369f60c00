"""Fixtures built by the tests themselves: tiny canonical datasets, a randomly initialised toy checkpoint, and the
miniature demo run that the pipeline tests share."""

from __future__ import annotations

import io
import os
import shutil
import signal
from pathlib import Path

from vlbench import portable

# The test processes compute under the stages' portable settings too, set before numpy and torch load: a test compares
# its in-process results with stage processes' and Ray workers' bytes, and on a CPU whose libraries would pick other
# kernels (MKL's AVX-512 on an Intel Xeon) those comparisons failed; an earlier test's `import stages` made it worse,
# putting the settings into this process's environment (and so its workers') after its own libraries had loaded.
if not portable.apply() and portable.enabled():
    raise RuntimeError("tests/conftest.py: numpy, torch, FAISS, pyarrow or scipy loaded before the portable settings "
                       "(a pytest plugin?): the tests' bytes would depend on the CPU")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
from filelock import FileLock  # noqa: E402
from PIL import Image  # noqa: E402

from tests.pipeline_repo import copy_repo, make_flows_demo, make_smoke_run, tree_state  # noqa: E402
from vlbench.datasets.canonical import ClassInfo, DatasetMeta, write_dataset  # noqa: E402

COLORS = {"red": (220, 30, 30), "green": (30, 200, 30), "blue": (30, 30, 220)}


# The long modules, longest first (most reproduce a pipeline; their times: docs/benchmarks.md, "The test suite"):
# `make test` runs pytest-xdist with `--dist loadfile --no-loadscope-reorder`, which hands modules out in this order, so
# the long ones start first and the two workers end together (xdist's own order, most tests first, started
# test_portable_demo, the longest but for test_readme_flows, last). The first two take different shared builds
# (test_readme_flows builds smoke_run and flows_demo; test_portable_demo its own), so neither worker waits on the
# other's lock; the third goes to test_portable_demo's worker too (xdist gives a worker a second module when its first
# has 2 tests or fewer), and by then smoke_run is normally built (else it waits on the lock, as before).
# The other modules follow in file order and fill the gaps.
LONGEST_FIRST = ("test_readme_flows", "test_portable_demo", "test_pipeline", "test_readme_flows_finetune",
                 "test_byo_pipeline", "test_remote", "test_finetune", "test_embed_ray", "test_finetune_units",
                 "test_share_images", "test_rerun", "test_datacomp_pipeline", "test_knowledge_pipeline", "test_plan",
                 "test_retrieval", "test_specificity", "test_compositionality_pipeline", "test_retrieval_pipeline",
                 "test_finetune_pipeline")


def pytest_collection_modifyitems(items):
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.stem, len(rank)))  # stable: a module's tests keep their order


def png(rgb, size: int = 32, seed: int = 0) -> bytes:
    rng = np.random.default_rng(seed)
    pixels = np.clip(np.array(rgb)[None, None, :] + rng.normal(0, 10, (size, size, 3)), 0, 255).astype(np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format="PNG")
    return buf.getvalue()


def make_dataset(out_dir, name="tiny", per_class=4, splits=("train", "test"), corrupt: dict | None = None):
    """Three colour classes; `corrupt={split: sample_id}` replaces that sample's bytes with garbage."""
    classes = [ClassInfo(index=i, name=n) for i, n in enumerate(COLORS)]
    meta = DatasetMeta(name=name, task="single-label", metric="accuracy", classes=classes)

    def rows(split):
        for k in range(per_class * len(COLORS)):
            label = k % len(COLORS)
            sample_id = f"{split}/{k:03d}"
            data = png(list(COLORS.values())[label], seed=k + (1000 if split == "test" else 0))
            if corrupt and corrupt.get(split) == sample_id:
                data = data[:40]
            yield {"sample_id": sample_id, "label": label, "image": data}

    return write_dataset(out_dir, meta, {s: rows(s) for s in splits})


TINY_TEMPLATES = ["a {c} square.", "a photo of something {c}."]


def make_texts(dataset_dir, out_dir, templates=TINY_TEMPLATES):
    """The text sets of a prepared dataset, as the texts stage writes them."""
    from vlbench.datasets.canonical import load_meta
    from vlbench.texts import build_text_sets, write_text_sets

    meta = load_meta(dataset_dir)
    return write_text_sets(out_dir, meta.name, build_text_sets(meta, dataset_dir, {"templates": templates}))


@pytest.fixture
def tiny_dataset(tmp_path):
    make_dataset(tmp_path / "prepared" / "tiny")
    return tmp_path / "prepared" / "tiny"


@pytest.fixture
def tiny_texts(tiny_dataset, tmp_path):
    make_texts(tiny_dataset, tmp_path / "texts" / "tiny")
    return tmp_path / "texts" / "tiny"


@pytest.fixture(scope="session")
def toy_model_cfg(tmp_path_factory):
    """A model config for the toy architecture with random (seeded) weights, loaded as a local checkpoint."""
    import open_clip

    from vlbench.models import register_local_configs

    register_local_configs()
    torch.manual_seed(0)
    model = open_clip.create_model("vlbench-toy")
    path = tmp_path_factory.mktemp("toy") / "checkpoint.pt"
    torch.save(model.state_dict(), path)
    return {"slug": "toy-random", "arch": "vlbench-toy", "pretrained": str(path), "precision": "fp32"}


def _interrupt(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


@pytest.fixture(scope="module")
def local_ray():
    """One local Ray of 2 CPUs for a module (the engines join it instead of starting their own); yields its GCS
    address. Its workers get the stages' portable settings and threads' wait (as vlbench.embed_ray.connect gives
    them, and as this process has) and the driver's priority (at Ray's default niceness of 15 they starved beside other jobs: on the shared
    2-core machine two ELEVATER search units took 14 min on Ray, 22 took 2 min in the driver). ray.init's SIGTERM
    handler is replaced: it made a `timeout` around pytest fail the running test (an "F" without traceback) and pytest
    went on to the next test; now SIGTERM stops the session as Ctrl-C does, showing where the test was and shutting
    Ray down."""
    ray = pytest.importorskip("ray")
    previous = signal.getsignal(signal.SIGTERM)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False,
             runtime_env={"env_vars": {**portable.THREAD_WAIT, **(portable.ENV if portable.enabled() else {})}},
             _system_config={"worker_niceness": 0})
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        yield ray.get_runtime_context().gcs_address
    finally:
        ray.shutdown()
        signal.signal(signal.SIGTERM, previous)


@pytest.fixture
def dirs(tmp_path, monkeypatch):
    """For the download-source tests: (www: the served folder, mirror: the local mirror folder, out: prepared
    datasets); the download cache and the hub lock (VLBENCH_HUB_LOCK) are private to the test."""
    www, mirror = tmp_path / "www", tmp_path / "mirror"
    www.mkdir()
    mirror.mkdir()
    monkeypatch.setenv("VLBENCH_DOWNLOADS", str(tmp_path / "cache"))
    monkeypatch.setenv("VLBENCH_HUB_LOCK", str(tmp_path / "hub.lock"))
    monkeypatch.setenv("VLBENCH_MIRROR", str(mirror))
    monkeypatch.setenv("VLBENCH_DOWNLOAD_BACKOFF", "0")
    return www, mirror, tmp_path / "out"


def built_once(tmp_path_factory, name: str, build) -> Path:
    """`build(folder)` run once per test session and once for all pytest-xdist workers: the first to ask builds it
    under a file lock in the session's shared temporary folder, the others wait and reuse it."""
    shared = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        shared = shared.parent  # the workers' base folders (popen-gw0, ...) sit in the session's
    base, done = shared / name, shared / f"{name}.done"
    with FileLock(str(shared / f"{name}.lock")):
        if not done.exists():
            shutil.rmtree(base, ignore_errors=True)  # a build that failed in another worker
            build(base)
            done.touch()
    return base


def copies_of(base: Path):
    """`copy(dest)`: a copy of the shared build `base` for a module to change as it likes (new files, no hard links);
    the session ends in an error if a file of `base` was written all the same."""
    before = tree_state(base)
    yield lambda dest: copy_repo(base, dest)
    assert tree_state(base) == before, f"a test wrote into the shared run {base}: tests must use a copy"


@pytest.fixture(scope="session")
def smoke_run(tmp_path_factory):
    """`smoke_run(dest)`: a copy at `dest` of the miniature demo run (tests/pipeline_repo.py, make_smoke_run: the smoke
    suite reproduced with the toy-smoke model and committed), for a module to change as it likes. The run is built once
    per test session, and once for all pytest-xdist workers (`built_once`). Nobody writes into it: each caller gets its
    own copy (new files, no hard links), and the session ends in an error if a file of the shared run was written all
    the same."""
    yield from copies_of(built_once(tmp_path_factory, "smoke-run", make_smoke_run))


@pytest.fixture(scope="session")
def flows_demo(smoke_run, tmp_path_factory):
    """`flows_demo(dest)`: a copy at `dest` of the README flows' miniature demo (tests/pipeline_repo.py,
    make_flows_demo: the smoke run with the demo's analyses at miniature sizes, reproduced, and an experiment applied),
    built once for the session as `smoke_run` is; tests/test_readme_flows.py and tests/test_readme_flows_finetune.py each
    take a copy, so the two modules run on both xdist workers."""
    yield from copies_of(built_once(tmp_path_factory, "flows-demo", lambda dest: make_flows_demo(smoke_run(dest))))
