"""The Ray engine (vlbench.embed_ray) on a local Ray of 2 CPUs: the same feature files as the local engine, the same
corrupt-image errors, nothing written when a worker dies, and an engine switch that DVC does not see."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

ray = pytest.importorskip("ray")

from tests.conftest import make_dataset, make_texts  # noqa: E402
from tests.test_embed_images import write_images  # noqa: E402
from vlbench import embed_ray  # noqa: E402
from vlbench.datasets.canonical import split_path, split_schema, write_split  # noqa: E402
from vlbench.embed import (  # noqa: E402
    CorruptImageError,
    EngineError,
    embed_image_splits,
    embed_images,
    embed_text_sets,
)
from vlbench.engines import engine  # noqa: E402
from vlbench.features import read_features  # noqa: E402
from vlbench.models.loading import load_model  # noqa: E402

ROWS_PER_GROUP = 4


@pytest.fixture(scope="module")
def loaded(toy_model_cfg):
    return load_model(toy_model_cfg, device="cpu")


def regroup(dataset_dir, split: str, rows_per_group: int = ROWS_PER_GROUP) -> None:
    """Rewrite a prepared split in small row groups, so that it spans several (and Ray several blocks)."""
    path = split_path(dataset_dir, split)
    rows = pq.read_table(path).to_pylist()
    write_split(path, rows, split_schema(False), rows_per_group=rows_per_group)


@pytest.fixture(scope="module")
def grouped(tmp_path_factory):
    """A prepared dataset of one split, 30 rows in 8 row groups."""
    out = tmp_path_factory.mktemp("grouped") / "tiny"
    make_dataset(out, per_class=10, splits=("test",))
    regroup(out, "test")
    return out


def test_ray_writes_the_local_engines_files_byte_for_byte_when_batches_are_row_groups(local_ray, loaded, grouped,
                                                                                      tmp_path):
    """Batches of one row group each are the same batches on both engines: the files are identical, bytes and all."""
    local, on_ray = tmp_path / "local", tmp_path / "ray"
    a = embed_image_splits(loaded, grouped, local, batch_size=ROWS_PER_GROUP, num_workers=0, progress=False)
    b = embed_image_splits(loaded, grouped, on_ray, batch_size=ROWS_PER_GROUP, progress=False, engine=embed_ray)
    assert pq.ParquetFile(split_path(grouped, "test")).num_row_groups == 8
    assert (on_ray / "test.parquet").read_bytes() == (local / "test.parquet").read_bytes()
    assert b["splits"]["test"]["images"] == a["splits"]["test"]["images"] == 30
    ids = read_features(on_ray / "test.parquet", {}).table.column("sample_id").to_pylist()
    assert ids == [f"test/{k:03d}" for k in range(30)]  # row order, across 8 row groups
    assert sorted(p.name for p in tmp_path.iterdir()) == ["local", "ray"]  # no temporary left beside them


def test_ray_runs_the_pillow_decoders_like_the_local_engine_and_refuses_torchvision(local_ray, loaded, grouped,
                                                                                   tmp_path):
    """embed.decode on Ray: pil_draft decodes in the CPU tasks as locally (same bytes); torchvision decodes on the
    model's device, which the actors would need the encoded bytes for: refused in one line before Ray starts."""
    local, on_ray = tmp_path / "local", tmp_path / "ray"
    embed_image_splits(loaded, grouped, local, batch_size=ROWS_PER_GROUP, num_workers=0, progress=False,
                       decode="pil_draft")
    embed_image_splits(loaded, grouped, on_ray, batch_size=ROWS_PER_GROUP, progress=False, engine=embed_ray,
                       decode="pil_draft")
    assert (on_ray / "test.parquet").read_bytes() == (local / "test.parquet").read_bytes()
    with pytest.raises(EngineError, match="embed.decode 'torchvision' runs on the local engine only"):
        embed_image_splits(loaded, grouped, tmp_path / "tv", progress=False, engine=embed_ray, decode="torchvision")
    assert not (tmp_path / "tv").exists()


