"""Fine-tuning (issue 23) end to end on the toy architecture on CPU: ELEVATER full fine-tuning and NegCLIP run on
miniature prepared data; frozen parameters stay bit-identical, the loss goes down, an interrupted run resumes to the
same weights bit for bit, the search is ELEVATER's, and a fine-tuned model's features are never read as the base's."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import open_clip
import pytest
import torch
import yaml

from tests.conftest import make_dataset, make_texts
from vlbench.analyses import specificity
from vlbench.analyses.base import Inputs
from vlbench.compose import compose
from vlbench.datasets.canonical import load_meta
from vlbench.datasets.synthetic import build
from vlbench.embed import EngineError, embed_image_splits, embed_text_sets
from vlbench.features import StaleFeaturesError, read_features
from vlbench.finetune import FinetuneError, negclip
from vlbench.finetune.registry import method
from vlbench.finetune.artifacts import make_fingerprint, write_finetuned
from vlbench.finetune.training import Interrupted, Job, Runtime
from vlbench.knowledge.negatives import specificity_text_sets
from vlbench.models import register_local_configs
from vlbench.models.identity import FinetunedModelError, model_identity
from vlbench.models.loading import load_model
from vlbench.params import ParamsError
from vlbench.texts import build_text_sets, write_text_sets

ADAPT = {"elevater": {"shots": [2], "seeds": [0], "batch_size": 8, "search_epochs": 1, "final_epochs": 2,
                      "lr_grid": {"log_lower": -3, "log_upper": -2, "num": 2}}}
ROOT = Path(__file__).resolve().parent.parent
TEXT_TOWER = ("transformer.", "token_embedding.", "ln_final.", "positional_embedding", "text_projection", "logit_scale")
COLOURS = ["red", "orange", "yellow", "green", "cyan", "blue", "purple", "pink", "brown"]


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """A seeded random toy CLIP checkpoint and its model config."""
    register_local_configs()
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("base") / "checkpoint.pt"
    torch.save(open_clip.create_model("vlbench-toy").state_dict(), path)
    return {"slug": "toy-random", "arch": "vlbench-toy", "pretrained": str(path), "precision": "fp32"}


@pytest.fixture(scope="module")
def colours(tmp_path_factory):
    root = tmp_path_factory.mktemp("colours")
    make_dataset(root / "prepared/tiny", per_class=4)
    make_texts(root / "prepared/tiny", root / "texts/tiny")
    return root


@pytest.fixture(scope="module")
def captions(tmp_path_factory):
    """The synthetic caption world with train and test splits and its specificity texts (altered captions)."""
    root = tmp_path_factory.mktemp("captions")
    spec = {"source": "synthetic", "task": "captions", "seed": 0, "image_size": 32, "splits": {"train": 48, "test": 32}}
    build("captions", spec, root / "prepared/captions")
    meta = load_meta(root / "prepared/captions")
    texts = {"templates": ["a {c}."], "specificity": {"altered": 4, "nouns": "vocabulary", "classes_from":
                                                       "labels_and_captions", "groups": {"colour": COLOURS}}}
    sets = build_text_sets(meta, root / "prepared/captions", texts)
    sets.update(specificity_text_sets(meta, root / "prepared/captions", texts["specificity"]))
    write_text_sets(root / "texts/captions", meta.name, sets)
    return root


@pytest.fixture(scope="module")
def negclip_run(captions, base):
    return method("negclip")(negclip_job(captions, base))


@pytest.fixture(scope="module")
def elevater_run(colours, base):
    return method("elevater_full")(elevater_job(colours, base))


def elevater_job(colours, base, runtime=None, adapt=ADAPT, **settings):
    return Job("tiny", colours / "prepared/tiny", colours / "texts/tiny", base, {"head": "language_2p", **settings},
               {"precision": "fp32"}, 0, {"adapt": adapt}, runtime or Runtime(progress=False))


def negclip_job(captions, base, runtime=None):
    settings = {"batch_size": 8, "lr": 1e-3, "warmup": 1, "max_steps": 6}
    params = {"specificity": {"negatives": 10}, "zeroshot": {"scoring": "logits"}}
    return Job("captions", captions / "prepared/captions", captions / "texts/captions", base, settings,
               {"precision": "fp32"}, 0, params, runtime or Runtime(progress=False))


def same_weights(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


# ---------------------------------------------------------------------------------------------------------------------


def test_the_table_names_every_method_and_an_unknown_one_is_one_line():
    assert all(callable(method(name)) for name in ("elevater_full", "negclip", "fewtrans_episodic"))
    with pytest.raises(FinetuneError, match=r"^params.yaml: finetune.method 'lora' is not one of elevater_full, "):
        method("lora")


def test_elevater_full_trains_the_image_tower_only_with_the_probe_search_and_the_papers_pe(colours, base, elevater_run):
    out = elevater_run
    start = torch.load(base["pretrained"])
    frozen = [k for k in start if k.startswith(TEXT_TOWER)]
    assert frozen and all(torch.equal(start[k], out.state_dict[k]) for k in frozen)  # bit for bit
    assert any(not torch.equal(start[k], out.state_dict[k]) for k in start if k.startswith("visual."))
    assert set(out.trainable) == {f"clip.{k}" for k, _ in open_clip.create_model("vlbench-toy").named_parameters()
                                  if k.startswith("visual.")} | {"head.weight", "head.bias"}
    # the search: per learning rate the weight-decay grid's 7 coarse values then 8 neighbours at most, scored on val
    table = out.tables["search"].to_pylist()
    lrs = sorted({r["lr"] for r in table})
    assert np.allclose(lrs, [1e-3, 1e-2]) and all(7 <= sum(r["lr"] == lr for r in table) <= 15 for lr in lrs)
    best = [max((r["val_score"] for r in table if r["lr"] == lr)) for lr in lrs]
    chosen = out.details["runs"][0]["chosen"]
    want = next((i for i, s in enumerate(best) if s > max([0.0] + best[:i])), None)
    assert chosen["lr"] == (lrs[want] if want is not None else 0.0)
    # parameter efficiency with M0 = 1e8 (App. D.2) on the trained parameter count, counted here independently
    toy = open_clip.create_model("vlbench-toy")
    m = sum(p.numel() for p in toy.visual.parameters()) + 128 * 3 + 3
    score = out.metrics["elevater_full/language_2p/2/last"]
    assert out.details["trainable_params"] == m
    assert out.metrics["elevater_full/language_2p/2/pe"] == pytest.approx(score * math.exp(math.log10(m / 1e8 + 1)))
    assert len(out.chart["data"]["values"]) == len(table)


def test_a_search_candidate_whose_loss_turns_non_finite_is_a_failed_candidate_and_the_search_goes_on(colours, base):
    """Issue 30 (2): with weight decay 1e4 and more, learning rate 0.01 multiplies the weights by about -100 per step
    (and learning rate 1 diverges at every weight decay): those candidates' loss is NaN within their 8 steps. Each is a
    failed candidate scored 0, the worst, as ELEVATER's toolkit scores a run that fails; the table says where it
    diverged, the choice is made among the others and the final run completes."""
    adapt = {"elevater": {"shots": [4], "seeds": [0], "batch_size": 2, "search_epochs": 2, "final_epochs": 1,
                          "lr_grid": {"log_lower": -2, "log_upper": 0, "num": 2}}}
    out = method("elevater_full")(elevater_job(colours, base, adapt=adapt))
    table = out.tables["search"].to_pylist()
    failed = [r for r in table if r["status"] == "diverged"]
    finite = [r for r in table if r["status"] == "ok"]
    assert len(failed) + len(finite) == len(table) and failed and finite
    assert any(r["lr"] == 0.01 and r["wd"] == 1e4 for r in failed)  # the candidate that stopped the stage before
    assert all(r["val_score"] == 0.0 and 1 <= r["diverged_step"] <= 8 for r in failed)  # 4 steps per epoch, 2 epochs
    assert all(r["diverged_step"] is None for r in finite)
    run = out.details["runs"][0]
    assert run["search_diverged"] == len(failed)
    best = max(r["val_score"] for r in finite)
    assert best > 0 and run["chosen"]["val_score"] == best
    chosen = next(r for r in table if r["lr"] == run["chosen"]["lr"] and r["wd"] == run["chosen"]["wd"])
    assert chosen["status"] == "ok" and chosen["val_score"] == best
    assert math.isfinite(out.metrics["elevater_full/language_2p/4/last"])
    assert any(v["status"] == "diverged" for v in out.chart["data"]["values"])


def test_a_diverging_final_run_is_one_line_naming_the_run_its_hyper_parameters_and_what_to_do(colours, base):
    """Weight decay 1e4 at learning rate 0.01 multiplies the weights by about -99 per step: a search run of one step
    stays finite, so that pair is chosen, and the final run's 30 steps overflow float32 on any CPU (a learning rate of
    100 alone overflowed in 6 steps only under some CPUs' kernels). That is an error: the message names the run, the
    chosen pair, and the grid to search instead."""
    adapt = {"elevater": {"shots": [2], "seeds": [0], "batch_size": 8, "search_epochs": 1, "final_epochs": 30,
                          "lr_grid": {"log_lower": -2, "log_upper": -2, "num": 1},
                          "wd_grid": {"log_lower": 4, "log_upper": 4}}}
    with pytest.raises(FinetuneError) as err:
        method("elevater_full")(elevater_job(colours, base, adapt=adapt))
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith("finetune elevater_full on 'tiny': the final run final-2-0 (2 shots, seed 0) diverged at "
                              "step ")
    assert "with the search's choice: learning rate 0.01, weight decay 10000" in message
    assert "-S ++adapt.elevater.lr_grid.log_lower=-3 -S ++adapt.elevater.lr_grid.log_upper=-3" in message


def test_an_interrupted_run_resumes_to_the_same_weights_bit_for_bit(captions, base, negclip_run, tmp_path):
    whole = negclip_run
    state = tmp_path / "state"
    with pytest.raises(Interrupted):
        method("negclip")(negclip_job(captions, base, Runtime(progress=False, state_dir=state, checkpoint_every=2,
                                                              stop_after=3)))
    assert (state / "negclip.pt").is_file() and torch.load(state / "negclip.pt", weights_only=False)["step"] == 2
    resumed = method("negclip")(negclip_job(captions, base, Runtime(progress=False, state_dir=state)))
    assert same_weights(whole.state_dict, resumed.state_dict)
    assert whole.tables["train_log"].equals(resumed.tables["train_log"])
    assert not same_weights(whole.state_dict, torch.load(base["pretrained"]))


def test_an_interrupted_elevater_final_run_resumes_to_the_same_weights(colours, base, elevater_run, tmp_path):
    runtime = Runtime(progress=False, state_dir=tmp_path, checkpoint_every=1, stop_after=1)
    with pytest.raises(Interrupted, match="final-2-0: stopped after step 1"):
        method("elevater_full")(elevater_job(colours, base, runtime))
    resumed = method("elevater_full")(elevater_job(colours, base, Runtime(progress=False, state_dir=tmp_path)))
    assert same_weights(elevater_run.state_dict, resumed.state_dict)
    assert resumed.details["runs"] == elevater_run.details["runs"]  # the per-epoch test scores included


def test_negclip_batches_hold_altered_captions_and_neighbour_images_and_the_loss_goes_down(captions, base, negclip_run):
    from vlbench.finetune import negclip

    job = negclip_job(captions, base)
    s = negclip.settings(job)
    loaded = load_model(base, "cpu")
    pairs = negclip.Pairs.load(job, s, load_meta(job.prepared), loaded)
    x, caption, negative, has = pairs.batch(1)
    assert x.shape[0] == caption.shape[0] == negative.shape[0] == 2 * s["batch_size"]  # B images + B neighbours
    rows = [next(i for i in range(len(pairs)) if torch.equal(pairs.images[i], img)) for img in x]
    for r, n in zip(rows[:8], rows[8:]):
        assert n in pairs.neighbours[r].tolist()  # one of the image's 3 nearest (base model cosine)
    for r, cap, neg, h in zip(rows, caption, negative, has):
        assert any(torch.equal(cap, c) for c in pairs.captions[r])
        assert bool(h) and any(torch.equal(neg, t) for t in pairs.negatives[r])  # one of its own altered captions
    # the NegCLIP loss of fixed batches, before and after the 6 steps (eval mode, no gradient)
    tuned = load_model(base, "cpu").model
    tuned.load_state_dict(negclip_run.state_dict)
    batches = [pairs.batch(step) for step in (1, 2, 3)]
    with torch.no_grad():
        losses = [[float(pairs.loss(m.eval(), *b)) for b in batches] for m in (loaded.model, tuned)]
    assert np.mean(losses[1]) < np.mean(losses[0]) - 0.05, losses


def test_negclip_table_is_the_specificity_analysis_of_each_model(captions, base, negclip_run, tmp_path):
    out = negclip_run
    rows = {(r["analysis"], r["metric"]): r for r in out.details["table"]}
    assert ("specificity", "captions_vs_altered") in rows and ("zeroshot", "accuracy") in rows
    # recompute "after" independently: the exported weights as a checkpoint, the embed functions, the analysis
    path = tmp_path / "tuned.pt"
    torch.save(out.state_dict, path)
    loaded = load_model({**base, "slug": "tuned", "pretrained": str(path)}, "cpu")
    embed_image_splits(loaded, captions / "prepared/captions", tmp_path / "f/images", progress=False, num_workers=0)
    embed_text_sets(loaded, captions / "texts/captions", tmp_path / "f/text")
    identity = {k: loaded.fingerprint[k] for k in ("model", "arch", "pretrained", "weights_sha256")}
    inputs = Inputs(load_meta(captions / "prepared/captions"), identity, tmp_path / "f", captions / "texts/captions")
    again = specificity.run(inputs, {"negatives": 10, "split": "test"}, 0).metrics
    for metric, value in again.items():
        assert rows["specificity", metric]["after"] == pytest.approx(value, abs=1e-6)
        assert rows["specificity", metric]["change"] == pytest.approx(value - rows["specificity", metric]["before"])


def test_features_of_a_finetuned_model_are_never_read_as_the_base_models(colours, base, tmp_path):
    state = torch.load(base["pretrained"])
    state["visual.attnpool.c_proj.bias"] = state["visual.attnpool.c_proj.bias"] + 1.0
    out_dir = tmp_path / "data/finetuned/tiny/elevater_full"
    fingerprint = make_fingerprint(model_identity(base), "elevater_full", {"lr": 0.1}, "tiny", {"dataset_version": "v"},
                                   0, 5)
    doc = write_finetuned(out_dir, lambda p: torch.save(state, p), fingerprint)
    tuned = {"slug": "toy-random-ft", "arch": "vlbench-toy", "pretrained": str(out_dir / "checkpoint.pt"),
             "precision": "fp32", "base": "toy-random", "finetune": {"dataset": "tiny", "method": "elevater_full"}}
    assert model_identity(tuned)["finetune"] == doc["id"] != make_fingerprint(
        model_identity(base), "elevater_full", {"lr": 0.01}, "tiny", {"dataset_version": "v"}, 0, 5)["id"]
    for cfg in (base, tuned):
        embed_image_splits(load_model(cfg, "cpu"), colours / "prepared/tiny", tmp_path / cfg["slug"], progress=False,
                           num_workers=0)
    meta = load_meta(colours / "prepared/tiny")
    expect = {"dataset": "tiny", "dataset_version": meta.version}
    read_features(tmp_path / "toy-random-ft/test.parquet", {**model_identity(tuned), **expect})
    with pytest.raises(StaleFeaturesError, match="finetune|weights_sha256|model"):
        read_features(tmp_path / "toy-random-ft/test.parquet", {**model_identity(base), **expect, "model": None})
    with pytest.raises(StaleFeaturesError, match="finetune"):
        read_features(tmp_path / "toy-random/test.parquet", {**model_identity(tuned), **expect, "model": None,
                                                             "pretrained": None, "weights_sha256": None})
    with pytest.raises(FinetunedModelError, match="was fine-tuned from 'toy-random'"):
        model_identity({**tuned, "base": "vitb16"})
    (out_dir / "checkpoint.pt").write_bytes(b"other weights")
    with pytest.raises(FinetunedModelError, match="fingerprint.json: its weights_sha256 is not the sha256 of"):
        model_identity(tuned)


def test_a_finetuned_entry_without_its_weights_names_the_run_that_makes_them(tmp_path, monkeypatch):
    """Issue 30 (5): `-S model=toy-elevater-shapes` before the fine-tuning run is refused when params are composed (DVC
    would otherwise fail hashing the missing checkpoint with a bare `No such file or directory`), in one line naming
    the checkpoint and the command that makes it; once the run's outputs are there, the entry composes and loads."""
    monkeypatch.chdir(tmp_path)  # a project without the fine-tuned weights
    entry = yaml.safe_load((ROOT / "conf/model/toy-elevater-shapes.yaml").read_text())
    message = ("model 'toy-elevater-shapes' needs data/finetuned/shapes/elevater_full/checkpoint.pt, which is not "
               "there: it is made by fine-tuning 'toy' on 'shapes' with elevater_full: `dvc exp run -S model=toy -S "
               "'suite.finetune=[shapes]' -S finetune.method=elevater_full`, then rerun this command")
    with pytest.raises(ParamsError) as err:
        compose(["model=toy-elevater-shapes"], ROOT / "conf")
    assert message in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(FinetunedModelError) as err:
        model_identity(entry)  # a stage run by hand says the same
    assert str(err.value) == message
    out = tmp_path / "data/finetuned/shapes/elevater_full"
    fingerprint = make_fingerprint({"model": "toy"}, "elevater_full", {}, "shapes", {"dataset_version": "v"}, 0, 1)
    write_finetuned(out, lambda p: p.write_bytes(b"weights"), fingerprint)
    params = compose(["model=toy-elevater-shapes"], ROOT / "conf")
    assert params["model"]["weights_file"] == "data/finetuned/shapes/elevater_full/checkpoint.pt"
    assert model_identity(params["model"])["finetune"] == fingerprint["id"]
    (out / "fingerprint.json").unlink()
    with pytest.raises(FinetunedModelError, match="needs data/finetuned/shapes/elevater_full/fingerprint.json, which"):
        model_identity(entry)


