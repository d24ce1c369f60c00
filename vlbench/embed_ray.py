"""Ray Data as the engine of the embed stages (`VLBENCH_ENGINE=ray`, or a stage's `--engine ray`).

The same functions as the local engine (`vlbench.embed`), spread over a Ray cluster: a Ray dataset of the split's
Parquet row groups; CPU tasks that read and decode one row group each (`decode_row_group`, the local path's own
decode and preprocess); the model in actors (`map_batches` with a callable class: one model per actor, shipped once
through the object store), on a GPU each where the cluster has GPUs; the driver puts each embedding at its row index
(Ray Data does not keep order), so the caller writes the same files, fingerprint and row order as the local engine,
inside the same `atomic_dir`. A failed run raises `EngineError` and writes nothing.

`ray.init(address=$VLBENCH_RAY_ADDRESS)` joins an existing cluster (`auto`, `ray://head:10001`, ...); unset, Ray's own
RAY_ADDRESS, else a local Ray on this machine. An address that does not answer a TCP connect within 5 s fails at once,
naming it (Ray would retry it for minutes). Cluster set-up: docs/cluster.md.
"""

from __future__ import annotations

import io
import os
import socket
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import ray
import torch

from vlbench import portable
from vlbench.adapters import ray as ray_private
from vlbench.embed import (
    CorruptSample,
    EngineError,
    SplitRows,
    decode_row_group,
    encode_batch,
    encode_texts,
    row_groups,
    worker_preprocess,
)
from vlbench.decoding import DEFAULT_DECODE, decoder
from vlbench.models import loading

ADDRESS_VARIABLE = "VLBENCH_RAY_ADDRESS"
ACTORS_VARIABLE = "VLBENCH_RAY_ACTORS"  # model actors on a CPU-only cluster (default: half its CPUs)
RETRIES_VARIABLE = "VLBENCH_RAY_RETRIES"  # restarts of a dead model actor, and retries of its batch (default 2)
EXIT_AFTER_VARIABLE = "VLBENCH_RAY_EXIT_AFTER_BATCHES"  # fault injection: every model actor dies after N batches
DEFAULT_RETRIES = 2
PROBE_SECONDS = 5.0  # an address that does not answer a TCP connect within this fails before ray.init
RAY_CLIENT_PORT = 10001


def connect() -> None:
    """Join the cluster $VLBENCH_RAY_ADDRESS names, or start a local Ray; once per process."""
    address = ray_address()
    if not ray.is_initialized():
        # workers start from Ray's environment, not this process's: they get the stages' portable settings (and its
        # thread count, where Ray would set OMP_NUM_THREADS to a task's CPUs), so both engines compute the same bytes;
        # and this process's threads' wait (portable.THREAD_WAIT), on a cluster too
        env = {name: os.environ.get(name, value) for name, value in portable.THREAD_WAIT.items()}
        env |= portable.ENV if portable.enabled() else {}
        ray.init(address=address, include_dashboard=False, log_to_driver=False, configure_logging=False,
                 runtime_env={"env_vars": env})


def ray_address() -> str | None:
    """$VLBENCH_RAY_ADDRESS (else Ray's own $RAY_ADDRESS), checked to answer a TCP connect within PROBE_SECONDS: Ray
    itself retries an unreachable address for minutes, printing only warnings that name the address it resolved."""
    variable = ADDRESS_VARIABLE if os.environ.get(ADDRESS_VARIABLE) else "RAY_ADDRESS"
    address = os.environ.get(variable) or None
    if address is None or address == "local":
        return address
    target = ray_private.last_started_cluster() if address == "auto" else address
    if target is None:
        return address  # "auto" on a machine without `ray start`: Ray says so at once
    host, port = _host_port(variable, address, target)
    try:
        socket.create_connection((host, port), timeout=PROBE_SECONDS).close()
    except OSError as err:
        reason = err.strerror or str(err) or type(err).__name__
        raise EngineError(f"${variable}={address}: no Ray cluster answers at {host}:{port} ({reason}, within "
                          f"{PROBE_SECONDS:g} s); check that the head node runs (`ray status` on it), that this is "
                          f"its GCS address (`ray start --head` prints it; port 6379 by default, Ray Client's ray:// "
                          f"port 10001) and that no firewall blocks the port from this machine") from None
    return address


def _host_port(variable: str, address: str, target: str) -> tuple[str, int]:
    client = target.startswith("ray://")
    host, _, port = target.removeprefix("ray://").rpartition(":")
    if client and not port.isdigit():
        host, port = target.removeprefix("ray://"), str(RAY_CLIENT_PORT)
    if not host or not port.isdigit():
        raise EngineError(f"${variable}={address}: not a Ray address; use auto, host:port (the head's GCS address) "
                          f"or ray://host:port (Ray Client)")
    return host.strip("[]"), int(port)


