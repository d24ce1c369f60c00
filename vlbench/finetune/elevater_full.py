"""ELEVATER full-model fine-tuning (Li et al., NeurIPS 2022 D&B, Sec. 4 and App. D; docs/protocols.md "Fine-tuning:
ELEVATER full"), with the toolkit's `evaluation/full_model_finetune.py` (Elevater_Toolkit_IC @ 00d0af7).

The linear probe's protocol, reused from `vlbench.analyses.adapt.elevater` (its Settings, read from `adapt.elevater`
with `finetune.elevater_full` overriding shots, seeds and the head): the few-shot sampler and seeds, the 20% validation
carve-out, the search (6 learning rates x the weight-decay refinement, 10 epochs each, best validation epoch), the
final run on train + validation for 10 + EXTRA_FINAL_TRAIN_EPOCH 40 epochs, the reported test metric, the
language-initialised head (`text_classifier`'s class embeddings of the `prompts` set, made here by the base model) or
Random-2P, and the parameter-efficiency metric with M0 = 1e8. What differs from the probe is what trains: the image
tower and the head (the toolkit's `Classifier`: the text tower and logit scale frozen), on images rather than
cached features, SGD with momentum in FP32 (finetune.precision amp_bf16 is an option on CUDA). A search run whose loss
turns non-finite is a failed candidate (score 0, the toolkit's score for a run that fails; `status` and `diverged_step`
in the search table); a final run that diverges is a one-line error naming the run, the chosen pair and what to do.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import pyarrow as pa
import torch

from vlbench.analyses.adapt.protocol import pytorch_linear_init, score_heads, softmax_np
from vlbench.analyses.adapt.elevater import (
    Settings,
    epoch_orders,
    few_shot_subset,
    logit_scale_factor,
    parameter_efficiency,
    search_table,
    select_learning_rate,
    settings_details,
    toolkit_shots,
    validation_split,
    weight_decay_search,
)
from vlbench.analyses.zeroshot_classifier import class_weights
from vlbench.datasets.canonical import load_meta
from vlbench.embed import embed_texts, model_for_dataset
from vlbench.finetune import FinetuneError, units
from vlbench.finetune.training import (
    Diverged,
    Job,
    Loop,
    Outcome,
    Runtime,
    constant,
    count_parameters,
    deterministic,
    freeze,
    pick_device,
    prepare_model,
    state_on_cpu,
    train,
)
from vlbench.finetune.data import Images, labels_of, load_split, targets
from vlbench.models.identity import model_identity
from vlbench.models.loading import load_model
from vlbench.texts import read_text_set

METHOD = "elevater_full"
HEADS = ("language_2p", "random_2p")  # Fig. 5 (d) and (c): the heads on the projected embedding
OWN_KEYS = ("head", "shots", "seeds", "workers")  # finetune.elevater_full; the rest is adapt.elevater's


class Classifier(torch.nn.Module):
    """The toolkit's `Classifier`: image tower -> BatchNorm1d(affine=False) -> Linear, times a fixed logit factor."""

    def __init__(self, clip: torch.nn.Module, weight: np.ndarray, bias: np.ndarray, factor: float):
        super().__init__()
        self.clip = clip
        self.bn = torch.nn.BatchNorm1d(weight.shape[0], affine=False)
        self.head = torch.nn.Linear(weight.shape[0], weight.shape[1])
        with torch.no_grad():
            self.head.weight.copy_(torch.from_numpy(np.ascontiguousarray(weight.T)))
            self.head.bias.copy_(torch.from_numpy(bias))
        self.factor = float(factor)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.factor * self.head(self.bn(self.clip.encode_image(x).float()))


def trainable(name: str) -> bool:
    """The toolkit freezes the text tower (`transformer`, `token_embedding`, `ln_final`, `positional_embedding`,
    `text_projection`) and `logit_scale`; the image tower and the head train."""
    return name.startswith(("clip.visual.", "head."))


