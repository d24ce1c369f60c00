"""texts@<dataset>: the dataset's text sets (class prompts, captions, ...) -> data/texts/<dataset>/ (no model)."""

from stages.command import parser, run
from vlbench.dataset_entries import dataset_entry
from vlbench.datasets.canonical import load_meta
from vlbench.knowledge.coarse_texts import coarse_text_sets
from vlbench.knowledge.negatives import specificity_text_sets
from vlbench.knowledge.vocabulary import vocabulary_text_sets
from vlbench.params import load_params
from vlbench.paths import prepared_dir, texts_dir
from vlbench.texts import build_text_sets, write_text_sets


def main() -> None:
    args = parser(__doc__).parse_args()
    entry = dataset_entry(load_params(args.params), args.dataset)
    meta = load_meta(prepared_dir(args.dataset))
    sets = build_text_sets(meta, prepared_dir(args.dataset), entry["texts"] or {})
    if (entry["texts"] or {}).get("specificity") is not None:  # the specificity analysis's texts (negatives.py)
        sets.update(specificity_text_sets(meta, prepared_dir(args.dataset), entry["texts"]["specificity"]))
    sets.update(coarse_text_sets(meta, entry["texts"] or {}))  # texts.hierarchy / texts.groups (coarse_texts.py)
    sets.update(vocabulary_text_sets(meta, entry["texts"] or {}))  # texts.vocabulary / texts.prompt_sets (vocabulary.py)
    versions = write_text_sets(texts_dir(args.dataset), args.dataset, sets)
    print(f"texts {args.dataset}: " + ", ".join(f"{k} ({sets[k].num_rows} texts, version {v})" for k, v in versions.items()))


if __name__ == "__main__":
    run(main)
