"""A team's shared DVC remote, tested for real: an S3-compatible server (moto's, on 127.0.0.1) and git remotes on disk.

Member A runs the smoke pipeline and pushes; member B clones and pulls instead of recomputing; experiments travel
with `dvc exp push/pull`; a change downstream of the embedding reuses the features A embedded. Credentials come from
the environment of the dvc subprocesses only (dummy values), never from the repository's config.

Assertions look at stage names by prefix (`embed`) and at `reports/metrics.json`, not at feature file paths.
"""

from __future__ import annotations

import json
import logging
import shutil
import sys
from pathlib import Path

import pytest

from tests.pipeline_repo import add_all, make_repo, run

boto3 = pytest.importorskip("boto3")
pytest.importorskip("dvc_s3", reason="DVC's S3 support: pip install dvc-s3")
moto_server = pytest.importorskip("moto.server", reason="pip install 'moto[server]'")

BUCKET = "vlbench-team"
PREFIX = "cache"  # the remote is s3://BUCKET/PREFIX
EXP = "wide"
DVC = (sys.executable, "-m", "dvc")


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    """moto's S3 server on a free port of 127.0.0.1 (port 0: the OS picks it), with one empty bucket."""
    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # not one line per request
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    missing = str(tmp_path_factory.mktemp("aws") / "none")  # no ~/.aws of whoever runs the tests
    env = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
           "AWS_CONFIG_FILE": missing, "AWS_SHARED_CREDENTIALS_FILE": missing, "DVC_NO_ANALYTICS": "1"}
    client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                          aws_access_key_id="testing", aws_secret_access_key="testing")
    client.create_bucket(Bucket=BUCKET)
    try:
        with pytest.MonkeyPatch.context() as mp:  # the subprocesses inherit os.environ: no profile or endpoint of ours
            for name in ("AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL",
                         "AWS_ENDPOINT_URL_S3", "AWS_REGION"):
                mp.delenv(name, raising=False)
            yield {"endpoint": endpoint, "client": client, "env": env}
    finally:
        server.stop()


def bucket_keys(s3) -> set[str]:
    pages = s3["client"].get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=f"{PREFIX}/")
    return {obj["Key"] for page in pages for obj in page.get("Contents", [])}


def object_key(md5: str) -> str:
    """Where DVC 3 stores an object in a remote: files/md5/<first 2 hex>/<rest> (a directory's listing ends in .dir)."""
    return f"{PREFIX}/files/md5/{md5[:2]}/{md5[2:]}"


def locked_outs(repo: Path, prefix: str = "", cached: bool = True) -> dict[str, str]:
    """{out path: md5} of the cached outputs (or, `cached=False`, all outputs, `cache: false` metrics included) of
    the pipeline's current stages whose name starts with `prefix`. Asked of DVC itself: dvc.lock also keeps entries
    of stages the params no longer generate (here the committed demo suite's, whose reports are in git too), and
    only dvc.yaml says which outputs are cached."""
    from dvc.repo import Repo

    with Repo(str(repo)) as dvc_repo:
        outs = {out.def_path: out.hash_info.value for stage in dvc_repo.index.stages if stage.name.startswith(prefix)
                for out in stage.outs if out.use_cache or not cached}
    assert outs and all(outs.values()), f"no locked, cached output of a stage named {prefix}*: {outs}"
    return outs


def embed_outs(repo: Path) -> dict[str, str]:
    return locked_outs(repo, "embed")


def assert_in_bucket(s3, outs: dict[str, str]) -> None:
    """Every out is in the bucket, and for a directory so is each file its listing names."""
    keys = bucket_keys(s3)
    for path, md5 in outs.items():
        assert object_key(md5) in keys, f"{path} ({md5}) is not in s3://{BUCKET}/{PREFIX}"
        if md5.endswith(".dir"):
            listing = json.loads(s3["client"].get_object(Bucket=BUCKET, Key=object_key(md5))["Body"].read())
            assert listing, path
            missing = [e["relpath"] for e in listing if object_key(e["md5"]) not in keys]
            assert not missing, f"{path}: files not pushed: {missing}"


def ran_stages(output: str) -> list[str]:
    return [line.split("'")[1] for line in output.splitlines() if line.startswith("Running stage '")]


def dvc(repo: Path, s3, *args: str, check: bool = True):
    return run(repo, *DVC, *args, env=s3["env"], check=check)


@pytest.fixture(scope="module")
def team(s3, tmp_path_factory):
    """Member A: a bare git remote `origin`, the pipeline reproduced, committed, pushed to git and to the S3 remote."""
    if shutil.which("git") is None:
        pytest.skip("git is needed to copy the repository")
    base = tmp_path_factory.mktemp("team")
    origin = base / "origin.git"
    run(base, "git", "init", "-q", "--bare", str(origin))
    a = make_repo(base / "a")
    # The remote is team-wide, so it goes into .dvc/config (committed); credentials stay in the environment.
    dvc(a, s3, "remote", "add", "-d", "team", f"s3://{BUCKET}/{PREFIX}")
    dvc(a, s3, "remote", "modify", "team", "endpointurl", s3["endpoint"])
    repro = dvc(a, s3, "repro")
    add_all(a)
    run(a, "git", "commit", "-qm", "smoke results")
    run(a, "git", "remote", "add", "origin", str(origin))
    run(a, "git", "push", "-q", "origin", "HEAD")
    push = dvc(a, s3, "push")
    return {"base": base, "origin": origin, "a": a, "repro": repro.stdout, "push": push.stdout}


def clone(team, name: str) -> Path:
    dest = team["base"] / name
    run(team["base"], "git", "clone", "-q", str(team["origin"]), str(dest))
    return dest


