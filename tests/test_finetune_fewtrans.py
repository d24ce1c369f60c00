"""FewTrans fine-tuning on adapt's episodes (vlbench/finetune/fewtrans_episodic.py), end to end on a miniature
prepared dataset with the toy open_clip model (random weights saved by the test): the same episodes as adapt, every
method trains (loss down, frozen parameters bit for bit), the ensemble grid and schedule, deterministic rows."""

from __future__ import annotations

import math

import numpy as np
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
import torch

from tests.conftest import png
from vlbench.analyses.adapt import fewtrans as episodic
from vlbench.analyses.base import Inputs
from vlbench.datasets.canonical import ClassInfo, DatasetMeta, load_meta, write_dataset
from vlbench.datasets.images import decode_rgb
from vlbench.embed import embed_image_splits, embed_text_sets
from vlbench.finetune import fewtrans_episodic as fft
from vlbench.finetune import FinetuneError
from vlbench.models.identity import model_identity
from vlbench.models.loading import load_model
from vlbench.texts import build_text_sets, write_text_sets

HUES = {"red": (220, 30, 30), "green": (30, 200, 30), "blue": (30, 30, 220), "yellow": (210, 210, 30),
        "cyan": (30, 200, 200), "magenta": (200, 30, 200)}
SAMPLER = {"episodes": 3, "splits": ["train", "test"], "novel_classes": {"hues": 2}}  # adapt.fewtrans
SMALL = {"lr_factors": [1.0], "two_lr_factors": [1.0], "epoch_offset": 0,  # 2 members per method: 1 and 2 epochs
         **{m: {"lr": 1e-3, "epochs": 2} for m in ("visual_ft", "text_ft", "all_ft")},
         **{m: {"lr": 1e-3, "head_lr": 1e-2, "epochs": 2} for m in ("finetune", "bitfit")},
         "lora": {"lr": 1e-2, "head_lr": 1e-2, "epochs": 2, "rank": 4, "alpha": 4.0}}


@pytest.fixture(scope="module")
def world(tmp_path_factory, toy_model_cfg):
    """A prepared dataset of six colour classes in two splits written in row groups of 7 rows, its prompts, and the
    toy model's features (what adapt reads)."""
    root = tmp_path_factory.mktemp("ftep")
    meta = DatasetMeta(name="hues", task="single-label", metric="accuracy",
                       classes=[ClassInfo(index=i, name=n) for i, n in enumerate(HUES)])

    def rows(split, n, offset):
        for k in range(n):
            colour = list(HUES.values())[k % 6]
            yield {"sample_id": f"{split}/{k:03d}", "label": k % 6, "image": png(colour, seed=offset + k)}

    prepared = root / "prepared" / "hues"
    write_dataset(prepared, meta, {"train": rows("train", 30, 0), "test": rows("test", 36, 500)})
    for split in ("train", "test"):
        path = prepared / "splits" / f"{split}.parquet"
        pq.write_table(pq.read_table(path), path, row_group_size=7)
    meta = load_meta(prepared)
    texts = root / "texts" / "hues"
    write_text_sets(texts, "hues", build_text_sets(meta, prepared, {"templates": ["a {c} square.", "something {c}."]}))
    loaded = load_model(toy_model_cfg, device="cpu")
    features = root / "features" / "hues"
    embed_image_splits(loaded, prepared, features / "images", batch_size=64, num_workers=0, progress=False)
    embed_text_sets(loaded, texts, features / "text")
    return {"prepared": prepared, "texts": texts / "prompts.parquet", "features": features, "meta": meta,
            "loaded": loaded, "texts_dir": texts}


def test_episodes_are_adapts_and_two_runs_give_identical_rows(world, toy_model_cfg):
    inputs = Inputs(world["meta"], model_identity(toy_model_cfg), world["features"], world["texts_dir"])
    adapt = episodic.evaluate(inputs, {**SAMPLER, "linear": {"epochs": 2}}, seed=3, device="cpu").tables["episodes"]
    cfg = {**SMALL, "methods": ["text_ft", "lora"]}
    summary, table = fft.run_episodes(toy_model_cfg, world["prepared"], world["texts"], cfg, 3, "cpu", SAMPLER)
    keys = ["episode", "split", "ways", "shots", "query", "classes", "node", "support_ids", "query_ids"]
    assert table.select(keys).equals(adapt.select(keys))
    assert table.column_names == keys + ["text_ft", "lora"]
    novel = table.filter(pc.equal(table.column("split"), "novel"))
    assert novel.column("lora").null_count == novel.num_rows == 3 and novel.column("text_ft").null_count == 0
    assert set(summary["metrics"]) == {"fewtrans/base/text_ft", "fewtrans/novel/text_ft", "fewtrans/base/lora"}
    base = table.filter(pc.equal(table.column("split"), "base")).column("lora").to_numpy()
    assert summary["metrics"]["fewtrans/base/lora"] == pytest.approx(base.mean())
    half = 1.96 * base.std(ddof=1) / math.sqrt(3)
    assert summary["summary"]["base/lora"]["ci95"] == pytest.approx(half)
    assert summary["trainable_parameters"]["lora"] == 2 * 2 * 4 * 1024  # q and v of the toy's 1,024-wide pool
    assert len(summary["ensemble"]["lora"]) == 2 and summary["base_classes"] == adapt_base(world)
    _, again = fft.run_episodes(toy_model_cfg, world["prepared"], world["texts"], cfg, 3, "cpu", SAMPLER)
    assert again.equals(table)