def test_other_batch_sizes_give_the_same_rows_within_float_rounding(local_ray, loaded, grouped, tmp_path):
    """Batches that span row groups differ between engines; CPU kernels pick their blocking by batch size, so a row's
    float32 rounding may differ in the last bits (as it does between the local engine's own batch sizes)."""
    embed_image_splits(loaded, grouped, tmp_path / "local", batch_size=7, num_workers=2, progress=False)
    embed_image_splits(loaded, grouped, tmp_path / "ray", batch_size=7, progress=False, engine=embed_ray)
    a, b = (read_features(tmp_path / name / "test.parquet", {}) for name in ("local", "ray"))
    assert b.table.equals(a.table) and b.fingerprint == a.fingerprint
    np.testing.assert_allclose(b.embeddings, a.embeddings, rtol=1e-5, atol=1e-6)


def test_corrupt_images_are_reported_exactly_as_the_local_engine_reports_them(local_ray, loaded, tmp_path):
    path = write_images(tmp_path / "test.parquet", 14, corrupt={1, 6, 13}, rows_per_group=3)
    errors = []
    for run in (lambda: embed_images(loaded, path, "shapes", "test", batch_size=3, num_workers=0, progress=False),
                lambda: embed_ray.embed_images(loaded, path, "shapes", "test", batch_size=3, progress=False)):
        with pytest.raises(CorruptImageError) as info:
            run()
        errors.append(str(info.value))
    assert errors[1] == errors[0]
    assert re.findall(r"'img-\d+'", errors[1]) == ["'img-001'", "'img-006'", "'img-013'"]


def test_skip_corrupt_keeps_the_same_rows_and_records_the_same_skipped_samples(local_ray, loaded, tmp_path):
    data = tmp_path / "bad"
    make_dataset(data, name="bad", per_class=5, splits=("test",), corrupt={"test": "test/004"})
    regroup(data, "test", 3)
    a = embed_image_splits(loaded, data, tmp_path / "local", batch_size=3, num_workers=0, skip_corrupt=True,
                           progress=False)
    b = embed_image_splits(loaded, data, tmp_path / "ray", batch_size=3, skip_corrupt=True, progress=False,
                           engine=embed_ray)
    assert b["splits"]["test"]["skipped_corrupt"] == a["splits"]["test"]["skipped_corrupt"] == ["test/004"]
    assert (tmp_path / "ray" / "test.parquet").read_bytes() == (tmp_path / "local" / "test.parquet").read_bytes()
    assert json.loads(pq.read_schema(tmp_path / "ray" / "test.parquet").metadata[b"vlbench.skipped_corrupt"]) == ["test/004"]


def test_a_model_actor_that_dies_mid_run_leaves_the_previous_features_intact(local_ray, loaded, grouped, tmp_path,
                                                                               monkeypatch):
    out = tmp_path / "features" / "tiny"
    embed_image_splits(loaded, grouped, out, batch_size=ROWS_PER_GROUP, num_workers=0, progress=False)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    monkeypatch.setenv(embed_ray.EXIT_AFTER_VARIABLE, "2")  # each actor's process exits at its 3rd batch
    monkeypatch.setenv(embed_ray.RETRIES_VARIABLE, "0")
    with pytest.raises(EngineError, match=r"dataset 'tiny' split 'test' \(.*test.parquet\): the Ray run failed "
                                         r"\(ActorDiedError: .*\); nothing was written"):
        embed_image_splits(loaded, grouped, out, batch_size=ROWS_PER_GROUP, progress=False, engine=embed_ray)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert [p.name for p in out.parent.iterdir()] == ["tiny"]  # no half-written temporary folder either
    fresh = tmp_path / "features" / "fresh"
    with pytest.raises(EngineError):
        embed_image_splits(loaded, grouped, fresh, batch_size=ROWS_PER_GROUP, progress=False, engine=embed_ray)
    assert not fresh.exists()


def test_a_dead_actor_is_restarted_and_the_run_gives_the_same_files(local_ray, loaded, grouped, tmp_path, monkeypatch):
    embed_image_splits(loaded, grouped, tmp_path / "local", batch_size=ROWS_PER_GROUP, num_workers=0, progress=False)
    monkeypatch.setenv(embed_ray.EXIT_AFTER_VARIABLE, "3")
    monkeypatch.setenv(embed_ray.RETRIES_VARIABLE, "10")
    embed_image_splits(loaded, grouped, tmp_path / "ray", batch_size=ROWS_PER_GROUP, progress=False, engine=embed_ray)
    assert (tmp_path / "ray" / "test.parquet").read_bytes() == (tmp_path / "local" / "test.parquet").read_bytes()


