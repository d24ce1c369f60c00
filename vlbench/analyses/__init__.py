"""The table of analyses. Stages, the report and the config tests read it; nothing else lists analyses.

Each analysis is one module here with `run(inputs: Inputs, cfg: Mapping, seed: int) -> Result`: cached
features in (through `Inputs`, which checks every fingerprint), metrics and tables out. An analysis never
loads a model and does not import torch at start-up. Adding one touches: its module, its entry below,
its dvc.yaml block, its config section (conf/config.yaml: `<name>:` and `suite.<name>: []`), its tests.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from types import ModuleType

from vlbench.errors import VlbenchError


@dataclass(frozen=True)
class Analysis:
    """`charts`: "module:function" names, each `f(analysis, results, metrics, out_dir) -> list[Path]` (results:
    {dataset: result JSON}; metrics: all of reports/metrics.json) writing SVGs under reports/plots; `summary`: an
    optional "module:function" `f(metrics, results) -> metrics` adding cross-dataset numbers (adapt's means);
    `headline`: fnmatch patterns of the metric keys the report's headline table shows; `explain`: what the
    numbers mean, for the page (reports/index.html)."""

    name: str
    module: str
    title: str
    charts: tuple[str, ...] = ("vlbench.report.plots:bars",)
    headline: tuple[str, ...] = ("*",)
    explain: str = ""
    summary: str | None = None


_DATASET_METRICS = ("accuracy", "mean_per_class", "map_11point", "roc_auc")

ANALYSES = {a.name: a for a in (
    Analysis("zeroshot", "vlbench.analyses.zeroshot", "Zero-shot classification (CLIP prompt ensembles)",
             charts=("vlbench.report.plots:bars", "vlbench.report.plots:knowledge_variants"),
             headline=_DATASET_METRICS + ("knowledge_best_*",),
             explain="Each test image is classified by the class whose prompt ensemble (the mean of its normalised "
                     "template embeddings) is most similar; the number is the dataset's own metric on the test split. "
                     "knowledge_best_* is the best knowledge-augmented prompt variant (WordNet, Wiktionary, LLM "
                     "descriptions, retrieval) on the same split."),
    Analysis("linear_probe", "vlbench.analyses.linear_probe", "Linear probe (CLIP-paper logistic regression)",
             headline=_DATASET_METRICS,
             explain="A logistic regression on frozen image features, its L2 strength chosen on a validation split "
                     "as in the CLIP paper, then refit on train + validation; the dataset's metric on the test split."),
    Analysis("specificity", "vlbench.analyses.specificity", "Specificity (true vs subtly wrong texts: mAP per cell)",
             charts=("vlbench.report.plots:bars", "vlbench.report.plots:specificity_heatmap"),
             explain="For each kind of true text (captions, single labels, multi labels) against each kind of wrong "
                     "text (random, relevant, altered), the mAP with which an image's true texts rank above the wrong "
                     "ones; 1 is perfect, the heat map gives each cell's chance level."),
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
                     "two-object scenes."),
    Analysis("retrieval", "vlbench.analyses.retrieval", "Zero-shot image-text retrieval (Recall@1/5/10, CLIP Table 13)",
             headline=("i2t_r*", "t2i_r*"),
             explain="Image-to-text (i2t): each test image ranks every caption of the test set by cosine similarity; "
                     "R@K is the fraction of images with one of their own captions among the K best. Text-to-image "
                     "(t2i): each caption ranks every image; R@K is the fraction of captions whose image is among the "
                     "K best. A negative that ties with a positive ranks above it; intervals resample test images "
                     "with their captions."),
    Analysis("granularity", "vlbench.analyses.granularity", "Granularity (WordNet levels: direct vs propagated mAP)",
             charts=("vlbench.report.plots:bars", "vlbench.report.plots:granularity_levels"),
             headline=("leaf_map", "coarse_map_*", "twolevel_*"),
             explain="mAP of the leaf classes and of the coarse WordNet classes above them, scored directly by their "
                     "own prompts or propagated from their children or leaves; a model consistent across levels "
                     "scores coarse classes directly about as well as by propagation."),
    Analysis("adapt", "vlbench.analyses.adapt", "Adaptation (ELEVATER linear probing, VTAB-1k, FewTrans episodes)",
             charts=("vlbench.report.plots:bars", "vlbench.report.adapt:shots_chart"),
             headline=("elevater/*/full/*", "elevater/*/5/*", "vtab/*", "fewtrans/*"),
             summary="vlbench.report.adapt:summary",
             explain="Heads trained on few labelled images per class: ELEVATER's linear probes at 5, 20, 50 shots and "
                     "the full training set (the mean over seeds of the test metric), the VTAB-1k median, and "
                     "FewTrans's mean accuracy over episodes; `mean` is the mean over datasets (the ELEVATER score)."),
    Analysis("extensibility", "vlbench.analyses.extensibility",
             "Extensibility and stability under vocabulary expansion (Acc-C / Acc-E / Acc-S)",
             charts=("vlbench.report.plots:bars", "vlbench.report.extensibility:charts"),
             headline=("acc_c_*", "acc_e_*", "acc_s_*", "adversarial_*"),
             explain="Acc-C: each group of classes alone; Acc-E: accuracy as groups join the vocabulary with their "
                     "images; Acc-S: a group's images as other groups join as distractors. Per prompt variant; a drop "
                     "from Acc-C to Acc-E or Acc-S measures how much a larger vocabulary hurts."),
    Analysis("robustness", "vlbench.analyses.robustness",
             "Robustness to natural distribution shifts (effective robustness)",
             charts=("vlbench.report.robustness:charts",),
             headline=("accuracy", "reference_accuracy", "effective_robustness"),
             explain="Each shifted test set (ImageNetV2, ImageNet-Sketch, ImageNet-R, ImageNet-A, ObjectNet; on the demo, "
                     "the shapes drawn as outlines) is classified with the in-distribution dataset's own class prompts, "
                     "restricted to the classes its authors keep (R and A: 200; ObjectNet: the ImageNet classes of its 113, "
                     "the prediction mapped back). effective_robustness is the shift accuracy minus what the reference "
                     "line predicts from the in-distribution zero-shot accuracy (logit-linear fit, Taori et al. 2020); "
                     "the lines are fit on open_clip's published results, so 0 means as robust as a typical CLIP model, "
                     "and the demo's line is y = x (no reference population)."),
)}


class UnknownAnalysisError(VlbenchError):
    """An analysis name that is not in the table."""


def analysis(name: str) -> Analysis:
    if name not in ANALYSES:
        raise UnknownAnalysisError(f"unknown analysis {name!r}; known analyses: {', '.join(ANALYSES)}")
    return ANALYSES[name]


def load(name: str) -> ModuleType:
    return importlib.import_module(analysis(name).module)
