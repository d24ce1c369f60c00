"""The table of analyses. Stages, the report, compare and the config tests read it; nothing else lists analyses.

Each analysis is one module here with `run(inputs: Inputs, cfg: Mapping, seed: int) -> Result`: cached
features in (through `Inputs`, which checks every fingerprint), metrics and tables out. An analysis never
loads a model and does not import torch at start-up. The table holds what each analysis is (its module, title,
headline metrics, what its numbers mean, its per-sample tables, its inputs) as plain data, and names no module of the
layers above it: the report keeps its charts and summaries (vlbench.report.registry), the pipeline its stage
(vlbench.pipeline). Adding one touches four places: its module, its entry below, its chart (an entry in
vlbench/report/registry.py; the default bar chart needs none), its config section (its defaults in
conf/settings/<name>.yaml; `<name>: {}` and `suite.<name>: []` in conf/config.yaml); `vlbench compose` then writes
its dvc.yaml stage (docs/architecture.md).
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from dataclasses import dataclass
from fnmatch import fnmatchcase
from types import ModuleType

from vlbench.datasets.canonical import METRICS as DATASET_METRICS  # DataComp's included: its cells are headlines
from vlbench.errors import VlbenchError


@dataclass(frozen=True)
class SampleTable:
    """A table an analysis keeps beside its JSON, reports/<analysis>/<dataset>.<name>.parquet, and how `vlbench
    compare` pairs two or more runs on it (docs/protocols.md, "Paired comparisons"). `unit`: what is resampled or
    paired (image, query, trial, episode, seed, class); `key`: the columns naming one row, equal in every run or the
    runs are refused; `metrics`: the metric keys it pairs (fnmatch patterns); `select`: a template of the metric key
    ("{positive}_vs_{negative}", "fewtrans/{split}/{method}"): each field that names a column keeps the rows whose
    column equals the field's text, the others are parameters (`at_most`, `value`).

    `statistic` (vlbench.stats, "Many systems on the same units"):
    - "correct": the metric from per-row correctness (the boolean column `correct`, or `predicted` == `label`):
      `measure` (default: the metric key itself; candidates `accuracy` and `mean_per_class` where the key is not a
      measure, the one that reproduces the result file's number) is `accuracy` (a ratio; McNemar's exact test),
      `mean_per_class` (the mean over the `label` column's classes) or `worst_group_accuracy` (the minimum over the
      `groups` column); paired bootstrap over the rows.
    - "scores": a whole-set metric (`map_11point`, `roc_auc`, `f1_macro`) or a worst-group top-k accuracy from the
      per-class scores in column `scores` and the `label` column (class indices, or lists of them for multi-label).
    - "mean": the mean of the numeric column `value` (or `value <= at_most`, recall@k) over rows; with `cluster`, a
      ratio over clusters (the rows of one cluster resampled together: an image with all its captions).
    - "t": the mean over units (`per`: the column naming a unit when it spans many rows, its number the `measure` of
      its rows' correctness; else one row per unit and its number in `value`); differences: a paired t-interval.
    - "median": the median over the `per` column's runs of each run's accuracy, resampling the shared test rows.
    - None: no paired test (`unpaired` says why; the difference is compared from the two intervals only with
      `vlbench compare --unpaired`).
    The paired numbers must reproduce each run's result file, or the table does not pair that metric; an analysis may
    declare several tables for a metric: the first that pairs it is used (ELEVATER: over seeds, or with one seed over
    its images)."""

    name: str
    unit: str
    metrics: tuple[str, ...] = ()
    key: tuple[str, ...] = ("sample_id",)
    statistic: str | None = "correct"
    label: str | None = "label"
    predicted: str | None = "predicted"
    correct: str | None = None
    select: str | None = None
    measure: str | None = None
    groups: str | None = None
    value: str | None = None
    at_most: str | None = None
    cluster: str | None = None
    per: str | None = None
    scores: str | None = None
    unpaired: str = ""

    def columns(self, fields: Mapping[str, str] | None = None, measure: str | None = None) -> list[str]:
        """The columns compare reads for a metric whose `select` fields are `fields` (nothing else, so a table may
        carry more): the key, the selecting columns, and what the statistic and `measure` need."""
        fields = fields or {}
        value = self.value if self.value and "{" not in self.value else None
        if self.value and fields:
            value = self.value.format(**fields)
        needs: list[str | None] = []
        if self.statistic in ("correct", "t", "median"):
            needs += [self.correct] if self.correct else [self.predicted, self.label]
            needs += [self.label] if measure != "accuracy" else []
        if self.statistic == "scores":
            needs += [self.scores, self.label]
        if measure and measure.startswith("worst_group"):
            needs.append(self.groups)
        names = [*self.key, *needs, self.cluster, self.per, value]
        return list(dict.fromkeys(n for n in names if n))


def _unpaired(name: str, unit: str, key: tuple[str, ...], reason: str,
              metrics: tuple[str, ...] = ("*",)) -> SampleTable:
    return SampleTable(name, unit, metrics, key, statistic=None, label=None, predicted=None, unpaired=reason)


@dataclass(frozen=True)
class Analysis:
    """`module`: the module whose `run` computes it from cached features; None where its results come from a stage
    of its own that runs a model (fine-tuning; the pipeline says which); `headline`: fnmatch patterns of the metric
    keys the report's headline table shows; `explain`: what the numbers mean, for the page (reports/index.html, which
    reads it with `title`); `tables`: the per-sample tables it writes (`SampleTable`: the unit that pairs two runs and
    the statistic), which `vlbench compare` reads as declared, in this order (the first whose `metrics` match a metric
    pairs it); `reads`: its inputs, dvc.yaml dependencies per dataset (`prepared`: data/prepared/<d>, `texts`:
    data/texts/<d>, `features`: features/<model>/<d>, `images`: its image features only; any other string is a path
    as dvc.yaml writes it); `dataset_metric`: its number on a dataset is the dataset's own metric, so its headline
    there is the metric the entry declares (`main_metric`). Its config section is `<name>` (settings) and
    `suite.<name>` (datasets); its dvc.yaml stage is generated from this row (the pipeline); its charts are the
    report's."""

    name: str
    module: str | None
    title: str
    headline: tuple[str, ...] = ("*",)
    explain: str = ""
    tables: tuple[SampleTable, ...] = ()
    reads: tuple[str, ...] = ("prepared", "texts", "features")
    dataset_metric: bool = False

    @property
    def table_names(self) -> tuple[str, ...]:
        """The names of the tables it writes, each once (several declarations may pair metrics on one table)."""
        return tuple(dict.fromkeys(t.name for t in self.tables))

    def main_metric(self, values: Mapping[str, object], declared: str | None = None) -> str | None:
        """The one number of a dataset's metrics that stands for the analysis (reports/headline.json, what `dvc exp
        show` lists): the metric the dataset's entry declares (`declared`, vlbench.datasets.registry.declared_metric)
        where the analysis reports the dataset's metric and the values hold it, else the first numeric key matching
        `headline`, in pattern order."""
        if self.dataset_metric and declared is not None and _is_number(values.get(declared)):
            return declared
        return next((k for p in self.headline for k in values if fnmatchcase(k, p) and _is_number(values[k])), None)


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


