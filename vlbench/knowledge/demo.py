"""The demo world's own knowledge files, in the exact upstream formats (ELEVATER external and GPT-3, CuPL, Menon).

The shapes and colours of the synthetic world (`vlbench/datasets/synthetic.py`) have no upstream knowledge files, so
this module writes small ones, deterministically, into `data/demo/` (committed, verified by sha256 through
`data/resources.json` and served to the download layer by a `file://` URL, so the demo goes through the same
fetch + parse path as the real files). Two vocabularies:

- `demo-shapes`: the 22 WordNet concepts of the world (its 12 shapes and their hypernyms), in `CONCEPTS` order;
- `demo-colors`: its 9 colours.

What each file holds:
- `<vocabulary>_knowledge.tsv` (ELEVATER external): `def_wiki` a Wiktionary-style definition written here;
  `def_wn` and `path_wn` from real WordNet 3.0 by the rule ELEVATER's released files follow (measured on its 21
  files, docs/protocols.md): the *first* synset of the class name as spelled (any part of speech; a name with a space
  finds nothing, giving "" for both), its definition, and the chain of first hypernyms (by synset name: NLTK sorted
  them so before 3.9; today's order depends on the hash seed) as first lemma names. By name, not by wnid: "diamond"
  is the gem, "star" the celestial body, "heart" "the locus of feelings", as ELEVATER would have it.
- `GPT3_<vocabulary>.tsv`: five GPT-3-style sentences per class (leading space, as in ELEVATER's files), composed
  from the short descriptions below (`DESCRIPTIONS`: what kind of thing it is and three visual facts).
- `<vocabulary>_prompts_base.json` (CuPL): three "what does it look like" sentences per class, from the same facts.
- `descriptors_<vocabulary>.json` (Menon & Vondrick): the three facts as descriptors.

`python -m vlbench.knowledge.demo` rewrites the files and prints their sha256 (for `data/resources.json`);
`--check` only compares (a test does the same).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

from vlbench.datasets.synthetic import COLORS, CONCEPTS

DEMO_DIR = Path(__file__).parent / "data" / "demo"
VOCABULARIES = {
    "demo-shapes": [name for name, _, _ in CONCEPTS.values()],
    "demo-colors": list(COLORS),
}

# Wiktionary-style definitions (written for the demo; two have two sentences, as many real ones do).
WIKTIONARY = {
    "circle": "A two-dimensional figure whose boundary consists of all the points at the same distance from a centre.",
    "ellipse": "A closed curve with the shape of a flattened circle.",
    "conic section": "Any curve formed by the intersection of a plane with a cone: a circle, ellipse, parabola or "
                     "hyperbola.",
    "plane figure": "A figure lying entirely in a plane, such as a polygon or a circle.",
    "figure": "A shape made of points, lines and curves.",
    "square": "A polygon with four equal sides and four right angles.",
    "regular polygon": "A polygon whose sides are all the same length and whose angles are all equal.",
    "isogon": "A polygon whose angles are all equal.",
    "polygon": "A plane figure bounded by three or more straight line segments.",
    "rectangle": "A quadrilateral with four right angles.",
    "parallelogram": "A quadrilateral whose opposite sides are parallel.",
    "quadrilateral": "A polygon with four sides and four corners.",
    "triangle": "A polygon with three sides and three corners.",
    "diamond": "A rhombus, especially one standing on a corner. The shape of the suit of playing cards of that name.",
    "trapezoid": "A quadrilateral with exactly one pair of parallel sides.",
    "hexagon": "A polygon with six sides and six angles.",
    "star": "A shape with five or more points arranged around a centre, as stars are drawn.",
    "crescent": "The shape of the moon when less than half of it is lit. A figure bounded by two arcs.",
    "curve": "A line that bends continuously, without angles.",
    "line": "A long, thin mark on a surface; in geometry, a path without width.",
    "heart": "A shape with two rounded lobes at the top meeting in a point at the bottom, a symbol of love.",
    "semicircle": "Half of a circle, bounded by an arc and a diameter.",
    "red": "The colour of blood or of a ripe tomato.",
    "orange": "The colour of a ripe orange, between red and yellow.",
    "yellow": "The colour of a lemon or of a ripe banana.",
    "green": "The colour of growing grass and leaves.",
    "cyan": "A greenish-blue colour, one of the primary colours of printing ink.",
    "blue": "The colour of the clear sky or the deep sea.",
    "purple": "A colour between red and blue, like that of grapes.",
    "pink": "A pale red colour, like that of cherry blossoms.",
    "brown": "A dark colour like that of chocolate, wood or soil.",
}

# Simple descriptions: (what kind of thing it is, three visual facts).
DESCRIPTIONS = {
    "circle": ("round plane figure", ("no corners", "one smooth curved edge",
                                      "every edge point at the same distance from its centre")),
    "ellipse": ("oval plane figure", ("no corners", "a smooth curved edge", "a long axis and a short axis")),
    "conic section": ("curve cut from a cone by a plane", ("a smooth curved outline", "no straight sides",
                                                           "the outline of a circle, an ellipse or a parabola")),
    "plane figure": ("flat two-dimensional shape", ("a closed outline", "length and width but no depth",
                                                    "an area enclosed by its edges")),
    "figure": ("shape made of points and lines", ("a visible outline", "lines or curves", "an enclosed area")),
    "square": ("regular four-sided polygon", ("four equal straight sides", "four right angles",
                                             "two diagonals of equal length")),
    "regular polygon": ("polygon with equal sides", ("straight sides of equal length", "equal angles",
                                                     "corners spaced evenly around a centre")),
    "isogon": ("equiangular polygon", ("equal angles at every corner", "straight sides", "corners around a centre")),
    "polygon": ("closed figure with straight sides", ("three or more straight sides", "sharp corners",
                                                      "a closed outline")),
    "rectangle": ("four-sided polygon with right angles", ("four right angles", "two pairs of parallel sides",
                                                           "opposite sides of equal length")),
    "parallelogram": ("slanted four-sided polygon", ("two pairs of parallel sides", "equal opposite angles",
                                                     "four straight sides")),
    "quadrilateral": ("four-sided polygon", ("four straight sides", "four corners",
                                             "angles that add up to 360 degrees")),
    "triangle": ("three-sided polygon", ("three straight sides", "three corners", "angles that add up to 180 degrees")),
    "diamond": ("four-sided polygon with equal sides", ("four equal straight sides",
                                                        "two sharp corners and two wide corners",
                                                        "a square outline tilted on its corner")),
    "trapezoid": ("four-sided polygon", ("one pair of parallel sides", "a wide base and a narrower top",
                                         "four straight sides")),
    "hexagon": ("six-sided polygon", ("six straight sides", "six corners", "the outline of a honeycomb cell")),
    "star": ("pointed plane figure", ("five sharp points", "ten straight edges", "points spread evenly around a centre")),
    "crescent": ("curved plane figure", ("the outline of a thin moon", "two pointed tips",
                                         "one convex and one concave edge")),
    "curve": ("bent line", ("no straight segment", "a smoothly changing direction", "a flowing outline")),
    "line": ("long thin mark", ("length without width", "a straight or curved path", "two ends")),
    "heart": ("rounded plane figure", ("two rounded lobes at the top", "a point at the bottom",
                                       "the outline of a love symbol")),
    "semicircle": ("half of a circle", ("one straight edge", "one curved edge", "two corners where the edges meet")),
    "red": ("warm colour", ("the hue of ripe tomatoes", "the hue of blood", "the hue of a stop sign")),
    "orange": ("warm colour", ("the hue of ripe oranges", "the hue of a carrot", "the hue of a pumpkin")),
    "yellow": ("warm colour", ("the hue of a lemon", "the hue of a ripe banana", "the hue of sunflowers")),
    "green": ("cool colour", ("the hue of fresh grass", "the hue of leaves in summer", "the hue of a lime")),
    "cyan": ("cool colour", ("the hue of turquoise water", "the hue of a clear swimming pool",
                             "the hue of cyan printing ink")),
    "blue": ("cool colour", ("the hue of a clear sky", "the hue of the deep sea", "the hue of sapphires")),
    "purple": ("cool colour", ("the hue of grapes", "the hue of lavender flowers", "the hue of an amethyst")),
    "pink": ("warm colour", ("the hue of cherry blossoms", "the hue of bubble gum", "the hue of flamingos")),
    "brown": ("warm colour", ("the hue of chocolate", "the hue of tree bark", "the hue of coffee beans")),
}


def _subject(vocabulary: str, name: str) -> str:
    """How a sentence names the class: "A hexagon", "Red"."""
    return name.capitalize() if vocabulary == "demo-colors" else f"{'An' if name[0] in 'aeiou' else 'A'} {name}"


def gpt3_items(vocabulary: str, name: str) -> list[str]:
    kind, (f0, f1, f2) = DESCRIPTIONS[name]
    article = "An" if kind[0] in "aeiou" else "A"
    return [f" {article} {kind} with {f0}.", f" {article} {kind} that has {f1}.", f" It has {f2}.",
            f" {_subject(vocabulary, name)} is {article.lower()} {kind}.", f" {article} {kind} with {f0}, {f1} and {f2}."]


def cupl_sentences(vocabulary: str, name: str) -> list[str]:
    kind, (f0, f1, f2) = DESCRIPTIONS[name]
    subject = _subject(vocabulary, name)
    article = "an" if kind[0] in "aeiou" else "a"
    return [f"{subject} looks like {article} {kind} with {f0}.", f"{subject} has {f1} and {f2}.",
            f"{subject} is {article} {kind} that you can recognise by {f2}."]


def elevater_wordnet(wn, name: str) -> tuple[str, list[str] | str]:
    """(def_wn, path_wn) by the rule of ELEVATER's released files: the name's first synset as spelled (any part of
    speech), its definition, and its chain of first hypernyms (the smallest synset name) as first lemma names; ("", "")
    when there is none. On ELEVATER's 21 files this gives every def_wn and 2,093 of the 2,151 path_wn exactly."""
    synsets = wn.synsets(name)
    if not synsets:
        return "", ""
    synset, path = synsets[0], []
    while True:
        path.append(synset.lemma_names()[0])
        if not synset.hypernyms():
            return synsets[0].definition(), path
        synset = min(synset.hypernyms(), key=lambda s: s.name())  # NLTK's first when it sorted them by name


