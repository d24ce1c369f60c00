"""The offline demo world: procedurally generated images of coloured shapes, with captions.

Every image holds one or more objects; each object has a shape (a WordNet noun.shape synset), a colour,
a size (small/large) and a position (a cell of a 3x3 grid), drawn on a noisy, tinted, dark or light
background. Captions come from a small grammar with varying specificity ("a circle", "a red circle",
"a small red circle on the left", "two blue stars and a green square") and sometimes name a WordNet
hypernym instead of the shape ("a red polygon", "a plane figure").

`build(name, spec, out_dir)` writes one dataset in the canonical format for one task of
`TASKS`; everything is deterministic in `(seed, task, split)`, and each split has its own random stream.
The WordNet facts (wnids, hypernyms) are tables here, checked against WordNet by the tests, so building
needs no WordNet.
"""

from __future__ import annotations

import io
import math
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
from PIL import Image, ImageDraw

import vlbench
from vlbench.datasets.canonical import (
    PREPROCESS,
    ClassInfo,
    DatasetError,
    DatasetMeta,
    write_dataset,
)
from vlbench.datasets.spec import check_keys

GENERATOR = "vlbench.datasets.synthetic"
SUPERSAMPLE = 4  # shapes are drawn at 4x and box-filtered down: anti-aliased edges


@dataclass(frozen=True)
class Shape:
    name: str  # the word used in captions and class names
    wnid: str
    synset: str  # NLTK name, for checking against WordNet


SHAPES = (
    Shape("circle", "n13873502", "circle.n.01"),
    Shape("ellipse", "n13878306", "ellipse.n.01"),
    Shape("square", "n13878634", "square.n.01"),
    Shape("rectangle", "n13883346", "rectangle.n.01"),
    Shape("triangle", "n13879320", "triangle.n.01"),
    Shape("diamond", "n13882961", "rhombus.n.01"),
    Shape("trapezoid", "n13881512", "trapezoid.n.01"),
    Shape("hexagon", "n13882276", "hexagon.n.01"),
    Shape("star", "n13881644", "star.n.05"),
    Shape("crescent", "n13896217", "crescent.n.01"),
    Shape("heart", "n13865904", "heart.n.07"),
    Shape("semicircle", "n13874251", "semicircle.n.01"),
)

ALIASES = {"diamond": ("rhombus",), "ellipse": ("oval",)}  # WordNet synonyms of the class names

# WordNet 3.0 hypernyms of the shapes, below the root shape.n.02 (excluded: every image would have it).
# synset -> (name, wnid, parents)
HIERARCHY_ROOT = "shape.n.02"
CONCEPTS = {
    "circle.n.01": ("circle", "n13873502", ("ellipse.n.01",)),
    "ellipse.n.01": ("ellipse", "n13878306", ("conic_section.n.01",)),
    "conic_section.n.01": ("conic section", "n13872975", ("plane_figure.n.01",)),
    "plane_figure.n.01": ("plane figure", "n13863186", ("figure.n.06",)),
    "figure.n.06": ("figure", "n13862780", ()),
    "square.n.01": ("square", "n13878634", ("regular_polygon.n.01", "rectangle.n.01")),
    "regular_polygon.n.01": ("regular polygon", "n13867133", ("isogon.n.01",)),
    "isogon.n.01": ("isogon", "n13866515", ("polygon.n.01",)),
    "polygon.n.01": ("polygon", "n13866144", ("plane_figure.n.01",)),
    "rectangle.n.01": ("rectangle", "n13883346", ("parallelogram.n.01",)),
    "parallelogram.n.01": ("parallelogram", "n13881175", ("quadrilateral.n.01",)),
    "quadrilateral.n.01": ("quadrilateral", "n13879126", ("polygon.n.01",)),
    "triangle.n.01": ("triangle", "n13879320", ("polygon.n.01",)),
    "rhombus.n.01": ("diamond", "n13882961", ("parallelogram.n.01",)),
    "trapezoid.n.01": ("trapezoid", "n13881512", ("quadrilateral.n.01",)),
    "hexagon.n.01": ("hexagon", "n13882276", ("polygon.n.01",)),
    "star.n.05": ("star", "n13881644", ("plane_figure.n.01",)),
    "crescent.n.01": ("crescent", "n13896217", ("curve.n.01",)),
    "curve.n.01": ("curve", "n13867641", ("line.n.04",)),
    "line.n.04": ("line", "n13863771", ()),
    "heart.n.07": ("heart", "n13865904", ("plane_figure.n.01",)),
    "semicircle.n.01": ("semicircle", "n13874251", ("plane_figure.n.01",)),
}
# Hypernyms natural enough to stand for a shape in a caption ("a red polygon", "a plane figure").
CAPTION_HYPERNYMS = ("polygon.n.01", "quadrilateral.n.01", "parallelogram.n.01", "curve.n.01", "plane_figure.n.01")

