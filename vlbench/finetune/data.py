"""Images and texts of a prepared dataset for training: decoded once, in the model's own preprocessing.

Rows are decoded by `vlbench.embed`'s reader (ParquetImages, DataLoader workers, one error for every corrupt image)
up to uint8 tensors where the model's transform ends in ToTensor + Normalize (`split_preprocess`); `finish` converts
and normalises a batch on the device with the same arithmetic as embedding, so a fine-tuned model sees its inputs as
the embed stage shows them. Memory: 3 x H x W bytes per image kept (150 KB at 224 px).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import torch
from torch.utils.data import DataLoader

from vlbench.datasets.canonical import DatasetMeta, split_path
from vlbench.decoding import DEFAULT_DECODE, decoder
from vlbench.embed import ParquetImages, collate, corrupt_images_error, split_preprocess


@dataclass
class Images:
    """One split's images (row order) as tensors, `finish` to apply per batch on the device, and its table."""

    pixels: torch.Tensor  # [n, 3, H, W], uint8 or float
    finish: Callable[[torch.Tensor], torch.Tensor]
    table: object  # pyarrow Table of the split's other columns (sample_id, label/labels, captions, ...)


def load_split(meta: DatasetMeta, prepared: Path, split: str, preprocess: Callable, workers: int = 0,
               columns: tuple[str, ...] = ()) -> Images:
    path = split_path(prepared, split)
    dec = decoder(DEFAULT_DECODE, preprocess, torch.device("cpu"), split=split_preprocess(preprocess))  # Pillow, as the papers
    finish = dec.finish
    n = pq.ParquetFile(path).metadata.num_rows
    out, bad = None, []
    loader = DataLoader(ParquetImages(path, dec.worker), batch_size=256, num_workers=workers, collate_fn=collate)
    for rows, images, corrupt in loader:
        bad += corrupt
        if images is None:
            continue
        if out is None:
            out = torch.empty((n, *images.shape[1:]), dtype=images.dtype)
        out[rows] = images
    if bad or out is None:
        raise corrupt_images_error(meta.name, split, path, bad)
    table = pq.read_table(path, columns=["sample_id", meta.label_column, *columns])
    return Images(out, finish, table)


def labels_of(images: Images, meta: DatasetMeta) -> list[list[int]]:
    """Per row its label indices (one for single-label data), as ELEVATER's few-shot sampler reads them."""
    column = images.table.column(meta.label_column).to_pylist()
    return [sorted(v or []) for v in column] if meta.multi_label else [[int(v)] for v in column]


def targets(labels: list[list[int]], rows: np.ndarray, num_classes: int, multi_label: bool) -> torch.Tensor:
    if multi_label:
        out = torch.zeros((rows.size, num_classes))
        for r, i in enumerate(rows.tolist()):
            out[r, labels[i]] = 1.0
        return out
    return torch.tensor([labels[i][0] for i in rows.tolist()], dtype=torch.long)
