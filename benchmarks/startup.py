"""Start-up of a model stage: a fresh process's imports and model load, as embed_images / embed_texts / embed_knowledge
do before their first batch, with and without vlbench.lazy_imports (stages.model_libraries.import_model_libraries),
alternated in one run on the same machine. Prints a Markdown table of median wall and CPU (user + sys) seconds and their ratio,
and checks that both load the same model: the features of a fixed batch must be the same bytes.

    python benchmarks/startup.py --runs 5                 # the demo's toy architecture, freshly initialised weights
    python benchmarks/startup.py --runs 5 --arch ViT-B-32
    python benchmarks/startup.py --child deferred --arch vlbench-toy --checkpoint ckpt.pt   # one process, one JSON line

A child reports which of torch._dynamo, timm and transformers it loaded and a hash of its features.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VARIANTS = ("eager", "deferred")  # eager: the stages' imports before vlbench.lazy_imports
WATCHED = ("torch._dynamo", "timm", "transformers")


def child(variant: str, arch: str, checkpoint: str) -> dict:
    """What a model stage does before its first batch; the features of a fixed batch; the watched modules loaded."""
    start = time.perf_counter()
    sys.path.insert(0, str(ROOT))
    import stages  # noqa: F401  (portable settings, as in every stage)
    from stages.model_libraries import import_model_libraries

    model = {"slug": "startup", "arch": arch, "pretrained": checkpoint, "precision": "fp32"}
    if variant == "deferred":
        import_model_libraries({"model": model})
    from vlbench.engines import engine

    loaded = engine("local").load_model(model, device="cpu")
    seconds = time.perf_counter() - start
    import torch

    g = torch.Generator().manual_seed(0)
    size = loaded.model.visual.image_size
    size = size if isinstance(size, int) else size[0]
    images = torch.rand(4, 3, size, size, generator=g)
    with torch.inference_mode():
        feats = torch.cat([loaded.model.encode_image(images).flatten(),
                           loaded.model.encode_text(loaded.tokenizer(["a red circle", "two blue squares"])).flatten()])
    return {"variant": variant, "seconds": seconds, "features": hashlib.sha256(feats.numpy().tobytes()).hexdigest(),
            "loaded": {m: m in sys.modules for m in WATCHED}}


def fresh_checkpoint(arch: str, path: Path) -> str:
    """A freshly initialised `arch` saved as a plain state_dict (the start-up does not depend on the weights)."""
    import open_clip
    import torch

    from vlbench.models import register_local_configs

    register_local_configs()
    torch.manual_seed(0)
    torch.save(dict(open_clip.create_model(arch, pretrained=None).state_dict()), path)
    return str(path)


def cpu_seconds(cmd: list[str]) -> tuple[dict, float, float]:
    before = os.times()
    start = time.perf_counter()
    out = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, cwd=ROOT, check=True,
                         env={**os.environ, "PYTHONWARNINGS": "ignore"}).stdout
    after = os.times()
    cpu = (after.children_user - before.children_user) + (after.children_system - before.children_system)
    return json.loads(out.strip().splitlines()[-1]), time.perf_counter() - start, cpu


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=5, help="processes per variant, alternated")
    p.add_argument("--arch", default="vlbench-toy")
    p.add_argument("--checkpoint", help="weights to load (default: a freshly initialised arch)")
    p.add_argument("--child", choices=VARIANTS, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.arch, args.checkpoint)))
        return
    sys.path.insert(0, str(ROOT))
    with tempfile.TemporaryDirectory() as tmp:
        checkpoint = args.checkpoint or fresh_checkpoint(args.arch, Path(tmp) / "checkpoint.pt")
        rows: dict[str, list[tuple[dict, float, float]]] = {v: [] for v in VARIANTS}
        for _ in range(args.runs):
            for variant in VARIANTS:
                cmd = [sys.executable, __file__, "--child", variant, "--arch", args.arch, "--checkpoint", checkpoint]
                rows[variant].append(cpu_seconds(cmd))
    hashes = {r[0]["features"] for runs in rows.values() for r in runs}
    if len(hashes) != 1:
        sys.exit(f"the variants load different models: {len(hashes)} feature hashes")
    med = {v: (statistics.median(r[1] for r in runs), statistics.median(r[2] for r in runs))
           for v, runs in rows.items()}
    print(f"| {args.arch}, {args.runs} runs each | wall s (median) | CPU s (median) | loads |")
    print("|---|---|---|---|")
    for v in VARIANTS:
        loaded = ", ".join(m for m, on in rows[v][0][0]["loaded"].items() if on) or "none of " + ", ".join(WATCHED)
        print(f"| {v} | {med[v][0]:.2f} | {med[v][1]:.2f} | {loaded} |")
    ratio = [med["deferred"][i] / med["eager"][i] for i in (0, 1)]
    print(f"| deferred / eager | {ratio[0]:.2f} | {ratio[1]:.2f} | |")
    print(f"\nsame features in every run ({hashes.pop()[:16]}); load average (1 min) at the end "
          f"{os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
