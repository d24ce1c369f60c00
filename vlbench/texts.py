"""Text sets: every text an analysis scores, as data (DESIGN.md, "Text sets").

`data/texts/<dataset>/<set>.parquet` holds one row per text: an owner column (`class_index` for class
prompts, `sample_id` for a sample's captions, `key` for free vocabularies), `source` (`template`, `caption`,
...) and `text`. A set's version is a hash of its rows and travels in the file's schema metadata, so text
features can say exactly which texts they encode. Text sets depend on the class list and the entry's
`texts` params, never on images: editing a prompt re-embeds texts only.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Mapping

import pyarrow as pa
import pyarrow.parquet as pq

from vlbench.datasets.canonical import DatasetError, DatasetMeta, iter_batches, objective_classes, split_path
from vlbench.io import atomic_dir
from vlbench.params import check_name
from vlbench.paths import prepared_dir

OWNERS = ("class_index", "sample_id", "key")
META_KEY = b"vlbench.text_set"
DEFAULT_TEMPLATES = ["a photo of a {c}."]
PREPARED_TEMPLATES = "prepared"  # texts.templates: the templates the prepared data recorded (webdataset shards)
ELEVATER_DATA = Path(__file__).resolve().parent / "datasets" / "data" / "elevater.json"
OPENCLIP_TEMPLATES = {"simple_imagenet": "SIMPLE_IMAGENET_TEMPLATES", "openai_imagenet": "OPENAI_IMAGENET_TEMPLATES"}
TEXTS_KEYS = ("templates", "hierarchy", "groups", "specificity", "knowledge", "vocabulary", "prompt_sets",
              "caption_prompt")
# caption_prompt: a template with '{c}' filled with every caption: the text set `captions_prompted` (the CLIP paper's
# "a photo of {c}" for zero-shot retrieval; vlbench/analyses/retrieval.py)
CAPTION_PROMPT_SET = "captions_prompted"
# vocabulary, prompt_sets: adversarial candidate words and named class-prompt sets (prompts_<name>), made by the texts
# stage with vlbench.knowledge.vocabulary (the extensibility analysis reads them)
# knowledge: the knowledge vocabulary whose files describe the classes (vlbench.knowledge.sources.vocabulary_for); read
# by the knowledge stage, not here
# hierarchy, groups: coarse-class prompts, made by the texts stage with vlbench.knowledge.coarse_texts;
# specificity: label prompts and altered captions, made by the texts stage with vlbench.knowledge.negatives (not imported
# here, so that only the texts stage depends on the noun finder)


def text_table(owner: str, owners: list, sources: list[str], texts: list[str]) -> pa.Table:
    if owner not in OWNERS:
        raise ValueError(f"text set owner column {owner!r} is not one of {OWNERS}")
    owner_type = pa.int64() if owner == "class_index" else pa.string()
    return pa.table({owner: pa.array(owners, owner_type), "source": pa.array(sources, pa.string()),
                     "text": pa.array(texts, pa.string())})


def owner_column(table: pa.Table) -> str:
    found = [c for c in OWNERS if c in table.column_names]
    if len(found) != 1:
        raise DatasetError(f"a text set has exactly one owner column of {OWNERS}; found {found}")
    return found[0]


def text_set_version(table: pa.Table) -> str:
    rows = json.dumps(table.to_pylist(), sort_keys=True, ensure_ascii=False)
    return hashlib.sha256(rows.encode()).hexdigest()[:16]


def check_templates(dataset: str, templates: Any) -> list[str]:
    if (not isinstance(templates, list) or not templates
            or not all(isinstance(t, str) and "{c}" in t for t in templates)):
        raise DatasetError(f"dataset {dataset!r}: texts.templates must be a non-empty list of strings, each with a "
                           f"'{{c}}' placeholder, or a named source such as 'openclip:openai_imagenet'; got {templates!r}")
    return templates


def entry_templates(dataset: str, cfg: Mapping[str, Any]) -> list[str]:
    """The entry's `texts.templates`: a list of templates with '{c}', or a named source of them
    (`openclip:openai_imagenet`, CLIP's 80 ImageNet templates; `openclip:simple_imagenet`; `elevater:<dataset>`:
    `resolve_templates`)."""
    value = cfg.get("templates", DEFAULT_TEMPLATES)
    if value == PREPARED_TEMPLATES:
        return prepared_templates(dataset)
    if isinstance(value, str) and ":" in value:
        return resolve_templates(dataset, "texts.templates", value, [])
    return check_templates(dataset, value)


def prepared_templates(dataset: str) -> list[str]:
    """`texts.templates: prepared`: the templates the source recorded in the prepared classes.json
    (`provenance.templates`; webdataset shards' zeroshot_classification_templates.txt, vlbench/datasets/wds.py)."""
    path = prepared_dir(dataset) / "classes.json"
    found = json.loads(path.read_text()).get("provenance", {}).get("templates") if path.is_file() else None
    if not found:
        raise DatasetError(f"dataset {dataset!r}: texts.templates is 'prepared' but {path} records no templates "
                           f"(provenance.templates); prepare the dataset first, or give a list of templates")
    return check_templates(dataset, list(found))


def resolve_templates(dataset: str, key: str, source: Any, own: Sequence[str]) -> list[str]:
    """A list of `{c}` templates from a list or a named source (module docstring)."""
    if isinstance(source, list):
        return check_templates(dataset, source)
    if source == "templates":
        return check_templates(dataset, list(own))
    if isinstance(source, str) and source.startswith("elevater:"):
        return check_templates(dataset, elevater_templates(dataset, key, source.split(":", 1)[1]))
    if isinstance(source, str) and source.startswith("openclip:"):
        return check_templates(dataset, openclip_templates(dataset, key, source.split(":", 1)[1]))
    raise DatasetError(f"dataset {dataset!r}: {key} must be a list of templates with '{{c}}', 'templates', "
                       f"'elevater:<dataset>' or 'openclip:<{'|'.join(OPENCLIP_TEMPLATES)}>'; got {source!r}")


def elevater_templates(dataset: str, key: str, name: str) -> list[str]:
    data = json.loads(ELEVATER_DATA.read_text())
    entry = data.get(name)
    if not isinstance(entry, Mapping) or not entry.get("templates"):
        known = sorted(k for k, v in data.items() if isinstance(v, Mapping) and v.get("templates"))
        raise DatasetError(f"dataset {dataset!r}: {key}: ELEVATER's data file has no templates for {name!r}; "
                           f"known: {known}")
    return list(entry["templates"])


def openclip_templates(dataset: str, key: str, name: str) -> list[str]:
    """open_clip's template tables (open_clip/zero_shot_metadata.py), read from the installed package's file
    without importing open_clip (whose package imports torch)."""
    if name not in OPENCLIP_TEMPLATES:
        raise DatasetError(f"dataset {dataset!r}: {key}: unknown open_clip template table {name!r}; "
                           f"known: {sorted(OPENCLIP_TEMPLATES)}")
    found = importlib.util.find_spec("open_clip")
    path = Path(found.origin).parent / "zero_shot_metadata.py" if found and found.origin else None
    if path is None or not path.is_file():
        raise DatasetError(f"dataset {dataset!r}: {key}: open_clip's zero_shot_metadata.py is not installed "
                           f"(pip install open_clip_torch)")
    spec = importlib.util.spec_from_file_location("_vlbench_open_clip_zero_shot_metadata", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return [template("{c}") for template in getattr(module, OPENCLIP_TEMPLATES[name])]


def prompts(meta: DatasetMeta, templates: list[str], formatted: bool = False) -> pa.Table:
    """Class prompts: every template filled with every class name, class-major. A multi-objective dataset's class
    '<objective>:<name>' gets its objective's templates ('<objective>:<template>', the prefix dropped; a template with
    no objective's prefix serves every objective) filled with `<name>` (DataComp's fairness_eval.py). `formatted`:
    filled as DataComp and CLIP_benchmark fill their templates, `template.format(c=name)` (its other braces are
    format fields: '{{' is a brace), else '{c}' replaced and every other character kept (`fill`)."""
    if objective_classes(meta):
        rows = [(c.index, fill(meta.name, t, c.name.split(":", 1)[1], formatted))
                for c in meta.classes for t in objective_templates(meta, templates)[c.name.split(":", 1)[0]]]
    else:
        rows = [(c.index, fill(meta.name, t, c.name, formatted)) for c in meta.classes for t in templates]
    return text_table("class_index", [i for i, _ in rows], ["template"] * len(rows), [t for _, t in rows])


def fill(dataset: str, template: str, name: str, formatted: bool) -> str:
    """`template` with the class `name` in place of '{c}': str.format (`formatted`) or str.replace."""
    if not formatted:
        return template.replace("{c}", name)
    try:
        return template.format(c=name)
    except (KeyError, IndexError, ValueError) as err:
        raise DatasetError(f"dataset {dataset!r}: template {template!r} cannot be filled with str.format(c=...) as "
                           f"DataComp fills it ({type(err).__name__}: {err})") from None


def objective_templates(meta: DatasetMeta, templates: list[str]) -> dict[str, list[str]]:
    """{objective: its templates} of a multi-objective dataset: '<objective>:<template>' lines to their objective,
    the others to every objective; an objective left without one is refused."""
    objectives = objective_classes(meta)
    out: dict[str, list[str]] = {o: [] for o in objectives}
    for t in templates:
        objective, _, rest = t.partition(":")
        for o in [objective] if objective in out else out:
            out[o].append(rest if o == objective else t)
    missing = [o for o, found in out.items() if not found]
    if missing:
        raise DatasetError(f"dataset {meta.name!r}: no template for objective(s) {missing} (templates "
                           f"'<objective>:<template>', or one without an objective's prefix for all)")
    return out


# Per-sample text columns of prepared splits and the text set (and `source`) each becomes.
SAMPLE_TEXT_COLUMNS = {"captions": "caption", "narratives": "narrative"}


def sample_texts(meta: DatasetMeta, dataset_dir: Path, column: str = "captions") -> pa.Table:
    """Every text of a per-sample list column (captions, narratives) of every split, owned by its sample_id."""
    ids, texts = [], []
    for split in meta.splits:
        for batch in iter_batches(split_path(dataset_dir, split), columns=["sample_id", column]):
            for sid, items in zip(batch.column("sample_id").to_pylist(), batch.column(column).to_pylist()):
                ids += [sid] * len(items or [])
                texts += list(items or [])
    return text_table("sample_id", ids, [SAMPLE_TEXT_COLUMNS[column]] * len(ids), texts)


def captions(meta: DatasetMeta, dataset_dir: Path) -> pa.Table:
    return sample_texts(meta, dataset_dir, "captions")


def _sample_text_columns(meta: DatasetMeta, dataset_dir: Path) -> list[str]:
    """The per-sample text columns every split of the prepared dataset has."""
    import pyarrow.parquet as pq

    names = [set(pq.read_schema(split_path(dataset_dir, split)).names) for split in meta.splits]
    return [c for c in SAMPLE_TEXT_COLUMNS if names and all(c in n for n in names)]


CANDIDATE_FIELDS = ("item", "category", "index")


def candidate_texts(meta: DatasetMeta, dataset_dir: Path) -> pa.Table:
    """The compositional benchmarks' candidate texts (the prepared `candidates` column, vlbench/datasets/compositional.py):
    one row per (image, candidate), owned by its sample_id, `source` positive or negative, with its item, category and
    index within the item."""
    rows = []
    for split in meta.splits:
        for batch in iter_batches(split_path(dataset_dir, split), columns=["sample_id", "candidates"]):
            for sid, items in zip(batch.column("sample_id").to_pylist(), batch.column("candidates").to_pylist()):
                rows += [{**c, "sample_id": sid} for c in items or []]
    table = text_table("sample_id", [r["sample_id"] for r in rows], [r["source"] for r in rows],
                       [r["text"] for r in rows])
    for key, kind in zip(CANDIDATE_FIELDS, (pa.string(), pa.string(), pa.int64())):
        table = table.append_column(key, pa.array([r[key] for r in rows], kind))
    return table


def _has_candidates(meta: DatasetMeta, dataset_dir: Path) -> bool:
    return bool(meta.splits) and all("candidates" in pq.read_schema(split_path(dataset_dir, s)).names
                                     for s in meta.splits)


def build_text_sets(meta: DatasetMeta, dataset_dir: Path, cfg: Mapping[str, Any]) -> dict[str, pa.Table]:
    """The text sets of one prepared dataset for its entry's `texts` params."""
    unknown = sorted(set(cfg) - set(TEXTS_KEYS))
    if unknown:
        raise DatasetError(f"dataset {meta.name!r}: unknown texts key(s) {unknown}; allowed: {', '.join(TEXTS_KEYS)}")
    # the shards' own templates (DataComp's tasks) are filled as DataComp fills them: str.format
    sets = {"prompts": prompts(meta, entry_templates(meta.name, cfg), cfg.get("templates") == PREPARED_TEMPLATES)}
    for column in _sample_text_columns(meta, dataset_dir):
        sets[column] = sample_texts(meta, dataset_dir, column)
    if cfg.get("caption_prompt") is not None:
        sets[CAPTION_PROMPT_SET] = prompted_captions(meta.name, sets.get("captions"), cfg["caption_prompt"])
    if _has_candidates(meta, dataset_dir):
        sets["candidates"] = candidate_texts(meta, dataset_dir)
    return sets


def prompted_captions(dataset: str, captions: pa.Table | None, template: Any) -> pa.Table:
    """The captions set with every caption put into `template` ('{c}' the caption), same owners and order."""
    if not isinstance(template, str) or "{c}" not in template:
        raise DatasetError(f"dataset {dataset!r}: texts.caption_prompt must be a text with a '{{c}}' placeholder for the "
                           f"caption, e.g. 'a photo of {{c}}'; got {template!r}")
    if captions is None:
        raise DatasetError(f"dataset {dataset!r}: texts.caption_prompt is set but the prepared dataset has no captions")
    texts = [template.replace("{c}", t) for t in captions.column("text").to_pylist()]
    return text_table("sample_id", captions.column("sample_id").to_pylist(), captions.column("source").to_pylist(), texts)


def write_text_sets(out_dir: Path, dataset: str, sets: Mapping[str, pa.Table],
                    stamps: Mapping[str, Mapping[str, Any]] | None = None) -> dict[str, str]:
    """Write every set atomically into `out_dir` (replaced whole); return {set: version}. `stamps[set]` adds keys to
    a set's stamp (e.g. the knowledge stage's coverage counts), which the set's text features then carry too."""
    versions = {}
    with atomic_dir(out_dir) as tmp:
        for name, table in sets.items():
            check_name("text set", name)
            owner_column(table)
            versions[name] = text_set_version(table)
            stamp = {**(stamps or {}).get(name, {}), "dataset": dataset, "text_set": name, "text_version": versions[name]}
            pq.write_table(table.replace_schema_metadata({META_KEY: json.dumps(stamp, sort_keys=True).encode()}),
                           tmp / f"{name}.parquet")
    return versions


def read_text_set(path: Path) -> tuple[pa.Table, dict[str, str]]:
    """(rows, {dataset, text_set, text_version}) of one text set file."""
    if not path.is_file():
        raise DatasetError(f"{path}: text set not found; run the texts stage for this dataset first")
    table = pq.read_table(path)
    stamp = (table.schema.metadata or {}).get(META_KEY)
    if stamp is None:
        raise DatasetError(f"{path}: not a vlbench text set (no {META_KEY.decode()} metadata)")
    return table.replace_schema_metadata(None), json.loads(stamp)


def text_set_names(texts_dir: Path) -> list[str]:
    return sorted(p.stem for p in Path(texts_dir).glob("*.parquet"))
