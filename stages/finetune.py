"""finetune@<dataset>: fine-tune the model with finetune.method on a prepared dataset (opt-in: suite.finetune) ->
data/finetuned/<dataset>/<method>/ (checkpoint.pt + fingerprint.json) and reports/finetune/<dataset>.json."""

import hashlib
import json
import shutil
from pathlib import Path

import pyarrow as pa
import torch

from stages.command import add_engine, parser, run
from vlbench.dataset_entries import check_suite_dataset
from vlbench.datasets.canonical import load_meta
from vlbench.finetune.registry import FINETUNE_METHODS, TABLES, method
from vlbench.finetune.artifacts import finetuned_dir, make_fingerprint, write_finetuned
from vlbench.finetune.training import Job, Runtime
from vlbench.io import atomic_path
from vlbench.models.identity import model_identity
from vlbench.models.loading import validate_model_config
from vlbench.params import get, load_params
from vlbench.paths import prepared_dir, texts_dir
from vlbench.report.plots import render_svg
from vlbench.results import Result, result_path, write_result
from vlbench.texts import read_text_set


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--device", default=None, help="cuda, cpu, ... (default: cuda when available)")
    p.add_argument("--state-dir", default=None,
                   help="resumable training state (default: runs/finetune/<dataset>/<method>/<key of the inputs>)")
    p.add_argument("--no-progress", action="store_true")
    add_engine(p)
    p.add_argument("--gpus-per-unit", type=float, default=None,
                   help="GPU share of each work unit's Ray task (episodes, search points; default $VLBENCH_GPUS_PER_UNIT, "
                        "else 1 with GPUs, 0 without; 0.25: four units per GPU)")
    args = p.parse_args()
    params = load_params(args.params)
    dataset = check_suite_dataset(params, args.dataset)
    options = dict(get(params, "finetune", dict))
    name = get(params, "finetune.method", str)
    fn = method(name)
    model_cfg = validate_model_config(get(params, "model", dict))
    state = Path(args.state_dir) if args.state_dir else state_dir(params, dataset, name, model_cfg)
    job = Job(dataset, prepared_dir(dataset), texts_dir(dataset), model_cfg, dict(options.get(name) or {}), options,
              int(get(params, "seed", int)), params,
              Runtime(args.device, not args.no_progress, state, engine=args.engine, gpus=args.gpus_per_unit,
                      units_dir=finetuned_dir(dataset, name) / "units"))
    outcome = fn(job)
    write(job, name, outcome)
    shutil.rmtree(state, ignore_errors=True)  # the outputs are written: nothing left to resume
    print(f"finetune {dataset} ({name}): {outcome.metrics}")


def state_dir(params, dataset: str, name: str, model_cfg) -> Path:
    """runs/finetune/<dataset>/<method>/<key>: the key hashes everything that changes the numbers (the base model's
    identity, the params a method reads, the prepared data's version), so a state file is only ever resumed by the
    run it belongs to."""
    sections = ("seed", "finetune", *FINETUNE_METHODS[name].sections)
    inputs = {"model": model_identity(model_cfg), **{s: params.get(s) for s in sections}, "data": data_versions(dataset)}
    key = hashlib.sha256(json.dumps(inputs, sort_keys=True, default=str).encode()).hexdigest()[:16]
    return Path("runs/finetune") / dataset / name / key


def data_versions(dataset: str) -> dict[str, str]:
    """The prepared data's version and each text set's (what the fingerprint and the state key record)."""
    texts = sorted(texts_dir(dataset).glob("*.parquet"))
    return {"dataset_version": load_meta(prepared_dir(dataset)).version,
            **{f"{t.stem}_version": read_text_set(t)[1].get("text_version") for t in texts}}


def write(job: Job, name: str, outcome) -> None:
    """The weights with their fingerprint, then the result (JSON, every table of TABLES) and the chart."""
    data_version = data_versions(job.dataset)
    base = model_identity(job.model_cfg)
    fingerprint = make_fingerprint(base, name, outcome.hyper, job.dataset, data_version, job.seed,
                                   outcome.details.get("trainable_params", 0))

    def save(path: Path) -> None:
        with open(path, "wb") as f:
            torch.save(outcome.state_dict, f)

    doc = write_finetuned(finetuned_dir(job.dataset, name), save if outcome.state_dict is not None else None, fingerprint)
    tables = {t: outcome.tables.get(t, pa.table({})) for t in TABLES}
    result = Result(outcome.metrics, outcome.counts, {"method": name, "seed": job.seed, "hyper": outcome.hyper},
                    tables, outcome.details, outcome.run, outcome.intervals)
    write_result("finetune", job.dataset, result, {**base, "finetuned": {k: doc[k] for k in ("id", "weights_sha256")}})
    with atomic_path(result_path("finetune", job.dataset, ".svg")) as tmp:
        tmp.write_text(render_svg(outcome.chart or no_chart(name)) + "\n")


def no_chart(name: str) -> dict:
    """The declared chart output of a method that draws none: one line saying so."""
    return {"data": {"values": [{"text": f"{name}: no chart"}]}, "mark": "text",
            "encoding": {"text": {"field": "text", "type": "nominal"}}}


if __name__ == "__main__":
    run(main)