COLORS = {
    "red": (220, 30, 30),
    "orange": (245, 135, 15),
    "yellow": (240, 225, 30),
    "green": (30, 165, 50),
    "cyan": (30, 205, 215),
    "blue": (35, 65, 225),
    "purple": (135, 45, 190),
    "pink": (250, 125, 190),
    "brown": (135, 80, 30),
}
SIZES = {"small": 0.16, "large": 0.24}  # object radius as a fraction of the image side
# 3x3 grid, row-major; each name with the phrase captions use for it.
POSITIONS = {
    "top left": "in the top left corner", "top": "at the top", "top right": "in the top right corner",
    "left": "on the left", "center": "in the center", "right": "on the right",
    "bottom left": "in the bottom left corner", "bottom": "at the bottom",
    "bottom right": "in the bottom right corner",
}
CELL_CENTERS = (0.22, 0.5, 0.78)  # fractions of the image side, for grid rows and columns
NUMBERS = ("zero", "one", "two", "three", "four")
MAX_COUNT = 4
PREFIXES = ("a picture of", "a drawing of", "an image of", "a photo of")

TASKS = ("shapes", "colors", "shape_color", "count", "position", "hierarchy", "captions", "corpus", "shapes_outline")
# How a task draws its shapes: filled (every task but these) or as outlines of this width in pixels of the final image;
# shapes_outline is the demo's distribution shift (suite demo's robustness analysis): the shapes task drawn as line art
OUTLINE_WIDTH = {"shapes_outline": 1.5}
SPEC_DEFAULTS = {"seed": 0, "image_size": 32}
SPEC_KEYS = ("source", "task", "seed", "image_size", "splits", "preprocess")

OBJECT_TYPE = pa.struct([("shape", pa.string()), ("color", pa.string()), ("size", pa.string()),
                         ("position", pa.string())])
METADATA_COLUMNS = {
    "shape": pa.string(), "color": pa.string(), "size": pa.string(), "position": pa.string(),
    "count": pa.int64(), "objects": pa.list_(OBJECT_TYPE),
}


@dataclass(frozen=True)
class Obj:
    shape: str
    color: str
    size: str
    position: str

    def to_row(self) -> dict:
        return {"shape": self.shape, "color": self.color, "size": self.size, "position": self.position}


# ---------------------------------------------------------------------------------------------------------
# WordNet tables


def shape_names() -> list[str]:
    return [s.name for s in SHAPES]


def _synset_of(shape: str) -> str:
    return next(s.synset for s in SHAPES if s.name == shape)


def ancestors(synset: str) -> list[str]:
    """Hypernyms of `synset` in CONCEPTS (not itself), nearest first, each once."""
    order: list[str] = []
    frontier = list(CONCEPTS[synset][2])
    while frontier:
        current = frontier.pop(0)
        if current not in order:
            order.append(current)
            frontier.extend(CONCEPTS[current][2])
    return order


def hierarchy_synsets() -> list[str]:
    """The hierarchy task's classes: every shape, then each of their ancestors, in first-seen order."""
    order = [s.synset for s in SHAPES]
    for s in SHAPES:
        order += [a for a in ancestors(s.synset) if a not in order]
    return order


# ---------------------------------------------------------------------------------------------------------
# Drawing


def _regular(n: int, phase: float = -math.pi / 2) -> np.ndarray:
    t = phase + np.arange(n) * 2 * math.pi / n
    return np.stack([np.cos(t), np.sin(t)], axis=1)


def _star(points: int = 5, inner: float = 0.42) -> np.ndarray:
    t = -math.pi / 2 + np.arange(2 * points) * math.pi / points
    r = np.where(np.arange(2 * points) % 2 == 0, 1.0, inner)
    return np.stack([r * np.cos(t), r * np.sin(t)], axis=1)


def _heart() -> np.ndarray:
    t = np.linspace(0, 2 * math.pi, 48, endpoint=False)
    x = 16 * np.sin(t) ** 3
    y = -(13 * np.cos(t) - 5 * np.cos(2 * t) - 2 * np.cos(3 * t) - np.cos(4 * t))
    pts = np.stack([x, y + 2.5], axis=1)
    return pts


