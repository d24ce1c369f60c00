"""pretrain@<toy model>: build the toy model's caption corpus and train it into data/models/<toy>/ (toy models only).

Its outputs are the checkpoint and the training log, kept in git rather than DVC's cache (the demo's toy model arrives
with the clone, like the committed results: a fresh clone's `dvc repro` finds this stage up to date and skips it;
`make verify-demo` retrains and checks the bytes). The corpus is built from params into a temporary folder beside them
and removed after training: it is no output, so nothing large has to be cached or committed.
It writes only its declared outputs: a `model.pretrained` path given by the user is read by the embed
stages, never written here.
"""

import shutil
import tempfile
from pathlib import Path

from stages.command import parser, run
from vlbench.datasets.registry import prepare_dataset
from vlbench.params import get, load_params
from vlbench.paths import model_dir

CORPUS_PREFIX = ".corpus-"  # the temporary folder the corpus is built in, beside the outputs


def main() -> None:
    p = parser(__doc__, dataset=False)
    p.add_argument("--model", required=True, help="toy model slug, an item of model.pretrain")
    args = p.parse_args()
    params = load_params(args.params)
    spec = dict(get(params, "model.train", dict))
    out = model_dir(args.model)
    out.mkdir(parents=True, exist_ok=True)
    for stale in out.glob(CORPUS_PREFIX + "*"):  # left by a run that was killed (DVC holds the stage's lock meanwhile)
        shutil.rmtree(stale)
    from vlbench.models.toy import train_toy_clip

    train_args = {k: v for k, v in spec.items() if k != "corpus"}
    with tempfile.TemporaryDirectory(prefix=CORPUS_PREFIX, dir=out) as tmp:
        corpus = prepare_dataset("corpus", get(params, "model.train.corpus", dict), Path(tmp) / "corpus")
        print(f"corpus: {corpus.splits}")
        stats = train_toy_clip(Path(tmp) / "corpus", get(params, "model.arch", str), out / "checkpoint.pt",
                               **train_args)
    print(f"trained {args.model}: {stats}")


if __name__ == "__main__":
    run(main)
