"""Every torch operation of one ELEVATER run, hashed: where two CPUs part ways (issue 44, item 2).

The demo's Language-1P numbers differ between an AMD EPYC and the Intel machines that wrote them, with every input
the same and every library setting that can be emulated ruled out (docs/reproducibility.md). This script runs one
(shots, seed) setting of one head on the demo's cached features, as `adapt@<dataset>` runs it but in one process, and
records each torch operation's name and a 32-bit hash of its output, in order (a `TorchFunctionMode`: no line of the
protocol is copied). Run it on each machine and compare the traces: the first operation whose output differs while
everything before it agrees is the one that escapes the portable settings.

    python benchmarks/adapt_trace.py --out /tmp/amd.trace.gz                   # shapes, language_1p, 50 shots, seed 0
    python benchmarks/adapt_trace.py --compare benchmarks/traces/amd-epyc.trace.gz /tmp/intel.trace.gz

Run it from the repository root after `make repro` (the demo's features must be in features/). It pins one core and
one torch thread (ELEVATER's workers run so), and imports `stages` first (the portable settings, as in every stage).
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import stages  # noqa: E402,F401  (vlbench.portable.apply(), before numpy and torch load, as in every stage)
import numpy as np  # noqa: E402
import torch  # noqa: E402
from torch.overrides import TorchFunctionMode  # noqa: E402

from vlbench.analyses.adapt import elevater  # noqa: E402
from vlbench.analyses.base import Inputs  # noqa: E402
from vlbench.datasets.canonical import load_meta  # noqa: E402
from vlbench.models.identity import model_identity  # noqa: E402
from vlbench.params import get, load_params  # noqa: E402
from vlbench.paths import features_dir, knowledge_dir, prepared_dir, texts_dir  # noqa: E402

SKIP = {"empty", "empty_like", "new_empty", "empty_strided",  # uninitialised memory
        "__get__", "__set__", "size", "dim", "numel", "shape", "device", "dtype", "is_floating_point", "item", "tolist",
        "__len__", "__bool__", "__index__", "__format__", "__repr__", "data_ptr", "stride", "is_contiguous"}


class Trace(TorchFunctionMode):
    """[name, hash] of every torch call whose result is a tensor, in call order."""

    def __init__(self):
        super().__init__()
        self.ops: list[tuple[str, str]] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = getattr(func, "__name__", str(func))
        if name not in SKIP and isinstance(out, torch.Tensor) and out.layout == torch.strided:
            data = out.detach().contiguous().cpu().numpy().tobytes()
            self.ops.append((name, hashlib.blake2b(data, digest_size=4).hexdigest()))
        return out


def run(dataset: str, head: str, shots: str, seed: int) -> list[tuple[str, str]]:
    os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})  # one core: map_runs runs the tasks in this process
    torch.set_num_threads(1)
    params = load_params(ROOT / "params.yaml")
    identity = model_identity(get(params, "model", dict))
    meta = load_meta(prepared_dir(dataset))
    inputs = Inputs(meta, identity, features_dir(identity["model"], dataset), texts_dir(dataset),
                    knowledge_dir(dataset), decode=get(params, "embed.decode", str))
    cfg = {**get(params, "adapt", dict)["elevater"], "heads": [head], "shots": [shots if shots == "full" else int(shots)],
           "seeds": [seed], "knowledge": []}
    with Trace() as trace:
        result = elevater.evaluate(inputs, cfg, int(get(params, "seed", int)))
    print(json.dumps({k: v for k, v in result.metrics.items()}), file=sys.stderr)
    return trace.ops


def compare(a_path: Path, b_path: Path) -> str:
    a, b = (json.loads(gzip.decompress(p.read_bytes())) for p in (a_path, b_path))
    for i, (x, y) in enumerate(zip(a["ops"], b["ops"])):
        if x != y:
            before = ", ".join(f"{n}" for n, _ in a["ops"][max(0, i - 8):i])
            return (f"first difference at operation {i} of {len(a['ops'])}/{len(b['ops'])}: {x[0]} -> {x[1]} "
                    f"({a['cpu']}) vs {y[0]} -> {y[1]} ({b['cpu']}); the 8 operations before it: {before}")
    return f"the same {min(len(a['ops']), len(b['ops']))} operations ({len(a['ops'])} and {len(b['ops'])} in all)"


def cpu_name() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "?"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dataset", default="shapes")
    p.add_argument("--head", default="language_1p")
    p.add_argument("--shots", default="50")
    p.add_argument("--seed", type=int, default=0, help="the (shots, seed) setting's seed")
    p.add_argument("--out", type=Path, help="write the trace here (gzipped JSON)")
    p.add_argument("--compare", nargs=2, type=Path, metavar=("A", "B"), help="compare two traces and exit")
    args = p.parse_args()
    if args.compare:
        print(compare(*args.compare))
        return
    ops = run(args.dataset, args.head, args.shots, args.seed)
    trace = {"cpu": cpu_name(), "torch": torch.__version__, "numpy": np.__version__, "setting": vars(args) | {"out": None, "compare": None},
             "ops": ops}
    if args.out:
        args.out.write_bytes(gzip.compress(json.dumps(trace, separators=(",", ":")).encode(), mtime=0))
    print(f"{len(ops)} operations traced on {trace['cpu']}" + (f" -> {args.out}" if args.out else ""))


if __name__ == "__main__":
    main()