def settings(job: Job) -> tuple[Settings, str]:
    own = dict(job.settings)
    unknown = sorted(set(own) - set(OWN_KEYS))
    if unknown:
        raise FinetuneError(f"params.yaml: unknown key(s) finetune.elevater_full.{', '.join(unknown)}; "
                            f"allowed: {', '.join(OWN_KEYS)} (the search is adapt.elevater's)")
    head = own.get("head") or "language_2p"
    if head not in HEADS:
        raise FinetuneError(f"params.yaml: finetune.elevater_full.head {head!r} is not one of {list(HEADS)}")
    base = {k: v for k, v in (job.params.get("adapt", {}).get("elevater") or {}).items() if k not in ("knowledge", "heads")}
    picked = {k: own[k] for k in ("shots", "seeds") if own.get(k) is not None}
    return Settings.from_cfg({**base, **picked, "heads": [head], "knowledge": []}), head


def run(job: Job) -> Outcome:
    s, head = settings(job)
    device = pick_device(job.runtime.device)
    work = SearchWork(job, device.type, torch.get_num_threads())
    task = work.build(test=True)
    task.job = job  # the final runs keep the stage's runtime (resumable state, progress)
    units.adopt(work, task)  # the local engine's units use this task; Ray workers build their own (no test split)
    started = time.perf_counter()
    search = Search(work, task, job.runtime)
    runs = [task.run_setting(shots, sd, search) for shots in s.shots for sd in (s.seeds if shots != "full" else s.seeds[:1])]
    result = outcome(job, s, head, task.meta, runs, task, task.texts_version, time.perf_counter() - started)
    search.cache.prune(search.kept)
    result.run["units"] = search.tally.to_json()
    return result


@dataclass
class SearchWork:
    """The work units of ELEVATER full fine-tuning: one search run (shots, seed, learning rate, weight decay) each
    (vlbench.finetune.units.Work). A process builds the task (model, head, training images) once."""

    job: Job
    device: str
    threads: int
    token: str = ""

    def __post_init__(self):
        job = self.job
        self.job = replace(job, runtime=Runtime(device=self.device, progress=False))
        self.token = units.canonical({"dataset": job.dataset, "prepared": job.prepared, "texts": job.texts,
                                      "model": job.model_cfg, "settings": job.settings, "options": job.options,
                                      "seed": job.seed, "adapt": (job.params.get("adapt") or {}).get("elevater"),
                                      "device": self.device})

    def build(self, test: bool) -> "Task":
        job = self.job
        s, head = settings(job)
        device = torch.device(self.device)
        meta = load_meta(job.prepared)
        loaded = model_for_dataset(load_model(job.model_cfg, device), meta)
        prepare_model(loaded.model, job.options)
        workers = int(job.settings.get("workers") or 0)
        train_images = load_split(meta, job.prepared, s.train_split, loaded.preprocess, workers)
        test_images = load_split(meta, job.prepared, s.test_split, loaded.preprocess, workers) if test else None
        weight, bias, texts_version = head_weights(job, loaded, meta, head)
        factor = logit_scale_factor(s.logit_scale, len(meta.classes)) if s.logit_scale != "pretrained" \
            else float(loaded.model.logit_scale.exp().item())
        base = state_on_cpu(loaded.model)
        task = Task(job, s, meta, loaded.model, base, weight, bias, factor, train_images, test_images, device)
        task.texts_version = texts_version
        return task

    def setup(self) -> "Task":
        return self.build(test=False)

    def compute(self, task: "Task", identity: Mapping[str, Any]) -> dict[str, Any]:
        """One search run's score (its best validation epoch) or, if its loss turned non-finite, the step."""
        shots, seed = identity["shots"], int(identity["seed"])
        fit, val, val_labels = task.setting_rows(shots, seed)[1:4]
        quiet = replace(task.job.runtime, state_dir=None, stop_after=None, progress=False)
        try:
            scores = task.fit(f"search-{shots}-{seed}-{identity['li']}-{identity['wi']}", fit, task.train_images, val,
                              val_labels, float(identity["lr"]), float(identity["wd"]), task.s.search_epochs, quiet)[1]
            return {"score": float(scores.max()), "diverged_step": None}
        except Diverged as err:
            return {"score": 0.0, "diverged_step": err.step, "loss": str(err.loss), "steps": err.steps}


