"""BREEDS Entity13 / Living17 (`source: breeds`): the BREEDS grouping algorithm on a miniature hierarchy,
against the published class lists on the real hierarchy files (when the shared reference copy is present), and
an end-to-end prepare with the hierarchy files served from 127.0.0.1 and miniature ImageNet files in a mirror."""

from __future__ import annotations

import hashlib
import itertools
import json
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from tests.http_server import serve
from tests.test_imagenet import fake_wnids, files_spec, make_imagenet, trust_devkit
from vlbench.datasets import breeds, imagenet
from vlbench.datasets.breeds import ClassHierarchy, Superclass
from vlbench.datasets.canonical import DatasetError
from vlbench.datasets.registry import describe, prepare_dataset

REFERENCE = Path(__file__).resolve().parents[2] / "shared" / "reference" / "breeds" / "modified"

# The published groupings (superclass -> subclasses, CLIP names, in BREEDS' draw order), as the openness paper's
# authors list them beside their loaders (lancopku/clip-openness datasets/imagenet_{living17,entity13}.py).
LIVING17 = {
    "salamander": ["newt", "axolotl", "smooth newt", "spotted salamander"],
    "turtle": ["box turtle", "leatherback sea turtle", "loggerhead sea turtle", "mud turtle"],
    "lizard": ["desert grassland whiptail lizard", "alligator lizard", "chameleon", "banded gecko"],
    "snake, serpent, ophidian": ["night snake", "garter snake", "sea snake", "boa constrictor"],
    "spider": ["tarantula", "yellow garden spider", "European garden spider", "wolf spider"],
    "grouse": ["ptarmigan", "prairie grouse", "ruffed grouse", "black grouse"],
    "parrot": ["macaw", "lorikeet", "african grey parrot", "sulphur-crested cockatoo"],
    "crab": ["Dungeness crab", "fiddler crab", "rock crab", "red king crab"],
    "dog, domestic dog, Canis familiaris": ["Bloodhound", "Pekingese", "Great Pyrenees dog", "Papillon"],
    "wolf": ["coyote", "red wolf or maned wolf", "Alaskan tundra wolf", "grey wolf"],
    "fox": ["grey fox", "Arctic fox", "red fox", "kit fox"],
    "domestic cat, house cat, Felis domesticus, Felis catus": ["tiger cat", "Egyptian Mau", "Persian cat",
                                                               "Siamese cat"],
    "bear": ["sloth bear", "American black bear", "polar bear", "brown bear"],
    "beetle": ["dung beetle", "rhinoceros beetle", "ground beetle", "longhorn beetle"],
    "butterfly": ["sulphur butterfly", "red admiral butterfly", "small white butterfly", "ringlet butterfly"],
    "ape": ["gibbon", "orangutan", "gorilla", "chimpanzee"],
    "monkey": ["marmoset", "titi monkey", "Geoffroy's spider monkey", "howler monkey"],
}
ENTITY13 = {
    "garment": ["trench coat", "abaya", "gown", "poncho", "military uniform", "T-shirt", "cloak", "bikini", "miniskirt",
                "swim trunks / shorts", "lab coat", "bra", "hoop skirt", "cardigan", "pajamas", "academic gown",
                "apron", "diaper", "sweatshirt", "sarong"],
    "bird": ["african grey parrot", "bee eater", "coucal", "American coot", "indigo bunting", "king penguin",
             "spoonbill", "limpkin", "quail", "kite (bird of prey)", "prairie grouse", "red-breasted merganser",
             "albatross", "American dipper", "goose", "oystercatcher", "great egret", "hen", "lorikeet",
             "ruffed grouse"],
    "reptile, reptilian": ["Gila monster", "agama", "triceratops", "chameleon", "worm snake", "Indian cobra",
                           "smooth green snake", "mud turtle", "water snake", "loggerhead sea turtle",
                           "sidewinder rattlesnake", "leatherback sea turtle", "boa constrictor", "garter snake",
                           "terrapin", "box turtle", "ring-necked snake", "African rock python", "Carolina anole",
                           "European green lizard"],
    "arthropod": ["rock crab", "yellow garden spider", "tiger beetle", "southern black widow", "barn spider",
                  "leafhopper", "ground beetle", "fiddler crab", "bee", "stick insect", "small white butterfly",
                  "red admiral butterfly", "lacewing", "trilobite", "sulphur butterfly", "cicada",
                  "European garden spider", "leaf beetle", "longhorn beetle", "fly"],
    "mammal, mammalian": ["Siamese cat", "Alpine ibex", "tiger", "hippopotamus", "Norwegian Elkhound", "dugong",
                          "black-and-white colobus", "Samoyed", "Persian cat", "Irish Wolfhound", "English Setter",
                          "llama", "red panda", "armadillo", "indri", "Giant Schnauzer", "pug", "Dobermann",
                          "American Staffordshire Terrier", "Beagle"],
    "accessory, accoutrement, accouterment": ["baby bib", "feather boa", "scarf", "plastic bag", "swimming cap",
                                              "cowboy boot", "necklace", "crash helmet", "gas mask or respirator",
                                              "tights", "hair clip", "umbrella", "Pickelhaube", "mitten", "sombrero",
                                              "shower cap", "sock", "sneaker", "graduation cap", "handkerchief"],
    "craft": ["catamaran", "motorboat", "fireboat", "sailboat", "airliner", "container ship", "ocean liner", "trimaran",
              "space shuttle", "aircraft carrier", "schooner", "gondola", "canoe", "shipwreck", "military aircraft",
              "balloon", "submarine", "pirate ship", "lifeboat", "airship"],
    "equipment": ["volleyball", "notebook computer", "basketball", "hand-held computer", "tripod", "projector",
                  "barbell", "monitor", "croquet ball", "balance beam", "cassette player", "snorkel",
                  "gymnastic horizontal bar", "soccer ball", "racket", "baseball", "joystick", "microphone",
                  "tape player", "reflex camera"],
    "furniture, piece of furniture, article of furniture": ["wardrobe", "toilet seat", "filing cabinet",
                                                            "mosquito net", "four-poster bed", "bassinet",
                                                            "chiffonier", "folding chair", "fire screen",
                                                            "shoji screen / room divider", "couch", "throne",
                                                            "infant bed", "rocking chair", "dining table",
                                                            "park bench", "storage chest", "window screen",
                                                            "medicine cabinet", "barber chair"],
    "instrument": ["upright piano", "padlock", "lighter", "steel drum", "parking meter", "cleaver", "syringe", "abacus",
                   "weighing scale", "corkscrew", "maraca", "salt shaker", "magnetic compass", "accordion",
                   "digital clock", "screw", "can opener", "odometer", "pipe organ", "screwdriver"],
    "man-made structure, construction": ["castle", "bell tower", "fountain", "planetarium", "traffic light",
                                         "breakwater", "cliff dwelling", "monastery", "prison", "water tower",
                                         "suspension bridge", "split-rail fence", "turnstile", "tile roof",
                                         "lighthouse", "traffic or street sign", "maze", "chain-link fence", "bakery",
                                         "drilling rig"],
    "wheeled vehicle": ["snowplow", "semi-trailer truck", "race car", "shopping cart", "unicycle", "vespa",
                        "railroad car", "minibus", "jeep", "recreational vehicle", "rickshaw", "golf cart", "tow truck",
                        "ambulance", "high-speed train", "fire truck", "horse-drawn vehicle", "tram", "tank",
                        "ford model t"],
    "produce, green goods, green groceries, garden truck": ["broccoli", "corn", "orange", "cucumber",
                                                            "spaghetti squash", "butternut squash", "acorn squash",
                                                            "cauliflower", "bell pepper", "fig", "pomegranate",
                                                            "mushroom", "strawberry", "lemon", "cabbage",
                                                            "Granny Smith apple", "rose hip", "corn cob", "banana",
                                                            "artichoke"],
}


