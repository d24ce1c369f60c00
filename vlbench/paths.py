"""The fixed layout of the pipeline's files: every output folder is built here from a validated name (a dataset key,
a model slug: `check_name`), so a key can never point a stage at a folder it does not own."""

from __future__ import annotations

from pathlib import Path

from vlbench.params import ParamsError, check_name

PREPARED = Path("data/prepared")
TEXTS = Path("data/texts")
KNOWLEDGE = Path("data/knowledge")
LLM_ANSWERS = Path("data/llm")
MODELS = Path("data/models")
FEATURES = Path("features")
REPORTS = Path("reports")


def _inside(path: Path, root: Path = Path(".")) -> Path:
    """`path` if it stays inside `root` once resolved; an error otherwise (no key may escape the project)."""
    if not path.resolve().is_relative_to(root.resolve()):
        raise ParamsError(f"output path {str(path)!r} leaves the project folder {str(root.resolve())!r}")
    return path


def prepared_dir(dataset: str) -> Path:
    return _inside(PREPARED / check_name("dataset", dataset))


def texts_dir(dataset: str) -> Path:
    return _inside(TEXTS / check_name("dataset", dataset))


def knowledge_dir(dataset: str) -> Path:
    """The knowledge stage's text sets (one per knowledge variant), apart from the texts stage's data/texts/<dataset>."""
    return _inside(KNOWLEDGE / check_name("dataset", dataset))


def llm_answers_path(dataset: str) -> Path:
    """The knowledge stage's cache of LLM answers (a persistent DVC output: kept when the stage reruns)."""
    return _inside(LLM_ANSWERS / f"{check_name('dataset', dataset)}.jsonl")


def model_dir(slug: str) -> Path:
    return _inside(MODELS / check_name("model", slug))


def features_dir(model_slug: str, dataset: str) -> Path:
    return _inside(FEATURES / check_name("model", model_slug) / check_name("dataset", dataset))
