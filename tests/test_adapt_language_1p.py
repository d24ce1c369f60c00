"""Pre-projection image features (vlbench.models.projection, embed.pre_projection) and ELEVATER's Language-1P head
(vlbench.analyses.adapt.elevater): what the image tower computes before its projection, the files and fingerprints
the embed step writes, the head's initialisation (the toolkit's MERGE_ENCODER_AND_HEAD_PROJ) and the protocol."""

from __future__ import annotations

import shutil

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

from tests.conftest import make_dataset, make_texts
from vlbench.analyses.adapt import elevater
from vlbench.analyses.adapt.protocol import AdaptError, LinearHeads
from vlbench.analyses.base import Inputs
from vlbench.datasets.canonical import load_meta
from vlbench.embed import embed_image_splits, embed_text_sets
from vlbench.features import (
    PRE_PROJECTION,
    PROJECTION,
    StaleFeaturesError,
    pre_projection_path,
    projection_path,
    read_features,
    read_fingerprint,
    read_projection,
)
from vlbench.models.identity import model_identity
from vlbench.models.loading import load_model
from vlbench.models.projection import (
    PreProjectionEncoder,
    ProjectionError,
    visual_projection,
)

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def loaded(toy_model_cfg):
    return load_model(toy_model_cfg, device="cpu")


def tiny_vit():
    """An open_clip ViT (class-token pooling, ln_post, `proj`), randomly initialised."""
    from open_clip.model import CLIP, CLIPTextCfg, CLIPVisionCfg

    torch.manual_seed(3)
    vision = CLIPVisionCfg(layers=1, width=32, head_width=16, patch_size=8, image_size=32)
    text = CLIPTextCfg(context_length=8, vocab_size=100, width=16, heads=2, layers=1)
    return CLIP(embed_dim=16, vision_cfg=vision, text_cfg=text).eval()


def images(n: int = 6) -> torch.Tensor:
    return torch.randn(n, 3, 32, 32, generator=torch.Generator().manual_seed(1))


# --------------------------------------------------------------------------------------------------
# what the tower computes before its projection


def test_vit_pre_projection_is_the_ln_post_class_token_and_proj_gives_the_embedding_exactly():
    model = tiny_vit()
    seen = []
    hook = model.visual.ln_post.register_forward_hook(lambda _m, _i, out: seen.append(out))
    with torch.inference_mode():
        reference = model.encode_image(images())
        both = PreProjectionEncoder(model, "vit")(images())
    hook.remove()
    assert both.shape == (6, 16 + 32)
    assert torch.equal(both[:, :16], reference)  # the tower's own `pooled @ proj`
    assert torch.equal(both[:, 16:], seen[-1][:, 0])  # ln_post'ed class token, as the toolkit trains on with proj None
    projection = visual_projection(model, "vit")
    assert projection.kind == "visual.proj" and projection.dims == (32, 16) and not projection.bias.any()
    np.testing.assert_allclose(both[:, 16:].numpy() @ projection.weight.T, reference.numpy(), rtol=1e-5, atol=1e-6)
    assert model.visual.proj is not None  # put back


def test_modified_resnet_pre_projection_is_the_attention_pool_output_before_c_proj(loaded):
    model = loaded.model
    with torch.inference_mode():
        reference = model.encode_image(images())
        both = PreProjectionEncoder(model, "toy")(images())
        again = model.encode_image(images())
    projection = visual_projection(model, "toy")
    assert projection.kind == "visual.attnpool.c_proj" and projection.dims == (1024, 128)
    assert both.shape == (6, 128 + 1024)
    assert torch.equal(both[:, :128], reference) and torch.equal(again, reference)  # bit for bit, model unchanged
    pre = both[:, 128:].numpy()
    np.testing.assert_allclose(pre @ projection.weight.T + projection.bias, reference.numpy(), rtol=1e-5, atol=1e-6)
    assert np.abs(projection.bias).max() > 0  # c_proj has a bias: the 1P head merges it (language_1p_init)


