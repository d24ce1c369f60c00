"""Encode a prepared dataset's images, and its text sets, into the feature store (two separate steps).

Images stream from Parquet row groups into DataLoader workers (an IterableDataset sharded by row group),
which decode and preprocess in parallel: on an accelerator up to uint8 tensors, which the device converts and
normalises; on the CPU the whole transform. The model runs under `torch.inference_mode`, with autocast on CUDA.
"""

from __future__ import annotations

import copy
import json
import os
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from functools import partial
from pathlib import Path
from types import ModuleType
from typing import Any, NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info
from torchvision.transforms import (
    CenterCrop,
    Compose,
    InterpolationMode,
    Normalize,
    PILToTensor,
    Resize,
    ToTensor,
)
from tqdm import tqdm

from vlbench import decoding, features
from vlbench.datasets.canonical import (
    ASSOCIATION_COLUMN,
    GROUP_COLUMN,
    DatasetMeta,
    load_meta,
    metadata_columns,
    split_path,
)
from vlbench.errors import VlbenchError
from vlbench.datasets.images import ImageDecodeError
from vlbench.decoding import DEFAULT_DECODE
from vlbench.io import atomic_dir
from vlbench.models.loading import LoadedModel, load_model  # noqa: F401 (load_model: this engine's, vlbench.engines)
from vlbench.models.projection import PreProjectionEncoder, VisualProjection
from vlbench.texts import read_text_set, text_set_names


class CorruptImageError(VlbenchError):
    """An image in a prepared dataset cannot be decoded; the message names the dataset, split and sample."""


class CorruptSample(NamedTuple):
    """What a worker yields in place of an image it cannot decode; the main process gathers them for the split."""

    sample_id: str
    reason: str


class PreprocessError(VlbenchError):
    """A dataset asks for a preprocessing that the model's own transform cannot be turned into."""


class EngineError(VlbenchError):
    """An unknown engine was asked for, its optional dependency is missing, or a run on it failed."""


OVERLAP_VARIABLE = "VLBENCH_EMBED_OVERLAP"  # "1" / "0": embed_images' `overlap` on / off (docs/benchmarks.md)


def check_batch_options(batch_size: Any, num_workers: Any = None) -> None:
    """The embed stages' --batch-size (a whole number >= 1) and --workers (>= 0, or None: the default), checked before
    a model is loaded; one line naming the option otherwise."""
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise EngineError(f"--batch-size must be a whole number of at least 1, got {batch_size!r}")
    if num_workers is not None and (isinstance(num_workers, bool) or not isinstance(num_workers, int)
                                    or num_workers < 0):
        raise EngineError(f"--workers must be a whole number of at least 0 (0: decode in the main process), "
                          f"got {num_workers!r}")


MAX_LISTED_CORRUPT = 20  # sample ids named in a CorruptImageError; the total count is always given


class ParquetImages(IterableDataset):
    """Yields (row index, `load(image bytes)` or CorruptSample) for one split; each worker reads every n-th row group.
    `load` is a decoder's worker step (`vlbench.decoding`). A corrupt image never raises in a worker, so that the main
    process can report every corrupt file of the split."""

    def __init__(self, path: Path, load: Callable[[bytes | None], Any]):
        self.path, self.load = Path(path), load

    def __iter__(self) -> Iterator[tuple[int, torch.Tensor | CorruptSample]]:
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info else (0, 1)
        for group, start in row_groups(self.path)[worker::workers]:
            yield from decode_row_group(self.path, group, start, self.load)



def row_groups(path: Path) -> list[tuple[int, int]]:
    """(row group, index of its first row) for every row group of a Parquet file: the unit both engines hand out."""
    meta = pq.ParquetFile(path).metadata
    sizes = [meta.row_group(i).num_rows for i in range(meta.num_row_groups)]
    return [(group, int(start)) for group, start in enumerate(np.cumsum([0] + sizes[:-1]))]


def decode_row_group(path: Path, group: int, start: int, load: Callable[[bytes | None], Any],
                     ) -> Iterator[tuple[int, torch.Tensor | CorruptSample]]:
    """(row index, `load(image bytes)` or CorruptSample) for each image of one row group, read alone."""
    table = pq.ParquetFile(path).read_row_group(group, columns=["sample_id", "image"])
    ids, images = table.column("sample_id").to_pylist(), table.column("image").to_pylist()
    for offset, (sample_id, data) in enumerate(zip(ids, images)):
        yield start + offset, decode_sample(load, sample_id, data)