def _semicircle() -> np.ndarray:
    t = np.linspace(math.pi, 2 * math.pi, 25)
    return np.stack([np.cos(t), np.sin(t) + 0.45], axis=1)


def _unit(pts: np.ndarray) -> np.ndarray:
    return pts / np.abs(pts).max()


_CIRCLE = _regular(40)
# Each shape is a list of (outline, fill): fill 0 cuts out (the crescent's bite). Outlines fit in [-1, 1]^2.
OUTLINES: dict[str, list[tuple[np.ndarray, int]]] = {
    "circle": [(_CIRCLE, 255)],
    "ellipse": [(_CIRCLE * [1.0, 0.55], 255)],
    "square": [(np.array([[-1, -1], [1, -1], [1, 1], [-1, 1]]) * 0.8, 255)],
    "rectangle": [(np.array([[-1, -0.55], [1, -0.55], [1, 0.55], [-1, 0.55]]), 255)],
    "triangle": [(_regular(3) + [0, 0.2], 255)],
    "diamond": [(np.array([[0, -1], [0.62, 0], [0, 1], [-0.62, 0]]), 255)],
    "trapezoid": [(np.array([[-1, 0.6], [1, 0.6], [0.45, -0.6], [-0.45, -0.6]]), 255)],
    "hexagon": [(_regular(6, 0.0), 255)],
    "star": [(_star(), 255)],
    "crescent": [(_CIRCLE, 255), (_CIRCLE * 0.82 + [0.5, -0.12], 0)],
    "heart": [(_unit(_heart()), 255)],
    "semicircle": [(_semicircle(), 255)],
}
# Rotation freedom per shape: (base angles to choose from, jitter), in degrees.
ROTATIONS = {
    "circle": ((0,), 0), "ellipse": ((0, 90), 12), "square": ((0,), 12), "rectangle": ((0, 90), 12),
    "triangle": ((0,), 12), "diamond": ((0,), 12), "trapezoid": ((0,), 12), "hexagon": ((0,), 30),
    "star": ((0,), 20), "crescent": ((0, 180), 25), "heart": ((0,), 12), "semicircle": ((0,), 12),
}


def _background(rng: np.random.Generator, size: int) -> np.ndarray:
    """A tinted dark or light background with a soft gradient (float32, HxWx3)."""
    level = rng.uniform(15, 75) if rng.random() < 0.5 else rng.uniform(170, 235)
    tint = rng.uniform(-25, 25, size=3)
    angle = rng.uniform(0, 2 * math.pi)
    ramp = np.linspace(-1, 1, size, dtype=np.float32)
    grad = (np.cos(angle) * ramp[None, :] + np.sin(angle) * ramp[:, None]) * rng.uniform(0, 18)
    return (level + tint[None, None, :] + grad[:, :, None]).astype(np.float32)


def _mask(rng: np.random.Generator, obj: Obj, center: tuple[float, float], image_size: int,
          line_width: float | None = None) -> np.ndarray:
    k = SUPERSAMPLE
    big = image_size * k
    radius = SIZES[obj.size] * big * rng.uniform(0.9, 1.1)
    bases, jitter = ROTATIONS[obj.shape]
    angle = math.radians(bases[rng.integers(len(bases))] + rng.uniform(-jitter, jitter))
    rot = np.array([[math.cos(angle), -math.sin(angle)], [math.sin(angle), math.cos(angle)]])
    cx, cy = center[0] * big, center[1] * big
    canvas = Image.new("L", (big, big), 0)
    draw = ImageDraw.Draw(canvas)
    for outline, fill in OUTLINES[obj.shape]:
        pts = outline @ rot.T * radius + [cx, cy]
        points = [tuple(p) for p in pts.tolist()]
        if line_width is None:
            draw.polygon(points, fill=fill)
        elif fill:
            draw.line(points + points[:1], fill=255, width=max(1, round(line_width * k)), joint="curve")
    return np.asarray(canvas.reduce(k), dtype=np.float32) / 255.0