def test_the_finetune_stages_method_runs_the_same_episodes_and_writes_no_weights(world, toy_model_cfg):
    """finetune.method fewtrans_episodic (the finetune stage's Job): params' finetune.fewtrans_episodic over DEFAULTS,
    adapt.fewtrans's episodes and the global seed; the table joins adapt's, the metrics carry their intervals."""
    from vlbench.finetune.registry import method
    from vlbench.finetune.training import Job, Runtime

    cfg = {**SMALL, "methods": ["bitfit"]}
    job = Job("hues", world["prepared"], world["texts_dir"], toy_model_cfg, cfg, {}, 3,
              {"adapt": {"fewtrans": SAMPLER}}, Runtime(device="cpu", progress=False))
    outcome = method("fewtrans_episodic")(job)
    _, table = fft.run_episodes(toy_model_cfg, world["prepared"], world["texts"], cfg, 3, "cpu", SAMPLER)
    assert outcome.state_dict is None and outcome.tables["episodes"].equals(table)
    assert set(outcome.metrics) == set(outcome.intervals) == {"fewtrans/base/bitfit"}
    assert outcome.hyper["settings"]["bitfit"]["lr"] == 1e-3 and outcome.counts == {"episodes": 3}


def adapt_base(world) -> list[int]:
    return episodic.episode_classes(world["meta"], episodic.settings(SAMPLER))[0].tolist()


def test_pool_images_are_the_rows_decoded_by_the_models_preprocess(world):
    meta, s, pool, *_ = fft.draw_episodes(world["prepared"], SAMPLER, 0)
    images = fft.PoolImages(world["prepared"], s["splits"], world["loaded"].preprocess, pool.sample_ids)
    rows = np.array([65, 0, 31, 29, 30, 7])  # across both files and several row groups, out of order
    got = images.load(rows)
    table = {split: pq.read_table(world["prepared"] / "splits" / f"{split}.parquet") for split in s["splits"]}
    for k, row in enumerate(rows):
        split, index = pool.sample_ids[row].split("/")
        t = table[split]
        data = t.column("image")[t.column("sample_id").to_pylist().index(pool.sample_ids[row])].as_py()
        assert torch.equal(got[k], world["loaded"].preprocess(decode_rgb(data)))
        assert pool.labels[row] == int(index) % 6


@pytest.mark.parametrize("name", list(fft.TUNINGS))
def test_every_method_lowers_the_support_loss_and_keeps_frozen_parameters(world, name):
    _, s, pool, _, _, pairs = fft.draw_episodes(world["prepared"], SAMPLER, 0)
    loaded = world["loaded"]
    images = fft.PoolImages(world["prepared"], s["splits"], loaded.preprocess, pool.sample_ids)
    base, novel = pairs[0]
    data = fft.episode_data(base, novel, images, loaded.device)
    prompts = fft.Prompts(world["texts"], loaded.tokenizer, 6)
    settings = fft.settings({**SMALL, name: {**SMALL[name], "epochs": 6}, "methods": [name]})
    ctx = fft.Context(loaded.model, prompts, settings, loaded.device, loaded.autocast, 0)
    before = {k: v.clone() for k, v in loaded.model.state_dict().items()}
    lr = 1e-4 if fft.TUNINGS[name].head == "text" else 1e-3  # the whole tower at 1e-3 overshoots at first
    member = fft.Member(lr, settings[name].get("head_lr"), 6, (6,))
    captured = {}
    original = fft.fit

    def spy(model, head, *args, **kwargs):
        captured["model"] = model
        return original(model, head, *args, **kwargs)

    fft.fit = spy
    try:
        trained = fft.train_member(ctx, name, data, member, 0, 0)
    finally:
        fft.fit = original
    assert sum(base.shots) <= settings[name]["batch_size"]  # full batch: every step's loss is the support loss
    assert len(trained.losses) == 6 and trained.losses[-1] < trained.losses[0]
    model = captured["model"]
    params = dict(model.named_parameters())
    frozen = [n for n, p in params.items() if not p.requires_grad]
    trainable = [n for n, p in params.items() if p.requires_grad]
    for n in frozen:
        original_name = n.replace("parametrizations.", "").replace(".original", "")
        assert torch.equal(params[n], before[original_name]), n
    changed = [n for n in trainable if n not in before or not torch.equal(params[n], before[n])]
    assert changed and trainable
    assert all(torch.equal(v, loaded.model.state_dict()[k]) for k, v in before.items())  # the base model untouched
    assert list(trained.logits) == [6] and trained.logits[6][0].shape == (sum(len(q) for q in base.query), base.ways)
    assert len(trained.logits[6]) == (2 if fft.TUNINGS[name].head == "text" else 1)