def records(vocabulary: str, wn) -> dict[str, object]:
    """{file name: JSON data} of one demo vocabulary."""
    names = VOCABULARIES[vocabulary]
    external = []
    for name in names:
        def_wn, path_wn = elevater_wordnet(wn, name)
        external.append({"classname": name, "def_wiki": WIKTIONARY[name], "path_wn": path_wn, "def_wn": def_wn})
    return {
        f"{vocabulary}_knowledge.tsv": external,
        f"GPT3_{vocabulary}.tsv": [{"classname": n, "gpt3": gpt3_items(vocabulary, n)} for n in names],
        f"{vocabulary}_prompts_base.json": {n: cupl_sentences(vocabulary, n) for n in names},
        f"descriptors_{vocabulary}.json": {n: list(DESCRIPTIONS[n][1]) for n in names},
    }


def render(wn=None) -> dict[str, bytes]:
    """{file name: bytes} of every demo file (JSON as Python's json.dumps writes it, like the upstream files)."""
    from vlbench.wordnet import load_wordnet

    wn = wn if wn is not None else load_wordnet()
    return {name: json.dumps(data).encode() for vocabulary in VOCABULARIES
            for name, data in records(vocabulary, wn).items()}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Write (or --check) the demo world's knowledge files")
    p.add_argument("--check", action="store_true", help="only compare the committed files with a fresh rendering")
    args = p.parse_args(argv)
    rendered, stale = render(), []
    for name, data in rendered.items():
        path = DEMO_DIR / name
        if args.check:
            stale += [name] if not path.is_file() or path.read_bytes() != data else []
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        print(f'"{name}": "{hashlib.sha256(data).hexdigest()}",')
    if stale:
        print(f"stale demo knowledge files: {', '.join(stale)}", file=sys.stderr)
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
