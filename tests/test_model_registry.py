"""Model registry entries (conf/model) and SigLIP-style models: hf-hub archs, the sigmoid logit bias, and the
preprocessing and text handling an entry fixes, all offline (a tiny SigLIP-shaped repo in a local hub cache)."""

import inspect
import subprocess
import sys
import time
from typing import Any
from pathlib import Path

import numpy as np
import open_clip
import pytest
import torch
import yaml
from open_clip.factory import get_model_config
from open_clip.tokenizer import HFTokenizer, SimpleTokenizer
from open_clip.transform import PreprocessCfg

from tests.tiny_siglip import LOGIT_BIAS, LOGIT_SCALE, write_repo
from vlbench.embed import embed_image_splits, embed_text_sets
from vlbench.features import StaleFeaturesError, matches, read_features
from vlbench.models.identity import is_local_checkpoint, model_identity
from vlbench.models.loading import (
    PREPROCESS_KEYS,
    ModelError,
    load_model,
    normalize_preprocess,
    register_local_configs,
    validate_model_config,
)
from vlbench.reference import load_tables
from vlbench.texts import read_text_set

ROOT = Path(__file__).resolve().parents[1]
ENTRIES = {p.stem: yaml.safe_load(p.read_text()) for p in sorted((ROOT / "conf" / "model").glob("*.yaml"))}
PUBLISHED = {slug: cfg for slug, cfg in ENTRIES.items() if not is_local_checkpoint(str(cfg["pretrained"]))}
NEW = ("siglip-vitb16", "siglip2-vitb16", "datacomp-vitb16", "dfn-vitb16", "dfn-vitl14", "metaclip-vitb16")
REPO = "vlbench/tiny-siglip"
TINY = {"slug": "tiny-siglip", "arch": f"hf-hub:{REPO}", "pretrained": "hf-hub", "precision": "fp32",
        "preprocess": {"size": 32, "mode": "RGB", "mean": [0.5, 0.5, 0.5], "std": [0.5, 0.5, 0.5],
                       "interpolation": "bicubic", "resize_mode": "squash", "fill_color": 0},
        "text": {"context_length": 16, "clean": "canonicalize"}, "logits": "sigmoid"}


def tag_declaration(arch: str, tag: str) -> dict[str, Any]:
    """What open_clip builds for a published (arch, tag), as a registry entry declares it (`preprocess`, `text`,
    `logits`), read from open_clip's registries without building a model: the tag's pretrained cfg (mean, std,
    interpolation, resize_mode) over PreprocessCfg's defaults, the arch config's image size, token length and text
    cleaning (its tokenizer_kwargs, else the default of the tokenizer class open_clip picks) and init_logit_bias."""
    register_local_configs()
    model_cfg, pcfg = get_model_config(arch), open_clip.get_pretrained_cfg(arch, tag)
    if not model_cfg or not pcfg:
        raise ModelError(f"open_clip has no pretrained tag {tag!r} of architecture {arch!r}")
    defaults = {k: getattr(PreprocessCfg(), k) for k in PREPROCESS_KEYS}
    preprocess = {**defaults, **{k: pcfg[k] for k in PREPROCESS_KEYS if k in pcfg},
                  "size": model_cfg["vision_cfg"].get("image_size", defaults["size"])}
    text_cfg = model_cfg["text_cfg"]
    tokenizer = HFTokenizer if text_cfg.get("hf_tokenizer_name") else SimpleTokenizer
    clean = text_cfg.get("tokenizer_kwargs", {}).get("clean",
                                                     inspect.signature(tokenizer.__init__).parameters["clean"].default)
    return {"preprocess": normalize_preprocess(preprocess),
            "text": {"context_length": text_cfg.get("context_length", open_clip.tokenizer.DEFAULT_CONTEXT_LENGTH),
                     "clean": clean},
            "logits": "softmax" if model_cfg.get("init_logit_bias") is None else "sigmoid"}


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    cache = tmp_path_factory.mktemp("hub")
    write_repo(cache, REPO)
    return str(cache)


