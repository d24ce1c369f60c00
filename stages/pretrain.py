"""pretrain@<toy model>: build the toy model's caption corpus and train it (only toy models have this stage)."""

from pathlib import Path

from stages.common import parser, run
from vlbench.config import MODELS, get, load_params
from vlbench.datasets.registry import prepare_dataset


def main() -> None:
    p = parser(__doc__, dataset=False)
    p.add_argument("--model", required=True, help="toy model slug, a key of model.pretrain")
    args = p.parse_args()
    params = load_params(args.params)
    spec = dict(get(params, f"model.pretrain.{args.model}", dict))
    corpus = prepare_dataset("corpus", get(params, f"model.pretrain.{args.model}.corpus", dict), MODELS / args.model / "corpus")
    print(f"corpus: {corpus.splits}")
    from vlbench.models.toy import train_toy_clip

    train_args = {k: v for k, v in spec.items() if k != "corpus"}
    stats = train_toy_clip(MODELS / args.model / "corpus", get(params, "model.arch", str),
                           Path(get(params, "model.pretrained", str)), **train_args)
    print(f"trained {args.model}: {stats}")


if __name__ == "__main__":
    run(main)
