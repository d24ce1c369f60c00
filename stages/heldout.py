"""heldout@<dataset>: the held-out search that sets FewTrans's ensemble centres (vlbench/finetune/heldout.py) on the
held-out dataset `--dataset` (params finetune.heldout.dataset) -> reports/heldout/<dataset>.json (the centres, read by
finetune.fewtrans_episodic with centres: heldout) and reports/heldout/<dataset>.search.parquet (every point searched);
each (point, task) cached in data/heldout/<dataset>/units/."""

from pathlib import Path

import pyarrow.parquet as pq

from stages.command import add_engine, parser, run
from vlbench.dataset_entries import check_suite_dataset
from vlbench.finetune import FinetuneError
from vlbench.io import atomic_path, write_json
from vlbench.params import get, load_params
from vlbench.paths import prepared_dir, texts_dir
from vlbench.results import write_run_facts

REPORTS, UNITS = Path("reports/heldout"), Path("data/heldout")


def main() -> None:
    p = parser(__doc__)
    add_engine(p)
    p.add_argument("--device", default=None, help="cuda, cpu, ... (local engine; default: cuda when available)")
    p.add_argument("--gpus-per-unit", type=float, default=None,
                   help="GPU share of each unit's Ray task (default $VLBENCH_GPUS_PER_UNIT, else 1 with GPUs, 0 without)")
    p.add_argument("--no-progress", action="store_true")
    args = p.parse_args()
    from vlbench.finetune.heldout import search  # torch: once the arguments are read (--help stays quick)
    from vlbench.models.loading import validate_model_config

    params = load_params(args.params)
    check_suite_dataset(params, args.dataset)
    finetune = dict(get(params, "finetune", dict))
    section = dict(finetune.get("heldout") or {})
    if section.get("dataset") not in (None, args.dataset):
        raise FinetuneError(f"params.yaml: finetune.heldout.dataset is {section['dataset']!r}, not --dataset "
                            f"{args.dataset!r}")
    cfg = section.get("search") or {}
    fewtrans = dict(finetune.get("fewtrans_episodic") or {})
    texts = texts_dir(args.dataset) / f"{fewtrans.get('text_set', 'prompts')}.parquet"
    doc, table, tally = search(validate_model_config(get(params, "model", dict)), prepared_dir(args.dataset),
                               texts if texts.is_file() else None, cfg, fewtrans, int(get(params, "seed", int)),
                               (params.get("adapt") or {}).get("fewtrans"), args.device,
                               units_dir=UNITS / args.dataset / "units", engine=args.engine, gpus=args.gpus_per_unit,
                               progress=not args.no_progress)
    with atomic_path(REPORTS / f"{args.dataset}.search.parquet") as tmp:
        pq.write_table(table, tmp)
    write_json(REPORTS / f"{args.dataset}.json", doc)
    write_run_facts("heldout", args.dataset, {"units": tally.to_json()})
    print(f"heldout {args.dataset}: centres {doc['centres']} ({tally.computed} units computed, {tally.cached} cached)")


if __name__ == "__main__":
    run(main)