class Search:
    """Search runs as cached work units on the job's engine (`Task.run_setting` asks for them round by round)."""

    def __init__(self, work: SearchWork, task: "Task", runtime: Runtime):
        job, s = task.job, task.s
        self.work, self.runtime = work, runtime
        self.cache = units.UnitCache(runtime.units_dir)
        self.tally, self.kept = units.Tally(engine=units.engine_name(runtime.engine)), []
        self.context = {"kind": "elevater_search", "model": model_identity(job.model_cfg),
                        "precision": job.model_cfg.get("precision"), "options": {"precision": job.options.get("precision")},
                        "device": work.device, "dataset_version": task.meta.version, "texts_version": task.texts_version,
                        "settings": settings_details(s, job.seed), "head": settings(job)[1], "seed": job.seed}

    def scores(self, identities: list[dict[str, Any]]) -> list[dict[str, Any]]:
        todo = units.make_units(self.context, identities)
        results, part = units.run_units(self.work, todo, self.cache, self.runtime.engine, self.runtime.gpus)
        self.tally.cached += part.cached
        self.tally.computed += part.computed
        self.kept += todo
        return results


def head_weights(job: Job, loaded, meta, head: str) -> tuple[np.ndarray, np.ndarray, str | None]:
    """(weight [d, C], bias [C], the prompts set's version or None): Language-2P from the base model's class
    embeddings of the `prompts` set's templates (ELEVATER's INIT_HEAD_WITH_TEXT_ENCODER); Random-2P PyTorch's Linear
    init seeded with the run seed (the toolkit's fix_seed)."""
    if head == "random_2p":
        w, b = pytorch_linear_init(int(loaded.model.text_projection.shape[1]), len(meta.classes), job.seed)
        return w, b, None
    rows, stamp = read_text_set(job.texts / "prompts.parquet")
    template = np.array([src == "template" for src in rows.column("source").to_pylist()])
    emb = embed_texts(loaded, [t for t, keep in zip(rows.column("text").to_pylist(), template) if keep])
    w = class_weights(emb, rows.column("class_index").to_numpy()[template], len(meta.classes))
    return w.T.astype(np.float32), np.zeros(len(meta.classes), np.float32), stamp.get("text_version")


