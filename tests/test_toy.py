import hashlib
import io
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import open_clip
import pytest
import torch
import yaml

from vlbench.datasets.canonical import DatasetError
from vlbench.datasets.synthetic import build
from vlbench.models import register_local_configs, toy
from vlbench.models.toy import train_toy_clip

SETTINGS = dict(steps=6, batch_size=32, lr=2e-3, weight_decay=0.1, warmup_steps=1, seed=0, progress=False)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    out = tmp_path_factory.mktemp("corpus") / "corpus"
    build("corpus", {"source": "synthetic", "task": "corpus", "seed": 3, "splits": {"train": 128}}, out)
    return out


def test_training_lowers_the_loss_and_writes_checkpoint_and_log(corpus, tmp_path):
    ckpt = tmp_path / "toy" / "checkpoint.pt"
    stats = train_toy_clip(corpus, "vlbench-toy", ckpt, **{**SETTINGS, "steps": 12})
    assert ckpt.exists() and (ckpt.parent / "train_log.csv").exists()
    rows = (ckpt.parent / "train_log.csv").read_text().splitlines()
    assert rows[0] == "step,loss,lr" and len(rows) == 13
    assert stats["final_loss"] < stats["initial_loss"]
    assert stats["images"] == 128


def test_checkpoint_reloads_through_open_clip_with_identical_embeddings(corpus, tmp_path):
    ckpt = tmp_path / "checkpoint.pt"
    train_toy_clip(corpus, "vlbench-toy", ckpt, **SETTINGS)
    register_local_configs()
    a, _, _ = open_clip.create_model_and_transforms("vlbench-toy", pretrained=str(ckpt))
    b, _, _ = open_clip.create_model_and_transforms("vlbench-toy", pretrained=str(ckpt))
    a.eval(), b.eval()
    x = torch.rand(2, 3, 32, 32)
    with torch.inference_mode():
        np.testing.assert_array_equal(a.encode_image(x).numpy(), b.encode_image(x).numpy())
    fresh = open_clip.create_model("vlbench-toy")
    assert not torch.equal(fresh.state_dict()["text_projection"], a.state_dict()["text_projection"])


def test_same_seed_same_weights_other_seed_other_weights(corpus, tmp_path):
    weights, hashes = [], []
    for name, seed in (("a", 0), ("b", 0), ("c", 1)):
        summary = train_toy_clip(corpus, "vlbench-toy", tmp_path / name / "ckpt.pt", **{**SETTINGS, "seed": seed})
        weights.append(torch.load(tmp_path / name / "ckpt.pt"))
        hashes.append(summary["weights_sha256"])
    assert all(torch.equal(weights[0][k], weights[1][k]) for k in weights[0])
    assert hashes[0] == hashes[1] != hashes[2]  # the fingerprint identifies the weights, byte for byte
    assert not all(torch.equal(weights[0][k], weights[2][k]) for k in weights[0])


def test_corpus_without_train_split_or_captions_is_a_clear_error(corpus, tmp_path):
    with pytest.raises(DatasetError, match="split 'train' not found"):
        train_toy_clip(tmp_path, "vlbench-toy", tmp_path / "x.pt", **SETTINGS)
    shapes = tmp_path / "shapes"
    build("shapes", {"source": "synthetic", "task": "shapes", "splits": {"train": 40}}, shapes)
    with pytest.raises(DatasetError, match="no 'captions' column"):
        train_toy_clip(shapes, "vlbench-toy", tmp_path / "x.pt", **SETTINGS)
    assert not (tmp_path / "x.pt").exists()


def test_three_steps_twice_give_the_same_checkpoint_bytes_and_leave_the_callers_rng_alone(corpus, tmp_path):
    torch.manual_seed(1234)
    rng_before, deterministic_before = torch.get_rng_state(), torch.are_deterministic_algorithms_enabled()
    runs = [train_toy_clip(corpus, "vlbench-toy", tmp_path / n / "ckpt.pt", **{**SETTINGS, "steps": 3}) for n in "ab"]
    assert (tmp_path / "a" / "ckpt.pt").read_bytes() == (tmp_path / "b" / "ckpt.pt").read_bytes()
    assert (tmp_path / "a" / "train_log.csv").read_bytes() == (tmp_path / "b" / "train_log.csv").read_bytes()
    assert runs[0]["weights_sha256"] == runs[1]["weights_sha256"]
    assert runs[0]["initial_loss"] == runs[1]["initial_loss"] and runs[0]["final_loss"] == runs[1]["final_loss"]
    assert torch.equal(torch.get_rng_state(), rng_before)
    assert torch.are_deterministic_algorithms_enabled() == deterministic_before


