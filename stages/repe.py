"""repe@<dataset>: retrieval-enhanced prompts (REPE) from a caption corpus's cached features (no model), mixed
into the template prompts of the dataset's class text set `repe.prompts` (default `prompts`) ->
features/<model>/<dataset>/retrieval/ (class_weights.parquet, retrieved.parquet, index.json) and
reports/repe/<dataset>.json (recall vs exact search, counts); index build and query times in
runs/repe/<dataset>.json."""

from pathlib import Path

import pyarrow.parquet as pq

from stages.command import parser, run
from vlbench.analyses.base import Inputs
from vlbench.analyses.text_sets import check_text_sets
from vlbench.dataset_entries import dataset_entry
from vlbench.datasets.canonical import load_meta
from vlbench.knowledge import repe
from vlbench.models.identity import model_identity
from vlbench.params import ParamsError, get, load_params
from vlbench.paths import features_dir, prepared_dir, texts_dir
from vlbench.results import Result, write_result
from vlbench.texts import text_set_names


def dataset_inputs(dataset: str, identity: dict, decode: str) -> Inputs:
    return Inputs(load_meta(prepared_dir(dataset)), identity, features_dir(identity["model"], dataset), texts_dir(dataset),
                  decode=decode)


def class_owned_sets(dataset: str) -> list[str]:
    """The dataset's text sets owned by class_index (prompts, knowledge, ...): where a query text may be found."""
    return [n for n in text_set_names(texts_dir(dataset))
            if "class_index" in pq.read_schema(Path(texts_dir(dataset)) / f"{n}.parquet").names]


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--device", default="auto", help="auto, cpu or cuda: where FAISS builds and searches the index")
    args = p.parse_args()
    params = load_params(args.params)
    check_text_sets(params, known_only=True)  # `repe.prompts` is made by the entry
    cfg = repe.parse_config(get(params, "repe", dict))
    try:
        dataset_entry(params, cfg.corpus)
    except ParamsError as err:
        raise ParamsError(f"repe.corpus {cfg.corpus!r}: {err}") from err
    identity = model_identity(get(params, "model", dict))
    decode = get(params, "embed.decode", str)
    target, corpus_inputs = dataset_inputs(args.dataset, identity, decode), dataset_inputs(cfg.corpus, identity, decode)
    class_sets = class_owned_sets(args.dataset)
    repe.check_prompt_set(args.dataset, cfg.prompts, class_sets)
    corpus = repe.load_corpus(corpus_inputs, cfg)
    names = target.meta.class_names
    prompts = target.texts(cfg.prompts)
    prompt_emb, class_index = repe.template_prompts(prompts, args.dataset, cfg.prompts, len(names))
    result = repe.run_retrieval(corpus, names, prompt_emb, class_index,
                                     repe.class_text_sets(target, class_sets), cfg, args.device)
    fingerprint = repe.weights_fingerprint(prompts.fingerprint, corpus, cfg, result.query_sources)
    repe.write_outputs(repe.retrieval_dir(target.features_dir), names, corpus, result, fingerprint)
    metrics, counts, used, timings = repe.summary(result, cfg, corpus)
    write_result("repe", args.dataset, Result(metrics, counts, used, run=timings), fingerprint)
    print(f"repe {args.dataset}: {result.info.kind} index over {result.info.vectors} {cfg.modality} vectors of "
          f"{cfg.corpus!r} built in {timings['index_build_seconds']:.3f} s, {len(names)} queries in "
          f"{timings['query_seconds']:.3f} s; kept {counts['kept']} captions, {counts['fallback']} class(es) fell back; "
          f"{metrics}")


if __name__ == "__main__":
    run(main)
