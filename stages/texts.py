"""texts@<dataset>: the dataset's text sets (class prompts, captions, ...) -> data/texts/<dataset>/ (no model)."""

from stages.common import parser, run
from vlbench.config import dataset_entry, load_params, prepared_dir, texts_dir
from vlbench.datasets.canonical import load_meta
from vlbench.texts import build_text_sets, write_text_sets


def main() -> None:
    args = parser(__doc__).parse_args()
    entry = dataset_entry(load_params(args.params), args.dataset)
    meta = load_meta(prepared_dir(args.dataset))
    sets = build_text_sets(meta, prepared_dir(args.dataset), entry["texts"] or {})
    versions = write_text_sets(texts_dir(args.dataset), args.dataset, sets)
    print(f"texts {args.dataset}: " + ", ".join(f"{k} ({sets[k].num_rows} texts, version {v})" for k, v in versions.items()))


if __name__ == "__main__":
    run(main)