def decode_sample(load: Callable[[bytes | None], Any], sample_id: str, data: bytes | None,
                  ) -> torch.Tensor | CorruptSample:
    """One image through a decoder's worker step (`vlbench.decoding`); a CorruptSample instead of an exception, so a
    split reports them all."""
    try:
        return load(data)
    except (OSError, ValueError, SyntaxError) as err:  # ImageDecodeError is a ValueError
        return CorruptSample(sample_id, str(err))


def collate(batch: list[tuple[int, torch.Tensor | CorruptSample]], stack: bool = True,
            ) -> tuple[torch.Tensor, torch.Tensor | list[torch.Tensor] | None, list[tuple[int, CorruptSample]]]:
    """(row indices of the decoded images, their tensors stacked (a list without `stack`) or None,
    [(row, CorruptSample)] of the others)."""
    good = [(i, x) for i, x in batch if not isinstance(x, CorruptSample)]
    bad = [(i, x) for i, x in batch if isinstance(x, CorruptSample)]
    rows = torch.tensor([i for i, _ in good], dtype=torch.long)
    images = [x for _, x in good]
    return rows, (torch.stack(images) if stack else images) if good else None, bad


def corrupt_images_error(dataset: str, split: str, path: Path, bad: list[tuple[int, CorruptSample]]) -> CorruptImageError:
    """One error for every corrupt image of a split: the first MAX_LISTED_CORRUPT sample ids in row order, and the count."""
    bad = sorted(bad, key=lambda item: item[0])
    fix = "then re-run prepare (skip_corrupt: true in the dataset's prepare spec leaves {} out)"
    if len(bad) == 1:
        (_, sample), = bad
        return CorruptImageError(
            f"dataset {dataset!r} split {split!r} sample {sample.sample_id!r}: cannot decode image ({sample.reason}) "
            f"in {path}; fix or remove the sample, " + fix.format("it"))
    listed = ", ".join(repr(s.sample_id) for _, s in bad[:MAX_LISTED_CORRUPT])
    more = f" and {len(bad) - MAX_LISTED_CORRUPT} more" if len(bad) > MAX_LISTED_CORRUPT else ""
    return CorruptImageError(
        f"dataset {dataset!r} split {split!r}: {len(bad)} images cannot be decoded in {path}: samples {listed}{more} "
        f"(first error: {bad[0][1].reason}); fix or remove these samples, " + fix.format("them"))


def device_decode_error(dataset: str, split: str, path: Path, rows: torch.Tensor, err: Exception) -> CorruptImageError:
    ids = pq.read_table(path, columns=["sample_id"]).column("sample_id").to_pylist()
    listed = ", ".join(repr(ids[i]) for i in rows.tolist()[:MAX_LISTED_CORRUPT])
    return CorruptImageError(f"dataset {dataset!r} split {split!r}: a batch of {len(rows)} images in {path} "
                             f"(samples {listed}, ...) cannot be decoded on the device: {err}; embed with "
                             f"embed.decode: pil to name the image (prepare checked every image with Pillow)")


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


IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
# How a prepared dataset's `preprocess` (canonical.PREPROCESS) changes the model's transform, as data: every mode
# squashes (one Resize to the crop size instead of Resize + CenterCrop); `interpolation`, `mean` and `std` replace the
# model's own. fewtrans: FewTrans' test transform (data/bulid_transforms.py with AUG.TEST_CROP False:
# transforms.Resize([224, 224]), torchvision's default bilinear, then Normalize with ImageNet's mean and std, which its
# configs set for every backbone, CLIP included).
PREPROCESS_MODES: dict[str, dict[str, Any]] = {
    "squash": {},
    "fewtrans": {"interpolation": "bilinear", "mean": IMAGENET_MEAN, "std": IMAGENET_STD},
}


