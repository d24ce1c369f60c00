"""embed@<dataset>: image features for every split and text features for every prompt, for the params' model."""

import json

from stages.common import parser, run
from vlbench.config import features_dir, get, load_params, prepared_dir
from vlbench.embed import embed_dataset
from vlbench.models.loading import load_model


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--device", default=None, help="cuda or cpu (default: cuda when available)")
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--workers", type=int, default=None, help="DataLoader workers (default: 8 at most on CUDA, half the cores on CPU)")
    args = p.parse_args()
    params = load_params(args.params)
    loaded = load_model(get(params, "model", dict), device=args.device)
    summary = embed_dataset(
        loaded, prepared_dir(args.dataset), features_dir(loaded.fingerprint["model"], args.dataset),
        batch_size=args.batch_size, num_workers=args.workers, skip_corrupt=bool(get(params, "embed.skip_corrupt")),
    )
    print(json.dumps(summary))


if __name__ == "__main__":
    run(main)
