"""prepare@<dataset>: build or convert one dataset into data/prepared/<dataset>/ (canonical format)."""

import os

from stages.common import parser, run
from vlbench.config import dataset_entry, load_params, prepared_dir
from vlbench.datasets.registry import check_input, prepare_dataset


def use_download_settings(params: dict) -> None:
    """`downloads.cache` / `downloads.mirror` from params, unless the environment already sets them."""
    settings = params.get("downloads") or {}
    for key, variable in (("cache", "VLBENCH_DOWNLOADS"), ("mirror", "VLBENCH_MIRROR")):
        if settings.get(key) and not os.environ.get(variable):
            os.environ[variable] = str(settings[key])


def main() -> None:
    args = parser(__doc__).parse_args()
    params = load_params(args.params)
    use_download_settings(params)
    entry = dataset_entry(params, args.dataset)
    check_input(args.dataset, entry)
    meta = prepare_dataset(args.dataset, entry["prepare"], prepared_dir(args.dataset))
    print(f"prepared {args.dataset}: version {meta.version}, splits {meta.splits}")


if __name__ == "__main__":
    run(main)
