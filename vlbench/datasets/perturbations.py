"""ARO's word-order perturbations (Yuksekgonul et al., "When and why vision-language models behave like bags-of-words",
ICLR 2023; mertyg/vision-language-models-are-bows, dataset_zoo/perturbations.py `TextShuffler` and
dataset_zoo/retrieval.py `pre_caption`), reimplemented and seeded.

COCO-Order and Flickr-Order give each caption four negatives, in this order (`PERTURBATIONS`):
1. `shuffle_nouns_and_adj`: the nouns (Penn tags NN, NNS, NNP, NNPS) permuted among themselves, then the adjectives
   (JJ, JJR, JJS) among themselves; tokens and tags from spaCy's `en_core_web_sm`, joined by single spaces;
2. `shuffle_allbut_nouns_and_adj`: every other token permuted, nouns and adjectives left in place;
3. `shuffle_within_trigrams`: NLTK word tokens cut into consecutive trigrams (the last may be shorter), each trigram's
   tokens permuted;
4. `shuffle_trigrams`: the trigrams themselves permuted.
Every option (the true caption too) then goes through BLIP's `pre_caption` (lower case, `.!"()*#:;~` to spaces,
runs of white space to one, stripped, at most `max_words` words; ARO: 30).

Differences from the authors' code (docs/protocols.md, "Compositionality"): their shuffles draw from numpy's and
Python's global generators unseeded; here each caption has its own generator, `default_rng([seed, crc32(key)])`, drawn
in the order above, so the texts are reproducible. NLTK's `word_tokenize` first splits sentences with the Punkt model
(downloaded data); here the same Treebank-style word tokenizer (`NLTKWordTokenizer`) runs on the whole caption, which
needs no data and differs only for captions of several sentences.
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Callable, Sequence

import numpy as np

from vlbench.datasets.canonical import DatasetError

NOUN_TAGS = ("NN", "NNS", "NNP", "NNPS")
ADJ_TAGS = ("JJ", "JJR", "JJS")
PERTURBATIONS = ("shuffle_nouns_and_adj", "shuffle_allbut_nouns_and_adj", "shuffle_within_trigrams",
                 "shuffle_trigrams")


def pre_caption(caption: str, max_words: int = 50) -> str:
    """BLIP's caption normalisation (dataset_zoo/retrieval.py)."""
    caption = re.sub(r"([.!\"()*#:;~])", " ", caption.lower())
    caption = re.sub(r"\s{2,}", " ", caption).rstrip("\n").strip(" ")
    words = caption.split(" ")
    return " ".join(words[:max_words]) if len(words) > max_words else caption


def _permute_at(tokens: list[str], positions: Sequence[int], rng: np.random.Generator) -> None:
    values = [tokens[i] for i in positions]
    for i, j in zip(positions, rng.permutation(len(values))):
        tokens[i] = values[j]


def shuffle_nouns_and_adj(tokens: Sequence[str], tags: Sequence[str], rng: np.random.Generator) -> str:
    out = list(tokens)
    _permute_at(out, [i for i, t in enumerate(tags) if t in NOUN_TAGS], rng)
    _permute_at(out, [i for i, t in enumerate(tags) if t in ADJ_TAGS], rng)
    return " ".join(out)


def shuffle_allbut_nouns_and_adj(tokens: Sequence[str], tags: Sequence[str], rng: np.random.Generator) -> str:
    out = list(tokens)
    _permute_at(out, [i for i, t in enumerate(tags) if t not in NOUN_TAGS + ADJ_TAGS], rng)
    return " ".join(out)


def trigrams(tokens: Sequence[str]) -> list[list[str]]:
    """Consecutive groups of three tokens, the last one shorter when the count is not a multiple of three."""
    return [list(tokens[i:i + 3]) for i in range(0, len(tokens), 3)]


def shuffle_within_trigrams(tokens: Sequence[str], rng: np.random.Generator) -> str:
    return " ".join(" ".join(g[j] for j in rng.permutation(len(g))) for g in trigrams(tokens))


def shuffle_trigrams(tokens: Sequence[str], rng: np.random.Generator) -> str:
    groups = trigrams(tokens)
    return " ".join(" ".join(groups[j]) for j in rng.permutation(len(groups)))


def caption_rng(seed: int, key: str) -> np.random.Generator:
    return np.random.default_rng([seed, zlib.crc32(key.encode())])


def perturb(caption: str, tagged: tuple[list[str], list[str]], words: list[str], rng: np.random.Generator
            ) -> list[str]:
    """The four perturbations of `caption` (not normalised): `tagged` its spaCy (tokens, tags), `words` its NLTK
    tokens."""
    tokens, tags = tagged
    return [shuffle_nouns_and_adj(tokens, tags, rng), shuffle_allbut_nouns_and_adj(tokens, tags, rng),
            shuffle_within_trigrams(words, rng), shuffle_trigrams(words, rng)]


def load_tagger(pipeline: str) -> Callable[[str], tuple[list[str], list[str]]]:
    """(tokens, Penn tags) of a text by an installed trained spaCy pipeline (ARO: en_core_web_sm)."""
    import spacy
    import spacy.util

    if pipeline not in spacy.util.get_installed_models():
        raise DatasetError(f"ARO's order perturbations need spaCy's trained pipeline {pipeline!r} for part-of-speech "
                           f"tags (as ARO uses it); it is not installed: pip install it from "
                           f"https://github.com/explosion/spacy-models/releases (vlbench never downloads one)")
    nlp = spacy.load(pipeline, exclude=["parser", "ner", "lemmatizer"])

    def tag(text: str) -> tuple[list[str], list[str]]:
        doc = nlp(text)
        return [t.text for t in doc], [t.tag_ for t in doc]

    return tag


class Perturber:
    """A caption's options for ARO's order benchmarks: itself and its four perturbations, all `pre_caption`ed."""

    def __init__(self, pipeline: str, seed: int, max_words: int = 30):
        from nltk.tokenize import NLTKWordTokenizer

        self.tag = load_tagger(pipeline)
        self.words = NLTKWordTokenizer().tokenize
        self.seed, self.max_words = seed, max_words

    def options(self, caption: str, key: str) -> list[str]:
        rng = caption_rng(self.seed, key)
        texts = [caption] + perturb(caption, self.tag(caption), self.words(caption), rng)
        return [pre_caption(t, self.max_words) for t in texts]
