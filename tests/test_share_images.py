"""Datasets of the same images share one image embedding (suite.share_images): a real DVC run of two manifests over
one image folder with different labels, and the suite rules."""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import yaml

from tests.conftest import COLORS, png
from tests.pipeline_repo import run
from vlbench.features import read_features
from vlbench.params import ParamsError, check_suite

DVC = (sys.executable, "-m", "dvc")
ROOT = Path(__file__).resolve().parent.parent
IMAGES = 16  # 10 train, 6 test
ENTRY = """input: pairs
prepare: {{source: manifest, path: '${{..input}}/{name}.csv', split_column: split, classnames: {classes}}}
texts: {{templates: ['a photo of {{c}}.']}}
"""
SUITE = {"slug": "pairs", "datasets": {"pair_a": "pairs", "pair_b": "pairs"}, "embed": ["pair_a", "pair_b"],
         "embed_images": ["pair_a"], "share_images": {"pair_b": "pair_a"}, "zeroshot": ["pair_b"],
         "linear_probe": ["pair_b"]}


def label_a(k: int) -> int:
    return k % 2  # the colour: red, green


def label_b(k: int) -> int:
    return (k // 2) % 3  # another labelling of the same images


def manifest(name: str, label, image=lambda k: f"img/{k}.png") -> str:
    rows = [f"{image(k)},{label(k)},{'train' if k < 10 else 'test'}" for k in range(IMAGES)]
    return "\n".join(["path,label,split", *rows]) + "\n"


@pytest.fixture(scope="module")
def pairs(smoke_run, tmp_path_factory):
    repo = smoke_run(tmp_path_factory.mktemp("share") / "repo")  # tests/conftest.py: its toy model is reused
    (repo / "pairs/img").mkdir(parents=True)
    for k in range(IMAGES):
        (repo / "pairs/img" / f"{k}.png").write_bytes(png(list(COLORS.values())[label_a(k)], seed=k))
    (repo / "pairs/pair_a.csv").write_text(manifest("pair_a", label_a))
    (repo / "pairs/pair_b.csv").write_text(manifest("pair_b", label_b))
    (repo / "conf/dataset/pair_a.yaml").write_text(ENTRY.format(name="pair_a", classes="[red, green]"))
    (repo / "conf/dataset/pair_b.yaml").write_text(ENTRY.format(name="pair_b", classes="[one, two, three]"))
    (repo / "conf/suite/pairs.yaml").write_text(yaml.safe_dump(SUITE))
    run(repo, sys.executable, "-m", "vlbench.cli", "compose", "suite=pairs")
    run(repo, *DVC, "repro")
    return repo


def lock(repo: Path) -> dict:
    return yaml.safe_load((repo / "dvc.lock").read_text())["stages"]


def features(repo: Path, dataset: str, split: str, sub: str = ""):
    meta = json.loads((repo / "data/prepared" / dataset / "classes.json").read_text())
    path = repo / "features/toy-smoke" / dataset / "images" / sub / f"{split}.parquet"
    return read_features(path, {"dataset": dataset, "dataset_version": meta["version"]})


def rows_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    for row in pq.read_table(path, columns=["sample_id", "image"]).to_pylist():
        for part in (row["sample_id"].encode(), row["image"]):
            digest.update(len(part).to_bytes(8, "little") + part)
    return digest.hexdigest()


def test_the_model_embeds_the_shared_images_once(pairs):
    stages = lock(pairs)
    assert "embed_images@pair_a" in stages and "embed_images@pair_b" not in stages
    assert {"share_images@pair_b", "embed_texts@pair_b", "zeroshot@pair_b", "linear_probe@pair_b"} <= set(stages)
    deps = {d["path"] for d in stages["share_images@pair_b"]["deps"]}
    assert {"features/toy-smoke/pair_a/images", "data/prepared/pair_a/splits", "data/prepared/pair_b/splits"} <= deps
    assert json.loads(run(pairs, *DVC, "status", "--json").stdout) == {}


@pytest.mark.parametrize("sub", ["", "pre_projection"])
@pytest.mark.parametrize("split", ["train", "test"])
def test_shared_features_are_the_sources_rows_with_their_own_labels(pairs, split, sub):
    a, b = features(pairs, "pair_a", split, sub), features(pairs, "pair_b", split, sub)
    np.testing.assert_array_equal(b.embeddings, a.embeddings)
    k = [int(Path(s).stem) for s in b.table.column("sample_id").to_pylist()]
    assert k == list(range(10) if split == "train" else range(10, 16))
    assert b.table.column("label").to_pylist() == [label_b(i) for i in k]
    assert a.table.column("label").to_pylist() == [label_a(i) for i in k]
    source = json.loads((pairs / "data/prepared/pair_a/classes.json").read_text())["version"]
    digest = rows_sha256(pairs / f"data/prepared/pair_a/splits/{split}.parquet")
    assert b.fingerprint["images_of"] == {"dataset": "pair_a", "dataset_version": source, "images_sha256": digest}
    assert {k: v for k, v in b.fingerprint.items() if k not in ("dataset", "dataset_version", "images_of")} == \
           {k: v for k, v in a.fingerprint.items() if k not in ("dataset", "dataset_version")}


def test_the_analyses_of_the_sharing_dataset_score_its_own_labels(pairs):
    probe = json.loads((pairs / "reports/linear_probe/pair_b.json").read_text())
    assert probe["dataset"] == "pair_b" and probe["counts"]["classes"] == 3
    assert probe["fingerprint"]["images_of"]["dataset"] == "pair_a"
    predictions = pq.read_table(pairs / "reports/zeroshot/pair_b.predictions.parquet").to_pylist()
    assert [r["label"] for r in predictions] == [label_b(int(Path(r["sample_id"]).stem)) for r in predictions]
    assert {len(r["logits"]) for r in predictions} == {3}
    assert {r["predicted_name"] for r in predictions} <= {"one", "two", "three"}


def test_new_labels_reshare_without_embedding_again(pairs):
    embedded = lock(pairs)["embed_images@pair_a"]
    (pairs / "pairs/pair_b.csv").write_text(manifest("pair_b", lambda k: (k + 1) % 3))
    run(pairs, *DVC, "repro")
    assert lock(pairs)["embed_images@pair_a"] == embedded
    b = features(pairs, "pair_b", "test")
    assert b.table.column("label").to_pylist() == [(k + 1) % 3 for k in range(10, 16)]


def test_different_images_are_refused_naming_both_datasets(pairs):
    (pairs / "pairs/img/copy.png").write_bytes(png(COLORS["blue"], seed=99))
    other = manifest("pair_b", label_b, lambda k: "img/copy.png" if k == 12 else f"img/{k}.png")
    (pairs / "pairs/pair_b.csv").write_text(other)
    proc = run(pairs, *DVC, "repro", "share_images@pair_b", check=False)
    assert proc.returncode != 0
    message = "error: datasets 'pair_b' and 'pair_a' cannot share image features: split 'test' differs"
    assert message in proc.stderr + proc.stdout


def suite(**changes) -> dict:
    return {**SUITE, **changes}


@pytest.mark.parametrize("changes, message", [
    ({"embed_images": ["pair_a", "pair_b"]}, "['pair_b'] are in both embed_images and share_images"),
    ({"embed_images": ["pair_b"], "share_images": {"pair_a": "pair_b"}, "embed": ["pair_b"]},
     "['pair_a'] are keys of share_images but not in embed"),
    ({"share_images": {}}, "['pair_b'] are in embed but neither in embed_images nor a key of share_images"),
    ({"share_images": {"pair_b": "pair_c"}}, "share_images lists dataset 'pair_c', which is not among"),
    ({"embed_images": [], "share_images": {"pair_b": "pair_a"}, "embed": ["pair_b"]},
     "share_images.pair_b is 'pair_a', whose images are not embedded"),
])
def test_suite_rules_for_shared_images(changes, message):
    with pytest.raises(ParamsError, match="suite 'pairs': ") as err:
        check_suite(suite(**changes), ROOT / "conf")
    assert message in str(err.value)


def test_a_suite_without_sharing_embeds_every_dataset():
    from vlbench.compose import compose

    params = compose([], ROOT / "conf")
    assert params["suite"]["embed_images"] == params["suite"]["embed"] and params["suite"]["share_images"] == {}


def test_vtab_embeds_each_pair_of_tasks_once():
    from vlbench.compose import compose

    suite = compose(["suite=vtab"], ROOT / "conf")["suite"]
    assert suite["share_images"] == {"vtab-clevr_distance": "vtab-clevr_count",
                                     "vtab-dsprites_orientation": "vtab-dsprites_location",
                                     "vtab-smallnorb_elevation": "vtab-smallnorb_azimuth"}
    assert suite["embed_images"] == [d for d in suite["embed"] if d not in suite["share_images"]]
    assert len(suite["embed_images"]) == 16


def test_dvc_composes_embed_images_from_an_overridden_embed(tmp_path):
    from dvc.utils.hydra import compose_and_dump

    overrides = ["suite.embed=[shapes,colors]"]
    compose_and_dump(tmp_path / "params.yaml", str(ROOT / "conf"), None, "config", str(tmp_path), overrides)
    suite = yaml.safe_load((tmp_path / "params.yaml").read_text())["suite"]
    assert suite["embed_images"] == ["shapes", "colors"] and suite["share_images"] == {}


def test_the_digest_covers_sample_ids_images_and_their_order(tmp_path):
    import pyarrow as pa

    from vlbench.share import images_digest

    def digest(ids, images):
        path = tmp_path / f"{len(list(tmp_path.iterdir()))}.parquet"
        pq.write_table(pa.table({"sample_id": ids, "image": pa.array(images, pa.binary())}), path)
        return images_digest(path)

    base = digest(["a", "b"], [b"x", b"y"])
    assert base == rows_sha256(tmp_path / "0.parquet") == digest(["a", "b"], [b"x", b"y"])
    assert len({base, digest(["a", "c"], [b"x", b"y"]), digest(["a", "b"], [b"x", b"z"]),
                digest(["b", "a"], [b"y", b"x"]), digest(["a", "b"], [b"xy", b""])}) == 5