def render(rng: np.random.Generator, objects: list[Obj], image_size: int, jitter: float = 0.02,
           line_width: float | None = None) -> bytes:
    """Draw `objects` on a random background, filled or (`line_width`: in pixels) as outlines; return PNG
    bytes (deterministic given the rng state)."""
    image = _background(rng, image_size)
    names = list(POSITIONS)
    for obj in objects:
        row, col = divmod(names.index(obj.position), 3)
        center = (CELL_CENTERS[col] + rng.uniform(-jitter, jitter), CELL_CENTERS[row] + rng.uniform(-jitter, jitter))
        alpha = _mask(rng, obj, center, image_size, line_width)[:, :, None]
        color = np.asarray(COLORS[obj.color], dtype=np.float32) + rng.uniform(-12, 12, size=3)
        image = image * (1 - alpha) + color * alpha
    image += rng.normal(0, rng.uniform(2, 9), size=image.shape)
    pixels = np.clip(np.rint(image), 0, 255).astype(np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels, "RGB").save(buffer, format="PNG")
    return buffer.getvalue()


# ---------------------------------------------------------------------------------------------------------
# Captions


def article(word: str) -> str:
    return "an" if word[0] in "aeiou" else "a"


def group_phrase(count: int, noun: str, color: str | None = None, size: str | None = None,
                 position: str | None = None, use_one: bool = False) -> str:
    """`count` objects alike: "a circle", "two blue stars", "a small red circle on the left"."""
    words = [w for w in (size, color) if w] + [noun if count == 1 else noun + "s"]
    det = ("one" if use_one else article(words[0])) if count == 1 else NUMBERS[count]
    phrase = " ".join([det] + words)
    return f"{phrase} {POSITIONS[position]}" if position else phrase


def join_phrases(phrases: list[str]) -> str:
    return phrases[0] if len(phrases) == 1 else ", ".join(phrases[:-1]) + " and " + phrases[-1]


def _groups(objects: list[Obj]) -> list[list[Obj]]:
    """Objects grouped by (shape, colour), in order of first appearance."""
    groups: dict[tuple[str, str], list[Obj]] = {}
    for obj in objects:
        groups.setdefault((obj.shape, obj.color), []).append(obj)
    return list(groups.values())


def caption(objects: list[Obj], level: int, nouns: dict[str, str] | None = None, use_one: bool = False) -> str:
    """Describe a scene at specificity `level`: 0 shape, 1 + colour, 2 + size, 3 + position.

    Sizes are named only when all objects of a group share one; positions only for single objects.
    `nouns` replaces shape names (with hypernyms).
    """
    phrases = []
    for group in _groups(objects):
        first = group[0]
        sizes = {o.size for o in group}
        phrases.append(group_phrase(
            len(group), (nouns or {}).get(first.shape, first.shape),
            color=first.color if level >= 1 else None,
            size=first.size if level >= 2 and len(sizes) == 1 else None,
            position=first.position if level >= 3 and len(group) == 1 else None,
            use_one=use_one,
        ))
    return join_phrases(phrases)


def hypernym_noun(rng: np.random.Generator, shape: str) -> str:
    options = [a for a in ancestors(_synset_of(shape)) if a in CAPTION_HYPERNYMS]
    return CONCEPTS[options[rng.integers(len(options))]][0]


def caption_levels(rng: np.random.Generator, objects: list[Obj]) -> list[str]:
    """True captions at every specificity level, plus one that names a hypernym of the first shape."""
    texts = [caption(objects, level) for level in range(4)]
    nouns = {objects[0].shape: hypernym_noun(rng, objects[0].shape)}
    texts.append(caption(objects, int(rng.integers(2)), nouns=nouns))
    return list(dict.fromkeys(texts))


def corpus_caption(rng: np.random.Generator, objects: list[Obj]) -> str:
    """One caption; names the colour and shape most of the time, sometimes a hypernym or a prefix."""
    level = int(rng.choice(4, p=[0.1, 0.4, 0.2, 0.3]))
    nouns = {o.shape: hypernym_noun(rng, o.shape) for o in objects if rng.random() < 0.1}
    text = caption(objects, level, nouns=nouns, use_one=rng.random() < 0.2)
    if rng.random() < 0.3:
        text = f"{PREFIXES[rng.integers(len(PREFIXES))]} {text}"
    return text


# ---------------------------------------------------------------------------------------------------------
# Scenes


def _pick(rng: np.random.Generator, options) -> Any:
    options = list(options)
    return options[rng.integers(len(options))]


def _cells(rng: np.random.Generator, n: int) -> list[str]:
    names = list(POSITIONS)
    return [names[i] for i in rng.choice(len(names), size=n, replace=False)]


def single_object(rng: np.random.Generator) -> list[Obj]:
    return [Obj(_pick(rng, shape_names()), _pick(rng, COLORS), _pick(rng, SIZES), _pick(rng, POSITIONS))]