def test_text_sets_on_ray_are_the_local_engines_in_the_same_order(local_ray, loaded, grouped, tmp_path):
    texts = tmp_path / "texts"
    make_texts(grouped, texts, templates=[f"template {i}: a {{c}} thing." for i in range(40)])
    a = embed_text_sets(loaded, texts, tmp_path / "local")
    b = embed_text_sets(loaded, texts, tmp_path / "ray", engine=embed_ray)
    assert a == b and sum(a.values()) >= 120
    for name in a:
        x, y = (read_features(tmp_path / side / f"{name}.parquet", {}) for side in ("local", "ray"))
        assert y.table.equals(x.table) and y.fingerprint == x.fingerprint
        np.testing.assert_allclose(y.embeddings, x.embeddings, rtol=1e-5, atol=1e-6)


def test_an_unknown_engine_is_one_line_naming_the_choices(monkeypatch):
    monkeypatch.setenv("VLBENCH_ENGINE", "spark")
    with pytest.raises(EngineError, match=r"engine 'spark' \(--engine or \$VLBENCH_ENGINE\) is not one of \['local', 'ray'\]"):
        engine()
    assert engine("ray") is embed_ray


def test_an_unreachable_ray_address_fails_at_once_naming_it_and_what_to_check(monkeypatch):
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]  # nothing listens there once the socket is closed
    monkeypatch.setenv("VLBENCH_RAY_ADDRESS", f"127.0.0.1:{port}")
    with pytest.raises(EngineError, match=rf"^\$VLBENCH_RAY_ADDRESS=127.0.0.1:{port}: no Ray cluster answers at "
                                          rf"127.0.0.1:{port} \(Connection refused, within 5 s\); check that the "
                                          r"head node runs \(`ray status` on it\), that this is its GCS address"):
        embed_ray.connect()
    monkeypatch.setenv("VLBENCH_RAY_ADDRESS", f"ray://127.0.0.1:{port}")
    with pytest.raises(EngineError, match=rf"ray://127.0.0.1:{port}: no Ray cluster answers at 127.0.0.1:{port}"):
        embed_ray.connect()
    monkeypatch.setenv("VLBENCH_RAY_ADDRESS", "head")
    with pytest.raises(EngineError, match=r"^\$VLBENCH_RAY_ADDRESS=head: not a Ray address; use auto, host:port"):
        embed_ray.connect()


def test_the_local_engine_never_imports_ray():
    code = ("import sys; from vlbench.engines import engine; engine(); engine('local'); "
            "print('ray' in sys.modules)")
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip() == "False"


def test_switching_the_engine_leaves_dvc_status_clean_and_writes_the_same_outputs(local_ray, toy_model_cfg, tmp_path):
    """The embed stages with dvc.yaml's own commands: run locally, `dvc status` is clean with VLBENCH_ENGINE=ray, and
    `dvc repro -f` on Ray (joining this module's Ray by its address) records the same output hashes in dvc.lock."""
    import shutil

    import yaml

    from tests.pipeline_repo import ROOT, run

    project = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]
    params = ["model.slug", "model.arch", "model.pretrained", "model.precision"]
    (tmp_path / "data/models/toy").mkdir(parents=True)
    shutil.copy(toy_model_cfg["pretrained"], tmp_path / "data/models/toy/checkpoint.pt")
    model = {**toy_model_cfg, "pretrained": "data/models/toy/checkpoint.pt"}
    (tmp_path / "params.yaml").write_text(yaml.safe_dump({"model": model, "embed": {"pre_projection": False, "decode": "pil"}}))
    make_dataset(tmp_path / "data/prepared/tiny", splits=("test",))
    make_texts(tmp_path / "data/prepared/tiny", tmp_path / "data/texts/tiny")
    stages = {
        kind: {"cmd": project[kind]["do"]["cmd"].replace("${item}", "tiny"), "deps": [dep, model["pretrained"]],
               "params": params, "outs": [f"features/toy-random/tiny/{out}"]}
        for kind, dep, out in (("embed_images", "data/prepared/tiny/splits", "images"),
                               ("embed_texts", "data/texts/tiny", "text"))}
    assert all("engine" not in stage["cmd"] for stage in stages.values())
    (tmp_path / "dvc.yaml").write_text(yaml.safe_dump({"stages": stages}))
    base = {"PYTHONPATH": str(ROOT), "VLBENCH_ENGINE": "local"}
    on_ray = {**base, "VLBENCH_ENGINE": "ray", "VLBENCH_RAY_ADDRESS": local_ray}
    run(tmp_path, "dvc", "init", "--no-scm", "-q")
    assert '"engine": "vlbench.embed"' in run(tmp_path, "dvc", "repro", env=base).stdout
    lock = (tmp_path / "dvc.lock").read_text()
    written = {p: p.read_bytes() for p in (tmp_path / "features").rglob("*.parquet")}
    assert "up to date" in run(tmp_path, "dvc", "status", env=on_ray).stdout
    assert '"engine": "vlbench.embed_ray"' in run(tmp_path, "dvc", "repro", "--force", env=on_ray).stdout
    assert (tmp_path / "dvc.lock").read_text() == lock
    assert {p: p.read_bytes() for p in (tmp_path / "features").rglob("*.parquet")} == written
    assert "up to date" in run(tmp_path, "dvc", "status", env=base).stdout


