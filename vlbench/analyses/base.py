"""What every analysis receives and returns: fingerprint-checked features in, a result out."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from vlbench.datasets.canonical import DatasetMeta
from vlbench.features import Features, read_features
from vlbench.results import Result  # noqa: F401  (what an analysis returns)
from vlbench.texts import read_text_set


@dataclass
class Inputs:
    """The cached features of one dataset for one model; every read checks the file's fingerprint against
    the model the params name (`identity`), the prepared data's version and the text set's version."""

    meta: DatasetMeta
    identity: Mapping[str, Any]  # vlbench.models.identity.model_identity(params' model)
    features_dir: Path  # features/<model>/<dataset>
    texts_dir: Path  # data/texts/<dataset>
    knowledge_dir: Path | None = None  # data/knowledge/<dataset> (the knowledge stage's sets), where there is one
    skipped: dict[str, list[str]] = field(default_factory=dict)  # split -> sample ids embed left out
    fingerprint: dict[str, Any] = field(default_factory=dict)  # of the first image features read
    decode: str | None = None  # params' embed.decode, which image features must have been decoded with (None: any)

    def has_split(self, split: str) -> bool:
        return split in self.meta.splits

    def image_identity(self) -> dict[str, Any]:
        """What this dataset's image features (projected or not) must have been made with."""
        return {**self.identity, "dataset": self.meta.name, "dataset_version": self.meta.version, "decode": self.decode}

    def images(self, split: str) -> Features:
        found = read_features(self.features_dir / "images" / f"{split}.parquet", self.image_identity())
        self.skipped[split] = found.skipped
        self.fingerprint = self.fingerprint or found.fingerprint
        return found

    def texts(self, text_set: str) -> Features:
        _, stamp = read_text_set(self.texts_dir / f"{text_set}.parquet")
        return read_features(self.features_dir / "text" / f"{text_set}.parquet", {**self.identity, **stamp})

    def knowledge_sets(self) -> list[str]:
        """The knowledge variants embedded for this dataset (features/<model>/<dataset>/knowledge/*.parquet)."""
        return sorted(p.stem for p in (self.features_dir / "knowledge").glob("*.parquet"))

    def knowledge(self, text_set: str) -> Features:
        """A knowledge set's features, for this model and dataset and, where the set itself is in `knowledge_dir`,
        for its current version and stamp (coverage counts included)."""
        expect = {**self.identity, "dataset": self.meta.name, "text_set": text_set}
        source = self.knowledge_dir / f"{text_set}.parquet" if self.knowledge_dir is not None else None
        if source is not None and source.is_file():
            expect.update(read_text_set(source)[1])
        return read_features(self.features_dir / "knowledge" / f"{text_set}.parquet", expect)

    def has_features(self, relative: str) -> bool:
        return (self.features_dir / relative).is_file()

    def precomputed(self, relative: str) -> Features:
        """A features file another stage computed under features/<model>/<dataset>/ (e.g. REPE's class weights), for
        this model and dataset."""
        return read_features(self.features_dir / relative, {**self.identity, "dataset": self.meta.name})