@pytest.fixture
def offline(monkeypatch):
    monkeypatch.setenv("VLBENCH_OFFLINE", "1")


# ------------------------------------------------------------------------------------------------ the registry


@pytest.mark.parametrize("slug", sorted(PUBLISHED))
def test_published_entries_exist_in_open_clip_and_declare_what_their_tag_builds(slug):
    """Every entry with a published tag names an open_clip (arch, tag) and declares the preprocessing, text handling
    and logits open_clip's registries give that tag, so that the numbers are the checkpoint's published ones."""
    cfg = validate_model_config(PUBLISHED[slug])
    assert cfg["slug"] == slug and cfg["weights_file"] == f"conf/model/{slug}.yaml"
    assert cfg["pretrained"] in open_clip.list_pretrained_tags_by_model(cfg["arch"])
    declared = {"preprocess": model_identity(cfg)["model_preprocess"], "text": cfg["text"], "logits": cfg["logits"]}
    assert declared == tag_declaration(cfg["arch"], cfg["pretrained"])


def test_the_new_entries_are_registered_with_their_scoring():
    assert set(NEW) <= set(PUBLISHED)
    assert {slug: ENTRIES[slug]["logits"] for slug in NEW if ENTRIES[slug]["logits"] == "sigmoid"} == {
        "siglip-vitb16": "sigmoid", "siglip2-vitb16": "sigmoid"}
    siglip = tag_declaration("ViT-B-16-SigLIP", "webli")
    assert siglip["preprocess"]["resize_mode"] == "squash" and siglip["text"] == {"context_length": 64,
                                                                                    "clean": "canonicalize"}
    # LAION-2B L/14 normalises with 0.5, not OpenAI's mean: the kind of difference an entry must carry
    assert tag_declaration("ViT-L-14", "laion2b_s32b_b82k")["preprocess"]["mean"] == [0.5, 0.5, 0.5]


def test_new_entries_have_published_imagenet_numbers_or_say_why_not():
    table = next(t for t in load_tables() if t.file == "open_clip_results.json")
    imagenet = {r.model: r.value for r in table.rows if r.dataset == "imagenet-1k"}
    assert imagenet["siglip-vitb16"] == 0.7604 and imagenet["dfn-vitb16"] == 0.7624
    assert imagenet["datacomp-vitb16"] == 0.7349 and imagenet["metaclip-vitb16"] == 0.7212
    assert imagenet["dfn-vitl14"] == 0.8141
    assert "siglip2-vitb16" not in imagenet
    assert any("siglip2-vitb16" in note for note in table.notes)


@pytest.mark.skipif(not Path("/work/shared/reference/open_clip/openclip_results.csv").is_file(),
                    reason="open_clip's results CSV is not beside the checkout")
def test_reference_file_is_what_the_tool_makes_from_the_csv(tmp_path):
    out = tmp_path / "open_clip_results.json"
    (tmp_path / "data").mkdir()
    subprocess.run([sys.executable, "tools/openclip_reference.py", "/work/shared/reference/open_clip/openclip_results.csv",
                    "--out", str(out), "--out-dir", str(tmp_path)], cwd=ROOT, check=True, capture_output=True)
    assert out.read_text() == (ROOT / "vlbench/reference/data/open_clip_results.json").read_text()


# ------------------------------------------------------------------------------------------ hf-hub and SigLIP


FAMILIES_2025 = {"pe-core-vitb16": ("PE-Core-B-16", "meta"), "pe-core-vitl14": ("PE-Core-L-14-336", "meta"),
                 "metaclip2-vith14": ("ViT-H-14-worldwide-quickgelu", "metaclip2_worldwide"),
                 "mobileclip2-s0": ("MobileCLIP2-S0", "dfndr2b"), "mobileclip2-b": ("MobileCLIP2-B", "dfndr2b"),
                 "mobileclip2-l14": ("MobileCLIP2-L-14", "dfndr2b"),
                 "siglip2-vitl16": ("ViT-L-16-SigLIP2-256", "webli"), "siglip2-so400m": ("ViT-SO400M-14-SigLIP2", "webli")}


