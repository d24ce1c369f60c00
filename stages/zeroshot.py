"""zeroshot@<dataset>: zero-shot classification from cached features -> reports/zeroshot/<dataset>.json."""

import pyarrow.parquet as pq

from stages.common import model_identity, parser, run, write_result
from vlbench.analyses.zeroshot import evaluate_zeroshot
from vlbench.config import features_dir, get, load_params, prepared_dir, report_path
from vlbench.datasets.canonical import load_meta
from vlbench.features import read_features
from vlbench.io import atomic_path


def main() -> None:
    args = parser(__doc__).parse_args()
    params = load_params(args.params)
    split = get(params, "zeroshot.split", str)
    meta = load_meta(prepared_dir(args.dataset))
    expect = {**model_identity(params), "dataset": meta.name, "dataset_version": meta.version}
    root = features_dir(expect["model"], args.dataset)
    images = read_features(root / f"{split}.parquet", expect)
    texts = read_features(root / "text.parquet", expect)
    metrics, predictions = evaluate_zeroshot(images.table, images.embeddings, texts.table, texts.embeddings, meta)
    with atomic_path(report_path("zeroshot", args.dataset, ".predictions.parquet")) as tmp:
        pq.write_table(predictions, tmp)
    write_result(report_path("zeroshot", args.dataset), "zeroshot", args.dataset, images.fingerprint,
                 {"split": split, "templates": len(meta.templates)}, metrics,
                 {"samples": images.table.num_rows, "classes": len(meta.classes)})
    print(f"zeroshot {args.dataset}: {metrics}")


if __name__ == "__main__":
    run(main)
