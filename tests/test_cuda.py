"""The embed path on a GPU: bf16 autocast, pinned memory, DataLoader workers. Skipped where there is no CUDA device."""

import numpy as np
import pytest
import torch

from tests.conftest import make_texts
from vlbench.embed import embed_image_splits, embed_text_sets
from vlbench.features import read_features
from vlbench.models.loading import load_model

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def cosine_rows(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


def embed(cfg, device, dataset, out, workers):
    loaded = load_model(cfg, device=device)
    embed_image_splits(loaded, dataset, out / "images", batch_size=5, num_workers=workers, progress=False)
    make_texts(dataset, out / "texts")
    embed_text_sets(loaded, out / "texts", out / "text")
    return read_features(out / "images" / "test.parquet", {}), read_features(out / "text" / "prompts.parquet", {})


@pytest.mark.parametrize("precision,min_cosine", [("amp_bf16", 0.99), ("amp_fp16", 0.999), ("fp32", 0.9999)])
def test_cuda_embeddings_match_cpu_fp32(toy_model_cfg, tiny_dataset, tmp_path, precision, min_cosine):
    cpu_images, cpu_text = embed(toy_model_cfg, "cpu", tiny_dataset, tmp_path / "cpu", workers=0)
    gpu_images, gpu_text = embed({**toy_model_cfg, "precision": precision}, "cuda", tiny_dataset, tmp_path / "gpu", workers=2)

    assert gpu_images.fingerprint["precision"] == precision
    assert cpu_images.fingerprint["precision"] == "fp32"
    assert gpu_images.table.column("sample_id").to_pylist() == cpu_images.table.column("sample_id").to_pylist()
    assert gpu_images.embeddings.dtype == np.float32
    assert cosine_rows(gpu_images.embeddings, cpu_images.embeddings).min() > min_cosine
    assert cosine_rows(gpu_text.embeddings, cpu_text.embeddings).min() > min_cosine



def test_torchvision_decoding_on_cuda_is_recorded_and_close_to_pillows(toy_model_cfg, tmp_path):
    """embed.decode: torchvision decodes JPEGs with nvJPEG on the device: the features say so (decode_device cuda)
    and stay close to Pillow's (the resize kernel and nvJPEG's IDCT differ: docs/protocols.md "Image decoding")."""
    from tests.test_decoding import write_photos

    write_photos(tmp_path / "prepared")
    loaded = load_model(toy_model_cfg, device="cuda")
    embed_image_splits(loaded, tmp_path / "prepared", tmp_path / "pil", num_workers=2, progress=False)
    embed_image_splits(loaded, tmp_path / "prepared", tmp_path / "tv", num_workers=2, progress=False, decode="torchvision")
    pil, tv = read_features(tmp_path / "pil" / "test.parquet", {}), read_features(tmp_path / "tv" / "test.parquet", {})
    assert tv.fingerprint["decode"] == "torchvision" and tv.fingerprint["decode_device"] == "cuda"
    assert cosine_rows(tv.embeddings, pil.embeddings).min() > 0.99


@pytest.mark.parametrize("selection", ["lora", "bitfit"])
def test_finetune_methods_prepare_a_cuda_model_as_the_cpu_one(selection):
    """LoRA's A is drawn from a CPU generator: on a CUDA model it used to fail ('Expected a cuda device type for
    generator'); now it is the CPU's draw, moved."""
    import copy

    from vlbench.finetune.selections import prepare
    from vlbench.models.toy import build_toy_model

    base = build_toy_model("vlbench-toy", 0)
    cpu, cpu_count = prepare(copy.deepcopy(base), selection, generator=torch.Generator().manual_seed(0))
    gpu, gpu_count = prepare(copy.deepcopy(base).cuda(), selection,
                             generator=torch.Generator().manual_seed(0))
    assert gpu_count == cpu_count
    for (name, p_cpu), (_, p_gpu) in zip(cpu.named_parameters(), gpu.named_parameters()):
        assert p_gpu.device.type == "cuda" and torch.equal(p_gpu.cpu(), p_cpu), name