def test_the_2025_families_are_registered_under_open_clips_names():
    """PE-Core B/16 and L/14, MetaCLIP 2 worldwide, MobileCLIP2, SigLIP 2 at three sizes (open_clip >= 3.3's tags);
    each declares what its tag builds (test above): SigLIP 2 sigmoid, the others softmax; PE's 32 text tokens."""
    for slug, (arch, tag) in FAMILIES_2025.items():
        assert (ENTRIES[slug]["arch"], ENTRIES[slug]["pretrained"]) == (arch, tag)
    assert {s for s in FAMILIES_2025 if ENTRIES[s]["logits"] == "sigmoid"} == {"siglip2-vitl16", "siglip2-so400m"}
    assert ENTRIES["pe-core-vitb16"]["text"] == {"context_length": 32, "clean": "lower"}
    assert ENTRIES["pe-core-vitl14"]["preprocess"]["size"] == 336
    assert ENTRIES["metaclip2-vith14"]["text"]["clean"] == "whitespace"  # XLM-V's tokenizer keeps case
    assert ENTRIES["mobileclip2-s0"]["preprocess"]["mean"] == [0.0, 0.0, 0.0]
    sizes = {ENTRIES[s]["arch"] for s in ENTRIES if "SigLIP2" in ENTRIES[s]["arch"]}
    assert len(sizes) >= 3


@pytest.mark.parametrize("slug", sorted(FAMILIES_2025))
def test_a_2025_family_entry_without_its_weights_fails_fast_offline(slug, tmp_path, offline):
    start = time.monotonic()
    with pytest.raises(ModelError) as err:
        load_model(ENTRIES[slug], device="cpu", cache_dir=str(tmp_path))
    assert time.monotonic() - start < 10
    assert f"model {slug!r}" in str(err.value) and str(tmp_path) in str(err.value) and "no network" in str(err.value)


def test_hf_hub_model_loads_offline_from_the_cache_with_its_bias_scale_and_text_handling(hub, offline):
    start = time.monotonic()
    loaded = load_model(TINY, device="cpu", cache_dir=hub)
    assert time.monotonic() - start < 20
    fp = loaded.fingerprint
    assert fp["logits"] == "sigmoid"
    assert fp["logit_scale"] == pytest.approx(LOGIT_SCALE) and fp["logit_bias"] == pytest.approx(LOGIT_BIAS)
    assert fp["model_preprocess"]["resize_mode"] == "squash" and fp["model_preprocess"]["interpolation"] == "bicubic"
    assert fp["text"] == {"context_length": 16, "clean": "canonicalize"}
    assert [type(t).__name__ for t in loaded.preprocess.transforms][0] == "Resize"  # squash: no CenterCrop
    assert "CenterCrop" not in [type(t).__name__ for t in loaded.preprocess.transforms]
    tokens = loaded.tokenizer(["A Photo, of the RED dog!"])
    assert tokens.shape == (1, 16) and torch.equal(tokens, loaded.tokenizer(["a photo of the red dog"]))


def test_the_entry_overrides_the_repo_preprocessing_and_text_and_says_so(hub, offline):
    other = {**TINY, "preprocess": {"resize_mode": "shortest", "interpolation": "bilinear"},
             "text": {"context_length": 8, "clean": "whitespace"}}
    loaded = load_model(other, device="cpu", cache_dir=hub)
    steps = [type(t).__name__ for t in loaded.preprocess.transforms]
    assert steps[:2] == ["Resize", "CenterCrop"] and loaded.preprocess.transforms[0].interpolation.value == "bilinear"
    assert loaded.fingerprint["model_preprocess"]["resize_mode"] == "shortest"
    assert loaded.fingerprint["text"] == {"context_length": 8, "clean": "whitespace"}
    # whitespace cleaning keeps case: "RED" is not the vocabulary's "red"
    assert loaded.tokenizer(["RED"]).shape == (1, 8)
    assert not torch.equal(loaded.tokenizer(["RED"]), loaded.tokenizer(["red"]))


