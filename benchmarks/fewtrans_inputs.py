"""FewTrans inputs: the paper's setting (the model's own preprocessing, the entry's templates) against the code's
(Frankluox/FewTrans: images squashed to the input size with bilinear resizing and ImageNet's mean and std, the single
prompt "a photo of a {c}."), on prepared datasets and a model's checkpoint; docs/protocols.md "Adapt: FewTrans
episodes", "Inputs".

For each dataset the pool split is embedded twice (its prepared preprocessing and `fewtrans`), the class prompts
twice (the entry's templates and the single prompt), and `vlbench.analyses.adapt.fewtrans.evaluate` runs on each of
the four combinations with the params' `adapt.fewtrans` settings (600 episodes, the ensemble, seed `seed`).

    python benchmarks/fewtrans_inputs.py [--datasets count position] [--params params.yaml] [--checkpoint PATH]

Needs `data/prepared/<dataset>` (dvc repro prepare@<dataset>) and the model's weights (for the demo, the toy
checkpoint of pretrain@toy). Prints one JSON line per dataset and setting: the four methods' mean accuracies.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

CODE_PROMPT = "a photo of a {c}."  # FewTrans' clip_prompt*.py: prompt_prefix "a photo of a" + " " + name + "."


class Inputs:
    """What the adapt analysis reads, held in memory: one image-features table per split, one text set."""

    def __init__(self, meta, images: dict, texts):
        self.meta, self._images, self._texts = meta, images, texts

    def has_split(self, split):
        return split in self._images

    def images(self, split):
        return self._images[split]

    def texts(self, text_set):
        return self._texts


def image_features(loaded, dataset_dir: Path, meta, split: str):
    from vlbench.datasets.canonical import split_path
    from vlbench.embed import embed_images, model_for_dataset
    from vlbench.features import Features

    emb, kept = embed_images(model_for_dataset(loaded, meta), split_path(dataset_dir, split), meta.name, split,
                             num_workers=0, progress=False)
    table = pq.read_table(split_path(dataset_dir, split), columns=["sample_id", "label"]).take(pa.array(kept))
    return Features(table, emb.astype(np.float32), {}, [])


def prompt_features(loaded, meta, templates: list[str]):
    from vlbench.embed import embed_texts
    from vlbench.features import Features

    rows = [(c.index, t.format(c=c.name)) for c in meta.classes for t in templates]
    table = pa.table({"class_index": [r[0] for r in rows], "source": ["template"] * len(rows),
                      "text": [r[1] for r in rows]})
    return Features(table, embed_texts(loaded, [r[1] for r in rows]).astype(np.float32), {}, [])


def main() -> None:
    from vlbench.analyses.adapt import fewtrans
    from vlbench.dataset_entries import dataset_entry
    from vlbench.datasets.canonical import load_meta
    from vlbench.models.loading import load_model
    from vlbench.params import load_params

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--datasets", nargs="+", default=["count", "position"])
    parser.add_argument("--params", default="params.yaml")
    parser.add_argument("--checkpoint", help="weights to use instead of the params' model.pretrained")
    args = parser.parse_args()
    params = load_params(args.params)
    model_cfg = {**params["model"], **({"pretrained": args.checkpoint} if args.checkpoint else {})}
    loaded = load_model(model_cfg, "cpu")
    cfg = dict(params["adapt"]["fewtrans"])
    for name in args.datasets:
        dataset_dir = Path("data/prepared") / name
        meta = load_meta(dataset_dir)
        templates = list(dataset_entry(params, name)["texts"]["templates"])
        images = {"paper": {s: image_features(loaded, dataset_dir, meta, s) for s in cfg["splits"]},
                  "code": {s: image_features(loaded, dataset_dir, replace(meta, preprocess="fewtrans"), s)
                           for s in cfg["splits"]}}
        texts = {"paper": prompt_features(loaded, meta, templates),
                 "code": prompt_features(loaded, meta, [CODE_PROMPT])}
        for pre in ("paper", "code"):
            for prompt in ("paper", "code"):
                result = fewtrans.evaluate(Inputs(meta, images[pre], texts[prompt]), cfg, params["seed"], "cpu")
                print(json.dumps({"dataset": name, "preprocess": pre if pre == "code" else meta.preprocess,
                                  "prompts": templates if prompt == "paper" else [CODE_PROMPT],
                                  "metrics": {k: round(v, 4) for k, v in result.metrics.items()},
                                  "ci95": {k: round(v["ci95"], 4) for k, v in result.details["summary"].items()}}),
                      flush=True)


if __name__ == "__main__":
    main()