# -------------------------------------------------------------------------------------- the algorithm


def tiny_hierarchy() -> ClassHierarchy:
    """root r -> a -> {A, B}, r -> b -> C -> D; also r -> A directly (a shorter path: A's level is still 2).
    Classes (leaves): A: a1..a5, B: b1 b2, D: d1..d4; x1 is a class outside the hierarchy; 'orphan' -> o1
    is an edge that leads to no class of the dataset's ancestors from the root."""
    leaves = ["a1", "a2", "a3", "a4", "a5", "b1", "b2", "d1", "d2", "d3", "d4", "x1"]
    edges = [("r", "a"), ("r", "b"), ("a", "A"), ("a", "B"), ("r", "A"), ("b", "C"), ("C", "D"),
             ("orphan", "o1"), ("b", "unused")]
    edges += [("A", f"a{i}") for i in range(1, 6)] + [("B", "b1"), ("B", "b2")] + [("D", f"d{i}") for i in range(1, 5)]
    names = {"r": "root", "a": "group a", "A": "big A", "B": "small B", "D": "deep D"}
    return ClassHierarchy.build([(i, w, w) for i, w in enumerate(leaves)], edges, names, root="r")


def test_levels_keep_the_longest_path_and_the_graph_keeps_only_ancestors_of_classes():
    h = tiny_hierarchy()
    assert h.level == {"r": 0, "a": 1, "b": 1, "A": 2, "B": 2, "C": 2, "D": 3,
                       **{f"a{i}": 3 for i in range(1, 6)}, "b1": 3, "b2": 3, **{f"d{i}": 4 for i in range(1, 5)}}
    assert "unused" not in h.level and "orphan" not in h.children  # no class below them
    assert h.nodes_at_level(2) == ["A", "B", "C"]
    assert h.nodes_at_level(2, ancestor="b") == ["C"]
    assert h.leaves_below("a") == {f"a{i}" for i in range(1, 6)} | {"b1", "b2"}
    assert h.leaves_below("a3") == {"a3"}
    assert h.descendants("b", depth=1) == {"b", "C"}


