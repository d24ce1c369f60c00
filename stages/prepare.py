"""prepare@<dataset>: build or convert one dataset into data/prepared/<dataset>/ (canonical format)."""

from stages.common import parser, run, use_download_settings
from vlbench.config import check_data_root, dataset_entry, load_params, prepared_dir
from vlbench.datasets.registry import check_input, prepare_dataset


def main() -> None:
    args = parser(__doc__).parse_args()
    params = load_params(args.params)
    use_download_settings(params)
    entry = dataset_entry(params, args.dataset)
    check_data_root(entry["input"], args.dataset)
    check_input(args.dataset, entry)
    meta = prepare_dataset(args.dataset, entry["prepare"], prepared_dir(args.dataset))
    print(f"prepared {args.dataset}: version {meta.version}, splits {meta.splits}")


if __name__ == "__main__":
    run(main)