def test_learning_rates_follow_the_cosine_to_zero_per_step(world):
    _, s, pool, _, _, pairs = fft.draw_episodes(world["prepared"], SAMPLER, 0)
    loaded = world["loaded"]
    images = fft.PoolImages(world["prepared"], s["splits"], loaded.preprocess, pool.sample_ids)
    data = fft.episode_data(*pairs[1], images, loaded.device)
    settings = fft.settings({**SMALL, "bitfit": {**SMALL["bitfit"], "batch_size": 2}, "methods": ["bitfit"]})
    ctx = fft.Context(loaded.model, None, settings, loaded.device, loaded.autocast, 0)
    member = fft.Member(0.4, 2.0, 2, (2,))
    trained = fft.train_member(ctx, "bitfit", data, member, 1, 0)
    steps = 2 * math.ceil(sum(pairs[1][0].shots) / 2)
    expected = [[0.5 * r * (1 + math.cos(math.pi * t / steps)) for r in (0.4, 2.0)] for t in range(steps)]
    np.testing.assert_allclose(trained.rates, expected, rtol=1e-12)
    assert trained.rates[0] == [0.4, 2.0] and steps > 4  # no warm-up; several batches per epoch


def test_ensembles_are_the_papers_grids():
    s, _ = fft.resolve_centres(fft.settings({"centres": "authors_fixed", "methods": ["finetune", "lora"],
                                             "visual_ft": {"lr": 1e-5, "epochs": 60}}), None)
    text = fft.members("visual_ft", s)
    assert len(text) == 15 and sorted({m.epochs for m in text}) == [23, 46, 70]  # E* 60 + 10, thirds
    assert sorted({m.lr for m in text}) == pytest.approx([4e-7, 2e-6, 1e-5, 5e-5, 2.5e-4])
    assert all(m.head_lr is None and m.scored == (m.epochs,) for m in text)
    lora = fft.members("lora", s)
    assert len(lora) == 27 and sorted({m.epochs for m in lora}) == [13, 26, 40]  # App. A's 13, 26, 40
    np.testing.assert_allclose(sorted({(m.lr, m.head_lr) for m in lora}),
                               [(a, b) for a in (4e-4, 2e-3, 1e-2) for b in (2e-3, 1e-2, 5e-2)])  # the code's LoRA grid
    fixed = {"centres": "authors_fixed", "methods": ["finetune"]}
    snap = fft.members("finetune", fft.resolve_centres(fft.settings({**fixed, "epoch_mode": "snapshots"}), None)[0])
    assert len(snap) == 9 and snap[0].epochs == 70 and snap[0].scored == (24, 48, 70)
    last = fft.members("finetune", fft.resolve_centres(fft.settings({**fixed, "epoch_mode": "last"}), None)[0])
    np.testing.assert_allclose([(m.lr, m.head_lr) for m in last],
                               [(a, b) for a in (2e-6, 1e-5, 5e-5) for b in (4e-4, 2e-3, 1e-2)])  # the code's grid
    assert {m.epochs for m in last} == {70}


def test_ensemble_sums_logits_or_votes():
    logits = [torch.tensor([[9.0, 0.0, 0.0]]), torch.tensor([[0.0, 1.0, 0.0]]), torch.tensor([[0.0, 1.0, 0.0]])]
    assert fft.ensemble_accuracy(logits, np.array([0]), "sum") == 1.0
    assert fft.ensemble_accuracy(logits, np.array([1]), "vote") == 1.0


def test_settings_and_inputs_errors_name_the_key(world, toy_model_cfg):
    with pytest.raises(FinetuneError, match=r"finetune.fewtrans_episodic has unknown key\(s\) \['epochs'\]"):
        fft.settings({"epochs": 3})
    with pytest.raises(FinetuneError, match="finetune.fewtrans_episodic.methods"):
        fft.settings({"methods": ["coop"]})
    with pytest.raises(FinetuneError, match=r"finetune.fewtrans_episodic.lora has unknown key\(s\) \['momentum'\]"):
        fft.settings({"lora": {"momentum": 0.9}})
    with pytest.raises(FinetuneError, match="finetune.fewtrans_episodic.bitfit learning rates must be positive"):
        fft.settings({"bitfit": {"lr": 1e-3, "head_lr": 0, "epochs": 2}})
    with pytest.raises(FinetuneError, match="finetune.fewtrans_episodic.epoch_mode"):
        fft.settings({"epoch_mode": "best"})
    with pytest.raises(FinetuneError, match="need the text set"):
        fft.run_episodes(toy_model_cfg, world["prepared"], None, {"methods": ["text_ft"]}, 0, "cpu", SAMPLER)
    with pytest.raises(FinetuneError, match=r"no split\(s\) \['val'\]"):
        fft.run_episodes(toy_model_cfg, world["prepared"], None, {"methods": ["lora"]}, 0, "cpu",
                         {**SAMPLER, "splits": ["val"]})
