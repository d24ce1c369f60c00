"""pretrain@<toy model>: build the toy model's caption corpus and train it into data/models/<toy>/ (toy models only).

It writes only its declared outputs: a `model.pretrained` path given by the user is read by the embed
stages, never written here.
"""

from stages.common import parser, run
from vlbench.config import get, load_params, model_dir
from vlbench.datasets.registry import prepare_dataset


def main() -> None:
    p = parser(__doc__, dataset=False)
    p.add_argument("--model", required=True, help="toy model slug, an item of model.pretrain")
    args = p.parse_args()
    params = load_params(args.params)
    spec = dict(get(params, "model.train", dict))
    out = model_dir(args.model)
    corpus = prepare_dataset("corpus", get(params, "model.train.corpus", dict), out / "corpus")
    print(f"corpus: {corpus.splits}")
    from vlbench.models.toy import train_toy_clip

    train_args = {k: v for k, v in spec.items() if k != "corpus"}
    stats = train_toy_clip(out / "corpus", get(params, "model.arch", str), out / "checkpoint.pt", **train_args)
    print(f"trained {args.model}: {stats}")


if __name__ == "__main__":
    run(main)