def cluster_device() -> torch.device:
    """cuda where the cluster has a GPU (the model actors take one each), else cpu."""
    connect()
    return torch.device("cuda" if ray.cluster_resources().get("GPU", 0) >= 1 else "cpu")


def load_model(cfg: dict[str, Any], device: str | torch.device | None = None) -> loading.LoadedModel:
    """The model as the actors will run it: loaded on this (driver) process's CPU, with the device, autocast and
    fingerprint precision of `device` (default: the cluster's), so that the fingerprint says what the actors do."""
    target = torch.device(device) if device else cluster_device()
    loaded = loading.load_model(cfg, device="cpu")
    precision = loading.validate_model_config(cfg)["precision"]
    return replace(loaded, device=target, autocast_dtype=loading.autocast_dtype(precision, target),
                   fingerprint={**loaded.fingerprint, "precision": loading.effective_precision(precision, target)})


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name) or str(default)
    if not value.isdigit():
        raise EngineError(f"${name} must be a whole number, got {value!r}")
    return int(value)


def actor_count(device: torch.device) -> int:
    """One model actor per GPU of the cluster; on a CPU-only cluster $VLBENCH_RAY_ACTORS, else half its CPUs."""
    resources = ray.cluster_resources()
    if device.type == "cuda":
        return int(resources["GPU"])
    return _env_int(ACTORS_VARIABLE, max(1, int(resources.get("CPU", 1)) // 2))


def actor_options(device: torch.device) -> dict[str, Any]:
    """The model actors' `map_batches` options: how many, one GPU (or one CPU) each, how often a dead one restarts."""
    retries = _env_int(RETRIES_VARIABLE, DEFAULT_RETRIES)
    holds = {"num_gpus": 1} if device.type == "cuda" else {"num_cpus": 1}
    return {"compute": ray.data.ActorPoolStrategy(size=actor_count(device)), **holds,
            "max_restarts": retries, "max_task_retries": retries}  # Ray's default: restart forever


def to_bytes(x: np.ndarray) -> bytes:
    """An array as .npy bytes (shape and dtype kept): decoded images and embeddings cross Ray as plain binary
    columns, so a row of a corrupt image (b"") fits the same column as a decoded one."""
    buf = io.BytesIO()
    np.save(buf, x, allow_pickle=False)
    return buf.getvalue()


def from_bytes(data: bytes) -> np.ndarray:
    return np.load(io.BytesIO(data), allow_pickle=False)


def decode_groups(batch: dict[str, np.ndarray], path: str, preprocess: Callable) -> dict[str, np.ndarray]:
    """A CPU task: the row groups of `batch` read and decoded; per image its row, sample id, the reason it could not
    be decoded ("" if it could) and its pixels (.npy bytes, b"" if corrupt)."""
    out: dict[str, list] = {"row": [], "sample_id": [], "reason": [], "pixels": []}
    for group, start in zip(batch["group"], batch["start"]):
        for row, item in decode_row_group(Path(path), int(group), int(start), preprocess):
            bad = isinstance(item, CorruptSample)
            out["row"].append(row)
            out["sample_id"].append(item.sample_id if bad else "")
            out["reason"].append(item.reason if bad else "")
            out["pixels"].append(b"" if bad else to_bytes(item.numpy()))
    return {"row": np.array(out["row"], dtype=np.int64), "sample_id": np.array(out["sample_id"], dtype=object),
            "reason": np.array(out["reason"], dtype=object), "pixels": np.array(out["pixels"], dtype=object)}


class ImageEncoder:
    """A model actor: the model arrives once (an object-store reference to (model, encode, finish)), moves to the
    actor's device, and encodes the decoded images of each batch; corrupt rows pass through with no embedding."""

    def __init__(self, shipped: list, exit_after: int = 0):
        self.loaded, self.encode, self.finish = ray.get(shipped[0])
        self.loaded.model.to(self.loaded.device)
        self.exit_after, self.batches = exit_after, 0

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        self.batches += 1
        if self.exit_after and self.batches > self.exit_after:
            os._exit(1)  # fault injection ($VLBENCH_RAY_EXIT_AFTER_BATCHES): the worker process dies mid-run
        ok = batch["reason"] == ""
        embedding = np.full(len(ok), b"", dtype=object)
        if ok.any():
            images = torch.from_numpy(np.stack([from_bytes(b) for b in batch["pixels"][ok]]))
            embedding[ok] = [to_bytes(e) for e in encode_batch(self.loaded, self.encode, self.finish, images)]
        return {"row": batch["row"], "sample_id": batch["sample_id"], "reason": batch["reason"], "embedding": embedding}


class TextEncoder:
    """A model actor for texts: (row, text) batches -> (row, embedding)."""

    def __init__(self, shipped: list):
        self.loaded = ray.get(shipped[0])
        self.loaded.model.to(self.loaded.device)

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return {"row": batch["row"], "embedding": encode_texts(self.loaded, [str(t) for t in batch["text"]])}


def _quiet(progress: bool) -> None:
    context = ray.data.DataContext.get_current()
    context.enable_progress_bars = progress
    context.print_on_execution_start = False


def _run(what: str, collect: Callable[[], Any]) -> Any:
    """`collect` (which iterates a Ray dataset), with a failed Ray run as one EngineError naming `what`."""
    try:
        return collect()
    except ray.exceptions.RayError as err:
        first = (str(err).strip().splitlines() or [type(err).__name__])[0]
        raise EngineError(f"{what}: the Ray run failed ({type(err).__name__}: {first}); "
                          f"nothing was written") from err


def embed_images(
    loaded: loading.LoadedModel, path: Path, dataset: str, split: str, *, batch_size: int = 256,
    num_workers: int | None = None, skip_corrupt: bool = False, progress: bool = True,
    normalise_in_workers: bool | None = None, encode: Callable[[torch.Tensor], torch.Tensor] | None = None,
    decode: str = DEFAULT_DECODE,
) -> tuple[np.ndarray, np.ndarray]:
    """`vlbench.embed.embed_images` on Ray: the same (embeddings in row order, kept rows) and the same
    CorruptImageError. `num_workers` is the local engine's: here Ray spreads decoding over the cluster's CPUs.
    `decode`: the Pillow decoders (`pil`, `pil_draft`) run in the CPU tasks; `torchvision` and `dali`, which decode
    in the model's process, are the local engine's only (their encoded bytes would travel to the actors undecoded)."""
    dec = decoder(decode, loaded.preprocess, loaded.device, loaded.fingerprint.get("model", "?"),
                  worker_preprocess(loaded.preprocess, loaded.device, normalise_in_workers))
    if not dec.stack:
        raise EngineError(f"embed.decode {decode!r} runs on the local engine only (it decodes on the model's device); "
                          f"use --engine local, or embed.decode pil / pil_draft on Ray")
    connect()
    _quiet(progress)
    path = Path(path)
    decode, finish = dec.worker, dec.finish
    shipped = [ray.put((loaded, encode or loaded.model.encode_image, finish))]
    items = [{"group": group, "start": start} for group, start in row_groups(path)]
    ds = ray.data.from_items(items, override_num_blocks=len(items))
    # the tasks may run on other nodes: the workspace must be at the same absolute path there (docs/cluster.md)
    ds = ds.map_batches(decode_groups, batch_size=1, batch_format="numpy", num_cpus=1,
                        fn_kwargs={"path": str(path.resolve()), "preprocess": decode})
    ds = ds.map_batches(ImageEncoder, batch_size=batch_size, batch_format="numpy",
                        fn_constructor_args=(shipped, _env_int(EXIT_AFTER_VARIABLE, 0)), **actor_options(loaded.device))
    rows = SplitRows(pq.ParquetFile(path).metadata.num_rows)

    def collect() -> None:
        for batch in ds.iter_batches(batch_size=None, batch_format="numpy"):
            _gather(rows, batch)

    _run(f"dataset {dataset!r} split {split!r} ({path})", collect)
    return rows.result(dataset, split, path, skip_corrupt)


def _gather(rows: SplitRows, batch: dict[str, np.ndarray]) -> None:
    """One output batch of the model actors into `rows`, by row index."""
    ok = batch["reason"] == ""
    rows.corrupt += [(int(r), CorruptSample(str(s), str(why)))
                     for r, s, why in zip(batch["row"][~ok], batch["sample_id"][~ok], batch["reason"][~ok])]
    if ok.any():
        rows.put(batch["row"][ok], np.stack([from_bytes(b) for b in batch["embedding"][ok]]))


def embed_texts(loaded: loading.LoadedModel, texts: list[str], batch_size: int = 512) -> np.ndarray:
    """`vlbench.embed.embed_texts` on Ray: the texts' embeddings in their order (each row carries its index)."""
    connect()
    _quiet(False)
    shipped = [ray.put(loaded)]
    ds = ray.data.from_items([{"row": i, "text": text} for i, text in enumerate(texts)])
    ds = ds.map_batches(TextEncoder, batch_size=batch_size, batch_format="numpy", fn_constructor_args=(shipped,),
                        **actor_options(loaded.device))

    def collect() -> np.ndarray:
        batches = list(ds.iter_batches(batch_size=None, batch_format="numpy"))
        order = np.argsort(np.concatenate([b["row"] for b in batches]), kind="stable")
        return np.concatenate([b["embedding"] for b in batches])[order].astype(np.float32, copy=False)

    return _run(f"{len(texts)} texts", collect)