def test_bad_settings_are_one_line_naming_the_key(colours, base):
    with pytest.raises(FinetuneError, match=r"unknown key\(s\) finetune.elevater_full.lr;"):
        method("elevater_full")(elevater_job(colours, base, lr=0.1))
    with pytest.raises(FinetuneError, match="finetune.elevater_full.head 'language_1p' is not one of"):
        method("elevater_full")(elevater_job(colours, base, head="language_1p"))
    with pytest.raises(FinetuneError, match="finetune.precision 'fp16' is not one of"):
        job = elevater_job(colours, base)
        method("elevater_full")(Job(**{**job.__dict__, "options": {"precision": "fp16"}}))


def test_negclip_evaluates_on_the_engine_the_stage_was_given(tmp_path):
    """The finetune stage's --engine reaches NegCLIP's before/after evaluation (it once followed $VLBENCH_ENGINE
    alone): an engine that does not exist is refused by name before anything is embedded."""
    job = Job("captions", tmp_path, tmp_path, {}, {}, {}, 0, runtime=Runtime(engine="no-such-engine"))
    with pytest.raises(EngineError, match="engine 'no-such-engine'"):
        negclip.evaluate(job, {"eval_split": "test"}, None, None, "base")


def test_a_method_without_a_single_model_leaves_its_fingerprint_alone(tmp_path):
    fingerprint = make_fingerprint({"model": "toy"}, "fewtrans_episodic", {"episodes": 2}, "tiny", {"dataset_version": "v"},
                                   0, 0)
    write_finetuned(tmp_path, lambda p: p.write_bytes(b"weights"), fingerprint)
    assert (tmp_path / "checkpoint.pt").read_bytes() == b"weights"
    doc = write_finetuned(tmp_path, None, fingerprint)  # a re-run by an episodic method removes the old weights
    assert not (tmp_path / "checkpoint.pt").exists() and doc["weights_sha256"] is None
    assert doc["id"] == fingerprint["id"] and (tmp_path / "fingerprint.json").is_file()