def counted_objects(rng: np.random.Generator, count: int) -> list[Obj]:
    """`count` small objects of one shape and colour in distinct cells."""
    shape, color = _pick(rng, shape_names()), _pick(rng, COLORS)
    return [Obj(shape, color, "small", cell) for cell in _cells(rng, count)]


def mixed_objects(rng: np.random.Generator, counts: tuple[int, ...]) -> list[Obj]:
    """Groups of small objects; groups differ in shape, cells are distinct."""
    shapes = [shape_names()[i] for i in rng.choice(len(SHAPES), size=len(counts), replace=False)]
    cells = iter(_cells(rng, sum(counts)))
    objects = []
    for shape, n in zip(shapes, counts):
        color = _pick(rng, COLORS)
        objects += [Obj(shape, color, "small", next(cells)) for _ in range(n)]
    return objects


def caption_scene(rng: np.random.Generator) -> list[Obj]:
    """The scene mix of the caption tasks: mostly single objects, some counts, some mixtures."""
    u = rng.random()
    if u < 0.55:
        return single_object(rng)
    if u < 0.8:
        return counted_objects(rng, int(rng.integers(2, MAX_COUNT + 1)))
    return mixed_objects(rng, (int(rng.integers(1, 3)), int(rng.integers(1, 3))))


# ---------------------------------------------------------------------------------------------------------
# Tasks: each gives the classes and a function from (rng, index) to a row's label and extra fields.


def _classes(task: str) -> list[ClassInfo]:
    if task in ("shapes", "captions", "corpus", "shapes_outline"):
        return [ClassInfo(i, s.name, wnid=s.wnid, aliases=list(ALIASES.get(s.name, ()))) for i, s in enumerate(SHAPES)]
    if task == "colors":
        return [ClassInfo(i, c) for i, c in enumerate(COLORS)]
    if task == "shape_color":
        pairs = [(c, s) for s in SHAPES for c in COLORS]
        return [ClassInfo(i, f"{c} {s.name}", group=s.name) for i, (c, s) in enumerate(pairs)]
    if task == "count":
        return [ClassInfo(i, NUMBERS[i + 1]) for i in range(MAX_COUNT)]
    if task == "position":
        return [ClassInfo(i, p) for i, p in enumerate(POSITIONS)]
    if task == "hierarchy":
        leaves = {s.synset for s in SHAPES}
        return [ClassInfo(i, CONCEPTS[s][0], wnid=CONCEPTS[s][1], group="shape" if s in leaves else "hypernym",
                          aliases=list(ALIASES.get(CONCEPTS[s][0], ()))) for i, s in enumerate(hierarchy_synsets())]
    raise AssertionError(task)


def _sample(task: str, rng: np.random.Generator, classes: list[ClassInfo]) -> tuple[list[Obj], dict]:
    """A scene for `task` and its label fields."""
    index = {c.name: c.index for c in classes}
    if task in ("shapes", "colors", "shape_color", "position", "shapes_outline"):
        objects = single_object(rng)
        o = objects[0]
        key = {"shapes": o.shape, "shapes_outline": o.shape, "colors": o.color, "shape_color": f"{o.color} {o.shape}", "position": o.position}[task]
        return objects, {"label": index[key]}
    if task == "count":
        objects = counted_objects(rng, int(rng.integers(1, MAX_COUNT + 1)))
        return objects, {"label": len(objects) - 1}
    if task == "hierarchy":
        objects = single_object(rng) if rng.random() < 0.5 else mixed_objects(rng, (1, 1))
        synsets = {s.name: s.synset for s in SHAPES}
        order = hierarchy_synsets()
        labels = set()
        for o in objects:
            labels.update(order.index(s) for s in [synsets[o.shape]] + ancestors(synsets[o.shape]))
        return objects, {"labels": sorted(labels)}
    objects = caption_scene(rng)
    return objects, {"label": index[objects[0].shape]}


def _rows(task: str, split: str, n: int, seed: int, image_size: int, classes: list[ClassInfo]) -> Iterator[dict]:
    rng = split_rng(seed, task, split)
    for i in range(n):
        objects, fields = _sample(task, rng, classes)
        image = render(rng, objects, image_size, jitter=0.02 if len(objects) == 1 else 0.01,
                       line_width=OUTLINE_WIDTH.get(task))
        if task == "captions":
            fields["captions"] = caption_levels(rng, objects)
        elif task == "corpus":
            fields["captions"] = [corpus_caption(rng, objects)]
        else:
            fields["caption"] = caption(objects, 3)
        first = objects[0]
        yield {"sample_id": f"{split}-{i:06d}", **fields, "image": image, **first.to_row(),
               "count": len(objects), "objects": [o.to_row() for o in objects]}


