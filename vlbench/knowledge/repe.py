"""Retrieval-enhanced prompts (REPE; Ren et al., "Delving into the Openness of CLIP", Appendix A.5) with FAISS.

Per class, a query embedding searches a caption corpus (a dataset of image-caption pairs whose image and caption
embeddings are ordinary cached features); the top `top_k` hits give a ranked list of captions; captions that name
a word of the class pass the filter; the first `keep` that pass are L2-normalised and averaged; every prompt of the
class (the template rows of the class text set `repe.prompts`: `prompts` by default, `prompts_ensemble` for the
authors' ensembles) is then mixed with that mean, `(1 - shift_lambda) * prompt + shift_lambda * captions`,
renormalised, and the class weight is the renormalised mean over the class's prompts (the authors' `repe/repe.py`
applied per template in their `ZeroshotCLIP2` ensemble). docs/protocols.md, "REPE", lists every choice and each difference from their code.

Nothing here loads a model or imports torch; FAISS is imported when an index is built.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from vlbench import portable
from vlbench.errors import VlbenchError
from vlbench.features import StaleFeaturesError, embedding_array, features_schema, read_features
from vlbench.io import atomic_dir
from vlbench.params import NAME, ParamsError, defaults

FILTERS = ("word", "exact_word", "substring")
MODALITIES = ("image", "text")
INDEX_KINDS = ("auto", "flat", "ivf", "hnsw")
QUERY_MISSING = ("ensemble", "error")
TEXT_SET = "repe"  # the `text_set` of the class weights' fingerprint
DEFAULT_PROMPTS = "prompts"  # what a fingerprint without `prompts_set` was made from (fixed, whatever repe.prompts' default)
WEIGHTS_FILE = "class_weights.parquet"
RETRIEVED_FILE = "retrieved.parquet"
INDEX_INFO_FILE = "index.json"
INDEX_FILE = "index.faiss"


class RepeError(VlbenchError):
    """A corpus, a text set or a retrieval output that cannot be used as asked; the message names it."""


# ---------------------------------------------------------------------------------------------------------
# Settings (params.yaml `repe`)


_DEFAULTS = defaults("repe")  # conf/config.yaml and conf/settings/repe.yaml, where each is explained


@dataclass(frozen=True)
class IndexConfig:
    kind: str = _DEFAULTS["index"]["kind"]  # auto: flat up to exact_max vectors, hnsw up to hnsw_max, ivf beyond
    exact_max: int = _DEFAULTS["index"]["exact_max"]
    hnsw_max: int = _DEFAULTS["index"]["hnsw_max"]
    nlist: int | None = _DEFAULTS["index"]["nlist"]  # None: 4 * sqrt(n); at most train_size / 39 (faiss's minimum)
    nprobe: int = _DEFAULTS["index"]["nprobe"]
    train_size: int = _DEFAULTS["index"]["train_size"]  # ivf: rows sampled (seeded) to train the coarse quantiser
    hnsw_m: int = _DEFAULTS["index"]["hnsw_m"]
    ef_construction: int = _DEFAULTS["index"]["ef_construction"]
    ef_search: int = _DEFAULTS["index"]["ef_search"]
    seed: int = _DEFAULTS["index"]["seed"]


@dataclass(frozen=True)
class RepeConfig:
    corpus: str = _DEFAULTS["corpus"]
    prompts: str = _DEFAULTS["prompts"]
    split: str = _DEFAULTS["split"]
    captions: str = _DEFAULTS["captions"]
    modality: str = _DEFAULTS["modality"]
    query: str = _DEFAULTS["query"]
    query_missing: str = _DEFAULTS["query_missing"]
    top_k: int = _DEFAULTS["top_k"]
    filter: str = _DEFAULTS["filter"]
    keep: int = _DEFAULTS["keep"]
    shift_lambda: float = _DEFAULTS["shift_lambda"]
    recall_queries: int = _DEFAULTS["recall_queries"]
    index: IndexConfig = field(default_factory=IndexConfig)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _choice(key: str, value: Any, allowed: Sequence[str]) -> str:
    if value not in allowed:
        raise ParamsError(f"params.yaml: repe.{key} {value!r} is not one of {list(allowed)}")
    return value


def _int(key: str, value: Any, low: int = 1, optional: bool = False) -> int | None:
    if optional and value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ParamsError(f"params.yaml: repe.{key} must be an integer >= {low}, got {value!r}")
    return value


def parse_index_config(cfg: Mapping[str, Any] | None) -> IndexConfig:
    cfg = dict(cfg or {})
    unknown = sorted(set(cfg) - set(IndexConfig.__dataclass_fields__))
    if unknown:
        raise ParamsError(f"params.yaml: unknown key(s) repe.index.{unknown}; known: {list(IndexConfig.__dataclass_fields__)}")
    out = IndexConfig(**cfg)
    _choice("index.kind", out.kind, INDEX_KINDS)
    for key in ("exact_max", "hnsw_max", "seed"):
        _int(f"index.{key}", getattr(out, key), low=0)
    for key in ("nprobe", "train_size", "hnsw_m", "ef_construction", "ef_search"):
        _int(f"index.{key}", getattr(out, key))
    _int("index.nlist", out.nlist, optional=True)
    return out


def parse_config(cfg: Mapping[str, Any]) -> RepeConfig:
    """The `repe` params, checked; every error names its key."""
    cfg = dict(cfg)
    unknown = sorted(set(cfg) - set(RepeConfig.__dataclass_fields__))
    if unknown:
        raise ParamsError(f"params.yaml: unknown key(s) repe.{unknown}; known: {list(RepeConfig.__dataclass_fields__)}")
    index = parse_index_config(cfg.pop("index", None))
    out = RepeConfig(**cfg, index=index)
    _choice("modality", out.modality, MODALITIES)
    _choice("filter", out.filter, FILTERS)
    _choice("query_missing", out.query_missing, QUERY_MISSING)
    if not isinstance(out.prompts, str) or not NAME.match(out.prompts):
        raise ParamsError(f"params.yaml: repe.prompts must name a text set (letters, digits, '-', '_'), "
                          f"got {out.prompts!r}")
    for key in ("top_k", "keep", "recall_queries"):
        _int(key, getattr(out, key))
    if not isinstance(out.query, str) or "{c}" not in out.query:
        raise ParamsError(f"params.yaml: repe.query must be a string with a '{{c}}' placeholder, got {out.query!r}")
    lam = out.shift_lambda
    if isinstance(lam, bool) or not isinstance(lam, (int, float)) or not 0 <= lam <= 1:
        raise ParamsError(f"params.yaml: repe.shift_lambda must be a number in [0, 1], got {lam!r}")
    return out


# ---------------------------------------------------------------------------------------------------------
# Vectors


def l2_normalize(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float32)
    return x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), 1e-12)


def exact_search(corpus: np.ndarray, queries: np.ndarray, k: int, chunk: int = 65536) -> tuple[np.ndarray, np.ndarray]:
    """Brute-force inner-product top k in numpy: (scores, ids), each (q, k), best first; ties to the lower id.
    Streams the corpus in chunks so a million rows never need a (q, n) matrix at once."""
    k = min(k, len(corpus))
    best_s = np.full((len(queries), 0), -np.inf, np.float32)
    best_i = np.zeros((len(queries), 0), np.int64)
    for start in range(0, len(corpus), chunk):
        s = queries @ corpus[start:start + chunk].T
        ids = np.broadcast_to(np.arange(start, start + s.shape[1]), s.shape)
        s, ids = np.concatenate([best_s, s], 1), np.concatenate([best_i, ids], 1)
        order = np.lexsort((ids, -s), axis=1)[:, :k]
        best_s, best_i = np.take_along_axis(s, order, 1), np.take_along_axis(ids, order, 1)
    return best_s, best_i


def recall_at_k(approx_ids: np.ndarray, exact_ids: np.ndarray) -> float:
    """Mean over queries of |approximate top k ∩ exact top k| / k (missing hits, id -1, count as misses)."""
    k = exact_ids.shape[1]
    hits = [len(np.intersect1d(a[a >= 0], e)) for a, e in zip(approx_ids, exact_ids)]
    return float(np.mean(hits) / k) if hits else float("nan")


# ---------------------------------------------------------------------------------------------------------
# FAISS index


@dataclass
class IndexInfo:
    """How an index was built (written as index.json) and how long building took."""

    kind: str  # flat | ivf | hnsw
    vectors: int
    dim: int
    metric: str = "inner_product"  # on L2-normalised vectors: cosine similarity
    params: dict[str, Any] = field(default_factory=dict)
    device: str = "cpu"
    build_seconds: float = 0.0
    faiss_version: str = ""

    @property
    def exact(self) -> bool:
        return self.kind == "flat"


def choose_kind(n: int, cfg: IndexConfig) -> str:
    """The index for `n` vectors: `cfg.kind`, or by size for `auto` (exact up to exact_max, HNSW up to hnsw_max,
    IVF beyond)."""
    if cfg.kind != "auto":
        return cfg.kind
    if n <= cfg.exact_max:
        return "flat"
    return "hnsw" if n <= cfg.hnsw_max else "ivf"


def ivf_nlist(n: int, cfg: IndexConfig) -> int:
    """IVF cells for `n` vectors: `cfg.nlist` or 4 * sqrt(n), at most one per 39 training vectors (faiss's minimum)."""
    nlist = cfg.nlist or round(4 * math.sqrt(n))
    return max(1, min(nlist, min(n, cfg.train_size) // 39))


def faiss_module():
    try:
        import faiss
    except ImportError as err:  # pragma: no cover - faiss-cpu is a dependency
        raise RepeError("retrieval needs FAISS: pip install faiss-cpu (or vlbench[gpu] for faiss-gpu)") from err
    portable.use_portable_faiss(faiss)
    return faiss


def gpu_available(faiss) -> bool:
    return hasattr(faiss, "StandardGpuResources") and faiss.get_num_gpus() > 0


def _on_device(faiss, index, kind: str, device: str):
    """Move a flat or IVF index to GPU 0 when asked (`cuda`) or possible (`auto`); HNSW has no GPU version."""
    if device not in ("auto", "cpu", "cuda"):
        raise RepeError(f"device {device!r} is not one of auto, cpu, cuda")
    if device == "cpu" or kind == "hnsw" or not gpu_available(faiss):
        if device == "cuda" and kind != "hnsw":
            raise RepeError("device cuda asked for, but FAISS has no GPU here (install vlbench[gpu]: faiss-gpu)")
        return index, "cpu"
    return faiss.index_cpu_to_gpu(faiss.StandardGpuResources(), 0, index), "cuda"


def build_index(vectors: np.ndarray, cfg: IndexConfig, device: str = "auto"):
    """(FAISS index over `vectors` (already L2-normalised float32), IndexInfo)."""
    faiss = faiss_module()
    vectors = np.ascontiguousarray(vectors, dtype=np.float32)
    n, d = vectors.shape
    kind = choose_kind(n, cfg)
    start = time.perf_counter()
    if kind == "flat":
        index, params = faiss.IndexFlatIP(d), {}
    elif kind == "hnsw":
        index = faiss.IndexHNSWFlat(d, cfg.hnsw_m, faiss.METRIC_INNER_PRODUCT)
        index.hnsw.efConstruction = cfg.ef_construction
        index.hnsw.efSearch = cfg.ef_search
        params = {"m": cfg.hnsw_m, "ef_construction": cfg.ef_construction, "ef_search": cfg.ef_search}
    else:
        nlist = ivf_nlist(n, cfg)
        index = faiss.IndexIVFFlat(faiss.IndexFlatIP(d), d, nlist, faiss.METRIC_INNER_PRODUCT)
        index.cp.seed = cfg.seed
        index.nprobe = min(cfg.nprobe, nlist)
        sample = min(n, cfg.train_size)
        rows = np.sort(np.random.default_rng(cfg.seed).choice(n, size=sample, replace=False)) if sample < n else slice(None)
        params = {"nlist": nlist, "nprobe": index.nprobe, "train_size": sample, "seed": cfg.seed}
    index, where = _on_device(faiss, index, kind, device)
    if kind == "ivf":
        index.train(vectors[rows])
    index.add(vectors)
    seconds = time.perf_counter() - start
    return index, IndexInfo(kind, n, d, params=params, device=where, build_seconds=seconds,
                            faiss_version=getattr(faiss, "__version__", ""))


def search(index, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray, float]:
    """(scores, ids, seconds): top min(k, index size) per query; an approximate index may return id -1 (no hit)."""
    k = min(k, index.ntotal)
    start = time.perf_counter()
    scores, ids = index.search(np.ascontiguousarray(queries, dtype=np.float32), k)
    return scores, ids.astype(np.int64), time.perf_counter() - start


def save_index(index, path: Path) -> None:
    faiss = faiss_module()
    if hasattr(faiss, "index_gpu_to_cpu") and type(index).__name__.startswith("Gpu"):
        index = faiss.index_gpu_to_cpu(index)
    faiss.write_index(index, str(path))


# ---------------------------------------------------------------------------------------------------------
# Caption filter


def class_words(name: str) -> list[str]:
    """The words of a class name as the authors' code splits them: at spaces and underscores (empty pieces,
    which in their code match every caption, are dropped)."""
    return [w for w in re.split(r"[ _]", name) if w]


def filter_pattern(name: str, mode: str) -> re.Pattern | None:
    """A case-insensitive pattern that a caption must contain to pass for class `name`, or None if nothing can.

    `word`: a word of the class name, or that word + "s"/"es" (regular plurals), between non-word characters, so
    "ray" matches "ray" and "rays" but not "gray"; `exact_word`: the word alone; `substring`: the authors' code
    (`cn.lower() in text.lower()` for any piece of the name: "ray" matches "gray"). In the word modes, pieces
    without a letter or digit ("/" in "baluster / handrail") are not words and are ignored."""
    words = class_words(name)
    if mode == "substring":
        return re.compile("|".join(re.escape(w) for w in words), re.IGNORECASE) if words else None
    if mode not in ("word", "exact_word"):
        raise ParamsError(f"params.yaml: repe.filter {mode!r} is not one of {list(FILTERS)}")
    words = [w for w in words if re.search(r"[^\W_]", w)]
    if not words:
        return None
    plural = "(?:e?s)?" if mode == "word" else ""
    return re.compile(rf"(?<!\w)(?:{'|'.join(re.escape(w) for w in words)}){plural}(?!\w)", re.IGNORECASE)


def caption_passes(name: str, captions: Sequence[str], mode: str = "word") -> np.ndarray:
    """Boolean mask: which captions pass the filter for class `name`."""
    pattern = filter_pattern(name, mode)
    if pattern is None:
        return np.zeros(len(captions), bool)
    return np.fromiter((pattern.search(c) is not None for c in captions), bool, len(captions))


# ---------------------------------------------------------------------------------------------------------
# The corpus and retrieval


@dataclass
class Corpus:
    """A caption corpus: its captions (text features, owner sample_id) and, for image retrieval, its images."""

    name: str
    caption_ids: np.ndarray  # (m,) owner sample id of every caption
    captions: list[str]
    caption_emb: np.ndarray  # (m, d) L2-normalised
    image_ids: np.ndarray | None = None  # (n,) sample ids of the indexed split
    image_emb: np.ndarray | None = None  # (n, d) L2-normalised
    fingerprint: dict[str, Any] = field(default_factory=dict)

    def vectors(self, modality: str) -> np.ndarray:
        if modality == "text":
            return self.caption_emb
        if self.image_emb is None:
            raise RepeError(f"corpus {self.name!r}: image retrieval needs its image features")
        return self.image_emb


@dataclass
class CaptionMap:
    """For each indexed image row, its caption rows (in the text set's order), as sorted runs."""

    order: np.ndarray  # caption rows sorted by image row
    start: np.ndarray  # (n_images,) first position in `order`
    count: np.ndarray  # (n_images,) captions of each image
    unmatched: int  # captions whose sample is not among the indexed images

    def expand(self, image_rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(caption rows, position of their image in `image_rows`), images in the given order."""
        cnt = self.count[image_rows]
        offsets = np.repeat(np.cumsum(cnt) - cnt, cnt)
        within = np.arange(cnt.sum()) - offsets
        return self.order[np.repeat(self.start[image_rows], cnt) + within], np.repeat(np.arange(len(image_rows)), cnt)


def caption_map(image_ids: np.ndarray, caption_ids: np.ndarray) -> CaptionMap:
    sorter = np.argsort(image_ids, kind="stable")
    pos = np.searchsorted(image_ids, caption_ids, sorter=sorter)
    pos = np.minimum(pos, len(image_ids) - 1)
    rows = sorter[pos]
    found = image_ids[rows] == caption_ids
    row_of_caption = np.where(found, rows, len(image_ids))
    order = np.argsort(row_of_caption, kind="stable")[: int(found.sum())]
    count = np.bincount(row_of_caption[found], minlength=len(image_ids))
    return CaptionMap(order, np.cumsum(count) - count, count, int((~found).sum()))


@dataclass
class ClassRetrieval:
    """What retrieval found for one class."""

    caption_rows: np.ndarray  # ranked caption rows (top k hits expanded to captions)
    image_rank: np.ndarray  # rank of the hit each caption came from (0-based)
    scores: np.ndarray  # similarity of that hit to the query
    passed: np.ndarray  # filter mask
    kept: np.ndarray  # the first `keep` that passed

    @property
    def fallback(self) -> bool:
        return not self.kept.any()


def rank_captions(ids: np.ndarray, scores: np.ndarray, modality: str, cmap: CaptionMap | None):
    """(caption rows, hit rank, hit score) of one query's hits, best first; ids of -1 (no hit) dropped."""
    valid = ids >= 0
    ids, scores, ranks = ids[valid], scores[valid], np.flatnonzero(valid)
    if modality == "text":
        return ids, ranks, scores
    rows, hit = cmap.expand(ids)
    return rows, ranks[hit], scores[hit]


def retrieve_classes(corpus: Corpus, class_names: Sequence[str], hits: tuple[np.ndarray, np.ndarray],
                     cfg: RepeConfig, cmap: CaptionMap | None = None) -> list[ClassRetrieval]:
    """Per class: the ranked captions of its top-k hits, the filter mask, and the first `cfg.keep` that pass."""
    scores, ids = hits
    out = []
    for c, name in enumerate(class_names):
        rows, ranks, sims = rank_captions(ids[c], scores[c], cfg.modality, cmap)
        passed = caption_passes(name, [corpus.captions[r] for r in rows], cfg.filter)
        kept = passed & (np.cumsum(passed) <= cfg.keep)
        out.append(ClassRetrieval(rows, ranks, sims, passed, kept))
    return out


# ---------------------------------------------------------------------------------------------------------
# REPE weights


def caption_means(found: Sequence[ClassRetrieval], caption_emb: np.ndarray, fallback: np.ndarray) -> np.ndarray:
    """(C, d): per class, the mean of its kept captions' normalised embeddings (not renormalised, as in the
    authors' code), or the class's row of `fallback` (its normalised query) when no caption passed."""
    caption_emb = l2_normalize(caption_emb)
    out = l2_normalize(fallback).copy()
    for c, r in enumerate(found):
        if not r.fallback:
            out[c] = caption_emb[r.caption_rows[r.kept]].mean(axis=0)
    return out


def mix(prompts: np.ndarray, captions: np.ndarray, shift_lambda: float) -> np.ndarray:
    """normalise((1 - lambda) * normalise(prompt) + lambda * captions), row by row."""
    return l2_normalize((1.0 - shift_lambda) * l2_normalize(prompts) + shift_lambda * np.asarray(captions, np.float32))


def repe_class_weights(prompt_emb: np.ndarray, prompt_class_index: np.ndarray, means: np.ndarray,
                       shift_lambda: float = 0.25) -> np.ndarray:
    """(C, d) REPE class weights: every prompt of class c mixed with `means[c]` (`mix`), then the renormalised
    mean over the class's prompts (a template ensemble: per template, then averaged, as the authors'
    `ZeroshotCLIP2`; one template: just the mixed prompt)."""
    prompt_class_index = np.asarray(prompt_class_index)
    num_classes = len(means)
    missing = sorted(set(range(num_classes)) - set(prompt_class_index.tolist()))
    if missing:
        raise RepeError(f"no prompt embeddings for class indices {missing[:10]}")
    mixed = mix(prompt_emb, means[prompt_class_index], shift_lambda).astype(np.float64)
    sums = np.zeros((num_classes, mixed.shape[1]))
    np.add.at(sums, prompt_class_index, mixed)
    return l2_normalize(sums / np.bincount(prompt_class_index, minlength=num_classes)[:, None])


def ensemble_weights(prompt_emb: np.ndarray, prompt_class_index: np.ndarray, num_classes: int) -> np.ndarray:
    """The plain prompt-ensemble class weights (REPE with lambda 0): the query used when the query text is absent."""
    return repe_class_weights(prompt_emb, prompt_class_index, np.zeros((num_classes, prompt_emb.shape[1]), np.float32), 0.0)


# ---------------------------------------------------------------------------------------------------------
# Queries


def query_embeddings(class_names: Sequence[str], texts: Sequence[Any], cfg: RepeConfig,
                     ensemble: np.ndarray) -> tuple[np.ndarray, list[str]]:
    """(C, d) normalised query embeddings and, per class, where each came from: `text` (the embedding of
    `cfg.query` filled with the class name, found in one of the dataset's embedded class text sets, `texts`: a
    sequence of (table, embeddings)), or `ensemble` (the class's prompt-ensemble weight, when that text was not
    embedded and `query_missing: ensemble`)."""
    lookup: dict[tuple[int, str], np.ndarray] = {}
    for table, emb in texts:
        for i, (c, t) in enumerate(zip(table.column("class_index").to_pylist(), table.column("text").to_pylist())):
            lookup.setdefault((c, t), emb[i])
    out, sources, missing = np.array(ensemble, np.float32, copy=True), [], []
    for c, name in enumerate(class_names):
        found = lookup.get((c, cfg.query.replace("{c}", name)))
        if found is not None:
            out[c] = found
        else:
            missing.append(cfg.query.replace("{c}", name))
        sources.append("text" if found is not None else "ensemble")
    if missing and cfg.query_missing == "error":
        raise RepeError(
            f"repe.query: {len(missing)} class(es) have no embedded query text, e.g. {missing[0]!r}; add "
            f"{cfg.query!r} to the dataset's texts.templates (or a text set with it), or set repe.query_missing: ensemble")
    return l2_normalize(out), sources


# ---------------------------------------------------------------------------------------------------------
# One dataset end to end (arrays in, arrays and tables out)


@dataclass
class RetrievalRun:
    weights: np.ndarray  # (C, d) REPE class weights
    found: list[ClassRetrieval]
    query_sources: list[str]
    index: Any
    info: IndexInfo
    query_seconds: float
    recall: float  # recall@k of the index vs exact search on the sampled queries (1.0 for an exact index)
    recall_queries: int
    k: int


def sample_rows(n: int, size: int, seed: int) -> np.ndarray:
    return np.arange(n) if size >= n else np.sort(np.random.default_rng(seed).choice(n, size, replace=False))


def run_retrieval(corpus: Corpus, class_names: Sequence[str], prompt_emb: np.ndarray, prompt_class_index: np.ndarray,
                  class_texts: Sequence[Any], cfg: RepeConfig, device: str = "auto") -> RetrievalRun:
    """Index the corpus, query it once per class, filter, average and mix: the whole of REPE for one dataset."""
    num_classes = len(class_names)
    ensemble = ensemble_weights(prompt_emb, prompt_class_index, num_classes)
    queries, sources = query_embeddings(class_names, class_texts, cfg, ensemble)
    vectors = corpus.vectors(cfg.modality)
    index, info = build_index(vectors, cfg.index, device)
    scores, ids, seconds = search(index, queries, cfg.top_k)
    cmap = caption_map(corpus.image_ids, corpus.caption_ids) if cfg.modality == "image" else None
    found = retrieve_classes(corpus, class_names, (scores, ids), cfg, cmap)
    recall, sample = 1.0, sample_rows(num_classes, cfg.recall_queries, cfg.index.seed)
    if not info.exact:
        recall = recall_at_k(ids[sample], exact_search(vectors, queries[sample], ids.shape[1])[1])
    means = caption_means(found, corpus.caption_emb, queries)
    weights = repe_class_weights(prompt_emb, prompt_class_index, means, cfg.shift_lambda)
    return RetrievalRun(weights, found, sources, index, info, seconds, recall, len(sample), ids.shape[1])


# ---------------------------------------------------------------------------------------------------------
# Reading inputs and writing outputs (the repe stage)


def retrieval_dir(features_dir: str | Path) -> Path:
    """features/<model>/<dataset>/retrieval: the repe stage's output folder."""
    return Path(features_dir) / "retrieval"


def weights_path(features_dir: str | Path) -> Path:
    """Where the REPE class weights of a dataset live: features/<model>/<dataset>/retrieval/class_weights.parquet."""
    return retrieval_dir(features_dir) / WEIGHTS_FILE


def load_corpus(inputs, cfg: RepeConfig) -> Corpus:
    """The corpus's caption features (and image features for image retrieval), each checked against its
    fingerprint by `inputs` (a `vlbench.analyses.base.Inputs` of the corpus dataset)."""
    if not inputs.has_split(cfg.split) and cfg.modality == "image":
        raise RepeError(f"corpus {cfg.corpus!r} has no split {cfg.split!r} (splits: {sorted(inputs.meta.splits)}); "
                             f"set repe.split")
    texts = inputs.texts(cfg.captions)
    if "sample_id" not in texts.table.column_names:
        raise RepeError(f"corpus {cfg.corpus!r}: text set {cfg.captions!r} is not owned by sample_id "
                             f"(columns {texts.table.column_names}); repe.captions must name its captions")
    corpus = Corpus(cfg.corpus, np.asarray(texts.table.column("sample_id").to_pylist(), dtype=str),
                    texts.table.column("text").to_pylist(), l2_normalize(texts.embeddings),
                    fingerprint={"corpus": cfg.corpus, "corpus_captions": cfg.captions,
                                 "corpus_text_version": texts.fingerprint.get("text_version")})
    if cfg.modality == "image":
        images = inputs.images(cfg.split)
        corpus.image_ids = np.asarray(images.table.column("sample_id").to_pylist(), dtype=str)
        corpus.image_emb = l2_normalize(images.embeddings)
        corpus.fingerprint.update(corpus_split=cfg.split, corpus_dataset_version=images.fingerprint.get("dataset_version"))
    if len(corpus.vectors(cfg.modality)) == 0:
        raise RepeError(f"corpus {cfg.corpus!r}: nothing to index ({cfg.modality} features are empty)")
    return corpus


def class_text_sets(inputs, names: Sequence[str]):
    """(table, embeddings) of every embedded class-owned text set of the dataset, `prompts` first."""
    out = []
    for name in sorted(names, key=lambda n: (n != "prompts", n)):
        feats = inputs.texts(name)
        if "class_index" in feats.table.column_names:
            out.append((feats.table, feats.embeddings))
    return out


def check_prompt_set(dataset: str, name: str, class_sets: Sequence[str]) -> str:
    """`name` (repe.prompts) if it is one of the dataset's class-owned text sets `class_sets`, else an error
    naming the dataset, the set and the param."""
    if name in class_sets:
        return name
    hint = (f"add `prompt_sets: {{{name[len('prompts_'):]}: [...]}}` under `texts` in its entry (conf/dataset/{dataset}.yaml) "
            f"or " if name.startswith("prompts_") else "")
    raise RepeError(f"dataset {dataset!r} has no class text set {name!r} (repe.prompts; its class text sets: "
                         f"{sorted(class_sets)}): {hint}set repe.prompts to one of them")


def template_prompts(feats, dataset: str, name: str, num_classes: int) -> tuple[np.ndarray, np.ndarray]:
    """(embeddings, class_index) of the template rows (`source == "template"`) of the class text set `name`
    (repe.prompts), whose features are `feats`; an error unless every class has at least one."""
    rows = np.array([s == "template" for s in feats.table.column("source").to_pylist()], bool)
    class_index = feats.table.column("class_index").to_numpy()[rows]
    missing = sorted(set(range(num_classes)) - set(class_index.tolist()))
    if missing:
        raise RepeError(f"dataset {dataset!r}, text set {name!r} (repe.prompts): no template prompt for "
                             f"{len(missing)} of {num_classes} classes (class indices {missing[:10]})")
    return feats.embeddings[rows], class_index


def weights_fingerprint(prompts_fingerprint: Mapping[str, Any], corpus: Corpus, cfg: RepeConfig,
                        sources: Sequence[str]) -> dict[str, Any]:
    """The model keys and dataset of the prompts' features, plus what the weights were made from: the prompts'
    text version (and `prompts_set`, the set's name, unless it is the default `prompts`: weights of the default
    stay byte-identical to those made before the param existed), the corpus's versions and the settings;
    `text_version` hashes all of it."""
    settings = {k: v for k, v in cfg.as_dict().items() if k != "prompts"}
    chosen = {} if cfg.prompts == DEFAULT_PROMPTS else {"prompts_set": cfg.prompts}
    made_from = {"prompts_version": prompts_fingerprint.get("text_version"), **chosen, **corpus.fingerprint,
                 "retrieval": settings, "query_sources": sorted(set(sources))}
    version = hashlib.sha256(json.dumps(made_from, sort_keys=True, default=str).encode()).hexdigest()[:16]
    return {**prompts_fingerprint, "text_set": TEXT_SET, "text_version": version, **made_from}


def weights_table(class_names: Sequence[str], run: RetrievalRun):
    import pyarrow as pa

    return pa.table({
        "class_index": pa.array(range(len(class_names)), pa.int64()),
        "name": pa.array(list(class_names), pa.string()),
        "query_source": pa.array(run.query_sources, pa.string()),
        "retrieved": pa.array([len(r.caption_rows) for r in run.found], pa.int64()),
        "passed": pa.array([int(r.passed.sum()) for r in run.found], pa.int64()),
        "kept": pa.array([int(r.kept.sum()) for r in run.found], pa.int64()),
        "fallback": pa.array([r.fallback for r in run.found], pa.bool_()),
        "embedding": embedding_array(run.weights),
    })


def retrieved_table(corpus: Corpus, run: RetrievalRun):
    """One row per retrieved caption per class, in rank order: which hit, which caption, its score, the filter."""
    import pyarrow as pa

    cls = np.concatenate([np.full(len(r.caption_rows), c, np.int64) for c, r in enumerate(run.found)] or [np.zeros(0, np.int64)])
    rows = np.concatenate([r.caption_rows for r in run.found] or [np.zeros(0, np.int64)]).astype(np.int64)

    def cat(attr: str) -> np.ndarray:
        return np.concatenate([getattr(r, attr) for r in run.found] or [np.zeros(0)])

    return pa.table({
        "class_index": pa.array(cls, pa.int64()),
        "hit_rank": pa.array(cat("image_rank"), pa.int64()),
        "score": pa.array(cat("scores"), pa.float32()),
        "sample_id": pa.array(corpus.caption_ids[rows].tolist(), pa.string()),
        "caption_row": pa.array(rows, pa.int64()),
        "caption": pa.array([corpus.captions[r] for r in rows], pa.string()),
        "passed": pa.array(cat("passed"), pa.bool_()),
        "kept": pa.array(cat("kept"), pa.bool_()),
    })


def write_outputs(out_dir: Path, class_names: Sequence[str], corpus: Corpus, run: RetrievalRun,
                  fingerprint: Mapping[str, Any]) -> None:
    """The stage's folder, replaced whole: class_weights.parquet (features-style, fingerprinted), retrieved.parquet,
    index.json (build parameters; an exact index is not saved: rebuilding it is a copy of the corpus features),
    index.faiss for an approximate index."""
    import pyarrow.parquet as pq

    table = weights_table(class_names, run)
    rows = table.drop(["embedding"]).schema
    schema = features_schema(rows, run.weights.shape[1], fingerprint)
    with atomic_dir(out_dir) as tmp:
        pq.write_table(table.cast(schema), tmp / WEIGHTS_FILE)
        pq.write_table(retrieved_table(corpus, run), tmp / RETRIEVED_FILE)
        # no timings here: the folder is zeroshot's dependency and must be byte-identical on a rerun
        info = {**{k: v for k, v in asdict(run.info).items() if k != "build_seconds"}, "saved": not run.info.exact}
        (tmp / INDEX_INFO_FILE).write_text(json.dumps(info, indent=2) + "\n")
        if not run.info.exact:
            save_index(run.index, tmp / INDEX_FILE)


def summary(run: RetrievalRun, cfg: RepeConfig, corpus: Corpus) -> tuple[dict, dict, dict, dict]:
    """(metrics, counts, params) of one run for reports/repe/<dataset>.json, and its timings for
    runs/repe/<dataset>.json (never in the report: it is byte-identical on a rerun)."""
    kept = np.array([r.kept.sum() for r in run.found])
    fallback = int(sum(r.fallback for r in run.found))
    metrics = {f"recall_at_{run.k}": run.recall, "classes_with_captions": float(np.mean(kept > 0)) if len(kept) else 0.0,
               "mean_kept": float(kept.mean()) if len(kept) else 0.0}
    counts = {"classes": len(run.found), "corpus_vectors": run.info.vectors, "corpus_captions": len(corpus.captions),
              "retrieved": int(sum(len(r.caption_rows) for r in run.found)),
              "passed": int(sum(r.passed.sum() for r in run.found)), "kept": int(kept.sum()), "fallback": fallback,
              "query_from_text": run.query_sources.count("text"), "recall_queries": run.recall_queries}
    qps = len(run.found) / run.query_seconds if run.query_seconds > 0 else None
    params = {**cfg.as_dict(), "k": run.k, "index_built": {k: v for k, v in asdict(run.info).items() if k != "build_seconds"}}
    timings = {"index_build_seconds": run.info.build_seconds, "query_seconds": run.query_seconds,
               "queries_per_second": qps}
    return metrics, counts, params, timings


def read_repe_class_weights(features_dir: str | Path, identity: Mapping[str, Any], dataset: str,
                            prompts_version: str | None = None, prompts_set: str | None = None):
    """The REPE class weights of a dataset as `vlbench.features.Features` (table: class_index, name,
    query_source, retrieved, passed, kept, fallback; embeddings (C, d), L2-normalised), refused
    (`StaleFeaturesError`) unless made by the model `identity` names for `dataset` and, when given, from the text
    set `prompts_set` (repe.prompts) of version `prompts_version`."""
    expect = {**identity, "dataset": dataset, "text_set": TEXT_SET, "prompts_version": prompts_version}
    found = read_features(weights_path(features_dir), expect)
    made_from = found.fingerprint.get("prompts_set", DEFAULT_PROMPTS)
    if prompts_set is not None and made_from != prompts_set:
        raise StaleFeaturesError(f"{weights_path(features_dir)}: REPE class weights made from text set {made_from!r}, "
                                 f"expected {prompts_set!r} (repe.prompts); re-run repe@{dataset}")
    return found
