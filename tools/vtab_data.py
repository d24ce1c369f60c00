"""Generate vlbench/datasets/data/vtab.json: class names and zero-shot templates of VTAB's 19 tasks.

    python tools/vtab_data.py --clip-benchmark FILE_OR_DIR --clip-prompts FILE --sun397-labels FILE [--out FILE]

Reads (string literals only, parsed with ast.literal_eval; the result is deterministic):
  --clip-benchmark  LAION-AI/CLIP_benchmark's clip_benchmark/datasets/ (en_classnames.json and
                    en_zeroshot_classification_templates.json), MIT
  --clip-prompts    openai/CLIP's data/prompts.md (the CLIP paper's class names), MIT
  --sun397-labels   tensorflow/datasets' sun397_labels.txt (TFDS's SUN397 label order), Apache-2.0

Which list each task takes (`SOURCES`) follows what CLIP_benchmark's `build_vtab_dataset` does for the task
(its en_classnames key where it names one), else the CLIP paper's list where the paper has the dataset and its
order is TFDS's label order, else TFDS's ClassLabel names (the index as a string, as CLIP_benchmark shows them).
SUN397: the CLIP paper's names put in TFDS's label order (they differ at two places, see docs/datasets.md).
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import sys
from pathlib import Path

CB = "LAION-AI/CLIP_benchmark@48de38c1689fa6d8b4dd53e3370c669c3bb18117 clip_benchmark/datasets/en_classnames.json"
CLIP = "openai/CLIP@d05afc436d78f1c48dc0dbf8e5980a9d471f35f6 data/prompts.md"
CB_TEMPLATES = ("LAION-AI/CLIP_benchmark@48de38c1689fa6d8b4dd53e3370c669c3bb18117 "
                "clip_benchmark/datasets/en_zeroshot_classification_templates.json")

# task -> (where its names come from, the key there, CLIP_benchmark's template key)
SOURCES = {
    "caltech101": ("cb", "caltech101_vtab", "caltech101"),
    "cifar100": ("clip", "CIFAR100", "cifar100"),
    "dtd": ("clip", "DescribableTextures", "dtd"),
    "oxford_flowers102": ("cb", "flowers", "flowers"),
    "oxford_iiit_pet": ("cb", "pets", "pets"),
    "sun397": ("clip_in_tfds_order", "SUN397", "sun397"),
    "svhn": ("cb", "svhn", "svhn"),
    "patch_camelyon": ("cb", "pcam", "pcam"),
    "eurosat": ("cb", "eurosat", "eurosat"),
    "resisc45": ("clip", "RESISC45", "resisc45"),
    "diabetic_retinopathy": ("cb", "diabetic_retinopathy", "diabetic_retinopathy"),
    "clevr_count": ("cb", "clevr_count_all", "clevr_count_all"),
    "clevr_distance": ("cb", "clevr_closest_object_distance", "clevr_closest_object_distance"),
    "dmlab": ("cb", "dmlab", "dmlab"),
    "kitti_distance": ("cb", "kitti_closest_vehicle_distance", "kitti_closest_vehicle_distance"),
    "dsprites_location": ("dsprites", 16, "dsprites_label_x_position"),
    "dsprites_orientation": ("dsprites", 16, "dsprites_label_orientation"),
    "smallnorb_azimuth": ("index", 18, "smallnorb_label_azimuth"),
    "smallnorb_elevation": ("index", 9, "smallnorb_label_elevation"),
}
INDEX_NOTE = ("TFDS ClassLabel(num_classes=N) names (the index as a string), which CLIP_benchmark's vtab builder "
              "shows for this task")
DSPRITES_NOTE = ("VTAB's 16 bins, named by the index as a string (TFDS ClassLabel(num_classes=16)); CLIP_benchmark's "
                 "vtab builder does not pass num_classes=16 to DSpritesData, so its dSprites tasks are 32-way (x "
                 "position) and 40-way (orientation): its numbers are not comparable with VTAB's 16-way task")


def clip_prompts(text: str) -> dict[str, list[str]]:
    """{section: classes} of prompts.md (each class a Python string literal on its own line)."""
    out = {}
    for section in re.split(r"^## ", text, flags=re.M)[1:]:
        name = section.split("\n", 1)[0].strip()
        m = re.search(r"classes = \[(.*?)\n\]", section, re.S)
        if m:
            out[name] = [ast.literal_eval(line.strip().rstrip(",")) for line in m.group(1).splitlines()
                         if line.strip()]
    return out


def in_tfds_order(names: list[str], tfds_labels: list[str]) -> list[str]:
    """`names` re-ordered to TFDS's label order, matching '/a/apse/indoor' to 'apse indoor'."""
    by_key = {n: n for n in names}
    keys = [label[3:].replace("_", " ").replace("/", " ") for label in tfds_labels]
    missing = [k for k in keys if k not in by_key]
    if missing or len(keys) != len(names):
        sys.exit(f"SUN397: names do not pair with TFDS labels one-to-one: {missing[:5]}")
    return [by_key[k] for k in keys]


def build(cb_dir: Path, prompts: Path, sun397_labels: Path) -> dict:
    cb_dir = cb_dir if cb_dir.is_dir() else cb_dir.parent
    cb = json.loads((cb_dir / "en_classnames.json").read_text())
    templates = json.loads((cb_dir / "en_zeroshot_classification_templates.json").read_text())
    clip = clip_prompts(prompts.read_text())
    tasks = {}
    for task, (kind, key, template_key) in SOURCES.items():
        if kind == "cb":
            classes, source = cb[key], f"CLIP_benchmark en_classnames[{key!r}] ({CB})"
        elif kind == "clip":
            classes, source = clip[key], f"CLIP paper prompts.md '## {key}' ({CLIP})"
        elif kind == "clip_in_tfds_order":
            classes = in_tfds_order(clip[key], sun397_labels.read_text().split())
            source = f"CLIP paper prompts.md '## {key}' ({CLIP}), in TFDS's sun397_labels.txt order"
        else:
            classes, source = [str(i) for i in range(key)], DSPRITES_NOTE if kind == "dsprites" else INDEX_NOTE
        tasks[task] = {"classes": classes, "class_source": source,
                       "templates": templates[template_key],
                       "template_source": f"CLIP_benchmark templates[{template_key!r}] ({CB_TEMPLATES})"}
    return {"source": "tools/vtab_data.py", "tasks": tasks}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--clip-benchmark", type=Path, required=True)
    p.add_argument("--clip-prompts", type=Path, required=True)
    p.add_argument("--sun397-labels", type=Path, required=True)
    p.add_argument("--out", type=Path, default=Path("vlbench/datasets/data/vtab.json"))
    a = p.parse_args(argv)
    text = json.dumps(build(a.clip_benchmark, a.clip_prompts, a.sun397_labels), indent=1, ensure_ascii=False) + "\n"
    a.out.write_text(text, encoding="utf-8")


if __name__ == "__main__":
    main()
