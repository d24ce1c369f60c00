"""Compositionality benchmarks (`source: compositional`): SugarCrepe, Winoground, ARO, and a demo-world set.

Every benchmark becomes one canonical dataset whose rows are images and whose per-row `candidates` column lists the
texts scored against that image: `{item, category, source (positive | negative), index, text}`. An *item* is one test
case of the benchmark (one image and its candidate texts; in Winoground one example: two images and two captions, each
image a row with both captions). The texts stage turns the column into the text set `candidates` (vlbench/texts.py);
the `compositionality` analysis scores them from cached features with each benchmark's own metric.

`benchmark` picks the reader (`BENCHMARKS`); `files` names the upstream files (download resources, or `manual`):

- `sugarcrepe` (RAIVNLab/sugar-crepe `data/<category>.json`: `{"<i>": {filename, caption, negative_caption}}`, seven
  categories; images: COCO val2017): one row per COCO image, every item of every category on it (index 0 positive,
  1 negative, as main_eval.py scores them).
- `winoground` (facebook/winoground, gated on the Hugging Face hub: `data/examples.jsonl` with `id`, `image_0`,
  `image_1`, `caption_0`, `caption_1`, `collapsed_tag`; `data/images.zip` with `images/<image_k>.png`): two rows per
  example; category = `collapsed_tag`.
- `aro-vg-relation`, `aro-vg-attribution` (mertyg/vision-language-models-are-bows: `visual_genome_relation.json` /
  `visual_genome_attribution.json`, lists of `{image_path, bbox_x, bbox_y, bbox_w, bbox_h, true_caption,
  false_caption, relation_name | attributes}`; `vgr_vga_images.zip` with `images/<image_path>`): **the stored image is
  the bounding-box crop** ARO's `__getitem__` makes (RGB, `crop((x, y, x + w, y + h))`), encoded as PNG (lossless),
  one row per distinct (image, box); candidates in ARO's order, index 0 the false caption, 1 the true one; category =
  the relation, or the two attributes joined by `_` as ARO's code keys them.
- `aro-coco-order`, `aro-flickr-order` (BLIP's Karpathy test files `coco_karpathy_test.json` / `flickr30k_test.json`:
  `[{image, caption: [...]}]`; images: COCO val2014 / Flickr30k): one row per image, one item per caption: the
  caption and its four perturbations (vlbench/datasets/perturbations.py), all through BLIP's `pre_caption`.
- `demo`: two-object scenes of the demo world (vlbench/datasets/synthetic.py) with colour-swapped (`swap_att`),
  colour-replaced (`replace_att`) and shape-replaced (`replace_obj`) captions as negatives.

Classes are the benchmark's categories; a row's `label` is the category of its first item (an image may carry items of
several categories: the analysis reads categories from the candidates, never from the label).
"""

from __future__ import annotations

import io
import json
import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path, PurePosixPath
from typing import Any

import numpy as np
import pyarrow as pa

from vlbench.datasets import synthetic as world
from vlbench.datasets.archives import extract
from vlbench.datasets.canonical import ClassInfo, DatasetError, DatasetMeta, write_dataset
from vlbench.datasets.download import Resource, fetch, resource
from vlbench.datasets.images import checked_rows, decode_rgb
from vlbench.datasets.perturbations import Perturber
from vlbench.datasets.spec import check_flag, check_keys

SPEC_KEYS = ("source", "benchmark", "files", "split", "size", "seed", "max_words", "pipeline", "skip_corrupt")
CANDIDATE = pa.struct([("item", pa.string()), ("category", pa.string()), ("source", pa.string()),
                       ("index", pa.int64()), ("text", pa.string())])
EXTRA_COLUMNS = {"candidates": pa.list_(CANDIDATE)}
SUGARCREPE = ("add_obj", "add_att", "replace_obj", "replace_att", "replace_rel", "swap_obj", "swap_att")


@dataclass(frozen=True)
class Benchmark:
    """A reader: `files` the spec's `files` keys it needs; `read(name, spec, paths) -> (rows, categories)`, each row
    `{sample_id, image, candidates}` with `image` a function giving the image's bytes when the row is written."""

    files: tuple[str, ...]
    read: Callable[[str, Mapping[str, Any], Mapping[str, Path]], tuple[list[dict], list[str]]]


def candidate(item: str, category: str, positive: bool, index: int, text: str) -> dict:
    return {"item": item, "category": category, "source": "positive" if positive else "negative", "index": index,
            "text": text}


