"""share_images@<dataset>: the image features of the dataset it shares images with (suite.share_images), with this
dataset's labels -> features/<model>/<dataset>/images/ (pre-projection files too). No model: the images are the
source's, byte for byte (checked), so the model ran on them once, in embed_images@<source>."""

import json

from stages.command import parser, run
from vlbench.dataset_entries import check_suite_dataset
from vlbench.params import get, load_params
from vlbench.paths import features_dir, prepared_dir
from vlbench.share import share_image_features


def main() -> None:
    args = parser(__doc__).parse_args()
    params = load_params(args.params)
    source = check_suite_dataset(params, get(params, f"suite.share_images.{args.dataset}", str))
    slug = get(params, "model.slug", str)
    summary = share_image_features(prepared_dir(source), prepared_dir(args.dataset),
                                   features_dir(slug, source) / "images", features_dir(slug, args.dataset) / "images")
    print(json.dumps(summary))


if __name__ == "__main__":
    run(main)