def test_superclasses_keep_those_big_enough_and_draw_with_one_seeded_generator():
    h = tiny_hierarchy()
    groups = breeds.superclasses(h, level=2, subclasses=2, seed=2)
    assert [g.wnid for g in groups] == ["A", "B", "C"]  # sorted wnids; C has D's classes below it
    assert [g.name for g in groups] == ["big A", "small B", "C"]  # a node without a name keeps its wnid
    rng = np.random.RandomState(2)  # BREEDS: one generator, one choice per superclass, in order
    expected = [list(rng.choice(sorted(h.leaves_below(n)), 2, replace=False)) for n in ("A", "B", "C")]
    assert [list(g.subclasses) for g in groups] == expected
    bigger = breeds.superclasses(h, level=2, subclasses=4, seed=2)
    assert [g.wnid for g in bigger] == ["A", "C"]  # B has only 2 classes
    assert all(len(set(g.subclasses)) == 4 and set(g.subclasses) <= h.leaves_below(g.wnid) for g in bigger)


def test_algorithm_errors_name_the_problem():
    h = tiny_hierarchy()
    with pytest.raises(DatasetError, match="no hierarchy node at level 9"):
        breeds.superclasses(h, level=9, subclasses=2)
    with pytest.raises(DatasetError, match="has a cycle"):
        ClassHierarchy.build([(0, "x", "x")], [("r", "a"), ("a", "b"), ("b", "a"), ("b", "x")], {}, root="r")
    with pytest.raises(DatasetError, match="root 'zz' is not an ancestor"):
        ClassHierarchy.build([(0, "x", "x")], [("r", "x")], {}, root="zz")


def test_catalogue_rows_need_no_download():
    for key, classes, superclasses in (("entity13", 260, 13), ("living17", 68, 17)):
        row = describe(f"breeds-{key}", {"prepare": {"source": "breeds", "breeds": key}})
        assert (row["classes"], row["splits"], row["metric"], row["manual_download"]) == (
            classes, {"test": classes * 50}, "accuracy", True)
        assert breeds.RECIPES[key].superclasses == superclasses
    with pytest.raises(DatasetError, match="'breeds' must be one of entity13, living17, got 'entity30'"):
        breeds.catalogue_row("b", {"source": "breeds", "breeds": "entity30"})


@pytest.mark.skipif(not REFERENCE.is_dir(), reason="shared reference copy of the BREEDS hierarchy absent")
@pytest.mark.parametrize("key, published", [("living17", LIVING17), ("entity13", ENTITY13)])
def test_real_hierarchy_gives_the_published_groupings(key, published):
    for role, spec in breeds.HIERARCHY_FILES.items():
        upstream = spec["url"].rsplit("/", 1)[1]
        assert hashlib.sha256((REFERENCE / upstream).read_bytes()).hexdigest() == spec["sha256"], role
    h = ClassHierarchy.from_files(REFERENCE / "dataset_class_info.json", REFERENCE / "class_hierarchy.txt",
                             REFERENCE / "node_names.txt")
    names = imagenet.clip_classnames()
    index = {wnid: i for i, wnid, _ in h.leaves}
    groups = breeds.make(h, key)
    assert {g.name: [names[index[w]] for w in g.subclasses] for g in groups} == published
    assert [g.name for g in groups] == list(published)  # superclass order = BREEDS labels


