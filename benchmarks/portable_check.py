"""Portable arithmetic check: a short toy training and embedding under vlbench.portable, as one hash per library.

Run it on two machines (or under settings that emulate another CPU) with the same torch, numpy and open_clip: equal
hashes mean the demo's bytes would be equal there. Needs only torch, numpy and open_clip (so it also runs on a
bare GPU machine's CPU with carried wheels); inputs are generated from a seed, not read from the demo's data.

    python benchmarks/portable_check.py --steps 20            # prints one JSON line
    VLBENCH_PORTABLE=0 python benchmarks/portable_check.py    # the libraries' own choice of kernels
"""

from __future__ import annotations

import argparse
import hashlib
import json
import platform
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import stages  # noqa: E402,F401  (vlbench.portable.apply(), before numpy and torch load, as in every stage)
import numpy as np  # noqa: E402
import torch  # noqa: E402

from vlbench import portable  # noqa: E402
from vlbench.models import register_local_configs  # noqa: E402


def digest(*arrays) -> str:
    h = hashlib.sha256()
    for a in arrays:
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()[:16]


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def toy_model():
    import open_clip

    register_local_configs()
    torch.manual_seed(0)
    return open_clip.create_model("vlbench-toy", pretrained=None, device="cpu")


def train_hash(steps: int, batch: int) -> tuple[str, str]:
    """Weights after `steps` AdamW steps of open_clip's ClipLoss (toy training's step), and features after it."""
    from open_clip.loss import ClipLoss

    if portable.enabled():
        torch.set_num_threads(portable.THREADS)
    torch.use_deterministic_algorithms(True)
    rng = np.random.default_rng(0)  # numpy's generators give the same numbers on every platform
    model = toy_model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.98), eps=1e-6, fused=True)
    loss_fn = ClipLoss()
    model.train()
    for _ in range(steps):
        x = torch.from_numpy(rng.standard_normal((batch, 3, 32, 32), dtype=np.float32))
        text = torch.from_numpy(rng.integers(1, 49407, (batch, 24)))
        image_features, text_features, scale = model(x, text)[:3]
        loss = loss_fn(image_features, text_features, scale)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
    weights = digest(*(v.detach().numpy() for v in model.state_dict().values()))
    model.eval()
    with torch.no_grad():
        x = torch.from_numpy(rng.standard_normal((64, 3, 32, 32), dtype=np.float32))
        feats = model.encode_image(x).numpy()
    return weights, digest(feats)


def numpy_hash() -> str:
    """BLAS products and numpy's vectorised loops, as the analyses use them."""
    rng = np.random.default_rng(1)
    a = rng.standard_normal((300, 257), dtype=np.float32)
    b = rng.standard_normal((257, 190), dtype=np.float32)
    c = a @ b
    return digest(c, np.exp(c / 10), np.log1p(np.abs(c)), c.sum(axis=0), (a.astype(np.float64) @ b).astype(np.float64))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--batch", type=int, default=64)
    args = p.parse_args()
    weights, features = train_hash(args.steps, args.batch)
    print(json.dumps({"cpu": cpu_name(), "portable": portable.enabled(), "torch": torch.__version__,
                      "numpy": np.__version__, "capability": torch.backends.cpu.get_cpu_capability(),
                      "weights": weights, "features": features, "numpy_ops": numpy_hash()}))


if __name__ == "__main__":
    main()
