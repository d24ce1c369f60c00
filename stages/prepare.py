"""prepare@<dataset>: build or convert one dataset into data/prepared/<dataset>/ (canonical format)."""

from stages.command import parser, run, use_download_settings
from vlbench.data_root import check_data_root
from vlbench.dataset_entries import dataset_entry
from vlbench.datasets.registry import check_input, prepare_dataset
from vlbench.params import load_params
from vlbench.paths import prepared_dir


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
