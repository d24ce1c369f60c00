"""Encode a prepared dataset's images and class prompts into the feature store.

Images stream from Parquet row groups into DataLoader workers (an IterableDataset sharded by row group),
which decode and preprocess in parallel up to uint8 tensors; the model's device converts and normalises them,
and the model runs under `torch.inference_mode`, with autocast on CUDA.
"""

from __future__ import annotations

import io
import json
import os
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch
from PIL import Image
from torch.utils.data import DataLoader, IterableDataset, get_worker_info
from torchvision.transforms import Compose, Normalize, PILToTensor, ToTensor
from tqdm import tqdm

from vlbench import features
from vlbench.datasets.canonical import DatasetMeta, load_meta
from vlbench.errors import VlbenchError
from vlbench.io import atomic_dir
from vlbench.models.loading import LoadedModel


class CorruptImageError(VlbenchError):
    """An image in a prepared dataset cannot be decoded; the message names the dataset, split and sample."""


class ParquetImages(IterableDataset):
    """Yields (row index, preprocessed tensor or None) for one split; each worker reads every n-th row group."""

    def __init__(self, path: Path, preprocess: Callable, dataset: str, split: str, skip_corrupt: bool = False):
        self.path, self.preprocess = Path(path), preprocess
        self.dataset, self.split, self.skip_corrupt = dataset, split, skip_corrupt

    def __iter__(self) -> Iterator[tuple[int, torch.Tensor | None]]:
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info else (0, 1)
        pf = pq.ParquetFile(self.path)
        starts = np.cumsum([0] + [pf.metadata.row_group(i).num_rows for i in range(pf.num_row_groups)])
        for group in range(worker, pf.num_row_groups, workers):
            table = pf.read_row_group(group, columns=["sample_id", "image"])
            ids, images = table.column("sample_id").to_pylist(), table.column("image").to_pylist()
            for offset, (sample_id, data) in enumerate(zip(ids, images)):
                yield int(starts[group]) + offset, self._decode(sample_id, data)

    def _decode(self, sample_id: str, data: bytes | None) -> torch.Tensor | None:
        try:
            with Image.open(io.BytesIO(data or b"")) as img:
                return self.preprocess(img.convert("RGB"))
        except (OSError, ValueError, SyntaxError) as err:
            if self.skip_corrupt:
                return None
            raise CorruptImageError(
                f"dataset {self.dataset!r} split {self.split!r} sample {sample_id!r}: cannot decode image ({err}); "
                f"fix or remove the sample, or set embed.skip_corrupt: true to leave it out"
            ) from err


def collate(batch: list[tuple[int, torch.Tensor | None]]) -> tuple[torch.Tensor, torch.Tensor | None, list[int]]:
    good = [(i, x) for i, x in batch if x is not None]
    bad = [i for i, x in batch if x is None]
    rows = torch.tensor([i for i, _ in good], dtype=torch.long)
    return rows, torch.stack([x for _, x in good]) if good else None, bad