def test_a_tower_without_such_a_projection_is_refused_with_the_param_to_change():
    model = tiny_vit()
    model.visual.proj = None
    with pytest.raises(ProjectionError, match=r"model 'bare'.*VisionTransformer without proj.*embed.pre_projection: false"):
        PreProjectionEncoder(model, "bare")
    other = torch.nn.Module()
    other.visual = torch.nn.Linear(4, 2)
    with pytest.raises(ProjectionError, match="its image tower is Linear"):
        visual_projection(other, "odd")


# --------------------------------------------------------------------------------------------------
# the files of the embed step


@pytest.fixture(scope="module")
def embedded(loaded, toy_model_cfg, tmp_path_factory):
    """A prepared dataset (3 classes, 8 per class), its text sets, and its image features with and without the
    pre-projection files."""
    root = tmp_path_factory.mktemp("l1p")
    data = root / "prepared" / "tiny"
    make_dataset(data, per_class=8)
    make_texts(data, root / "texts" / "tiny")
    embed_text_sets(loaded, root / "texts" / "tiny", root / "features" / "tiny" / "text")
    summary = embed_image_splits(loaded, data, root / "features" / "tiny" / "images", num_workers=0, progress=False,
                                 pre_projection=True)
    embed_image_splits(loaded, data, root / "plain" / "images", num_workers=0, progress=False)
    return root, summary, model_identity(toy_model_cfg)


def test_embed_writes_pre_projection_features_and_the_projection_with_their_fingerprints(embedded):
    root, summary, identity = embedded
    images, plain = root / "features" / "tiny" / "images", root / "plain" / "images"
    assert summary["pre_projection"] == {"dim": 1024, "projection": "visual.attnpool.c_proj"}
    assert sorted(p.name for p in (images / PRE_PROJECTION).iterdir()) == ["projection.weights.parquet", "test.parquet",
                                                                           "train.parquet"]
    assert not (plain / PRE_PROJECTION).exists()
    version = load_meta(root / "prepared" / "tiny").version
    expect = {**identity, "dataset": "tiny", "dataset_version": version}
    projection = read_projection(projection_path(images), {**expect, "representation": PROJECTION})
    assert projection.weight.shape == (128, 1024) and projection.bias.shape == (128,)
    for split in ("train", "test"):
        projected = read_features(images / f"{split}.parquet", expect)
        pre = read_features(pre_projection_path(images, split), {**expect, "representation": PRE_PROJECTION})
        assert pre.fingerprint == {**projected.fingerprint, "representation": PRE_PROJECTION,
                                   "projection": "visual.attnpool.c_proj", "projection_dims": [1024, 128]}
        assert pre.table.equals(projected.table) and pre.embeddings.shape == (24, 1024)
        np.testing.assert_allclose(pre.embeddings @ projection.weight.T + projection.bias, projected.embeddings,
                                   rtol=1e-5, atol=1e-6)
        # the projected features are the same bytes whether or not the pre-projection ones are cached
        assert pq.read_table(images / f"{split}.parquet").equals(pq.read_table(plain / f"{split}.parquet"))
        assert read_fingerprint(plain / f"{split}.parquet") == projected.fingerprint
    with pytest.raises(StaleFeaturesError, match="representation"):  # a reader of one kind never takes the other
        read_features(images / "train.parquet", {**expect, "representation": PRE_PROJECTION})


# --------------------------------------------------------------------------------------------------
# Language-1P


def inputs_for(root, identity, images_dir=None) -> Inputs:
    meta = load_meta(root / "prepared" / "tiny")
    features = root / "features" / "tiny"
    if images_dir is not None:  # another images folder beside the same text features
        features = images_dir.parent
        if not (features / "text").exists():
            shutil.copytree(root / "features" / "tiny" / "text", features / "text")
    return Inputs(meta, identity, features, root / "texts" / "tiny")


def initial_logits(w, b, x):
    """What a head computes before any step: the batch norm's running statistics at their start (mean 0, var 1)."""
    heads = LinearHeads(w[None], b[None], [0.0], [0.0], on=CPU)
    x = elevater.ChannelBatchNorm(x.shape[1], CPU).eval(torch.tensor(x))
    return heads.logits(x)[0].numpy()


