"""embed_images@<dataset>: image features of every split for the params' model -> features/<model>/<dataset>/images/
(with embed.pre_projection, also the features before the image tower's projection, in images/pre_projection/)."""

import json

from stages.command import add_engine, parser, run
from stages.model_libraries import import_model_libraries
from vlbench.params import get, load_params
from vlbench.paths import features_dir, prepared_dir


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--device", default=None, help="cuda or cpu (default: cuda when available)")
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--workers", type=int, default=None, help="DataLoader workers (default: 16 at most on CUDA, half the cores on CPU)")
    add_engine(p)
    args = p.parse_args()
    params = load_params(args.params)
    import_model_libraries(params)
    from vlbench.embed import check_batch_options, embed_image_splits
    from vlbench.engines import engine

    check_batch_options(args.batch_size, args.workers)

    chosen = engine(args.engine)
    loaded = chosen.load_model(get(params, "model", dict), device=args.device)
    summary = embed_image_splits(loaded, prepared_dir(args.dataset), features_dir(loaded.fingerprint["model"], args.dataset) / "images",
                                 batch_size=args.batch_size, num_workers=args.workers,
                                 pre_projection=get(params, "embed.pre_projection", bool),
                                 decode=get(params, "embed.decode", str), engine=chosen,
                                 bf16_weights=bf16_weights(params))
    print(json.dumps(summary))


def bf16_weights(params: dict) -> bool:
    """embed.bf16_weights (conf/settings/embed.yaml); off where params.yaml has no embed section's settings file (a
    project without conf/settings/, as before the setting existed)."""
    return get(params, "embed.bf16_weights", bool) if "bf16_weights" in (params.get("embed") or {}) else False


if __name__ == "__main__":
    run(main)