def default_workers(device: torch.device) -> int:
    """On CUDA the CPU only decodes: every core but the main process's, up to 16. On CPU the model needs half."""
    cores = len(os.sched_getaffinity(0))
    return min(16, max(1, cores - 1)) if device.type == "cuda" else max(1, cores // 2)


def split_preprocess(preprocess: Callable) -> tuple[Callable, Callable[[torch.Tensor], torch.Tensor]]:
    """Split the model's transform before ToTensor + Normalize: workers return uint8 tensors (a quarter of the bytes
    to pass between processes, pin and copy to the GPU) and `finish` converts and normalises a batch on the model's
    device with the same fp32 arithmetic, so features are unchanged. Other transforms run whole in the workers."""
    steps = list(getattr(preprocess, "transforms", []))
    if len(steps) < 2 or not isinstance(steps[-2], ToTensor) or not isinstance(steps[-1], Normalize):
        return preprocess, lambda batch: batch
    mean = torch.tensor(steps[-1].mean, dtype=torch.float32).view(1, -1, 1, 1)
    std = torch.tensor(steps[-1].std, dtype=torch.float32).view(1, -1, 1, 1)

    def finish(batch: torch.Tensor) -> torch.Tensor:
        return batch.float().div_(255).sub_(mean.to(batch.device)).div_(std.to(batch.device))

    return Compose(steps[:-2] + [PILToTensor()]), finish


def embed_images(
    loaded: LoadedModel, path: Path, dataset: str, split: str, *, batch_size: int = 256,
    num_workers: int | None = None, skip_corrupt: bool = False, progress: bool = True,
) -> tuple[np.ndarray, np.ndarray]:
    """Return (embeddings in row order, row indices that were kept)."""
    num_rows = pq.ParquetFile(path).metadata.num_rows
    workers = default_workers(loaded.device) if num_workers is None else num_workers
    decode, finish = split_preprocess(loaded.preprocess)
    loader = DataLoader(
        ParquetImages(path, decode, dataset, split, skip_corrupt), batch_size=batch_size,
        num_workers=workers, collate_fn=collate, pin_memory=loaded.device.type == "cuda",
    )
    out: np.ndarray | None = None
    kept = np.zeros(num_rows, dtype=bool)
    bar = tqdm(total=num_rows, desc=f"embed {dataset}/{split}", unit="img", disable=not progress)
    with torch.inference_mode():
        for rows, images, bad in loader:
            bar.update(len(rows) + len(bad))
            if images is None:
                continue
            with loaded.autocast():
                emb = loaded.model.encode_image(finish(images.to(loaded.device, non_blocking=True)))
            emb = emb.float().cpu().numpy()
            if out is None:
                out = np.zeros((num_rows, emb.shape[1]), dtype=np.float32)
            out[rows.numpy()] = emb
            kept[rows.numpy()] = True
    bar.close()
    if out is None:
        raise CorruptImageError(f"dataset {dataset!r} split {split!r}: no image could be decoded")
    return out[kept], np.flatnonzero(kept)


def prompt_texts(meta: DatasetMeta) -> list[tuple[int, str, str]]:
    """(class_index, source, text) for every class and template of the dataset."""
    return [(c.index, "template", t.replace("{c}", c.name)) for c in meta.classes for t in meta.templates]


def embed_texts(loaded: LoadedModel, texts: list[str], batch_size: int = 512) -> np.ndarray:
    chunks = []
    with torch.inference_mode():
        for start in range(0, len(texts), batch_size):
            tokens = loaded.tokenizer(texts[start:start + batch_size]).to(loaded.device)
            with loaded.autocast():
                chunks.append(loaded.model.encode_text(tokens).float().cpu().numpy())
    return np.concatenate(chunks)


def embed_dataset(
    loaded: LoadedModel, dataset_dir: Path, out_dir: Path, *, batch_size: int = 256,
    num_workers: int | None = None, skip_corrupt: bool = False, progress: bool = True,
) -> dict[str, Any]:
    """Write features/<model>/<dataset>/ (every split + text.parquet) atomically; return a summary."""
    dataset_dir, out_dir = Path(dataset_dir), Path(out_dir)
    meta = load_meta(dataset_dir)
    fingerprint = {**loaded.fingerprint, "dataset": meta.name, "dataset_version": meta.version}
    label_col = "labels" if meta.multi_label else "label"
    summary: dict[str, Any] = {"dataset": meta.name, "splits": {}}
    with atomic_dir(out_dir) as tmp:
        for split in meta.splits:
            path = dataset_dir / f"{split}.parquet"
            start = time.perf_counter()
            emb, kept = embed_images(loaded, path, meta.name, split, batch_size=batch_size,
                                     num_workers=num_workers, skip_corrupt=skip_corrupt, progress=progress)
            seconds = time.perf_counter() - start
            ids_labels = pq.read_table(path, columns=["sample_id", label_col])
            skipped = [ids_labels.column("sample_id")[int(i)].as_py() for i in np.setdiff1d(np.arange(ids_labels.num_rows), kept)]
            table = ids_labels.take(pa.array(kept)).append_column("embedding", features.embedding_array(emb))
            schema = features.image_schema(emb.shape[1], meta.multi_label, fingerprint)
            schema = schema.with_metadata({**schema.metadata, b"vlbench.skipped_corrupt": json.dumps(skipped).encode()})
            features.write_table(tmp / f"{split}.parquet", [table], schema)
            summary["splits"][split] = {"images": int(len(kept)), "skipped_corrupt": skipped,
                                        "seconds": round(seconds, 3), "images_per_s": round(len(kept) / max(seconds, 1e-9), 1)}
        prompts = prompt_texts(meta)
        text_emb = embed_texts(loaded, [t for _, _, t in prompts])
        text_table = pa.table({
            "class_index": [c for c, _, _ in prompts], "source": [s for _, s, _ in prompts],
            "text": [t for _, _, t in prompts], "embedding": features.embedding_array(text_emb),
        })
        features.write_table(tmp / "text.parquet", [text_table], features.text_schema(text_emb.shape[1], fingerprint))
    summary["texts"] = len(prompts)
    return summary