@pytest.mark.parametrize("change, match", [
    ({"logits": "softmax"}, r"model.logits is 'softmax', built 'sigmoid'"),
    ({"preprocess": {"size": 64}}, r"model.preprocess.size is \[64, 64\], built \[32, 32\]"),
    ({"text": {"context_length": 40}}, "context_length 40 exceeds the text tower's 16 positions"),
    ({"preprocess": {"crop": 1.0}}, r"unknown key\(s\) model.preprocess.crop"),
    ({"text": {"clean": "upper"}}, "model.text.clean 'upper' is not one of"),
    ({"pretrained": "webli"}, "carries its repo's weights: set model.pretrained to 'hf-hub'"),
])
def test_an_entry_the_model_cannot_have_is_refused(hub, offline, change, match):
    with pytest.raises(ModelError, match=match):
        load_model({**TINY, **change}, device="cpu", cache_dir=hub)


def test_hf_hub_model_missing_offline_fails_fast_naming_model_and_cache(tmp_path, offline):
    start = time.monotonic()
    with pytest.raises(ModelError) as err:
        load_model({**TINY, "slug": "siglip2-hub", "arch": "hf-hub:timm/ViT-B-16-SigLIP2-256"}, device="cpu",
                   cache_dir=str(tmp_path))
    assert time.monotonic() - start < 10
    message = str(err.value)
    assert "'siglip2-hub'" in message and str(tmp_path) in message and "timm/ViT-B-16-SigLIP2-256" in message
    assert "no network" in message


def test_registered_siglip_missing_offline_fails_fast_naming_model_and_cache(tmp_path, offline):
    start = time.monotonic()
    with pytest.raises(ModelError) as err:
        load_model(ENTRIES["siglip-vitb16"], device="cpu", cache_dir=str(tmp_path))
    assert time.monotonic() - start < 10
    assert "'siglip-vitb16'" in str(err.value) and str(tmp_path) in str(err.value)


# ------------------------------------------------------------------------------- features and their readers


def test_features_record_the_scale_and_bias_and_refuse_another_preprocessing(hub, offline, tiny_dataset, tiny_texts,
                                                                              tmp_path):
    loaded = load_model(TINY, device="cpu", cache_dir=hub)
    images, texts = tmp_path / "f" / "images", tmp_path / "f" / "text"
    embed_image_splits(loaded, tiny_dataset, images, num_workers=0, progress=False)
    embed_text_sets(loaded, tiny_texts, texts)
    stamp = read_text_set(tiny_texts / "prompts.parquet")[1]
    identity = model_identity(TINY)
    image_features = read_features(images / "test.parquet", identity)
    text_features = read_features(texts / "prompts.parquet", {**identity, **stamp})
    for fp in (image_features.fingerprint, text_features.fingerprint):
        assert fp["logit_scale"] == pytest.approx(LOGIT_SCALE) and fp["logit_bias"] == pytest.approx(LOGIT_BIAS)
    # the recorded scale and bias give the model's own pair scores, sigmoid(scale * cos + bias)
    with torch.inference_mode():
        x = loaded.model.encode_image(torch.zeros(1, 3, 32, 32), normalize=True)
        t = loaded.model.encode_text(loaded.tokenizer(["a red square"]), normalize=True)
        expected = torch.sigmoid(loaded.model.logit_scale.exp() * x @ t.T + loaded.model.logit_bias).item()
    fp = image_features.fingerprint
    assert expected == pytest.approx(1 / (1 + np.exp(-(fp["logit_scale"] * float(x @ t.T) + fp["logit_bias"]))),
                                     rel=1e-5)
    # a reader asked for another resize, interpolation or token length refuses these features
    for other, key in [({"preprocess": {**TINY["preprocess"], "resize_mode": "shortest"}}, "model_preprocess"),
                       ({"preprocess": {**TINY["preprocess"], "interpolation": "bilinear"}}, "model_preprocess"),
                       ({"text": {"context_length": 8, "clean": "canonicalize"}}, "text"),
                       ({"logits": "softmax"}, "logits")]:
        demanded = model_identity({**TINY, **other})
        assert demanded != identity
        with pytest.raises(StaleFeaturesError, match=key):
            read_features(images / "test.parquet", demanded)
        with pytest.raises(StaleFeaturesError, match=key):
            read_features(texts / "prompts.parquet", {**demanded, **stamp})