def test_the_named_pieces_compose_into_exactly_train_toy_clip(corpus, tmp_path):
    """build model -> load corpus -> batches -> optimizer -> loop is the whole of training: same weights."""
    steps = 2
    train_toy_clip(corpus, "vlbench-toy", tmp_path / "ckpt.pt", **{**SETTINGS, "steps": steps})
    seed = SETTINGS["seed"]
    with toy._deterministic(seed), torch.random.fork_rng(devices=[]):
        model = toy.build_toy_model("vlbench-toy", seed)
        pp = dict(model.visual.preprocess_cfg)
        images, tokens, owner = toy._load_corpus(corpus, "vlbench-toy", pp, None)
        batches = toy._Batches(images, tokens, owner, pp, SETTINGS["batch_size"], seed)
        optimizer = toy.make_optimizer(model, SETTINGS["lr"], SETTINGS["weight_decay"])
        schedule = toy._lr_schedule(SETTINGS["lr"], SETTINGS["warmup_steps"], steps)
        log = toy._train_loop(model, optimizer, batches, schedule, steps, 1.0)
    assert [s for s, _, _ in log] == [1, 2]
    expected = torch.load(tmp_path / "ckpt.pt")
    got = model.state_dict()
    assert list(got) == list(expected)
    assert all(torch.equal(got[k], expected[k]) for k in expected)
    # loaded into a model and saved as a state_dict again, the checkpoint gives its own bytes (what `make verify-demo`
    # and the check of a retrained checkpoint against the committed one rely on)
    register_local_configs()
    reloaded = open_clip.create_model("vlbench-toy")
    reloaded.load_state_dict(expected)
    before, again = io.BytesIO(), io.BytesIO()
    torch.save(got, before)
    torch.save(reloaded.state_dict(), again)
    assert before.getvalue() == again.getvalue()


def test_training_without_the_nan_fill_gives_the_weights_of_training_with_it(corpus, tmp_path):
    """_deterministic turns off deterministic mode's NaN fill of new tensors (about 5% of a step's CPU): no kernel of
    training reads memory it did not write, so the weights are the same bytes as with the fill, and the caller's
    setting is restored."""
    steps, seed = 3, SETTINGS["seed"]
    fill_before = torch.utils.deterministic.fill_uninitialized_memory
    train_toy_clip(corpus, "vlbench-toy", tmp_path / "ckpt.pt", **{**SETTINGS, "steps": steps})
    assert torch.utils.deterministic.fill_uninitialized_memory == fill_before
    with toy._deterministic(seed), torch.random.fork_rng(devices=[]):
        assert torch.utils.deterministic.fill_uninitialized_memory is False
        torch.utils.deterministic.fill_uninitialized_memory = True  # deterministic mode's default
        model = toy.build_toy_model("vlbench-toy", seed)
        pp = dict(model.visual.preprocess_cfg)
        images, tokens, owner = toy._load_corpus(corpus, "vlbench-toy", pp, None)
        batches = toy._Batches(images, tokens, owner, pp, SETTINGS["batch_size"], seed)
        optimizer = toy.make_optimizer(model, SETTINGS["lr"], SETTINGS["weight_decay"])
        toy._train_loop(model, optimizer, batches, toy._lr_schedule(SETTINGS["lr"], SETTINGS["warmup_steps"], steps),
                        steps, 1.0)
    assert torch.utils.deterministic.fill_uninitialized_memory == fill_before
    expected = torch.load(tmp_path / "ckpt.pt")
    assert all(torch.equal(model.state_dict()[k], expected[k]) for k in expected)


# pretrain's stage process on a 3-step schedule (64 corpus images): its checkpoint and log, byte for byte
PINNED_CHECKPOINT_SHA256 = "b06faf5454b4c08e8b634b843f34b21ee0974a1524178c3e68f6ac0a256fd695"
PINNED_LOG_SHA256 = "051f487c98935a8425f8ec7b12a3716a3a02d35ace679c386d670f8b3dfcd42e"


def test_the_stage_trains_a_short_schedule_to_the_pinned_bytes_and_keeps_only_its_two_outputs(tmp_path):
    """`python -m stages.pretrain` runs under the portable settings (vlbench.portable), so these bytes are the same on
    every x86-64 CPU with AVX2; the demo's committed checkpoint relies on the same (`make verify-demo` retrains it).
    The model folder holds the two outputs kept in git and nothing else: the corpus was built in a temporary folder
    and removed (as was one a killed run left), and the checkpoint is the model's state_dict (no optimizer state)."""
    train = {"corpus": {"source": "synthetic", "task": "corpus", "seed": 1, "image_size": 32, "splits": {"train": 64}},
             "steps": 3, "batch_size": 32, "lr": 0.003, "weight_decay": 0.1, "warmup_steps": 1, "seed": 0}
    model = {"slug": "toy-pin", "arch": "vlbench-toy", "train": train}
    (tmp_path / "params.yaml").write_text(yaml.safe_dump({"model": model}))
    root = Path(__file__).resolve().parent.parent
    out = tmp_path / "data/models/toy-pin"
    (out / ".corpus-killed").mkdir(parents=True)  # the temporary corpus of a run that was killed
    (out / ".corpus-killed/train.parquet").write_bytes(b"partial")
    subprocess.run([sys.executable, "-m", "stages.pretrain", "--model", "toy-pin"], cwd=tmp_path, check=True,
                   capture_output=True, env={**os.environ, "PYTHONPATH": str(root)})
    assert sorted(p.name for p in out.iterdir()) == ["checkpoint.pt", "train_log.csv"]
    assert hashlib.sha256((out / "checkpoint.pt").read_bytes()).hexdigest() == PINNED_CHECKPOINT_SHA256
    assert hashlib.sha256((out / "train_log.csv").read_bytes()).hexdigest() == PINNED_LOG_SHA256
    state = torch.load(out / "checkpoint.pt", weights_only=True)
    register_local_configs()
    assert list(state) == list(open_clip.create_model("vlbench-toy").state_dict())