def test_the_accelerator_split_uint8_tasks_and_finish_in_the_actor_gives_the_same_bits(local_ray, loaded, grouped):
    """On a GPU the decode tasks stop at uint8 and the actor converts and normalises (`split_preprocess`'s `finish`,
    shipped with the model): the same path, forced here on the CPU, gives the local engine's bits."""
    path = split_path(grouped, "test")
    a, ka = embed_images(loaded, path, "tiny", "test", batch_size=ROWS_PER_GROUP, num_workers=0, progress=False,
                         normalise_in_workers=False)
    b, kb = embed_ray.embed_images(loaded, path, "tiny", "test", batch_size=ROWS_PER_GROUP, progress=False,
                                   normalise_in_workers=False)
    assert np.array_equal(kb, ka) and np.array_equal(b, a)


def test_the_drivers_model_carries_the_actors_device_and_precision_in_its_fingerprint(toy_model_cfg):
    """A driver without a GPU stamps what GPU actors will do: bf16 autocast on CUDA, as a local CUDA run would."""
    cfg = {**toy_model_cfg, "precision": "amp_bf16"}
    on_gpu = embed_ray.load_model(cfg, device="cuda")
    on_cpu = embed_ray.load_model(cfg, device="cpu")
    assert on_gpu.device.type == "cuda" and on_gpu.autocast_dtype == torch.bfloat16
    assert on_gpu.fingerprint == {**on_cpu.fingerprint, "precision": "amp_bf16"}
    assert on_cpu.fingerprint == load_model(cfg, device="cpu").fingerprint and on_cpu.fingerprint["precision"] == "fp32"
    assert next(on_gpu.model.parameters()).device.type == "cpu"  # the actors move it; the driver never needs a GPU


def test_batches_arriving_in_any_order_are_put_back_in_row_order(tmp_path):
    """Ray Data does not keep order: the driver places each embedding by the row index its batch carries."""
    from vlbench.embed import SplitRows

    rng = np.random.default_rng(0)
    emb = rng.normal(size=(10, 3)).astype(np.float32)
    reasons = ["" if r != 7 else "truncated" for r in range(10)]
    batches = [{"row": np.array(rows), "sample_id": np.array([f"s{r}" for r in rows], dtype=object),
                "reason": np.array([reasons[r] for r in rows], dtype=object),
                "embedding": np.array([b"" if reasons[r] else embed_ray.to_bytes(emb[r]) for r in rows], dtype=object)}
               for rows in ([8, 9], [4, 5, 6, 7], [0, 1, 2, 3])]
    rows = SplitRows(10)
    for batch in batches:
        embed_ray._gather(rows, batch)
    out, kept = rows.result("d", "test", tmp_path / "test.parquet", skip_corrupt=True)
    assert kept.tolist() == [0, 1, 2, 3, 4, 5, 6, 8, 9] and np.array_equal(out, emb[kept])
    with pytest.raises(CorruptImageError, match=r"sample 's7': cannot decode image \(truncated\)"):
        rows.result("d", "test", tmp_path / "test.parquet", skip_corrupt=False)