# ------------------------------------------------------------------------------------------ end to end


LIVING = "n00004258"
SUPER = [f"n0150{k:04d}" for k in range(18)]  # level-5 superclass nodes; the last has 3 classes only


def living_hierarchy(wnids: list[str]) -> tuple[list[tuple[str, str]], dict[str, str], dict[str, list[str]]]:
    """root -> living thing -> organism -> animal -> chordate -> 18 superclasses (17 with 5 classes, 1 with 3);
    the other classes hang under 'non-living thing'. A short cut living thing -> superclass 3 does not lower
    its level (BREEDS keeps the longest path)."""
    chain = ["n00001740", LIVING, "n00004475", "n00015388", "n01466257"]
    edges = list(itertools.pairwise(chain)) + [(chain[-1], s) for s in SUPER] + [(LIVING, SUPER[3])]
    members = {s: wnids[20 * k + 3: 20 * k + 3 + (5 if k < 17 else 3)] for k, s in enumerate(SUPER)}
    edges += [(s, w) for s, ws in members.items() for w in ws]
    used = {w for ws in members.values() for w in ws}
    edges += [("n00001740", "n00021939")] + [("n00021939", w) for w in wnids if w not in used]
    names = {"n00001740": "entity", LIVING: "living thing", "n00021939": "non-living thing",
             **{s: f"superclass {k}" for k, s in enumerate(SUPER)}}
    return edges, names, members


def serve_hierarchy(www: Path, wnids: list[str]) -> dict[str, list[str]]:
    edges, names, members = living_hierarchy(wnids)
    www.mkdir(parents=True, exist_ok=True)
    (www / "class_hierarchy.txt").write_text("".join(f"{p} {c}\n" for p, c in edges))
    (www / "node_names.txt").write_text("".join(f"{w}\t{n}\n" for w, n in names.items()))
    (www / "dataset_class_info.json").write_text(json.dumps([[i, w, f"thing {i}"] for i, w in enumerate(wnids)]))
    return members


def hierarchy_spec(www: Path, base: str) -> dict:
    files = {}
    for role, default in breeds.HIERARCHY_FILES.items():
        upstream = default["url"].rsplit("/", 1)[1]
        files[role] = {"file": f"test-{upstream}", "url": f"{base}/{upstream}",
                       "sha256": hashlib.sha256((www / upstream).read_bytes()).hexdigest()}
    return files


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("VLBENCH_DOWNLOADS", str(tmp_path / "downloads"))
    monkeypatch.setenv("VLBENCH_MIRROR", str(tmp_path / "mirror"))
    return tmp_path / "downloads"


def test_living17_prepared_from_served_hierarchy_and_mirrored_imagenet(tmp_path, cache, monkeypatch):
    wnids = fake_wnids()
    members = serve_hierarchy(tmp_path / "www", wnids)
    index = {w: i for i, w in enumerate(wnids)}
    in_super0 = [index[w] for w in members[SUPER[0]]]
    images = in_super0 + [index[members[SUPER[16]][0]], 0, 999, index[members[SUPER[17]][0]]] + in_super0
    mini = make_imagenet(tmp_path / "mirror", images, wnids=wnids)
    trust_devkit(monkeypatch, mini["devkit"])
    out = tmp_path / "prepared" / "breeds-living17"
    with serve(tmp_path / "www") as base:
        spec = {"source": "breeds", "breeds": "living17",
                "files": {**hierarchy_spec(tmp_path / "www", base), **files_spec(mini)}}
        meta = prepare_dataset("breeds-living17", spec, out)
        assert sum(base.requests.values()) == 3

    classes = json.loads((out / "classes.json").read_text())
    assert len(classes["classes"]) == 68 and classes["metric"] == "accuracy"
    groups: dict[str, list[dict]] = {}
    for c in classes["classes"]:
        groups.setdefault(c["group"], []).append(c)
    assert sorted(groups) == sorted(f"superclass {k}" for k in range(17))  # the 3-class superclass is left out
    for k in range(17):
        chosen = groups[f"superclass {k}"]
        assert len(chosen) == 4 and {c["wnid"] for c in chosen} <= set(members[SUPER[k]])
    assert [index[c["wnid"]] for c in classes["classes"]] == sorted(index[c["wnid"]] for c in classes["classes"])
    clip = imagenet.clip_classnames()
    for c in classes["classes"]:  # CLIP's name and the devkit's lemmas of the ImageNet class
        assert (c["name"], c["aliases"]) == (clip[index[c["wnid"]]], [f"thing {index[c['wnid']]}", f"alias {index[c['wnid']]}"])

    label_of = {c["wnid"]: c["index"] for c in classes["classes"]}
    rows = pq.read_table(out / "splits" / "test.parquet").to_pylist()
    kept = [k for k, cls in enumerate(images) if wnids[cls] in label_of]
    assert meta.splits == {"test": len(kept)} and len(kept) >= 8
    by_id = {r["sample_id"]: r for r in rows}
    assert sorted(by_id) == sorted(f"ILSVRC2012_val_{k + 1:08d}.JPEG" for k in kept)
    superclass_names = [g["name"] for g in classes["provenance"]["superclasses"]]
    for k in kept:
        row = by_id[f"ILSVRC2012_val_{k + 1:08d}.JPEG"]
        wnid = wnids[images[k]]
        assert row["label"] == label_of[wnid] and row["imagenet_label"] == images[k]
        assert superclass_names[row["superclass"]] == classes["classes"][row["label"]]["group"]
        assert row["image"] == mini["images"][row["sample_id"]]

    prov = classes["provenance"]
    assert prov["recipe"] == {"level": 5, "subclasses": 4, "ancestor": LIVING, "balanced": True, "split": None,
                              "random_seed": 2}
    assert set(prov["files"]) == {"class_hierarchy", "node_names", "class_info", "devkit", "val_images"}
    assert all(f["verified"] for f in prov["files"].values())
    assert [g["wnid"] for g in prov["superclasses"]] == SUPER[:17]


