"""`vlbench plan` on a real DVC copy of this repository (the smoke suite): DVC's own status for the overrides,
counts from the catalogue, caches, the warm-up estimate; nothing run, nothing written."""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from tests.pipeline_repo import make_repo, run
from vlbench.cli import main as cli
from vlbench.compose import compose
from vlbench.dataset_entries import dataset_entry
from vlbench.datasets.registry import describe
from vlbench.models import rates
from vlbench.plan import estimate, make_plan, summary

DVC = (sys.executable, "-m", "dvc")
ROOT = Path(__file__).resolve().parent.parent
SPLITS = {"shapes": 48 + 24 + 36, "hierarchy": 30}  # tests/pipeline_repo.py's smoke suite


@pytest.fixture(autouse=True)
def rate_cache(tmp_path, monkeypatch) -> Path:
    """The measured rates' cache of this test alone (never the user's ~/.cache/vlbench)."""
    monkeypatch.setenv("VLBENCH_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache" / rates.CACHE_FILE


@pytest.fixture(scope="module")
def repo(tmp_path_factory) -> Path:
    """The smoke copy with prepare@hierarchy run (its other stages never run for this suite)."""
    repo = make_repo(tmp_path_factory.mktemp("plan") / "repo")
    run(repo, *DVC, "repro", "prepare@hierarchy")
    return repo


def snapshot(repo: Path) -> dict[str, str]:
    """Every file of the copy with its hash, but git's and DVC's scratch folder (.dvc/tmp: `dvc status` locks there) and
    the listings of folder dependencies DVC keeps in its cache (`.dir` objects: `dvc status` writes them as it hashes a
    folder it has not seen, e.g. data/prepared/<d>)."""
    skip = (repo / ".git", repo / ".dvc/tmp")
    return {str(p.relative_to(repo)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(repo.rglob("*"))
            if p.is_file() and not any(p.is_relative_to(s) for s in skip)
            and not (p.is_relative_to(repo / ".dvc/cache") and p.suffix == ".dir")}


def dvc_status(repo: Path) -> set[str]:
    return set(json.loads(run(repo, *DVC, "status", "--json").stdout))


def stage(plan: dict, name: str) -> dict:
    return next(row for row in plan["stages"] if row["name"] == name)


def would_run(plan: dict) -> set[str]:
    return {row["name"] for row in plan["stages"] if row["status"] != "up to date"}


def test_plan_lists_what_dvc_status_lists_in_dag_order_with_split_sizes_and_writes_nothing(repo):
    before = snapshot(repo)
    proc = run(repo, sys.executable, "-m", "vlbench.cli", "plan", "--json", "--no-warmup")
    plan = json.loads(proc.stdout)
    assert snapshot(repo) == before
    assert set(plan) >= {"model", "suite", "stages", "images", "texts", "manual_downloads", "estimate"}
    assert (plan["model"], plan["suite"]) == ("toy-smoke", "smoke")
    assert would_run(plan) == dvc_status(repo) and "prepare@hierarchy" not in would_run(plan)
    names = [row["name"] for row in plan["stages"]]
    for first, then in [("prepare@shapes", "texts@shapes"), ("texts@shapes", "embed_texts@shapes"),
                        ("pretrain@toy-smoke", "embed_images@shapes"), ("embed_images@shapes", "linear_probe@shapes")]:
        assert names.index(first) < names.index(then)
    assert names[-1] == "report"
    rows = {row["name"]: row for row in plan["stages"]}
    assert rows["pretrain@toy-smoke"]["status"] == "never run"  # the copied dvc.lock is the demo suite's
    assert rows["embed_images@shapes"]["status"] == "stale"
    assert {d: rows[f"embed_images@{d}"]["images"] for d in SPLITS} == SPLITS
    assert plan["images"] == sum(SPLITS.values())
    assert rows["embed_texts@shapes"]["texts"] is None and rows["zeroshot@shapes"]["images"] is None
    assert plan["estimate"] == {"seconds": None, "device": "cpu", "images_per_second": None, "rate": None,
                                "reason": "warm-up skipped (--no-warmup)"}
    assert summary(plan, "vlbench-toy") == (
        "toy-smoke (vlbench-toy) on suite smoke: 138 images, 0 texts (+ 2 embed stages whose inputs are not prepared "
        "yet), time unknown, 0 datasets need manual files")


def test_overrides_give_the_stages_dvc_status_gives_once_they_are_composed(repo, monkeypatch):
    monkeypatch.chdir(repo)
    plan = make_plan(compose(["model=toy-wide-smoke"], repo / "conf"), warmup=False)
    assert "pretrain@toy-wide-smoke" in would_run(plan) and plan["model"] == "toy-wide-smoke"
    params = (repo / "params.yaml").read_text()
    try:
        run(repo, sys.executable, "-m", "vlbench.cli", "compose", "model=toy-wide-smoke")
        assert would_run(plan) == dvc_status(repo)
    finally:
        (repo / "params.yaml").write_text(params)


def test_cached_locally_and_on_a_remote_as_dvc_sees_them(repo, tmp_path, monkeypatch):
    monkeypatch.chdir(repo)
    params = compose([], repo / "conf")
    run(repo, *DVC, "remote", "add", "-d", "store", str(tmp_path / "store"))
    try:
        row = stage(make_plan(params, warmup=False), "prepare@hierarchy")
        assert row == {"name": "prepare@hierarchy", "status": "up to date", "cached": {"local": True, "remote": False},
                       "after": [], "images": None, "texts": None}
        run(repo, *DVC, "push", "prepare@hierarchy")
        shutil.rmtree(repo / "data/prepared/hierarchy")  # stale for `dvc status`, but `dvc repro` restores it
        plan = make_plan(params, warmup=False)
        assert stage(plan, "prepare@hierarchy")["status"] == "stale" and "prepare@hierarchy" in dvc_status(repo)
        assert stage(plan, "prepare@hierarchy")["cached"] == {"local": True, "remote": True}
        assert plan["remote"] == {"name": "store", "reason": None}
        # prepare@shapes: never run with these inputs, so no outputs to look for on the remote
        assert stage(plan, "prepare@shapes")["cached"] == {"local": False, "remote": None}
        run(repo, *DVC, "remote", "add", "-d", "dead", "s3://bucket/cache")
        run(repo, *DVC, "remote", "modify", "dead", "endpointurl", "http://127.0.0.1:9")
        monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", "x")
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "y")
        plan = make_plan(params, warmup=False)
        assert stage(plan, "prepare@hierarchy")["cached"] == {"local": True, "remote": None}
        assert plan["remote"]["reason"].startswith("remote 'dead' cannot be reached: ")
    finally:
        run(repo, *DVC, "checkout", "prepare@hierarchy")
        run(repo, "git", "checkout", ".dvc/config")


def test_manual_downloads_and_image_counts_come_from_the_catalogue_without_download(repo, monkeypatch):
    monkeypatch.chdir(repo)
    params = compose(["suite=granularity"], repo / "conf")
    plan = make_plan(params, warmup=False)
    assert plan["manual_downloads"] == ["imagenet-1k", "tiered-imagenet"]
    for dataset in params["suite"]["embed"]:
        row = next(r for r in plan["stages"] if r["name"] == f"embed_images@{dataset}")
        splits = describe(dataset, dataset_entry(params, dataset))["splits"]
        assert row["images"] == (sum(splits.values()) if splits else None)


def test_the_datacomp_suite_counts_the_images_of_each_task_before_any_download():
    """`vlbench plan -S suite=datacomp` lists each task's images from its entry (DataComp's tasklist.yml sizes), Flickr
    and MSCOCO included (1,000 and 5,000: their entries had no size); only WinoGAViL's candidate images are known
    after prepare (its 3,563 are instances, 5 to 12 candidate images each)."""
    from tools.datacomp_conf import TABLE, slug
    from vlbench.plan import image_count

    params = compose(["suite=datacomp"], ROOT / "conf")
    counts = {d: image_count(params, d) for d in params["suite"]["embed"]}
    assert counts == {slug(k): None if k == "misc/winogavil" else size for k, _, size, *_ in TABLE}
    assert (counts["wds-flickr30k"], counts["wds-mscoco"]) == (1000, 5000)
    assert sum(filter(None, counts.values())) == 693_806


def test_warmup_of_the_toy_model_on_cpu_gives_a_positive_rate_and_a_time(repo, monkeypatch):
    monkeypatch.chdir(repo)
    model = compose([], repo / "conf")["model"]
    est = estimate(model, images=30, datasets=["hierarchy"], device="cpu", warmup=True)
    assert est["device"] == "cpu" and est["images_per_second"] > 0
    assert est["seconds"] == pytest.approx(30 / est["images_per_second"])
    assert "decoding" in est["reason"] and "from 30 prepared images" in est["reason"]
    assert estimate(model, images=0, datasets=[], device="cpu", warmup=True)["seconds"] == 0.0


@pytest.mark.parametrize("args, message", [
    (["--suite", "nosuch"], "unknown suite 'nosuch'"),
    (["--model", "nosuch"], "unknown model 'nosuch'"),
    (["nosuch=1"], "Could not override 'nosuch'"),
    (["-S", "suite.nosuch=1"], "Could not override 'suite.nosuch'"),
])
def test_unknown_suite_model_or_key_fails_with_one_clear_line(args, message):
    result = CliRunner().invoke(cli, ["--conf", str(ROOT / "conf"), "plan", "--no-warmup", *args])
    assert result.exit_code == 1 and message in result.output
    assert len(result.output.strip().splitlines()) == 1


def test_a_running_dvc_command_is_named_not_waited_for(repo, monkeypatch):
    from dvc.repo import Repo

    from vlbench.plan import PlanError

    monkeypatch.chdir(repo)
    params = compose([], repo / "conf")
    with Repo(str(repo)) as other, other.lock:  # what `dvc repro` holds while it runs
        with pytest.raises(PlanError, match=r"locked by another DVC command \(a `dvc repro` running\?\)"):
            make_plan(params, warmup=False)


@pytest.fixture(scope="module")
def ran(smoke_run, tmp_path_factory) -> Path:
    """A copy of the session's smoke run (tests/conftest.py): zeroshot@hierarchy and everything it needs run (the whole
    smoke suite is), stages up to date below a change."""
    return smoke_run(tmp_path_factory.mktemp("plan-ran") / "repo")


def test_a_changed_upstream_param_lists_the_stages_downstream_of_it(ran, monkeypatch):
    """embed.pre_projection is a param of embed_images@ only: `dvc status` lists embed_images@hierarchy alone, but
    `dvc repro` would rerun zeroshot@hierarchy (and report) on its new features: the plan lists them, after it."""
    monkeypatch.chdir(ran)
    assert "zeroshot@hierarchy" not in dvc_status(ran)
    plan = make_plan(compose(["embed.pre_projection=false"], ran / "conf"), warmup=False)
    rows = {row["name"]: row for row in plan["stages"]}
    assert rows["embed_images@hierarchy"]["status"] == "stale" and rows["texts@hierarchy"]["status"] == "up to date"
    assert rows["zeroshot@hierarchy"]["status"] == "downstream"
    assert rows["zeroshot@hierarchy"]["after"] == ["embed_images@hierarchy"]
    assert rows["zeroshot@hierarchy"]["cached"] == {"local": False, "remote": None}
    assert rows["report"]["status"] != "up to date" and "zeroshot@hierarchy" in would_run(plan)
    result = CliRunner().invoke(cli, ["plan", "--no-warmup", "-S", "embed.pre_projection=false"])
    assert "downstream zeroshot@hierarchy  (after embed_images@hierarchy)" in result.output


def test_a_planned_held_out_search_is_counted_through_dvc(repo, monkeypatch):
    """suite.heldout names a dataset: DVC lists heldout@ as never run and the plan counts its coarse grid's units
    (the default search: 3 x 3 points per text-head method, 3 x 3 x 3 per linear-head one, x 50 tasks)."""
    from vlbench.finetune import fewtrans_episodic as fft

    monkeypatch.chdir(repo)
    params = compose(["suite.heldout=[hierarchy]"], repo / "conf")
    plan = make_plan(params, warmup=False)
    assert stage(plan, "heldout@hierarchy")["status"] == "never run"
    (search,) = plan["finetune"]["stages"]
    points = {m: 9 if fft.TUNINGS[m].head == "text" else 27 for m in fft.DEFAULTS["methods"]}
    assert search["name"] == "heldout@hierarchy" and search["tasks"] == 50
    assert {m: row["units"] for m, row in search["methods"].items()} == {m: 50 * p for m, p in points.items()}
    assert plan["finetune"]["estimate"]["seconds"] is None
    assert make_plan(compose([], repo / "conf"), warmup=False)["finetune"] == {"stages": [], "estimate": None}


# ----------------------------------------------------------------------------------------------------------------
# The model's rate: measured in a capped child, cached, or estimated from FLOPs (vlbench/models/rates.py)

TOY = compose([], ROOT / "conf")["model"]
VIT_B32 = {"slug": "vit-b32", "arch": "ViT-B-32-quickgelu", "pretrained": "random", "precision": "fp32"}


def no_child(*args, **kwargs):
    raise AssertionError(f"a child process was started: {args}")


def test_a_measured_rate_is_cached_and_the_next_plan_starts_no_child(rate_cache, monkeypatch):
    first = estimate(TOY, 1000, [], "cpu", True, cap_s=600)
    assert first["rate"] == "measured" and first["images_per_second"] > 0
    assert first["reason"].startswith(f"model {first['images_per_second']:.3g} img/s measured on random input")
    (key, entry), = json.loads(rate_cache.read_text()).items()
    assert entry["value"] == first["images_per_second"]
    assert key.startswith("vlbench-toy | fp32 | cpu (") and key.endswith(" | batch 256")
    monkeypatch.setattr(rates.subprocess, "run", no_child)
    second = estimate(TOY, 1000, [], "cpu", True)
    assert second["rate"] == "cached" and second["images_per_second"] == first["images_per_second"]
    assert second["seconds"] == pytest.approx(1000 / first["images_per_second"]) and str(rate_cache) in second["reason"]
    plan = {"model": "toy", "suite": "demo", "images": 1000, "texts": 0, "manual_downloads": [], "stages": [],
            "estimate": second}
    assert "on this CPU (model rate cached)" in summary(plan, "vlbench-toy")


def test_flops_of_a_vit_are_counted_as_an_independent_count_gives():
    """ViT-B/32 at 224 px: 49 patches + the class token, width 768, 12 layers, MLP 3072, projection to 512."""
    tokens, width, layers = 50, 768, 12
    per_layer = 2 * tokens * width * 3 * width + 2 * 2 * tokens * tokens * width + 2 * tokens * width * width \
        + 2 * 2 * tokens * width * 4 * width
    assert rates.architecture(VIT_B32).flops == 2 * 49 * 3 * 32 * 32 * width + layers * per_layer + 2 * width * 512


@pytest.mark.parametrize("caps, over", [({"cap_s": 1e-6}, "cap of 1e-06 s"), ({"cap_bytes": 1024}, "9.54e-07 GiB")])
def test_a_measurement_that_would_pass_the_cap_is_estimated_from_flops_and_says_so(rate_cache, monkeypatch, caps, over):
    monkeypatch.setattr(rates.subprocess, "run", no_child)
    est = estimate(VIT_B32, 1000, [], "cpu", True, **caps)
    assert est["rate"] == "estimated from FLOPs" and over in est["reason"]
    assert "measuring would take ~" in est["reason"] and "8.82 GFLOP per image" in est["reason"]
    matmul = float(est["reason"].split("matrix-product rate of ")[1].split(" GFLOP/s")[0]) * 1e9
    assert est["images_per_second"] == pytest.approx(matmul / 8.817623040e9, rel=5e-3)
    assert est["seconds"] == pytest.approx(1000 / est["images_per_second"])
    assert not rate_cache.exists()  # an estimate is never cached


@pytest.mark.parametrize("caps, why", [
    ({"cap_s": 0.2}, "the warm-up did not finish within its cap of 0.2 s"),
    ({"cap_bytes": 70_000_000}, "the warm-up ran out of its memory cap of 0.0652 GiB ("),
])
def test_a_child_that_passes_its_cap_is_stopped_and_the_rate_estimated_from_flops(rate_cache, monkeypatch, caps, why):
    """The caps hold in the child: the prediction is made to pass (an immense matrix-product rate), the toy's
    imports alone take longer than 0.2 s, and its build and batches need more than 70 MB."""
    monkeypatch.setattr(rates, "matmul_flops", lambda device, precision: 1e18)
    est = estimate(TOY, 1000, [], "cpu", True, **{"cap_s": 600, **caps})
    assert est["rate"] == "estimated from FLOPs" and why in est["reason"]
    assert not rate_cache.exists()


def test_a_cache_that_cannot_be_written_costs_the_next_plan_a_measurement_only(tmp_path, monkeypatch):
    (tmp_path / "a-file").write_text("")
    monkeypatch.setenv("VLBENCH_CACHE", str(tmp_path / "a-file" / "cache"))
    est = estimate(TOY, 1000, [], "cpu", True, cap_s=600)
    assert est["rate"] == "measured" and "(not cached: " in est["reason"] and est["images_per_second"] > 0