def squash_preprocess(preprocess: Callable, model: str = "?", interpolation: str | None = None,
                      mean=None, std=None) -> Compose:
    """The model's transform with its Resize + CenterCrop replaced by one Resize to the crop size (h, w), with the
    same interpolation and antialiasing unless `interpolation` names another: the whole image is squashed to the
    model's input, its aspect ratio not kept and nothing cropped (ELEVATER's KITTI distance; open_clip's
    `resize_mode="squash"`). A model that squashes already (SigLIP's transform: one Resize to (h, w)) keeps its Resize,
    with `interpolation` if given. The steps after it (RGB, ToTensor, Normalize) are kept, with `mean` / `std` replacing the Normalize's if given, so `split_preprocess`
    still stops at uint8 for accelerators."""
    steps = list(getattr(preprocess, "transforms", []))
    pairs = [(i, 2) for i in range(len(steps) - 1) if isinstance(steps[i], Resize) and isinstance(steps[i + 1], CenterCrop)]
    # a model that squashes already (open_clip's resize_mode 'squash', SigLIP's): one Resize to (h, w), kept
    squashing = [(i, 1) for i, step in enumerate(steps) if isinstance(step, Resize) and isinstance(step.size, (list, tuple))
                 and len(step.size) == 2 and not any(isinstance(s, CenterCrop) for s in steps)]
    if not pairs + squashing:
        raise PreprocessError(
            f"model {model!r}: cannot squash images: its preprocess has no Resize followed by CenterCrop nor a Resize "
            f"to (h, w) (steps: {[type(step).__name__ for step in steps]}); use a model with open_clip's resize_mode "
            "'shortest' or 'squash'")
    i, width = (pairs + squashing)[0]
    resize = steps[i]
    mode = InterpolationMode(interpolation) if interpolation else resize.interpolation
    squash = Resize(tuple(steps[i + width - 1].size), interpolation=mode, antialias=resize.antialias)
    steps = steps[:i] + [squash] + steps[i + width:]
    if mean is not None:
        if not isinstance(steps[-1], Normalize):
            raise PreprocessError(f"model {model!r}: cannot set the normalisation: its preprocess does not end in "
                                  "Normalize")
        steps[-1] = Normalize(mean=list(mean), std=list(std))
    return Compose(steps)


# Pixels cropped off every side of each image before the model's own transform, per prepared `preprocess`. objectnet:
# ObjectNet's images carry a thin red border; imagenet-testbed (src/eval_settings/objectnet.py, crop_image) and wise-ft /
# model-soups crop 2 pixels (PIL.ImageOps.crop(image, border=2)), the crop of the published effective-robustness
# numbers (docs/protocols.md "Robustness"); CLIP_benchmark crops nothing.
BORDER_CROPS: dict[str, int] = {"objectnet": 2}


class BorderCrop:
    """Crop `border` pixels off every side (PIL.ImageOps.crop); a class, so DataLoader workers can pickle it."""

    def __init__(self, border: int):
        self.border = border

    def __call__(self, image):
        """A PIL image, or a (batch of) CHW tensor(s) (the device decoders' geometric steps): the same pixels cut."""
        from PIL import ImageOps

        if isinstance(image, torch.Tensor):
            b = self.border
            return image[..., b:image.shape[-2] - b, b:image.shape[-1] - b]
        return ImageOps.crop(image, border=self.border)

    def __repr__(self) -> str:
        return f"BorderCrop(border={self.border})"


def model_for_dataset(loaded: LoadedModel, meta: DatasetMeta) -> LoadedModel:
    """The model as it embeds this dataset's images: unchanged for `preprocess: default`; otherwise with
    `squash_preprocess` as PREPROCESS_MODES says, and the fingerprint's `preprocess` saying so (`resize_mode:
    squash`, and the interpolation, mean and std where the mode replaces them), so that features made either way can
    never be mistaken for each other."""
    if meta.preprocess == "default":
        return loaded
    if meta.preprocess in BORDER_CROPS:
        border = BORDER_CROPS[meta.preprocess]
        described = {**loaded.fingerprint.get("preprocess", {}), "border_crop": border}
        steps = [BorderCrop(border)] + list(getattr(loaded.preprocess, "transforms", [loaded.preprocess]))
        return replace(loaded, preprocess=Compose(steps), fingerprint={**loaded.fingerprint, "preprocess": described})
    mode = PREPROCESS_MODES[meta.preprocess]
    described = {**loaded.fingerprint.get("preprocess", {}), "resize_mode": "squash",
                 **{k: list(v) if isinstance(v, tuple) else v for k, v in mode.items()}}
    preprocess = squash_preprocess(loaded.preprocess, loaded.fingerprint.get("model", "?"), **mode)
    return replace(loaded, preprocess=preprocess, fingerprint={**loaded.fingerprint, "preprocess": described})