def split_rng(seed: int, task: str, split: str) -> np.random.Generator:
    """An independent random stream per (seed, task, split)."""
    return np.random.default_rng([seed, zlib.crc32(task.encode()), zlib.crc32(split.encode())])


# ---------------------------------------------------------------------------------------------------------
# Entry point


def parse_spec(name: str, spec: dict) -> dict:
    """Validate a spec and fill defaults; errors name the dataset and the key."""
    def fail(key: str, problem: str):
        raise DatasetError(f"dataset {name!r}: spec key {key!r} {problem}")

    check_keys(name, spec, SPEC_KEYS, source="synthetic")
    task = spec.get("task")
    if task not in TASKS:
        fail("task", f"is {task!r}; expected one of {', '.join(TASKS)}")
    splits = spec.get("splits")
    if not splits or not hasattr(splits, "items"):
        fail("splits", "is missing or empty; expected a mapping like {train: 2000, test: 1000}")
    for split, n in splits.items():
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            fail("splits", f"has {split!r}: {n!r}; expected a positive integer (a split needs samples)")
    out = {**SPEC_DEFAULTS, **{k: v for k, v in spec.items() if v is not None}}
    if isinstance(out["seed"], bool) or not isinstance(out["seed"], int) or out["seed"] < 0:
        fail("seed", f"is {out['seed']!r}; expected a non-negative integer")
    size = out["image_size"]
    if isinstance(size, bool) or not isinstance(size, int) or not 16 <= size <= 1024:
        fail("image_size", f"is {size!r}; expected an integer in 16..1024")
    preprocess = out.get("preprocess", "default")
    if preprocess not in PREPROCESS:
        fail("preprocess", f"is {preprocess!r}; expected one of {', '.join(PREPROCESS)}")
    return {"source": out.get("source", "synthetic"), "task": task, "seed": out["seed"], "image_size": size,
            "splits": {str(k): int(v) for k, v in splits.items()},
            **({"preprocess": preprocess} if preprocess != "default" else {})}  # default: classes.json as it was


def build(name: str, spec: dict, out_dir: str | Path) -> DatasetMeta:
    """Generate dataset `name` for `spec` (see `parse_spec`) into `out_dir` in the canonical format."""
    spec = parse_spec(name, spec)
    task = spec["task"]
    classes = _classes(task)
    meta = DatasetMeta(
        name=name,
        task={"hierarchy": "multi-label", "captions": "captions", "corpus": "captions"}.get(task, "single-label"),
        metric=_metric(task),
        classes=classes,
        preprocess=spec.get("preprocess", "default"),
        provenance={"generator": GENERATOR, "vlbench_version": vlbench.__version__, "seed": spec["seed"],
                    "spec": spec, **({"hierarchy_root": HIERARCHY_ROOT} if task == "hierarchy" else {})},
    )
    extra = dict(METADATA_COLUMNS)
    extra.update({"captions": pa.list_(pa.string())} if task in ("captions", "corpus") else {"caption": pa.string()})
    splits = {split: _rows(task, split, n, spec["seed"], spec["image_size"], classes)
              for split, n in spec["splits"].items()}
    return write_dataset(out_dir, meta, splits, extra_columns=extra)


def catalogue_row(name: str, spec: dict) -> dict:
    """Classes, split sizes and metric of a synthetic spec, known without generating anything."""
    spec = parse_spec(name, spec)
    return {"classes": len(_classes(spec["task"])), "splits": dict(spec["splits"]),
            "metric": _metric(spec["task"])}


def leaf_classes(name: str, spec: dict, cache: Path | None = None, mirror: Path | None = None
                 ) -> tuple[list[str], str]:
    """The demo world's leaf wnids (its classes known without generating anything; the `hypernym` group lists coarse
    concepts, not leaves). `cache` and `mirror` are unused: nothing is downloaded."""
    classes = _classes(parse_spec(name, spec)["task"])
    return [c.wnid for c in classes if c.wnid and c.group != "hypernym"], "the demo world's class list"


def _metric(task: str) -> str:
    return "map_11point" if task == "hierarchy" else "accuracy"