# ------------------------------------------------------------------------------------------------ JSON helpers


def load_json(name: str, path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise DatasetError(f"dataset {name!r}: {path.name} is not readable JSON ({err})") from err


def fields(name: str, where: str, obj: Any, keys: Mapping[str, type]) -> dict:
    """`obj` checked to be an object with `keys` of the given types (numbers: int or float)."""
    bad = [k for k, kind in keys.items() if not isinstance(obj, dict) or not isinstance(obj.get(k), kind)
           or isinstance(obj.get(k), bool)]
    if bad:
        raise DatasetError(f"dataset {name!r}: {where}: missing or mistyped {bad}: {obj!r:.200}")
    return obj


# ------------------------------------------------------------------------------------------------ SugarCrepe


def read_sugarcrepe(name: str, spec: Mapping[str, Any], paths: Mapping[str, Path]) -> tuple[list[dict], list[str]]:
    by_file: dict[str, list[dict]] = {}
    for category in SUGARCREPE:
        data = load_json(name, paths[category])
        if not isinstance(data, dict) or not data:
            raise DatasetError(f"dataset {name!r}: {paths[category].name} must be a non-empty JSON object of items")
        for key, obj in data.items():
            where = f"{paths[category].name} item {key!r}"
            fields(name, where, obj, {"filename": str, "caption": str, "negative_caption": str})
            item = f"{category}/{key}"
            by_file.setdefault(obj["filename"], []).extend([
                candidate(item, category, True, 0, obj["caption"]),
                candidate(item, category, False, 1, obj["negative_caption"])])
    folder = extract(paths["images"]) / "val2017"
    rows = [{"sample_id": PurePosixPath(f).stem, "image": _image(name, folder / f, paths["images"]), "candidates": c}
            for f, c in sorted(by_file.items())]
    return rows, list(SUGARCREPE)


def _image(name: str, path: Path, archive: Path) -> Callable[[], bytes]:
    """The image's bytes, read when the row is written (rows stream into Parquet: no split is held in memory); a
    missing file is named now."""
    if not path.is_file():
        raise DatasetError(f"dataset {name!r}: image {path.name!r} is not in {archive.name}")
    return path.read_bytes


# ------------------------------------------------------------------------------------------------ Winoground


def read_winoground(name: str, spec: Mapping[str, Any], paths: Mapping[str, Path]) -> tuple[list[dict], list[str]]:
    rows, categories = [], {}
    folder = extract(paths["images"]) / "images"
    lines = paths["examples"].read_text(encoding="utf-8").splitlines()
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"{paths['examples'].name} line {number}"
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as err:
            raise DatasetError(f"dataset {name!r}: {where}: not valid JSON ({err})") from err
        fields(name, where, obj, {"id": int, "image_0": str, "image_1": str, "caption_0": str, "caption_1": str,
                                  "collapsed_tag": str})
        item, category = str(obj["id"]), obj["collapsed_tag"]
        categories.setdefault(category, None)
        for k in (0, 1):
            image = _image(name, folder / f"{obj[f'image_{k}']}.png", paths["images"])
            rows.append({"sample_id": obj[f"image_{k}"], "image": image,
                         "candidates": [candidate(item, category, j == k, j, obj[f"caption_{j}"]) for j in (0, 1)]})
    return rows, sorted(categories)


# ------------------------------------------------------------------------------------------------ ARO: Visual Genome

BOX = {"bbox_x": (int, float), "bbox_y": (int, float), "bbox_w": (int, float), "bbox_h": (int, float)}


def crop_png(image: Callable[[], bytes], box: tuple[float, float, float, float]) -> bytes:
    """ARO's crop: the image in RGB, `crop((x, y, x + w, y + h))`, stored as PNG."""
    x, y, w, h = box
    out = io.BytesIO()
    decode_rgb(image()).crop((x, y, x + w, y + h)).save(out, format="PNG")
    return out.getvalue()


VG_KINDS = {  # the fields ARO's VG files add, and an item's category as ARO's code keys it
    "relation": ({"relation_name": str}, lambda obj: obj["relation_name"]),
    "attribution": ({"attributes": list}, lambda obj: f"{obj['attributes'][0]}_{obj['attributes'][1]}"),
}


def read_aro_vg(kind: str):
    extra, category_of = VG_KINDS[kind]

    def read(name: str, spec: Mapping[str, Any], paths: Mapping[str, Path]) -> tuple[list[dict], list[str]]:
        data = load_json(name, paths["annotations"])
        if not isinstance(data, list) or not data:
            raise DatasetError(f"dataset {name!r}: {paths['annotations'].name} must be a non-empty JSON list")
        folder = extract(paths["images"]) / "images"
        crops: dict[tuple, dict] = {}
        for i, obj in enumerate(data):
            where = f"{paths['annotations'].name} item {i}"
            fields(name, where, obj, {"image_path": str, "true_caption": str, "false_caption": str, **BOX, **extra})
            if kind == "attribution" and len(obj["attributes"]) != 2:
                raise DatasetError(f"dataset {name!r}: {where}: 'attributes' must list two attributes")
            box = tuple(obj[k] for k in BOX)
            key = (obj["image_path"], box)
            if key not in crops:
                image = _image(name, folder / obj["image_path"], paths["images"])
                sid = f"{PurePosixPath(obj['image_path']).stem}_" + "_".join(f"{v:g}" for v in box)
                crops[key] = {"sample_id": sid, "image": partial(crop_png, image, box), "candidates": []}
            category = category_of(obj)
            crops[key]["candidates"] += [candidate(str(i), category, False, 0, obj["false_caption"]),
                                         candidate(str(i), category, True, 1, obj["true_caption"])]
        categories = sorted({c["category"] for r in crops.values() for c in r["candidates"]})
        return list(crops.values()), categories

    return read


# ------------------------------------------------------------------------------------------------ ARO: order


def read_aro_order(name: str, spec: Mapping[str, Any], paths: Mapping[str, Path]) -> tuple[list[dict], list[str]]:
    data = load_json(name, paths["annotations"])
    if not isinstance(data, list) or not data:
        raise DatasetError(f"dataset {name!r}: {paths['annotations'].name} must be a non-empty JSON list")
    perturber = Perturber(spec.get("pipeline", "en_core_web_sm"), int(spec.get("seed", 0)),
                          int(spec.get("max_words", 30)))
    root = extract(paths["images"])
    rows = []
    for i, obj in enumerate(data):
        where = f"{paths['annotations'].name} item {i}"
        fields(name, where, obj, {"image": str, "caption": list})
        sid = PurePosixPath(obj["image"]).stem
        cands = []
        for j, text in enumerate(obj["caption"]):
            item = f"{sid}/{j}"
            options = perturber.options(text, item)
            cands += [candidate(item, "order", k == 0, k, t) for k, t in enumerate(options)]
        rows.append({"sample_id": sid, "image": _image(name, root / obj["image"], paths["images"]),
                     "candidates": cands})
    return rows, ["order"]


# ------------------------------------------------------------------------------------------------ demo


DEMO_CATEGORIES = ("swap_att", "replace_att", "replace_obj")


def demo_scene(rng: np.random.Generator):
    shapes = [world.shape_names()[i] for i in rng.choice(len(world.SHAPES), size=2, replace=False)]
    colors = [list(world.COLORS)[i] for i in rng.choice(len(world.COLORS), size=2, replace=False)]
    positions = list(world.POSITIONS)
    cells = [positions[i] for i in rng.choice(len(positions), size=2, replace=False)]
    return [world.Obj(s, c, "large", p) for s, c, p in zip(shapes, colors, cells)]


def demo_negatives(rng: np.random.Generator, objects) -> dict[str, str]:
    """One negative caption per category for a two-object scene."""
    a, b = objects
    other_color = [c for c in world.COLORS if c not in (a.color, b.color)]
    other_shape = [s for s in world.shape_names() if s not in (a.shape, b.shape)]
    k = int(rng.integers(2))
    recolored = [replace(o, color=other_color[rng.integers(len(other_color))]) if i == k else o
                 for i, o in enumerate(objects)]
    reshaped = [replace(o, shape=other_shape[rng.integers(len(other_shape))]) if i == k else o
                for i, o in enumerate(objects)]
    swapped = [replace(a, color=b.color), replace(b, color=a.color)]
    return {"swap_att": world.caption(swapped, 1), "replace_att": world.caption(recolored, 1),
            "replace_obj": world.caption(reshaped, 1)}


def read_demo(name: str, spec: Mapping[str, Any], paths: Mapping[str, Path]) -> tuple[list[dict], list[str]]:
    size = spec.get("size")
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise DatasetError(f"dataset {name!r}: 'size' must be a positive number of images, got {size!r}")
    rng = np.random.default_rng([int(spec.get("seed", 0)), zlib.crc32(b"compositional-demo")])
    rows = []
    for i in range(size):
        objects = demo_scene(rng)
        image = world.render(rng, objects, 32, jitter=0.01)
        true = world.caption(objects, 1)
        cands = []
        for category, negative in demo_negatives(rng, objects).items():
            item = f"{category}/{i}"
            cands += [candidate(item, category, True, 0, true), candidate(item, category, False, 1, negative)]
        rows.append({"sample_id": f"demo-{i:05d}", "image": partial(bytes, image), "candidates": cands})
    return rows, list(DEMO_CATEGORIES)


BENCHMARKS = {
    "sugarcrepe": Benchmark(("images",) + SUGARCREPE, read_sugarcrepe),
    "winoground": Benchmark(("examples", "images"), read_winoground),
    "aro-vg-relation": Benchmark(("annotations", "images"), read_aro_vg("relation")),
    "aro-vg-attribution": Benchmark(("annotations", "images"), read_aro_vg("attribution")),
    "aro-coco-order": Benchmark(("annotations", "images"), read_aro_order),
    "aro-flickr-order": Benchmark(("annotations", "images"), read_aro_order),
    "demo": Benchmark((), read_demo),
}


# ------------------------------------------------------------------------------------------------ public


def parse_spec(name: str, spec: Mapping[str, Any]) -> tuple[str, dict[str, Resource]]:
    check_keys(name, spec, SPEC_KEYS, "compositional")
    benchmark = spec.get("benchmark")
    if benchmark not in BENCHMARKS:
        raise DatasetError(f"dataset {name!r}: 'benchmark' must be one of {', '.join(BENCHMARKS)}, got {benchmark!r}")
    files = spec.get("files") or {}
    missing = [k for k in BENCHMARKS[benchmark].files if not isinstance(files.get(k), Mapping)]
    if missing:
        raise DatasetError(f"dataset {name!r}: 'files' lacks {missing} (each a resource {{file, url | manual, "
                           f"sha256}}) for benchmark {benchmark!r}")
    check_flag(name, spec, "skip_corrupt")
    return benchmark, {k: resource(name, files[k]) for k in BENCHMARKS[benchmark].files}


def build(name: str, spec: dict, out_dir: str | Path) -> DatasetMeta:
    """Fetch the benchmark's files, read them and write the canonical dataset (one split, `split`, default test)."""
    benchmark, resources = parse_spec(name, spec)
    paths = {key: fetch(res, name) for key, res in resources.items()}
    rows, categories = BENCHMARKS[benchmark].read(name, spec, paths)  # images still unread: each row's `image()`
    if isinstance(spec.get("size"), int) and len(rows) != spec["size"]:
        raise DatasetError(f"dataset {name!r}: {', '.join(p.name for p in paths.values())} give {len(rows)} images, "
                           f"expected {spec['size']} (spec 'size'); are these the right files?")
    split = str(spec.get("split", "test"))
    provenance = {"source": "compositional", "benchmark": benchmark,
                  "files": [resources[k].provenance(p) for k, p in paths.items()],
                  "items": len({c["item"] for r in rows for c in r["candidates"]}),
                  "texts": sum(len(r["candidates"]) for r in rows), "counts": {}, "skipped_corrupt": []}
    index = {c: i for i, c in enumerate(categories)}
    labelled = ({**r, "image": r["image"](), "label": index[r["candidates"][0]["category"]]} for r in rows)
    meta = DatasetMeta(name=name, task="captions", metric="accuracy",
                       classes=[ClassInfo(i, c) for i, c in enumerate(categories)], provenance=provenance)
    checked = checked_rows(name, split, labelled, check_flag(name, spec, "skip_corrupt"), provenance)
    return write_dataset(out_dir, meta, {split: checked}, extra_columns=EXTRA_COLUMNS)


def catalogue_row(name: str, spec: dict) -> dict:
    benchmark, resources = parse_spec(name, spec)
    categories = {"sugarcrepe": len(SUGARCREPE), "demo": len(DEMO_CATEGORIES)}.get(benchmark)
    sizes = {str(spec.get("split", "test")): spec["size"]} if isinstance(spec.get("size"), int) else {}
    return {"classes": categories, "splits": sizes, "metric": "accuracy",
            "manual_download": any(not r.urls for r in resources.values())}
