"""<analysis>@<dataset>: one analysis of the table (vlbench/analyses) on cached features -> reports/<analysis>/<dataset>.json."""

from stages.command import parser, run
from vlbench.analyses import UnknownAnalysisError, analysis, load
from vlbench.analyses.base import Inputs
from vlbench.analyses.text_sets import check_text_sets
from vlbench.datasets.canonical import load_meta
from vlbench.models.identity import model_identity
from vlbench.params import get, load_params
from vlbench.paths import features_dir, knowledge_dir, prepared_dir, texts_dir
from vlbench.results import write_result


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--analysis", required=True, help="a name from vlbench.analyses.ANALYSES")
    args = p.parse_args()
    params = load_params(args.params)
    check_text_sets(params, known_only=True)  # the text sets an analysis reads are made by the entries
    if analysis(args.analysis).module is None:  # it runs a model: vlbench.pipeline.COMMANDS names its stage
        raise UnknownAnalysisError(f"{args.analysis} runs in its own stage (stages.{args.analysis}), "
                                   "not in stages.analysis")
    module = load(args.analysis)
    identity = model_identity(get(params, "model", dict))
    meta = load_meta(prepared_dir(args.dataset))
    inputs = Inputs(meta, identity, features_dir(identity["model"], args.dataset), texts_dir(args.dataset),
                    knowledge_dir(args.dataset), decode=get(params, "embed.decode", str))
    result = module.run(inputs, get(params, args.analysis, dict), int(get(params, "seed", int)))
    skipped = meta.provenance.get("skipped_corrupt", []) + [s for ids in inputs.skipped.values() for s in ids]
    result.counts["skipped_corrupt"] = len(skipped)
    write_result(args.analysis, args.dataset, result, inputs.fingerprint or identity,
                 partition=meta.provenance.get("partition"))
    print(f"{args.analysis} {args.dataset}: {result.metrics}")


if __name__ == "__main__":
    run(main)
