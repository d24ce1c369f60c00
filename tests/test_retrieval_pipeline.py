"""The retrieval analysis in a pipeline: a temporary copy of the repository whose suite prepares a miniature
coco-karpathy-5k (caption_datasets.zip and val2014.zip served from 127.0.0.1), embeds it with a few-step toy model,
runs retrieval@coco-karpathy-5k and the report, and leaves `dvc status report` clean. (The demo's `captions` with its
raw-caption text set: `make repro`, and tests/test_zeroshot_retrieval.py.)"""

from __future__ import annotations

import json
import sys

import numpy as np
import pyarrow.parquet as pq
import pytest
import yaml

from tests.archives import CONF, sha256
from tests.http_server import serve
from tests.test_karpathy import write_splits, write_val2014

DVC = (sys.executable, "-m", "dvc")


@pytest.fixture(scope="module")
def repo(smoke_run, tmp_path_factory):
    from tests.pipeline_repo import read_suite, run, write_suite

    base = tmp_path_factory.mktemp("retrieval")
    www = base / "www"
    www.mkdir()
    write_splits(www)
    write_val2014(www)
    repo = smoke_run(base / "repo")  # the session's smoke run (tests/conftest.py): its toy model is reused
    with serve(www) as base_url:
        coco = yaml.safe_load((CONF / "coco-karpathy-5k.yaml").read_text())
        coco["prepare"]["annotations"]["urls"] = [f"{base_url}/caption_datasets.zip"]
        coco["prepare"]["images"].update(urls=[f"{base_url}/val2014.zip"], sha256=sha256(www / "val2014.zip"))
        coco["prepare"]["splits"] = {"test": 3}
        suite = read_suite(repo, "smoke")
        suite["datasets"] = {"coco-karpathy-5k": coco}
        suite.update(embed=["coco-karpathy-5k"], zeroshot=[], linear_probe=[], retrieval=["coco-karpathy-5k"])
        write_suite(repo, suite)
        run(repo, sys.executable, "-m", "vlbench.cli", "compose")
        run(repo, "git", "add", "-A")
        run(repo, "git", "commit", "-qm", "retrieval suite")
        run(repo, *DVC, "repro", "report", env={"VLBENCH_DOWNLOADS": str(base / "cache")})
    return repo


def test_results_ranks_metrics_and_chart(repo):
    coco = json.loads((repo / "reports/retrieval/coco-karpathy-5k.json").read_text())
    assert coco["counts"]["images"] == 3 and coco["counts"]["captions"] == 18
    assert coco["params"]["text_set"] == "captions_prompted" and coco["details"]["example_text"].startswith("a photo of ")
    assert coco["details"]["captions_per_image"] == {"5": 1, "6": 1, "7": 1}
    for direction in ("i2t", "t2i"):
        ranks = np.array(pq.read_table(repo / f"reports/retrieval/coco-karpathy-5k.{direction}_ranks.parquet")
                         .column("rank").to_pylist())
        assert len(ranks) == {"i2t": 3, "t2i": 18}[direction]
        for k in (1, 5, 10):
            assert coco["metrics"][f"{direction}_r{k}"] == pytest.approx(np.mean(ranks <= k))
            assert coco["intervals"][f"{direction}_r{k}"]["method"] == "bootstrap"
    prompted = pq.read_table(repo / "features/toy-smoke/coco-karpathy-5k/text/captions_prompted.parquet")
    assert prompted.num_rows == 18
    metrics = json.loads((repo / "reports/metrics.json").read_text())
    assert metrics["retrieval"] == {"coco-karpathy-5k": coco["metrics"]}
    assert (repo / "reports/plots/retrieval.svg").is_file()
    assert "Zero-shot image-text retrieval" in (repo / "reports/index.html").read_text()


def test_nothing_is_stale_after_the_run(repo):
    from tests.pipeline_repo import run

    status = run(repo, *DVC, "status", "--json", "report").stdout
    assert json.loads(status) == {}