def test_features_made_with_another_preprocessing_are_refused_by_the_entrys_reader(hub, offline, tiny_dataset,
                                                                                   tmp_path):
    """The same model, embedded once as the entry says and once with an overridden interpolation: each file is read
    only by the reader of its own entry."""
    bilinear = {**TINY, "preprocess": {**TINY["preprocess"], "interpolation": "bilinear"}}
    for name, cfg in (("bicubic", TINY), ("bilinear", bilinear)):
        embed_image_splits(load_model(cfg, device="cpu", cache_dir=hub), tiny_dataset, tmp_path / name,
                           num_workers=0, progress=False)
    read_features(tmp_path / "bicubic" / "test.parquet", model_identity(TINY))
    read_features(tmp_path / "bilinear" / "test.parquet", model_identity(bilinear))
    with pytest.raises(StaleFeaturesError, match="interpolation"):
        read_features(tmp_path / "bilinear" / "test.parquet", model_identity(TINY))
    with pytest.raises(StaleFeaturesError, match="bicubic"):
        read_features(tmp_path / "bicubic" / "test.parquet", model_identity(bilinear))


def test_demanded_mappings_match_on_the_keys_they_name():
    found = {"size": [224, 224], "mean": [0.5, 0.5, 0.5], "resize_mode": "squash"}
    assert matches(found, {"resize_mode": "squash"}) and matches(found, found)
    assert not matches(found, {"resize_mode": "shortest"}) and not matches(found, {"crop": 1})
    assert not matches({"a": 1}, 1) and matches(3, 3)


def test_identity_of_an_entry_is_computed_without_torch():
    code = ("import sys, yaml; from vlbench.models.identity import model_identity; "
            f"i = model_identity(yaml.safe_load(open({str(ROOT / 'conf/model/siglip-vitb16.yaml')!r}))); "
            "assert 'torch' not in sys.modules, 'torch imported'; print(i['model_preprocess']['resize_mode'], i['text'])")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert out.strip() == "squash {'context_length': 64, 'clean': 'canonicalize'}"


def test_a_squashing_model_embeds_squash_datasets_with_its_own_resize(hub, offline):
    """VTAB's squash datasets (`preprocess: squash` / `fewtrans`) work with a model that squashes already (SigLIP):
    its one Resize is kept, the mode's interpolation and normalisation replace its own where the mode says."""
    from vlbench.datasets.canonical import ClassInfo, DatasetMeta
    from vlbench.embed import model_for_dataset

    loaded = load_model(TINY, device="cpu", cache_dir=hub)
    classes = [ClassInfo(index=0, name="a"), ClassInfo(index=1, name="b")]
    squash = model_for_dataset(loaded, DatasetMeta(name="kitti", task="single-label", metric="accuracy",
                                                   classes=classes, preprocess="squash"))
    assert repr(squash.preprocess) == repr(loaded.preprocess)
    fewtrans = model_for_dataset(loaded, DatasetMeta(name="dtd", task="single-label", metric="accuracy",
                                                     classes=classes, preprocess="fewtrans"))
    resize, *_, normalize = fewtrans.preprocess.transforms
    assert tuple(resize.size) == (32, 32) and resize.interpolation.value == "bilinear"
    assert normalize.mean == [0.485, 0.456, 0.406]
    assert fewtrans.fingerprint["preprocess"]["interpolation"] == "bilinear"
    assert fewtrans.fingerprint["model_preprocess"] == loaded.fingerprint["model_preprocess"]