def worker_preprocess(
    preprocess: Callable, device: torch.device, normalise_in_workers: bool | None = None,
) -> tuple[Callable, Callable[[torch.Tensor], torch.Tensor]]:
    """(what the DataLoader workers run on each image, what the main process runs on each batch).

    By default, on the CPU the workers run the model's whole transform, so that the model's process does not also
    convert and normalise; on an accelerator they stop at uint8 and the device finishes (`split_preprocess`). Both
    give bitwise-equal model inputs, hence identical features; only speed differs (docs/benchmarks.md)."""
    if normalise_in_workers is None:
        normalise_in_workers = device.type == "cpu"
    return (preprocess, decoding.unchanged) if normalise_in_workers else split_preprocess(preprocess)


def embed_images(
    loaded: LoadedModel, path: Path, dataset: str, split: str, *, batch_size: int = 256,
    num_workers: int | None = None, skip_corrupt: bool = False, progress: bool = True,
    normalise_in_workers: bool | None = None, encode: Callable[[torch.Tensor], torch.Tensor] | None = None,
    decode: str = DEFAULT_DECODE, overlap: bool | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Return (embeddings in row order, row indices that were kept).

    Corrupt images: with `skip_corrupt` their rows are left out of the result; without it the whole split is still
    read (the model stops at the first one) and one CorruptImageError names them all. `normalise_in_workers`: see
    `worker_preprocess` (None: on the CPU only); it changes speed, never the features. `encode`: what runs on each
    batch of model inputs (default `model.encode_image`; `PreProjectionEncoder` adds the pre-projection features).
    `decode`: how bytes become model inputs (`vlbench.decoding.DECODERS`; `pil` unless the params say otherwise).
    `overlap`: on CUDA, queue each batch on the device before waiting for the previous one's embeddings
    (`launch_batch`), so that the device never idles while the host collects a batch; the same kernels on the same
    batches, so the same features (a runtime choice, never a param). None: $VLBENCH_EMBED_OVERLAP (1 on, 0 off), else
    on for the decoders that finish on the device (`torchvision`, measured faster with it) and off for the Pillow
    decoders (measured no faster; docs/benchmarks.md). Images a device decoder leaves to the CPU are counted on
    stderr (`Decoder.log_line`)."""
    path = Path(path)
    encode = encode or loaded.model.encode_image
    num_rows = pq.ParquetFile(path).metadata.num_rows
    workers = default_workers(loaded.device) if num_workers is None else num_workers
    dec = decoding.decoder(decode, loaded.preprocess, loaded.device, loaded.fingerprint.get("model", "?"),
                           worker_preprocess(loaded.preprocess, loaded.device, normalise_in_workers))
    loader = DataLoader(
        ParquetImages(path, dec.worker), batch_size=batch_size, num_workers=workers,
        collate_fn=partial(collate, stack=dec.stack), pin_memory=loaded.device.type == "cuda" and dec.stack,
    )
    overlap = default_overlap(dec) if overlap is None else overlap
    split_rows = SplitRows(num_rows)
    queued: list[tuple[np.ndarray, Callable[[], np.ndarray]]] = []  # batches on the device, oldest first
    bar = tqdm(total=num_rows, desc=f"embed {dataset}/{split}", unit="img", disable=not progress)
    for rows, images, bad in loader:
        bar.update(len(rows) + len(bad))
        split_rows.corrupt += bad
        if images is None or (split_rows.corrupt and not skip_corrupt):  # the split fails: only look for more corrupt files
            continue
        try:
            if overlap:
                queued.append((rows.numpy(), launch_batch(loaded, encode, dec.finish, images)))
            else:
                split_rows.put(rows.numpy(), encode_batch(loaded, encode, dec.finish, images))
        except ImageDecodeError as err:  # a decoder that decodes on the device (torchvision)
            raise device_decode_error(dataset, split, path, rows, err) from err
        while len(queued) > 1:  # the newest batch runs while the host takes the one before it
            split_rows.put(*_waited(queued.pop(0)))
    for item in queued:
        split_rows.put(*_waited(item))
    bar.close()
    fallback = dec.log_line(dataset, split)
    if fallback:
        print(fallback, file=sys.stderr)
    return split_rows.result(dataset, split, path, skip_corrupt)


def default_overlap(dec: decoding.Decoder) -> bool:
    """$VLBENCH_EMBED_OVERLAP if set (1 / 0), else on for a decoder that finishes on the device (a list of items)."""
    value = os.environ.get(OVERLAP_VARIABLE)
    if value not in (None, "", "0", "1"):
        raise EngineError(f"${OVERLAP_VARIABLE} must be 1 (on) or 0 (off), got {value!r}")
    return not dec.stack if value in (None, "") else value == "1"


def bf16_image_weights(loaded: LoadedModel) -> LoadedModel:
    """`embed.bf16_weights`: a copy of the model whose image tower holds bf16 weights, run under bf16 autocast on any
    device (the tower's matrix products ran in bf16 under autocast already; what changes is that its norms' and
    embeddings' parameters are rounded to bf16 and its residual stream is carried in bf16). Changes bits: the
    features' fingerprint records `image_weights: bf16`."""
    visual = getattr(loaded.model, "visual", None)
    if not isinstance(visual, torch.nn.Module):
        raise EngineError(f"model {loaded.fingerprint.get('model', '?')!r}: embed.bf16_weights needs an image tower at "
                          f"model.visual; set embed.bf16_weights: false")
    model = copy.deepcopy(loaded.model)
    model.visual.to(torch.bfloat16)
    return replace(loaded, model=model, autocast_dtype=torch.bfloat16,
                   fingerprint={**loaded.fingerprint, "image_weights": "bf16"})


def _waited(item: tuple[np.ndarray, Callable[[], np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    rows, wait = item
    return rows, wait()


def encode_batch(loaded: LoadedModel, encode: Callable[[torch.Tensor], torch.Tensor],
                 finish: Callable[[torch.Tensor], torch.Tensor], images: torch.Tensor) -> np.ndarray:
    """One batch of worker outputs (stacked, or a list for a decoder that finishes on the device) through `finish` and
    the model on its device: float32 embeddings on the host."""
    batch = images.to(loaded.device, non_blocking=True) if isinstance(images, torch.Tensor) else images
    with torch.inference_mode(), loaded.autocast():
        return encode(finish(batch)).float().cpu().numpy()


def launch_batch(loaded: LoadedModel, encode: Callable[[torch.Tensor], torch.Tensor],
                 finish: Callable[[torch.Tensor], torch.Tensor], images: torch.Tensor) -> Callable[[], np.ndarray]:
    """`encode_batch` in two halves: queue the batch on the device now (the copy from pinned memory on a side stream,
    so that it runs while the previous batch computes, then `finish`, the model, and a copy of the embeddings into
    pinned host memory from torch's caching host allocator, which reuses its buffers across batches), all without
    waiting; return what waits for the embeddings. Off CUDA it runs at once."""
    if loaded.device.type != "cuda":
        embeddings = encode_batch(loaded, encode, finish, images)
        return lambda: embeddings
    batch = copied_beside(images, loaded.device) if isinstance(images, torch.Tensor) else images
    with torch.inference_mode():
        with loaded.autocast():
            on_device = encode(finish(batch)).float()
        host = torch.empty(on_device.shape, dtype=on_device.dtype, pin_memory=True)
        host.copy_(on_device, non_blocking=True)
    done = torch.cuda.Event()
    done.record()

    def wait() -> np.ndarray:
        done.synchronize()
        return host.numpy()

    return wait


_COPY_STREAMS: dict[torch.device, Any] = {}


def copied_beside(images: torch.Tensor, device: torch.device) -> torch.Tensor:
    """`images` (pinned) copied to `device` on a stream of its own; the current stream waits for the copy alone, and
    the copy's memory is marked as used there (so the copy stream cannot reuse it while the model reads it)."""
    if device not in _COPY_STREAMS:
        _COPY_STREAMS[device] = torch.cuda.Stream(device)
    stream = _COPY_STREAMS[device]
    with torch.cuda.stream(stream):
        batch = images.to(device, non_blocking=True)
    current = torch.cuda.current_stream(device)
    current.wait_stream(stream)
    batch.record_stream(current)
    return batch


class SplitRows:
    """A split's embeddings gathered by row index as batches arrive in any order, and its corrupt samples."""

    def __init__(self, num_rows: int):
        self.out: np.ndarray | None = None
        self.kept = np.zeros(num_rows, dtype=bool)
        self.corrupt: list[tuple[int, CorruptSample]] = []

    def put(self, rows: np.ndarray, emb: np.ndarray) -> None:
        if self.out is None:
            self.out = np.zeros((len(self.kept), emb.shape[1]), dtype=np.float32)
        self.out[rows] = emb
        self.kept[rows] = True

    def result(self, dataset: str, split: str, path: Path, skip_corrupt: bool) -> tuple[np.ndarray, np.ndarray]:
        """(embeddings in row order, kept row indices); the one CorruptImageError of the split unless `skip_corrupt`."""
        if self.corrupt and not skip_corrupt:
            raise corrupt_images_error(dataset, split, path, self.corrupt)
        if self.out is None:
            raise CorruptImageError(f"dataset {dataset!r} split {split!r}: no image could be decoded in {path}")
        return self.out[self.kept], np.flatnonzero(self.kept)


def embed_texts(loaded: LoadedModel, texts: list[str], batch_size: int = 512) -> np.ndarray:
    return np.concatenate([encode_texts(loaded, texts[start:start + batch_size])
                           for start in range(0, len(texts), batch_size)])


def encode_texts(loaded: LoadedModel, texts: list[str]) -> np.ndarray:
    """One batch of texts tokenized and through the text tower: float32 embeddings on the host."""
    with torch.inference_mode():
        tokens = loaded.tokenizer(texts).to(loaded.device)
        with loaded.autocast():
            return loaded.model.encode_text(tokens).float().cpu().numpy()


def embed_image_splits(
    loaded: LoadedModel, dataset_dir: Path, out_dir: Path, *, batch_size: int = 256,
    num_workers: int | None = None, skip_corrupt: bool = False, progress: bool = True, pre_projection: bool = False,
    decode: str = DEFAULT_DECODE, engine: ModuleType | None = None, bf16_weights: bool = False,
) -> dict[str, Any]:
    """Write `out_dir/<split>.parquet` for every split of a prepared dataset (the folder replaced whole), with the
    preprocessing the dataset asks for (`model_for_dataset`). With `pre_projection`, the same forward pass also gives
    the image tower's features before its projection: `out_dir/pre_projection/<split>.parquet` and the projection in
    `out_dir/pre_projection/projection.weights.parquet` (`vlbench.models.projection`; the projected embeddings are the
    same either way). `decode` (params' embed.decode) is recorded in every file's fingerprint, and so is
    `bf16_weights` where true (`bf16_image_weights`). `engine`: the engine module that embeds each split
    (`vlbench.engines.engine`; default this one, the local engine); the files are the same either way."""
    check_batch_options(batch_size, num_workers)
    embed_split = engine.embed_images if engine else embed_images
    dataset_dir, out_dir = Path(dataset_dir), Path(out_dir)
    meta = load_meta(dataset_dir)
    loaded = model_for_dataset(bf16_image_weights(loaded) if bf16_weights else loaded, meta)
    fingerprint = {**loaded.fingerprint, "dataset": meta.name, "dataset_version": meta.version,
                   **decoding.decode_fingerprint(decode, loaded.device)}
    encoder = PreProjectionEncoder(loaded.model, loaded.fingerprint.get("model", "?")) if pre_projection else None
    summary: dict[str, Any] = {"dataset": meta.name, "engine": embed_split.__module__, "splits": {}}
    with atomic_dir(out_dir) as tmp:
        for split in meta.splits:
            path = split_path(dataset_dir, split)
            start = time.perf_counter()
            emb, kept = embed_split(loaded, path, meta.name, split, batch_size=batch_size, num_workers=num_workers,
                                    skip_corrupt=skip_corrupt, progress=progress, encode=encoder, decode=decode)
            seconds = time.perf_counter() - start
            ids_labels = pq.read_table(path, columns=feature_columns(path, meta))
            skipped = ids_labels.column("sample_id").to_numpy(zero_copy_only=False)[
                np.setdiff1d(np.arange(ids_labels.num_rows), kept)].tolist()
            rows = ids_labels.take(pa.array(kept))
            if encoder is not None:
                emb = _write_pre_projection(tmp, split, rows, emb, encoder.projection, fingerprint, skipped)
            _write_image_features(tmp / f"{split}.parquet", rows, emb, fingerprint, skipped)
            summary["splits"][split] = {"images": len(kept), "skipped_corrupt": skipped,
                                        "seconds": round(seconds, 3), "images_per_s": round(len(kept) / max(seconds, 1e-9), 1)}
        if encoder is not None:
            summary["pre_projection"] = _write_projection(tmp, encoder.projection, fingerprint)
    return summary


def feature_columns(path: Path, meta: DatasetMeta) -> list[str]:
    """The prepared columns image features carry: sample_id, the label column and, where the data has them, the
    per-sample `group` that group metrics are computed over (vlbench.metrics.GROUP_METRICS), a multi-objective
    dataset's metadata columns (FairFace's age, gender, race, race_binary; canonical.metadata_columns) and WinoGAViL's
    `association` (the zero-shot analysis' Jaccard)."""
    names = pq.ParquetFile(path).schema_arrow.names
    extra = (GROUP_COLUMN, ASSOCIATION_COLUMN, *metadata_columns(meta))
    return ["sample_id", meta.label_column] + [c for c in extra if c in names]


def _write_image_features(path: Path, rows: pa.Table, emb: np.ndarray, fingerprint: dict[str, Any],
                          skipped: list[str]) -> None:
    """A split's rows (sample_id, label) with their embedding, stamped with `fingerprint` and the skipped ids."""
    schema = features.features_schema(rows.schema, emb.shape[1], fingerprint)
    schema = schema.with_metadata({**schema.metadata, features.SKIPPED_KEY: json.dumps(skipped).encode()})
    features.write_table(path, [rows.append_column("embedding", features.embedding_array(emb))], schema)


def pre_projection_fingerprint(fingerprint: dict[str, Any], projection: VisualProjection,
                               representation: str = features.PRE_PROJECTION) -> dict[str, Any]:
    """The image features' fingerprint with what sets pre-projection files apart: `representation` (a reader of
    projected embeddings, which expects none, and a reader of these, which expects it, never mix them up), where
    the projection sits in the tower, and its (d_pre, d_out)."""
    return {**fingerprint, "representation": representation, "projection": projection.kind,
            "projection_dims": list(projection.dims)}


def _write_pre_projection(tmp: Path, split: str, rows: pa.Table, both: np.ndarray, projection: VisualProjection,
                          fingerprint: dict[str, Any], skipped: list[str]) -> np.ndarray:
    """Write the pre-projection part of `both` ([projected | pre], `PreProjectionEncoder`); return the projected part."""
    d_out = projection.dims[1]
    path = features.pre_projection_path(tmp, split)
    path.parent.mkdir(exist_ok=True)
    _write_image_features(path, rows, both[:, d_out:], pre_projection_fingerprint(fingerprint, projection), skipped)
    return both[:, :d_out]


def _write_projection(tmp: Path, projection: VisualProjection, fingerprint: dict[str, Any]) -> dict[str, Any]:
    path = features.projection_path(tmp)
    path.parent.mkdir(exist_ok=True)
    features.write_projection(path, projection.weight, projection.bias,
                              pre_projection_fingerprint(fingerprint, projection, features.PROJECTION))
    return {"dim": projection.dims[0], "projection": projection.kind}


def embed_text_sets(loaded: LoadedModel, texts_dir: Path, out_dir: Path,
                    engine: ModuleType | None = None) -> dict[str, int]:
    """Write `out_dir/<set>.parquet` (the set's rows + embedding) for every text set of a dataset, on `engine` (an
    engine module, `vlbench.engines.engine`; default this one, the local engine)."""
    embed = engine.embed_texts if engine else embed_texts
    counts = {}
    with atomic_dir(out_dir) as tmp:
        for name in text_set_names(texts_dir):
            rows, stamp = read_text_set(Path(texts_dir) / f"{name}.parquet")
            emb = embed(loaded, rows.column("text").to_pylist())
            table = rows.append_column("embedding", features.embedding_array(emb))
            schema = features.features_schema(rows.schema, emb.shape[1], {**loaded.fingerprint, **stamp})
            features.write_table(tmp / f"{name}.parquet", [table], schema)
            counts[name] = rows.num_rows
    return counts
