"""knowledge@<dataset>: one text set per knowledge variant (ELEVATER's Wiktionary / WordNet / GPT-3 prompts, CuPL,
Menon & Vondrick, WordNet 3.0 by wnid, LLM descriptions) -> data/knowledge/<dataset>/ (no model; knowledge files via the
download layer), and the LLM answers in data/llm/<dataset>.jsonl (kept across runs; empty unless an llm_* variant is
asked for; the endpoint is asked only for answers it lacks)."""

from stages.command import parser, run, use_download_settings
from vlbench.dataset_entries import dataset_entry
from vlbench.datasets.canonical import load_meta
from vlbench.io import write_json
from vlbench.knowledge.llm import AnswerCache
from vlbench.knowledge.variants import build_knowledge, knowledge_options
from vlbench.params import get, load_params
from vlbench.paths import knowledge_dir, llm_answers_path, prepared_dir
from vlbench.texts import entry_templates, write_text_sets


def main() -> None:
    args = parser(__doc__).parse_args()
    params = load_params(args.params)
    use_download_settings(params)
    entry = dataset_entry(params, args.dataset)
    options = knowledge_options(get(params, "knowledge", dict))
    templates = entry_templates(args.dataset, entry["texts"] or {})
    answers = AnswerCache(llm_answers_path(args.dataset))
    built = build_knowledge(args.dataset, entry, load_meta(prepared_dir(args.dataset)), templates, options,
                            llm_cache=answers)
    answers.ensure()
    out = knowledge_dir(args.dataset)
    versions = write_text_sets(out, args.dataset, built.sets, built.stamps)
    write_json(out / "knowledge.json", built.summary())
    if built.wordnet is not None:
        write_json(out / "wordnet.json", {"dataset": args.dataset, "wordnet": "3.0", "classes": built.wordnet})
    made = ", ".join(f"{v} ({built.sets[v].num_rows} texts, {built.stamps[v]['knowledge']['template_only']} "
                     f"template-only, version {versions[v]})" for v in built.sets)
    skipped = "".join(f"; skipped {v}: {why}" for v, why in built.skipped.items())
    print(f"knowledge {args.dataset} (vocabulary {built.vocabulary}): {made or 'no variant'}{skipped}")


if __name__ == "__main__":
    run(main)