@pytest.fixture(scope="module")
def member_b(team, s3):
    """Member B: a fresh clone of the git remote that pulls A's outputs from the S3 remote."""
    b = clone(team, "b")
    assert not (b / ".dvc" / "cache").exists()
    pull = dvc(b, s3, "pull")
    return {"path": b, "pull": pull.stdout}


def test_push_puts_every_output_in_the_bucket_and_no_credentials_in_the_repo(team, s3):
    a = team["a"]
    assert "embed" in " ".join(ran_stages(team["repro"]))
    assert "pushed" in team["push"]
    assert_in_bucket(s3, embed_outs(a))
    assert_in_bucket(s3, locked_outs(a))  # prepared data, the toy checkpoint, predictions: everything cached is shared
    status = dvc(a, s3, "status", "--cloud")
    assert "in sync" in status.stdout, status.stdout
    config = (a / ".dvc" / "config").read_text()
    assert s3["endpoint"] in config and "testing" not in config
    assert "secret" not in config and "access_key" not in config
    assert not (a / ".dvc" / "config.local").exists()


def test_a_fresh_clone_pulls_instead_of_recomputing(team, member_b, s3):
    b = member_b["path"]
    for path in embed_outs(b):
        assert (b / path).exists(), f"{path} was not pulled"
    status = dvc(b, s3, "status")
    assert "up to date" in status.stdout, status.stdout
    repro = dvc(b, s3, "repro")
    assert ran_stages(repro.stdout) == [], repro.stdout
    assert "up to date" in repro.stdout
    assert (b / "reports/metrics.json").read_text() == (team["a"] / "reports/metrics.json").read_text()


@pytest.fixture(scope="module")
def experiment(team, s3):
    """A runs an experiment with another model and pushes it (git refs to origin, outputs to S3); C pulls it."""
    a = team["a"]
    exp_run = dvc(a, s3, "exp", "run", "-n", EXP, "-S", "model=toy-wide-smoke")
    a_metrics = json.loads((a / "reports/metrics.json").read_text())
    a_headline = json.loads((a / "reports/headline.json").read_text())
    a_model = json.loads((a / "reports/model.json").read_text())
    a_outs = embed_outs(a)
    push = dvc(a, s3, "exp", "push", "origin", EXP)
    c = clone(team, "c")
    pull = dvc(c, s3, "exp", "pull", "origin", EXP)
    return {"c": c, "run": exp_run.stdout, "push": push.stdout, "pull": pull.stdout,
            "a_metrics": a_metrics, "a_headline": a_headline, "a_model": a_model, "a_outs": a_outs}


def test_an_experiment_travels_with_its_metrics_and_features(experiment, team, s3):
    assert any(name.startswith("embed") for name in ran_stages(experiment["run"]))
    assert experiment["a_model"]["model"] == "toy-wide-smoke"
    refs = run(team["base"], "git", "ls-remote", str(team["origin"])).stdout
    assert f"/{EXP}" in refs and "refs/exps/" in refs
    # exp push uploads the experiment's outputs by default: its features are in the bucket
    assert "uploaded" in experiment["push"]
    assert_in_bucket(s3, experiment["a_outs"])

    c = experiment["c"]
    shown = json.loads(dvc(c, s3, "exp", "show", "--json").stdout)
    exps = [rev for row in shown for e in row.get("experiments") or [] if e.get("name") == EXP for rev in e["revs"]]
    assert exps, json.dumps(shown)[:2000]
    assert exps[0]["data"]["metrics"]["reports/headline.json"]["data"] == experiment["a_headline"]  # DVC's metrics

    dvc(c, s3, "exp", "apply", EXP)
    assert json.loads((c / "reports/metrics.json").read_text()) == experiment["a_metrics"]
    assert json.loads((c / "reports/model.json").read_text()) == experiment["a_model"]
    assert embed_outs(c) == experiment["a_outs"]
    for path in experiment["a_outs"]:
        assert (c / path).exists(), f"{path} of the experiment is missing in the clone"
    # a toy model's checkpoint and log are uncached outputs and only the demo's `toy` is kept in git (docs/architecture
    # .md, "The toy checkpoint arrives with the clone"): the teammate retrains the experiment's toy model, byte for byte
    # (pretrain runs under the portable settings), and nothing it feeds reruns
    repro = dvc(c, s3, "repro")
    assert set(ran_stages(repro.stdout)) <= {"pretrain@toy-wide-smoke", "train_plot@toy-wide-smoke"}, repro.stdout
    status = dvc(c, s3, "status")
    assert "up to date" in status.stdout, status.stdout


def test_a_downstream_change_reuses_the_features_another_member_embedded(member_b, s3):
    b = member_b["path"]
    before = json.loads((b / "reports/metrics.json").read_text())
    model = (b / "reports/model.json").read_text()
    out = dvc(b, s3, "exp", "run", "-S", "+linear_probe.test_split=val").stdout
    ran = ran_stages(out)
    assert any(name.startswith("linear_probe") for name in ran), out
    assert not any(name.startswith(("embed", "pretrain", "prepare")) for name in ran), out
    assert "report" in ran
    probes = [json.loads((b / path).read_text()) for path in locked_outs(b, "linear_probe", cached=False)
              if path.endswith(".json")]
    assert probes and all(p["params"]["test_split"] == "val" for p in probes), probes
    after = json.loads((b / "reports/metrics.json").read_text())
    assert after["zeroshot"] == before["zeroshot"] and set(after) == set(before)
    assert (b / "reports/model.json").read_text() == model
