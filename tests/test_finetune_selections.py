"""Trainable-parameter selections (vlbench/finetune/selections.py) on real open_clip models: the toy ResNet, a tiny ViT
built here, and ViT-B/16's architecture on the meta device (no weights): counts against the architecture, LoRA's
adapters, frozen parameters bit for bit after training."""

from __future__ import annotations

import copy
import json

import open_clip
import pytest
import torch
from open_clip.model import CLIP
from torch import nn

from vlbench.finetune import selections as fm
from vlbench.models import CONFIG_DIR, register_local_configs

TOY = json.loads((CONFIG_DIR / "vlbench-toy.json").read_text())
TINY_VIT = {"embed_dim": 32,
            "vision_cfg": {"layers": 2, "width": 64, "head_width": 32, "patch_size": 8, "image_size": 32},
            "text_cfg": {"context_length": 8, "vocab_size": 100, "width": 32, "heads": 2, "layers": 1}}


@pytest.fixture(scope="module")
def toy():
    register_local_configs()
    torch.manual_seed(0)
    return open_clip.create_model("vlbench-toy")


@pytest.fixture(scope="module")
def vit():
    torch.manual_seed(0)
    return CLIP(**TINY_VIT).eval()


def numel(params) -> int:
    return sum(p.numel() for p in params)


def bias_numel_by_module_type(visual: nn.Module) -> int:
    """BitFit's parameters counted another way: the bias of every layer type that has one."""
    total = 0
    for m in visual.modules():
        if isinstance(m, (nn.Linear, nn.Conv2d, nn.LayerNorm, nn.BatchNorm2d)) and m.bias is not None:
            total += m.bias.numel()
        if isinstance(m, nn.MultiheadAttention) and m.in_proj_bias is not None:
            total += m.in_proj_bias.numel()
    return total


def test_tower_selections_train_exactly_their_tower(toy):
    counts = {s: fm.prepare(copy.deepcopy(toy), s)[1] for s in ("visual", "text", "all")}
    visual = numel(toy.visual.parameters())
    assert counts["visual"] == visual
    assert counts["all"] == numel(toy.parameters()) - toy.logit_scale.numel()  # the scale never trains
    assert counts["text"] == counts["all"] - visual
    model, _ = fm.prepare(copy.deepcopy(toy), "text")
    assert "token_embedding.weight" in fm.trainable_names(model) and "logit_scale" not in fm.trainable_names(model)
    assert not any(n.startswith("visual.") for n in fm.trainable_names(model))


def test_lora_and_bitfit_counts_on_the_toy_follow_its_config(toy):
    rank = 4
    pool_dim = TOY["vision_cfg"]["width"] * 32  # ModifiedResNet's attention pool runs at width x 32 channels
    lora = fm.prepare(copy.deepcopy(toy), "lora", rank=rank)[1]
    assert lora == 2 * (rank * pool_dim + pool_dim * rank)  # query and value: A (r x d) and B (d x r) each
    assert fm.prepare(copy.deepcopy(toy), "bitfit")[1] == bias_numel_by_module_type(toy.visual)


def test_vit_b16_counts_from_the_architecture_alone():
    """ViT-B/16 (OpenAI's config) on the meta device: LoRA rank 4 on q and v of 12 blocks of width 768; BitFit's
    biases per block (ln_1, in_proj 3w, out_proj, ln_2, c_fc 4w, c_proj) plus ln_pre and ln_post."""
    with torch.device("meta"):
        model = open_clip.create_model("ViT-B-16-quickgelu", device="meta")
    layers, width, rank = 12, 768, 4
    assert fm.prepare(copy.deepcopy(model), "lora", rank=rank)[1] == layers * 2 * (rank * width + width * rank)
    assert fm.prepare(copy.deepcopy(model), "bitfit")[1] == layers * (1 + 3 + 1 + 1 + 4 + 1) * width + 2 * width
    assert fm.prepare(copy.deepcopy(model), "visual")[1] == numel(model.visual.parameters())


def test_lora_starts_as_the_identity_and_adapts_query_and_value_rows_only(vit):
    x = torch.randn(3, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        before = vit.encode_image(x)
    model, count = fm.prepare(copy.deepcopy(vit), "lora", rank=2, alpha=4.0, generator=torch.Generator().manual_seed(0))
    layers, width = TINY_VIT["vision_cfg"]["layers"], TINY_VIT["vision_cfg"]["width"]
    assert count == layers * 2 * 2 * 2 * width
    with torch.no_grad():
        torch.testing.assert_close(model.encode_image(x), before, rtol=0, atol=1e-6)  # B = 0
    attn = model.visual.transformer.resblocks[0].attn
    delta = attn.parametrizations.in_proj_weight[0]
    with torch.no_grad():
        for b in delta.b:
            b.fill_(0.1)
    w0 = attn.parametrizations.in_proj_weight.original
    w = attn.in_proj_weight
    rows = slice(width, 2 * width)
    assert torch.equal(w[rows], w0[rows])  # keys untouched
    expected_q = w0[:width] + (4.0 / 2) * delta.b[0] @ delta.a[0]  # alpha / rank x B A
    torch.testing.assert_close(w[:width], expected_q)
    assert not torch.equal(w[2 * width:], w0[2 * width:])


def test_a_training_step_changes_the_trainable_parameters_only(vit, toy):
    toy = copy.deepcopy(toy)
    with torch.no_grad():  # open_clip zero-initialises each bottleneck's last BatchNorm (no gradient inside it)
        for name, p in toy.visual.named_parameters():
            if name.endswith("bn3.weight"):
                p.fill_(1.0)
    for model0, x in ((vit, torch.randn(4, 3, 32, 32)), (toy, torch.randn(4, 3, 32, 32))):
        for selection in ("lora", "bitfit", "visual"):
            model, _ = fm.prepare(copy.deepcopy(model0), selection, generator=torch.Generator().manual_seed(0))
            frozen = {n: p.detach().clone() for n, p in model.named_parameters() if not p.requires_grad}
            trainable = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
            opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=1e-2)
            moved = set()
            for _ in range(2):  # LoRA's B is zero at first: A moves from the second step
                opt.zero_grad()
                model.encode_image(x).pow(2).sum().backward()
                moved |= {n for n, p in model.named_parameters() if p.grad is not None and p.grad.abs().max() > 0}
                opt.step()
            params = dict(model.named_parameters())
            assert all(torch.equal(params[n], v) for n, v in frozen.items()), selection
            # a key bias gets no gradient (softmax ignores a shift common to all keys): every other one moves
            assert set(trainable) - moved <= {"visual.attnpool.k_proj.bias"}, selection
            assert all(not torch.equal(params[n], trainable[n]) for n in moved), selection


def test_bad_selection_and_a_tower_without_attention_are_one_line_errors(toy):
    with pytest.raises(fm.FinetuneError, match="unknown fine-tuning selection 'prompt'"):
        fm.prepare(copy.deepcopy(toy), "prompt")
    bare = copy.deepcopy(toy)
    bare.visual.attnpool = nn.Identity()
    with pytest.raises(fm.FinetuneError, match="finetune.fewtrans_episodic.lora"):
        fm.prepare(bare, "lora")
