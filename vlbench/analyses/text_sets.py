"""The text sets the suite's analyses read that a dataset's entry alone decides (`prompts_<name>`, `captions_prompted`),
checked before anything runs: by `vlbench.compose.compose`, by the first stage of every run (`stages.code`) and by
the stages that read them (`stages.repe`, `stages.analysis`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from vlbench.dataset_entries import dataset_entry
from vlbench.params import CONF, ParamsError, conf_dir, defaults
from vlbench.texts import CAPTION_PROMPT_SET


def made_text_sets(entry: Mapping[str, Any]) -> set[str]:
    """The text sets an entry makes from its own `texts` params, known before anything is prepared: `prompts`,
    `prompts_<name>` per `prompt_sets` entry, `captions_prompted` with a `caption_prompt`. (Sets made from the
    prepared data, such as `captions`, are not known here.)"""
    texts = entry.get("texts") or {}
    made = {"prompts", *(f"prompts_{name}" for name in (texts.get("prompt_sets") or {}))}
    return made | ({CAPTION_PROMPT_SET} if texts.get("caption_prompt") is not None else set())


def text_set_needs(params: Mapping[str, Any]) -> list[tuple[str, str, str]]:
    """(analysis, dataset, text set) for every text set that an analysis of the suite reads and that the entry alone
    decides (`prompts_<name>`, `captions_prompted`): extensibility's variants (datasets and set members), adapt
    FewTrans' zeroshot method, repe's prompts, retrieval's captions."""
    def setting(dotted: str) -> Any:  # the default where params leave the key out
        node: Any = params
        for key in dotted.split("."):
            node = node.get(key) if isinstance(node, Mapping) else None
        return defaults(dotted) if node is None else node

    suite = params["suite"]
    members = list(suite.get("extensibility") or []) + [d for ds in (suite.get("extensibility_sets") or {}).values()
                                                          for d in ds]
    needs = [("extensibility", d, f"prompts_{v}") for d in dict.fromkeys(members)
             for v in setting("extensibility.variants") if v != "repe"]
    if "fewtrans" in setting("adapt.protocols") and "zeroshot" in setting("adapt.fewtrans.methods"):
        needs += [("adapt", d, setting("adapt.fewtrans.text_set")) for d in suite.get("adapt") or []]
    needs += [("repe", d, setting("repe.prompts")) for d in suite.get("repe") or []]
    per_dataset = setting("retrieval.dataset_text_sets")
    needs += [("retrieval", d, per_dataset.get(d, setting("retrieval.text_set"))) for d in suite.get("retrieval") or []]
    return [(a, d, t) for a, d, t in needs if t.startswith("prompts_") or t == CAPTION_PROMPT_SET]


def check_text_sets(params: Mapping[str, Any], config_dir: str | Path | None = None, known_only: bool = False) -> None:
    """Every text set an analysis of the suite needs (`text_set_needs`) is made by the dataset's entry: else one
    line naming the analysis, the dataset, the set and the entry key that makes it, before anything runs.
    `known_only` (a stage's check of params.yaml): skip datasets without an entry file (their prepare stage says so),
    and everything outside a project checkout (no conf/config.yaml)."""
    conf = Path(config_dir) if config_dir else CONF
    if known_only and not (isinstance(params.get("suite"), Mapping) and (conf / "config.yaml").is_file()):
        return
    slug = params["suite"].get("slug")
    for analysis, dataset, name in text_set_needs(params):
        path = conf_dir(config_dir) / "dataset" / f"{dataset}.yaml"
        if known_only and not path.is_file():
            continue
        if name in made_text_sets(dataset_entry(params, dataset, config_dir)):
            continue
        key = "caption_prompt: 'a photo of {c}'" if name == CAPTION_PROMPT_SET else \
            f"prompt_sets: {{{name.removeprefix('prompts_')}: [...]}}"
        raise ParamsError(f"suite {slug!r}: {analysis} on dataset {dataset!r} needs text set {name!r}, which "
                          f"{path} does not make: add `{key}` under its `texts` (or the suite's `entries: "
                          f"{{{dataset}: {{texts: ...}}}}`), or change the {analysis} params that ask for it")
