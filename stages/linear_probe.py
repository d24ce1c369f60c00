"""linear_probe@<dataset>: CLIP-paper logistic-regression probe on cached features -> reports/linear_probe/<dataset>.json."""

from stages.common import model_identity, parser, run, write_result
from vlbench import metrics
from vlbench.analyses.linear_probe import evaluate_linear_probe, fit_linear_probe
from vlbench.config import features_dir, get, load_params, prepared_dir, report_path
from vlbench.datasets.canonical import DatasetError, load_meta
from vlbench.features import read_features


def labels(features):
    return features.table.column("label").to_numpy()


def main() -> None:
    args = parser(__doc__).parse_args()
    params = load_params(args.params)
    cfg = get(params, "linear_probe", dict)
    meta = load_meta(prepared_dir(args.dataset))
    if meta.multi_label:
        raise DatasetError(f"dataset {args.dataset!r} is multi-label; the linear probe takes single-label datasets")
    expect = {**model_identity(params), "dataset": meta.name, "dataset_version": meta.version}
    root = features_dir(expect["model"], args.dataset)
    splits = {role: get(params, f"linear_probe.{role}_split", str) for role in ("train", "val", "test")}
    train, test = (read_features(root / f"{splits[r]}.parquet", expect) for r in ("train", "test"))
    val = read_features(root / f"{splits['val']}.parquet", expect) if splits["val"] in meta.splits else None
    fit = fit_linear_probe(
        train.embeddings, labels(train), val.embeddings if val else None, labels(val) if val else None,
        seed=int(get(params, "seed")), metric=meta.metric, num_classes=len(meta.classes),
    )
    scores = evaluate_linear_probe(fit.model, test.embeddings)
    result = {meta.metric: float(metrics.compute(meta.metric, scores, labels(test)))}
    write_result(report_path("linear_probe", args.dataset), "linear_probe", args.dataset, train.fingerprint,
                 {**cfg, "val_split": splits["val"] if val else "carved from train", "chosen_C": fit.chosen_C},
                 result, {"train": train.table.num_rows, "val": val.table.num_rows if val else 0,
                          "test": test.table.num_rows, "classes": len(meta.classes)})
    print(f"linear_probe {args.dataset}: {result} (C={fit.chosen_C:g})")


if __name__ == "__main__":
    run(main)