def test_hierarchy_files_in_the_mirror_under_their_upstream_names_are_used(tmp_path, cache, monkeypatch):
    """The cache names are prefixed (BREEDS-<commit>-...); a mirror filled from upstream keeps the plain names."""
    from vlbench.datasets.download import resource

    default = resource("breeds-living17", breeds.HIERARCHY_FILES["class_info"])
    assert default.mirror_names() == (f"BREEDS-{breeds.COMMIT[:8]}-dataset_class_info.json", "dataset_class_info.json")
    wnids = fake_wnids()
    members = serve_hierarchy(tmp_path / "www", wnids)
    mini = make_imagenet(tmp_path / "mirror", [wnids.index(w) for w in members[SUPER[0]]], wnids=wnids)
    trust_devkit(monkeypatch, mini["devkit"])
    with serve(tmp_path / "www") as base:
        spec = {"source": "breeds", "breeds": "living17",
                "files": {**hierarchy_spec(tmp_path / "www", base), **files_spec(mini)}}
        (tmp_path / "mirror" / "breeds").mkdir()
        for upstream in ("class_hierarchy.txt", "node_names.txt", "dataset_class_info.json"):
            (tmp_path / "www" / upstream).rename(tmp_path / "mirror" / "breeds" / upstream)
        meta = prepare_dataset("breeds-living17", spec, tmp_path / "out")
    assert sum(base.requests.values()) == 0 and meta.splits == {"test": 4}  # 4 of the superclass's 5 classes
    assert sorted(p.name for p in cache.iterdir() if p.name.startswith("test-") and not p.name.endswith(".sha256")) == [
        "test-class_hierarchy.txt", "test-dataset_class_info.json", "test-node_names.txt"]


def test_hierarchy_that_disagrees_with_the_devkit_is_refused(tmp_path, cache, monkeypatch):
    wnids = fake_wnids()
    serve_hierarchy(tmp_path / "www", wnids)
    mini = make_imagenet(tmp_path / "mirror", [0, 1], wnids=fake_wnids(seed=1))  # other class ids
    trust_devkit(monkeypatch, mini["devkit"])
    with serve(tmp_path / "www") as base:
        spec = {"source": "breeds", "breeds": "living17",
                "files": {**hierarchy_spec(tmp_path / "www", base), **files_spec(mini)}}
        with pytest.raises(DatasetError, match="does not list the ImageNet devkit's classes in the standard order"):
            prepare_dataset("breeds-living17", spec, tmp_path / "out")


def test_a_different_number_of_superclasses_is_refused():
    groups = [Superclass(f"n{k}", f"s{k}", ("a", "b", "c", "d")) for k in range(16)]
    with pytest.raises(DatasetError, match="give 16 living17 superclasses .* but living17 has 17"):
        breeds._check_published_shape("b", "living17", groups)