def test_the_sigmoid_bias_changes_no_argmax_or_per_class_ranking_but_would_change_elevater_roc_auc():
    """Why the analyses keep 100 * cos for SigLIP models (docs/protocols.md, "The sigmoid logit bias in the analyses"):
    with the model's own scores sigmoid(scale * cos + bias), accuracy, mean-per-class accuracy and per-class 11-point
    mAP are the same numbers; ELEVATER's ROC-AUC (probability of class 1) is not, so ELEVATER scoring keeps its
    toolkit's softmax(100 * cos) for every model."""
    from vlbench import metrics

    rng = np.random.default_rng(0)
    cos = rng.uniform(-0.2, 0.4, (400, 5)).astype(np.float32)
    own = 1 / (1 + np.exp(-(LOGIT_SCALE * cos.astype(np.float64) + LOGIT_BIAS)))
    labels = rng.integers(0, 5, 400)
    for name in ("accuracy", "mean_per_class"):
        assert metrics.compute(name, own, labels) == metrics.compute(name, 100 * cos, labels)
    multi = (rng.uniform(size=(400, 5)) < 0.3).astype(int)
    assert metrics.compute("map_11point", own, multi) == pytest.approx(metrics.compute("map_11point", 100 * cos, multi))
    binary = rng.integers(0, 2, 400)
    softmax = np.exp(100 * cos[:, :2]) / np.exp(100 * cos[:, :2]).sum(axis=1, keepdims=True)
    assert metrics.compute("roc_auc", own[:, :2], binary, "elevater") != pytest.approx(
        metrics.compute("roc_auc", softmax, binary, "elevater"), abs=1e-3)


def test_plan_builds_an_hf_hub_arch_from_its_cached_config_without_weights(hub, monkeypatch, offline):
    from vlbench.models.timing import build_image_model

    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", hub)  # where open_clip looks without cache_dir
    model, preprocess, precision = build_image_model(TINY, "cpu")
    assert model.visual.image_size == (32, 32) and precision == "fp32"
    assert model.logit_bias.item() == pytest.approx(-10)  # the config's init, not the checkpoint's: no weights read


def test_a_hub_tokenizer_missing_from_the_cache_is_a_model_error_naming_it(tmp_path, offline):
    snapshot = write_repo(tmp_path, REPO)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (snapshot / name).unlink()
    start = time.monotonic()
    with pytest.raises(ModelError, match=f"Hugging Face tokenizer is not in the cache {tmp_path}"):
        load_model(TINY, device="cpu", cache_dir=str(tmp_path))
    assert time.monotonic() - start < 20


@pytest.mark.parametrize("arch", ["hf-hub:", "hf-hub:just-a-name", "hf-hub:a/b/c"])
def test_a_malformed_hub_name_is_refused(arch):
    with pytest.raises(ModelError, match="must name a hub repo as hf-hub:org/name"):
        validate_model_config({**TINY, "arch": arch})


def test_a_run_with_another_preprocessing_gets_no_verdict_against_the_published_number():
    """open_clip's rows check the entry's preprocessing and text handling against reports/model.json: the entry's
    own run is compared; a run that squashed differently or cut texts shorter is listed as not compared."""
    from vlbench.reference.verdicts import reference_report

    table = next(t for t in load_tables() if t.file == "open_clip_results.json")
    cfg = ENTRIES["siglip-vitb16"]
    model = {"model": "siglip-vitb16", "model_preprocess": model_identity(cfg)["model_preprocess"],
             "text": cfg["text"], "logits": "sigmoid"}
    metrics = {"zeroshot": {"imagenet-1k": {"accuracy": 0.7601}}}
    results = {"zeroshot": {"imagenet-1k": {"params": {"prompts_per_class": 80, "split": "test"}}}}
    (c,) = reference_report([table], metrics, model, results)["comparisons"]
    assert c["verdict"] == "reproduced" and "model.model_preprocess.resize_mode" in c["settings_checked"]
    assert "model.text.clean" in c["settings_checked"]
    other = {**model, "model_preprocess": {**model["model_preprocess"], "resize_mode": "shortest"},
             "text": {"context_length": 16, "clean": "canonicalize"}}
    report = reference_report([table], metrics, other, results)
    assert report["applies"] is False
    reason = report["not_compared"][0]["reason"]
    assert "model.model_preprocess.resize_mode: run 'shortest', reference 'squash'" in reason
    assert "model.text.context_length: run 16, reference 64" in reason
