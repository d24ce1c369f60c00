"""prepare@<dataset>: build or download one dataset into data/prepared/<dataset>/ (canonical format)."""

from stages.common import parser, run
from vlbench.config import dataset_spec, load_params, prepared_dir
from vlbench.datasets.registry import prepare_dataset


def main() -> None:
    args = parser(__doc__).parse_args()
    spec = dataset_spec(load_params(args.params), args.dataset)
    meta = prepare_dataset(args.dataset, spec, prepared_dir(args.dataset))
    print(f"prepared {args.dataset}: version {meta.version}, splits {meta.splits}")


if __name__ == "__main__":
    run(main)