class Task:
    """Everything one dataset's runs share: the base weights, the head's initialisation, the decoded images."""

    def __init__(self, job: Job, s: Settings, meta, clip, base, weight, bias, factor, train_images: Images,
                 test_images: Images, device):
        self.job, self.s, self.meta, self.clip, self.base = job, s, meta, clip, base
        self.weight, self.bias, self.factor, self.device = weight, bias, factor, device
        self.train_images, self.test_images = train_images, test_images
        self.labels = labels_of(train_images, meta)
        self.test_labels = labels_of(test_images, meta) if test_images is not None else []
        self.texts_version: str | None = None
        self.trainable_count = 0
        self.exported: dict[str, torch.Tensor] | None = None
        self.trainable_names: list[str] = []

    # ---- one training run
    def model(self) -> Classifier:
        self.clip.load_state_dict(self.base)
        model = Classifier(self.clip, self.weight, self.bias, self.factor).to(self.device)
        self.trainable_names = freeze(model, trainable)
        self.trainable_count = count_parameters(model, self.trainable_names)
        return model

    def fit(self, name: str, rows: np.ndarray, eval_images: Images, eval_rows: np.ndarray, eval_labels,
            lr: float, wd: float, epochs: int, runtime: Runtime) -> tuple[Classifier, np.ndarray, np.ndarray]:
        """Train a fresh model on `rows` for `epochs` epochs (the toolkit's `train_task`); the metric on the evaluation
        rows after every epoch, and the predictions after the last."""
        s, job = self.s, self.job
        with deterministic(job.seed):
            model = self.model()
            params = [p for p in model.parameters() if p.requires_grad]
            optimizer = torch.optim.SGD(params, lr=lr, momentum=s.momentum, weight_decay=wd, nesterov=s.nesterov)
            plan = epoch_batches(rows.size, epochs, s.batch_size)
            y = targets(self.labels, rows, len(self.meta.classes), self.meta.multi_label)
            y_eval = np.asarray(eval_labels)

            def batch(step: int):
                index = plan[step - 1][1]
                return self.train_images.pixels[rows[index]], y[index]

            def after(m, step: int):
                epoch = plan[step - 1][0]
                if step < len(plan) and plan[step][0] == epoch:
                    return None
                probs = self.predict(m, eval_images, eval_rows)
                m.train()
                return {"epoch": epoch + 1, "eval": float(score_heads(probs[None], y_eval, self.meta.metric,
                                                                     "elevater")[0])}

            loop = Loop(name, len(plan), batch, self.loss, constant(lr), job.seed, after)
            log = train(model, optimizer, loop, job.options, runtime, self.device)
        per_epoch = np.array([e["eval"] for e in log if "eval" in e])
        return model, per_epoch, self.predict(model, eval_images, eval_rows).argmax(axis=1)

    def loss(self, model: Classifier, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        logits = model(self.train_images.finish(x))
        if self.meta.multi_label:
            return torch.nn.functional.binary_cross_entropy_with_logits(logits, y)
        return torch.nn.functional.cross_entropy(logits, y)

    @torch.no_grad()
    def predict(self, model: Classifier, images: Images, rows: np.ndarray, chunk: int = 256) -> np.ndarray:
        """Softmax probabilities [n, C] in eval mode (batch norm's running statistics), as the toolkit scores."""
        model.eval()
        out = []
        for lo in range(0, rows.size, chunk):
            x = images.finish(images.pixels[rows[lo:lo + chunk]].to(self.device))
            out.append(model(x).float().cpu().numpy())
        return softmax_np(np.concatenate(out), axis=1)

    # ---- one (shots, seed)
    def setting_rows(self, shots, seed: int):
        """(sampled rows, search-training rows, validation rows, validation targets, rows of the search-only subset or
        None, merge) of one (shots, seed): the few-shot sample and its 20% validation carve-out."""
        s = self.s
        per_class, merge = toolkit_shots(shots)
        n_search = s.search_subset.get(self.meta.name) if shots == "full" else None
        pool = np.arange(len(self.labels))
        rows = pool if (per_class or n_search) is None else few_shot_subset(self.labels, len(self.meta.classes),
                                                                            per_class or n_search, seed)
        y_rows = targets(self.labels, rows, len(self.meta.classes), self.meta.multi_label).numpy()
        train_pos, val_pos = validation_split(y_rows, s.val_fraction)
        if val_pos.size == 0:
            raise FinetuneError(f"dataset {self.meta.name!r}: no validation images in {rows.size} training images "
                                f"({shots} shots, seed {seed})")
        fit, val = rows[train_pos], rows[val_pos]
        val_labels = targets(self.labels, val, len(self.meta.classes), self.meta.multi_label).numpy()
        return rows, fit, val, val_labels, n_search, merge

    def run_setting(self, shots, seed: int, search: "Search") -> dict[str, Any]:
        s = self.s
        rows, fit, val, val_labels, n_search, merge = self.setting_rows(shots, seed)
        pool = np.arange(len(self.labels))
        lrs, wds = s.learning_rates(), s.weight_decays()

        diverged: dict[tuple[int, int], int] = {}  # (lr index, wd index trained) -> the step its loss turned non-finite

        def candidates(requests) -> list[float]:
            """Search runs' scores: each its best validation epoch; a run that diverges is a failed run and scores 0,
            the worst (the toolkit's `except: best_score_ = 0.0`), so it is never chosen over one that did not."""
            identities = [{"shots": shots, "seed": seed, "li": li, "wi": wi, "lr": lrs[li], "wd": wds[wi]}
                          for (_, li), wi in requests]
            out = []
            for ident, result in zip(identities, search.scores(identities)):
                if result["diverged_step"] is not None:
                    li, wi = ident["li"], ident["wi"]
                    diverged[li, wi] = result["diverged_step"]
                    print(f"search-{shots}-{seed}-{li}-{wi}: loss {result['loss']} at step {result['diverged_step']} "
                          f"of {result['steps']} (learning rate {lrs[li]:g}, weight decay {wds[wi]:g}): diverged, "
                          "a failed search run (score 0)")
                out.append(result["score"])
            return out

        outcome = weight_decay_search(candidates,
                                      [("finetune", li) for li in range(len(lrs))], refinement=s.wd_refinement)
        per_lr = [outcome.peaks["finetune", li] for li in range(len(lrs))]
        li = select_learning_rate([score for _, score in per_lr])
        chosen = {"lr": lrs[li] if li is not None else 0.0, "wd": wds[per_lr[li][0]] if li is not None else 0.0,
                  "val_score": per_lr[li][1] if li is not None else 0.0}
        final_rows = pool if n_search else (rows if merge else fit)
        test_rows = np.arange(len(self.test_labels))
        test_y = targets(self.test_labels, test_rows, len(self.meta.classes), self.meta.multi_label).numpy()
        try:
            model, scores, predicted = self.fit(f"final-{shots}-{seed}", final_rows, self.test_images, test_rows,
                                                test_y, chosen["lr"], chosen["wd"], s.final_epochs, self.job.runtime)
        except Diverged as err:
            raise FinetuneError(final_diverged(err, self.meta.name, shots, seed, chosen, s, li, fit.size,
                                               final_rows.size)) from None
        if self.exported is None:
            self.exported = state_on_cpu(model.clip)
            self.export_setting = {"shots": shots, "seed": seed, **chosen}
        return {"shots": shots, "seed": seed, "sampled": int(rows.size), "train": int(fit.size), "val": int(val.size),
                "final_train": int(final_rows.size), "chosen": chosen,
                "final": {"last": float(scores[-1]), "best_on_test": float(scores.max()),
                          "best_epoch": int(scores.argmax()) + 1, "per_epoch": scores.tolist()},
                "search_runs": outcome.runs, "search_diverged": len(diverged),
                "trace": [{**t, "line": ("finetune", t["line"][1]),
                           "diverged_step": diverged.get((t["line"][1], t["trained"]))} for t in outcome.trace],
                "predicted": predicted}


def final_diverged(err: Diverged, dataset: str, shots, seed: int, chosen: Mapping[str, float], s: Settings,
                   li: int | None, search_images: int, final_images: int) -> str:
    """The one-line error of a final run that diverged: the run, the search's choice, and a grid that leaves out the
    chosen learning rate (the smaller rates of this grid; a grid one step lower when it was the smallest)."""
    lower, upper = s.lr_log_range
    key = "-S ++adapt.elevater.lr_grid"  # ++: set whether or not params.yaml has the key
    if li:
        grid = f"{key}.log_upper={math.log10(s.learning_rates()[li - 1]):g} {key}.num={li}"
    else:
        step = (upper - lower) / (s.lr_num - 1) if s.lr_num > 1 else 1
        grid = f"{key}.log_lower={lower - step:g} {key}.log_upper={upper - step:g}"
    return (f"finetune {METHOD} on {dataset!r}: the final run {err.run} ({shots} shots, seed {seed}) diverged at step "
            f"{err.step} of {err.steps} (loss {err.loss}) with the search's choice: learning rate {chosen['lr']:g}, "
            f"weight decay {chosen['wd']:g} (validation score {chosen['val_score']:.4f} after {s.search_epochs} search "
            f"epoch(s) on {search_images} images; the final run: {s.final_epochs} epochs on {final_images}); rerun "
            f"searching smaller learning rates: {grid} (docs/protocols.md, \"Fine-tuning: ELEVATER full\")")


def outcome(job: Job, s: Settings, head: str, meta, runs: list[dict], task: Task, texts_version, seconds) -> Outcome:
    m = task.trainable_count
    summary = {}
    for shots in s.shots:
        values = [r["final"][s.report] for r in runs if r["shots"] == shots]
        mean = float(np.mean(values))
        summary[str(shots)] = {"mean": mean, "std": float(np.std(values, ddof=1)) if len(values) > 1 else 0.0,
                               "per_seed": values, **parameter_efficiency(mean, m, s)}
    metrics = {f"{METHOD}/{head}/{k}/{s.report}": v["mean"] for k, v in summary.items()}
    metrics.update({f"{METHOD}/{head}/{k}/pe": v["pe"] for k, v in summary.items()})
    table = with_status(search_table([{**r, "trace": [{**t, "line": (head, t["line"][1])} for t in r["trace"]]}
                                      for r in runs], s), [t for r in runs for t in r["trace"]])
    hyper = {"head": head, **task.export_setting, "settings": settings_details(replace(s, heads=(head,)), job.seed),
             "options": {k: job.options.get(k) for k in ("precision",)}}
    kept = [{k: v for k, v in r.items() if k not in ("trace", "predicted")} for r in runs]
    return Outcome(
        state_dict=task.exported, trainable=task.trainable_names, hyper=hyper, metrics=metrics,
        details={"summary": summary, "trainable_params": m, "runs": kept, "exported": task.export_setting,
                 "settings": settings_details(replace(s, heads=(head,)), job.seed), "texts_version": texts_version},
        tables={"search": table}, counts={"pool": len(task.labels), "test": len(task.test_labels)},
        run={"seconds": seconds}, chart=search_chart(table.to_pylist(), meta.name))


def with_status(table: pa.Table, trace: list[Mapping[str, Any]]) -> pa.Table:
    """The probe's search table (one row per candidate, in `trace` order) with `status` ("ok" | "diverged") and
    `diverged_step` (the step of the run whose loss was not finite; null for a run that finished)."""
    steps = [t["diverged_step"] for t in trace]
    return (table.append_column("status", pa.array(["ok" if x is None else "diverged" for x in steps], pa.string()))
            .append_column("diverged_step", pa.array(steps, pa.int64())))


def search_chart(rows: list[Mapping[str, Any]], dataset: str) -> dict[str, Any]:
    """Validation accuracy over the search, in the order the runs were made, one colour per learning rate."""
    values = [{**r, "order": i + 1, "lr": f"{r['lr']:.0e}", "setting": f"{r['shots']} shots, seed {r['seed']}"}
              for i, r in enumerate(rows)]
    return {"$schema": "https://vega.github.io/schema/vega-lite/v5.json",
            "title": f"ELEVATER full fine-tuning search on {dataset}: best validation score per run",
            "data": {"values": values}, "mark": {"type": "point", "filled": True},
            "encoding": {"x": {"field": "order", "type": "quantitative", "title": "search run"},
                         "y": {"field": "val_score", "type": "quantitative", "title": "validation score"},
                         "color": {"field": "lr", "type": "nominal", "title": "learning rate"},
                         "shape": {"field": "setting", "type": "nominal"},
                         "tooltip": [{"field": "wd", "type": "quantitative"}, {"field": "round", "type": "quantitative"},
                                     {"field": "status", "type": "nominal"}]},
            "width": 480, "height": 240}


def epoch_batches(n: int, epochs: int, batch_size: int) -> list[tuple[int, np.ndarray]]:
    """(epoch, row positions) of every training step: the toolkit's loader orders (generator seeded 0 per run),
    batches of `batch_size`, a last batch of one image skipped."""
    plan = []
    for epoch, order in enumerate(epoch_orders(n, epochs)):
        plan += [(epoch, order[i:i + batch_size]) for i in range(0, n, batch_size) if order[i:i + batch_size].size > 1]
    if not plan:
        raise FinetuneError(f"no training batch of two or more images in {n} images")
    return plan