# predictions per image: accuracy, mean-per-class and worst-group accuracy from the predicted class; the whole-set
# metrics (11-point mAP of multi-label data from `labels`, ROC-AUC, macro F1, worst-group top-5) from the logits
_PREDICTIONS = (SampleTable("predictions", "image", ("accuracy", "mean_per_class", "worst_group_accuracy"),
                            groups="group"),
                SampleTable("predictions", "image", ("map_11point",), statistic="scores", label="labels",
                            predicted=None, scores="logits"),
                SampleTable("predictions", "image", ("roc_auc", "f1_macro", "worst_group_top5"), statistic="scores",
                            predicted=None, scores="logits", groups="group"),
                # WinoGAViL (zeroshot.evaluate_winogavil): one row per instance, the mean Jaccard of those the metric
                # counts (column `counts_in` names it: the 10- and 12-candidate instances)
                SampleTable("predictions", "instance", ("winogavil_jaccard",), statistic="mean", label=None,
                            predicted=None, select="{counts_in}", value="jaccard"))
_NOT_SAMPLED = "compared from the two intervals"

ANALYSES = {a.name: a for a in (
    Analysis("zeroshot", "vlbench.analyses.zeroshot", "Zero-shot classification (CLIP prompt ensembles)",
             headline=DATASET_METRICS + ("knowledge_best_*",),
             explain="Each test image is classified by the class whose prompt ensemble (the mean of its normalised "
                     "template embeddings) is most similar; the number is the dataset's own metric on the test split. "
                     "knowledge_best_* is the best knowledge-augmented prompt variant (WordNet, Wiktionary, LLM "
                     "descriptions, retrieval) on the same split.",
             tables=_PREDICTIONS, dataset_metric=True),
    Analysis("linear_probe", "vlbench.analyses.linear_probe", "Linear probe (CLIP-paper logistic regression)",
             headline=DATASET_METRICS,
             explain="A logistic regression on frozen image features, its L2 strength chosen on a validation split "
                     "as in the CLIP paper, then refit on train + validation; the dataset's metric on the test split.",
             tables=_PREDICTIONS, reads=("prepared", "images"), dataset_metric=True),
    Analysis("specificity", "vlbench.analyses.specificity", "Specificity (true vs subtly wrong texts: mAP per cell)",
             explain="For each kind of true text (captions, single labels, multi labels) against each kind of wrong "
                     "text (random, relevant, altered), the mAP with which an image's true texts rank above the wrong "
                     "ones; 1 is perfect, the heat map gives each cell's chance level.",
             tables=(SampleTable("ap", "image", ("*_vs_*",), ("sample_id", "positive", "negative"), "mean",
                                 label=None, predicted=None, select="{positive}_vs_{negative}", value="ap"),)),
    Analysis("compositionality", "vlbench.analyses.compositionality",
             "Compositionality (SugarCrepe, Winoground, ARO: the right text among compositional distractors)",
             headline=("mean", "group", "text", "image", "macro_accuracy", "precision_at_1"),
             explain="Beside specificity: each image is scored against its true text and texts that reorder, swap, "
                     "replace or add its objects, attributes or relations. SugarCrepe: per category the fraction of "
                     "images whose true caption scores above the hard negative (mean: of the categories); Winoground: "
                     "text score (each image prefers its own caption), image score (each caption its own image), "
                     "group score (both), chance 25%, 25%, 16.7%; ARO: macro accuracy over VG relations or attribute "
                     "pairs (chance 50%) and precision@1 of the true caption among its four word-order shuffles "
                     "(COCO-/Flickr-Order, chance 20%). The demo swaps or replaces the colours and shapes of "
                     "two-object scenes.",
             tables=(SampleTable("trials", "trial", ("mean", "macro_accuracy"), ("item", "sample_id"),
                                 label="category", predicted=None, correct="correct", measure="mean_per_class"),
                     SampleTable("trials", "trial", ("*",), ("item", "sample_id"), label=None, predicted=None,
                                 correct="correct", select="{category}", measure="accuracy"))),
    Analysis("retrieval", "vlbench.analyses.retrieval", "Zero-shot image-text retrieval (Recall@1/5/10, CLIP Table 13)",
             headline=("i2t_r*", "t2i_r*"),
             explain="Image-to-text (i2t): each test image ranks every caption of the test set by cosine similarity; "
                     "R@K is the fraction of images with one of their own captions among the K best. Text-to-image "
                     "(t2i): each caption ranks every image; R@K is the fraction of captions whose image is among the "
                     "K best. A negative that ties with a positive ranks above it; intervals resample test images "
                     "with their captions.",
             tables=(SampleTable("i2t_ranks", "image", ("i2t_r*",), statistic="mean", label=None, predicted=None,
                                 select="i2t_r{k}", value="rank", at_most="k"),
                     SampleTable("t2i_ranks", "image", ("t2i_r*",), ("caption_row",), "mean", label=None,
                                 predicted=None, select="t2i_r{k}", value="rank", at_most="k", cluster="sample_id")),
             dataset_metric=True),
    Analysis("granularity", "vlbench.analyses.granularity", "Granularity (WordNet levels: direct vs propagated mAP)",
             headline=("leaf_map", "coarse_map_*", "twolevel_*"),
             explain="mAP of the leaf classes and of the coarse WordNet classes above them, scored directly by their "
                     "own prompts or propagated from their children or leaves; a model consistent across levels "
                     "scores coarse classes directly about as well as by propagation.",
             tables=(_unpaired("classes", "class", ("wnid",), "AP per class: the classes are the fixed vocabulary, "
                               f"not sampled units, and the per-image scores are not kept; {_NOT_SAMPLED}"),),
             reads=("prepared", "texts", "data/texts/${granularity.corpus}", "features")),
    Analysis("adapt", "vlbench.analyses.adapt", "Adaptation (ELEVATER linear probing, VTAB-1k, FewTrans episodes)",
             headline=("elevater/*/full/*", "elevater/*/5/*", "vtab/*", "fewtrans/*"),
             explain="Heads trained on few labelled images per class: ELEVATER's linear probes at 5, 20, 50 shots and "
                     "the full training set (the mean over seeds of the test metric), the VTAB-1k median, and "
                     "FewTrans's mean accuracy over episodes; `mean` is the mean over datasets (the ELEVATER score).",
             tables=(SampleTable("elevater_predictions", "seed", ("elevater/*",), ("head", "shots", "seed", "sample_id"),
                                 "t", select="elevater/{head}/{shots}/{report}", per="seed"),
                     SampleTable("elevater_predictions", "image", ("elevater/*",),  # one seed (`full`): its images
                                 ("head", "shots", "seed", "sample_id"), select="elevater/{head}/{shots}/{report}"),
                     SampleTable("vtab_predictions", "image", ("vtab/median",), ("run", "sample_id"), "median",
                                 measure="accuracy", per="run"),
                     SampleTable("episodes", "episode", ("fewtrans/*",), ("split", "episode"), "t", label=None,
                                 predicted=None, select="fewtrans/{split}/{method}", value="{method}"),
                     _unpaired("elevater_search", "search candidate", ("head", "shots", "seed", "lr", "wd_index"),
                               "the search's candidates on validation data, not test samples", ()))),
    Analysis("extensibility", "vlbench.analyses.extensibility",
             "Extensibility and stability under vocabulary expansion (Acc-C / Acc-E / Acc-S)",
             headline=("acc_c_*", "acc_e_*", "acc_s_*", "adversarial_*"),
             explain="Acc-C: each group of classes alone; Acc-E: accuracy as groups join the vocabulary with their "
                     "images; Acc-S: a group's images as other groups join as distractors. Per prompt variant; a drop "
                     "from Acc-C to Acc-E or Acc-S measures how much a larger vocabulary hurts.",
             tables=(_unpaired("vocabulary", "word", ("word",), "the adversarial words and the images each harms, not test "
                               "samples of a metric"),)),
    Analysis("robustness", "vlbench.analyses.robustness",
             "Robustness to natural distribution shifts (effective robustness)",
             headline=("accuracy", "reference_accuracy", "effective_robustness"),
             explain="Each shifted test set (ImageNetV2, ImageNet-Sketch, ImageNet-R, ImageNet-A, ObjectNet; on the demo, "
                     "the shapes drawn as outlines) is classified with the in-distribution dataset's own class prompts, "
                     "restricted to the classes its authors keep (R and A: 200; ObjectNet: the ImageNet classes of its 113, "
                     "the prediction mapped back). effective_robustness is the shift accuracy minus what the reference "
                     "line predicts from the in-distribution zero-shot accuracy (logit-linear fit, Taori et al. 2020); "
                     "the lines are fit on open_clip's published results, so 0 means as robust as a typical CLIP model, "
                     "and the demo's line is y = x (no reference population).",
             tables=(SampleTable("predictions", "image", ("accuracy",), predicted=None, correct="correct"),),
             # the shift's images, scored with the reference dataset's prompts at its zero-shot accuracy
             reads=("prepared", "features", "data/prepared/${robustness.reference}",
                    "data/texts/${robustness.reference}", "features/${model.slug}/${robustness.reference}",
                    "reports/zeroshot/${robustness.reference}.json")),
    Analysis("finetune", None, "Fine-tuning (ELEVATER full fine-tuning, NegCLIP, FewTrans episodic)",
             explain="The model's weights trained on the dataset by the method `finetune.method` names: ELEVATER's "
                     "full fine-tuning (test accuracy per shots, the mean over seeds, its learning rate and weight "
                     "decay searched as the linear probe's), NegCLIP (specificity and zero-shot before and after "
                     "training with hard negatives) or FewTrans's episodic fine-tuning (the mean accuracy over the "
                     "same episodes adapt samples, per method). The fine-tuned weights are a model of their own "
                     "(conf/model/<slug>.yaml with `finetune`), on which every analysis runs.",
             # FewTrans methods: the accuracy per episode (adapt's episodes format), a paired t-interval over episodes
             tables=(SampleTable("episodes", "episode", ("fewtrans/*",), ("split", "episode"), "t", label=None,
                                 predicted=None, select="fewtrans/{split}/{method}", value="{method}"),
                     _unpaired("search", "search candidate", ("shots", "seed", "lr", "wd"),
                               "the search's candidates on validation data, not test samples", ()),
                     _unpaired("comparison", "metric", ("analysis", "metric"), "before and after, one row per "
                               "metric: not samples", ()),
                     _unpaired("train_log", "step", ("step",), "the training loss per step: not samples", ()))),
)}


class UnknownAnalysisError(VlbenchError):
    """An analysis name that is not in the table."""


def analysis(name: str) -> Analysis:
    if name not in ANALYSES:
        raise UnknownAnalysisError(f"unknown analysis {name!r}; known analyses: {', '.join(ANALYSES)}")
    return ANALYSES[name]


def load(name: str) -> ModuleType:
    """The module of analysis `name` (its `run`)."""
    module = analysis(name).module
    if module is None:
        raise UnknownAnalysisError(f"{name} has no analysis module: a stage of its own writes its results (it runs "
                                   "a model)")
    return importlib.import_module(module)
