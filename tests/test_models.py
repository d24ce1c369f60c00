import time

import pytest
import torch

from vlbench.models.loading import (
    ModelError,
    load_model,
    network_reachable,
    validate_model_config,
)


def test_local_checkpoint_loads_and_fingerprints(toy_model_cfg):
    loaded = load_model(toy_model_cfg, device="cpu")
    fp = loaded.fingerprint
    assert fp["model"] == "toy-random" and fp["arch"] == "vlbench-toy" and fp["precision"] == "fp32"
    assert len(fp["weights_sha256"]) == 64
    assert fp["preprocess"]["size"] in (32, [32, 32])
    with torch.inference_mode():
        out = loaded.model.encode_text(loaded.tokenizer(["a red circle"]))
    assert out.shape[0] == 1


def test_cpu_runs_fp32_even_when_config_asks_for_bf16(toy_model_cfg):
    loaded = load_model({**toy_model_cfg, "precision": "amp_bf16"}, device="cpu")
    assert loaded.fingerprint["precision"] == "fp32" and loaded.autocast_dtype is None


@pytest.mark.skipif(network_reachable(), reason="this machine has network: the weights would be downloaded")
def test_missing_openai_weights_offline_fail_fast_naming_model_and_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    start = time.monotonic()
    with pytest.raises(ModelError) as err:
        load_model({"slug": "vitb16", "arch": "ViT-B-16-quickgelu", "pretrained": "openai"}, device="cpu",
                   cache_dir=str(tmp_path))
    assert time.monotonic() - start < 10
    message = str(err.value)
    assert "vitb16" in message and str(tmp_path) in message and "no network" in message
    assert "model.pretrained" in message  # says how to fix it


@pytest.mark.parametrize("cfg, match", [
    ({"slug": "x", "arch": "ViT-B-16-quickgeluu", "pretrained": "openai"}, "unknown open_clip architecture 'ViT-B-16-quickgeluu'.*ViT-B-16-quickgelu"),
    ({"slug": "x", "arch": "ViT-B-16", "pretrained": "openaii"}, "pretrained 'openaii' is no such file .* and no pretrained tag of 'ViT-B-16'.*laion2b_s34b_b88k"),
    ({"slug": "x", "arch": "ViT-B-16", "pretrained": "mycheckpoint"}, "'mycheckpoint' is no such file \\(checked '/.*/mycheckpoint'\\) and no pretrained tag"),
    ({"slug": "x", "arch": "ViT-B-16"}, r"lacks key\(s\) \['pretrained'\]"),
    ({"slug": "x", "arch": "ViT-B-16", "pretrained": "openai", "precision": "int3"}, "precision 'int3'"),
    ({"slug": "x", "arch": "vlbench-toy", "pretrained": "data/nowhere/checkpoint.pt"}, "checkpoint data/nowhere/checkpoint.pt not found"),
])
def test_bad_model_configs(cfg, match):
    with pytest.raises(ModelError, match=match):
        load_model(cfg, device="cpu")


def test_checkpoint_of_another_architecture_is_refused(toy_model_cfg):
    with pytest.raises(ModelError, match="does not fit architecture"):
        load_model({**toy_model_cfg, "arch": "vlbench-toy-wide"}, device="cpu")


def test_model_config_must_be_a_mapping():
    with pytest.raises(ModelError, match="must be a mapping"):
        validate_model_config(["vitb16"])