def test_language_1p_is_the_language_2p_head_merged_with_the_projection(embedded):
    root, _, identity = embedded
    inputs = inputs_for(root, identity)
    s = elevater.Settings(heads=("language_2p", "language_1p"))
    pool = elevater.load_pool(inputs, s)
    pre, projection = elevater.load_pre_projection(inputs, s, pool)
    init = elevater.head_init(inputs, pool, s, seed=0, projection=projection)
    (w2, b2), (w1, b1) = init.weights["language_2p"], init.weights["language_1p"]
    assert w1.shape == (1024, 3) and b1.shape == (3,) and not b2.any()
    # the toolkit's head_proj @ encoder_proj.T, in [d, C] layout; the bias takes c_proj's bias through the head
    np.testing.assert_allclose(w1, projection.weight.T @ w2, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(b1, projection.bias @ w2, rtol=1e-5, atol=1e-7)
    # without the batch norm the two heads are the same function of the image
    np.testing.assert_allclose(pre.x @ w1 + b1, pool.x @ w2 + b2, rtol=1e-4, atol=1e-5)
    # with it (running statistics at their start, x / sqrt(1 + eps)) they agree up to that factor on c_proj's bias
    one_p, two_p = initial_logits(w1, b1, pre.x), initial_logits(w2, b2, pool.x)
    gap = np.abs(b1) * (1 - 1 / np.sqrt(1 + elevater.BN_EPS))
    assert np.all(np.abs(one_p - two_p) <= gap + 1e-4 * np.abs(two_p) + 1e-5)
    assert (one_p.argmax(1) == two_p.argmax(1)).all()


def test_language_1p_with_a_vit_projection_starts_from_the_same_logits_as_language_2p():
    rng = np.random.default_rng(0)
    model = tiny_vit()
    projection = visual_projection(model)
    pre = rng.normal(size=(20, 32)).astype(np.float32)
    w2 = rng.normal(size=(16, 5)).astype(np.float32)
    w1, b1 = elevater.language_1p_init(w2, np.zeros(5, np.float32), projection)
    assert not b1.any()  # the toolkit keeps the head's zero bias
    np.testing.assert_allclose(initial_logits(w1, b1, pre), initial_logits(w2, np.zeros(5, np.float32),
                                                                           pre @ projection.weight.T),
                               rtol=1e-4, atol=1e-5)


FAST = {"shots": [2, "full"], "seeds": [0], "search_epochs": 2, "final_epochs": 3, "batch_size": 8,
        "parameter_efficiency": {"m0": 100_000}}


def test_protocol_runs_language_1p_as_its_own_search_on_pre_projection_features(embedded):
    root, _, identity = embedded
    inputs = inputs_for(root, identity)
    both = elevater.evaluate(inputs, {**FAST, "heads": ["language_2p", "language_1p"]}, seed=0)
    alone = elevater.evaluate(inputs_for(root, identity), {**FAST, "heads": ["language_1p"]}, seed=0)
    for shots in ("2", "full"):
        assert both.metrics[f"elevater/language_1p/{shots}/last"] == alone.metrics[f"elevater/language_1p/{shots}/last"]
        assert f"elevater/language_2p/{shots}/last" in both.metrics
    summary = both.details["summary"]
    assert summary["trainable_params"] == {"language_2p": 128 * 3 + 3, "language_1p": 1024 * 3 + 3}
    one = summary["language_1p"]["2"]
    r = np.log10((1024 * 3 + 3) / 100_000 + 1.0)
    assert one["pe"] == pytest.approx(one["mean"] * np.exp(r))
    run = both.details["runs"][0]
    assert set(run["chosen"]) == set(run["final"]) == {"language_2p", "language_1p"}
    heads = both.tables["elevater_search"].column("head").to_pylist()
    assert heads.count("language_1p") == alone.tables["elevater_search"].num_rows > 0
    assert sum(r["search_runs"] for r in both.details["runs"]) == len(heads)  # each run counts both heads' searches
    assert "MERGE_ENCODER_AND_HEAD_PROJ" in both.details["settings"]["language_1p"]


def test_missing_or_foreign_pre_projection_features_are_one_clear_error(embedded):
    root, _, identity = embedded
    plain = inputs_for(root, identity, root / "plain" / "images")
    with pytest.raises(AdaptError, match=r"dataset 'tiny'.*language_1p.*embed.pre_projection: true.*embed_images@tiny"):
        elevater.evaluate(plain, {**FAST, "heads": ["language_1p"]}, seed=0)
    elevater.evaluate(plain, {**FAST, "heads": ["language_2p"]}, seed=0)  # the 2P heads do not need them
    swapped = root / "swapped" / "images"
    shutil.copytree(root / "features" / "tiny" / "images", swapped)
    shutil.copy(swapped / "train.parquet", pre_projection_path(swapped, "train"))
    with pytest.raises(StaleFeaturesError, match="representation"):
        elevater.evaluate(inputs_for(root, identity, swapped), {**FAST, "heads": ["language_1p"]}, seed=0)


def test_vtab_trains_on_pre_projection_features_when_asked(embedded):
    from vlbench.analyses.adapt import vtab

    root, _, identity = embedded
    small = {"val_split": "test", "train_examples": 12, "val_examples": 6, "steps": [5], "learning_rates": [0.1],
             "runs": 1, "groups": {"tiny": "natural"},
             "preprocess": "default"}  # the tiny dataset is prepared without VTAB's squash
    for representation, dim in (("projected", 128), ("pre_projection", 1024)):
        s = vtab.settings({**small, "representation": representation})
        assert vtab.load_splits(inputs_for(root, identity), s)["train800"].x.shape == (12, dim)
    result = vtab.evaluate(inputs_for(root, identity), {**small, "representation": "pre_projection"}, seed=0)
    assert result.details["settings"]["representation"] == "pre_projection" and 0 <= result.metrics["vtab/median"] <= 1
    plain = inputs_for(root, identity, root / "plain" / "images")
    with pytest.raises(AdaptError, match=r"dataset 'tiny': adapt.vtab.representation is pre_projection.*embed_images@tiny"):
        vtab.evaluate(plain, {**small, "representation": "pre_projection"}, seed=0)
    with pytest.raises(AdaptError, match="adapt.vtab.representation must be one of"):
        vtab.settings({"representation": "logits"})


def test_logit_scale_options_are_the_toolkits_factors_and_pretrained_is_the_models_own(embedded, loaded):
    import math

    from vlbench.features import read_fingerprint

    root, _, identity = embedded
    recorded = read_fingerprint(root / "features" / "tiny" / "images" / "train.parquet")["logit_scale"]
    assert recorded == pytest.approx(float(loaded.model.logit_scale.detach().exp()), rel=1e-6) and recorded > 1
    inputs = inputs_for(root, identity)
    assert elevater.logit_scale_factor("none", 3) == 1.0
    assert elevater.logit_scale_factor("clip", 3) == pytest.approx(1 / 0.07)
    assert elevater.logit_scale_factor("ln_cls", 3) == pytest.approx(math.log(3))  # exp(log(log C))
    assert elevater.logit_scale_factor("pretrained", 3, inputs, "train") == recorded
    result = elevater.evaluate(inputs, {**FAST, "heads": ["language_2p"], "logit_scale": "pretrained"}, seed=0)
    assert result.details["settings"]["logit_factor"] == recorded
    # the factor multiplies the logits the heads train on: the same run with factor 1 ends elsewhere
    plain = elevater.evaluate(inputs, {**FAST, "heads": ["language_2p"]}, seed=0)
    assert plain.details["settings"]["logit_factor"] == 1.0
    assert result.details["runs"] != plain.details["runs"]
    with pytest.raises(AdaptError, match="logit_scale"):
        elevater.evaluate(inputs, {**FAST, "logit_scale": "learned"}, seed=0)
