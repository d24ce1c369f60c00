"""extensibility_sets@<name>: dataset-level vocabulary expansion (the openness paper's CIFAR100-Caltech101-SUN397, ...):
the datasets of suite.extensibility_sets.<name>, each one group over the union of their classes, on cached features
-> reports/extensibility/<name>.json (vlbench.analyses.extensibility.run_union). No model. Variant `repe` runs when every
member has REPE class weights (features/<model>/<member>/retrieval/, the repe stage's, for suite.repe);
otherwise the result's details.skipped_variants says which member lacks them."""

from stages.command import parser, run
from vlbench.analyses.base import Inputs
from vlbench.analyses.extensibility import run_union, set_members
from vlbench.datasets.canonical import load_meta
from vlbench.models.identity import model_identity
from vlbench.params import get, load_params
from vlbench.paths import features_dir, prepared_dir, texts_dir
from vlbench.results import write_result


def main() -> None:
    p = parser(__doc__, dataset=False)
    p.add_argument("--name", required=True, help="a key of suite.extensibility_sets")
    args = p.parse_args()
    params = load_params(args.params)
    identity = model_identity(get(params, "model", dict))
    members = [(d, Inputs(meta=load_meta(prepared_dir(d)), identity=identity,
                          features_dir=features_dir(identity["model"], d), texts_dir=texts_dir(d),
                          decode=get(params, "embed.decode", str)))
               for d in set_members(params, args.name)]
    result = run_union(members, get(params, "extensibility", dict), int(get(params, "seed", int)))
    result.counts["skipped_corrupt"] = sum(len(i.meta.provenance.get("skipped_corrupt", []))
                                           + sum(len(s) for s in i.skipped.values()) for _, i in members)
    partitions = {d: i.meta.provenance["partition"] for d, i in members if "partition" in i.meta.provenance}
    write_result("extensibility", args.name, result, members[0][1].fingerprint or identity,
                 partition={"members": partitions} if partitions else None)
    print(f"extensibility_sets {args.name}: {result.metrics}")
    for variant, why in result.details["skipped_variants"].items():
        print(f"extensibility_sets {args.name}: {variant} {why}")


if __name__ == "__main__":
    run(main)
