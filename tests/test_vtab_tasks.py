"""VTAB's task table: splits, label rules on miniature examples whose geometry the tests set, class counts and
groups against the VTAB paper (Zhai et al., App. A Table 2) and task_adaptation's code."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from vlbench.datasets.vtab_tasks import TASKS, VtabLabelError

# VTAB paper, App. A, Table 2: classes and "train size" per task
PAPER = {
    "caltech101": (102, 3060), "cifar100": (100, 60000), "dtd": (47, 3760), "oxford_flowers102": (102, 2040),
    "oxford_iiit_pet": (37, 3680), "sun397": (397, 87003), "svhn": (10, 73257), "eurosat": (10, 21600),
    "resisc45": (45, 25200), "patch_camelyon": (2, 294912), "diabetic_retinopathy": (5, 46032),
    "clevr_count": (8, 70000), "clevr_distance": (6, 70000), "dsprites_location": (16, 663552),
    "dsprites_orientation": (16, 663552), "smallnorb_azimuth": (18, 36450), "smallnorb_elevation": (9, 36450),
    "dmlab": (6, 88178), "kitti_distance": (4, 5711),
}
# train / val / test as task_adaptation computes them from the TFDS sizes (worked out by hand here)
EXPECTED_SIZES = {
    "caltech101": (2754, 306, 6084), "cifar100": (45000, 5000, 10000), "dtd": (1880, 1880, 1880),
    "oxford_flowers102": (1020, 1020, 6149), "oxford_iiit_pet": (2944, 736, 3669),
    "sun397": (76128, 10875, 21750), "svhn": (65931, 7326, 26032), "patch_camelyon": (262144, 32768, 32768),
    "eurosat": (16200, 5400, 5400), "resisc45": (18900, 6300, 6300), "diabetic_retinopathy": (35126, 10906, 42670),
    "clevr_count": (63000, 7000, 15000), "clevr_distance": (63000, 7000, 15000), "dmlab": (65550, 22628, 22735),
    "kitti_distance": (6347, 423, 711), "dsprites_location": (589824, 73728, 73728),
    "dsprites_orientation": (589824, 73728, 73728), "smallnorb_azimuth": (24300, 12150, 12150),
    "smallnorb_elevation": (24300, 12150, 12150),
}
GROUPS_FILE = Path(__file__).resolve().parents[1] / "vlbench" / "analyses" / "adapt" / "vtab_groups.json"
REFERENCE = Path(__file__).resolve().parents[2] / "shared" / "reference" / "clip_benchmark" / "en_classnames.json"


def rows(slices):
    return {(split, i) for split, start, stop in slices for i in range(start, stop)}


def test_nineteen_tasks_with_the_papers_class_counts():
    assert set(TASKS) == set(PAPER)
    assert {name: len(t.classes) for name, t in TASKS.items()} == {name: c for name, (c, _) in PAPER.items()}


def test_train_plus_val_is_the_papers_train_size_except_two_documented_cases():
    ours = {name: t.split_sizes()["train"] + t.split_sizes()["val"] for name, t in TASKS.items()}
    differ = {name: (ours[name], size) for name, (_, size) in PAPER.items() if ours[name] != size}
    # the paper counts CIFAR-100's test images and KITTI's miscomputed 2019 counts (80% + 10% of TFDS train)
    assert differ == {"cifar100": (50000, 60000), "kitti_distance": (6770, 5711)}
    assert 6347 * 80 // 100 + 6347 * 10 // 100 == 5711


def test_split_sizes_are_task_adaptations():
    got = {name: tuple(t.split_sizes()[s] for s in ("train", "val", "test")) for name, t in TASKS.items()}
    assert got == EXPECTED_SIZES


@pytest.mark.parametrize("name", sorted(PAPER))
def test_splits_are_disjoint_nested_and_inside_tfds(name):
    task = TASKS[name]
    s = {split: rows(slices) for split, slices in task.splits.items()}
    assert not (s["train"] & s["val"]) and not (s["train"] & s["test"]) and not (s["val"] & s["test"])
    assert s["train800"] <= s["train"] and s["val200"] <= s["val"]
    assert s["train800val200"] == s["train800"] | s["val200"]
    assert (len(s["train800"]), len(s["val200"]), len(s["train800val200"])) == (800, 200, 1000)
    # the 1k subsets are the first rows of train and of val, in TFDS's prepared order
    assert min(i for _, i in s["train800"]) == min(i for _, i in s["train"])
    assert min(i for _, i in s["val200"]) == min(i for _, i in s["val"])
    for split, start, stop in (sl for slices in task.splits.values() for sl in slices):
        assert 0 <= start < stop <= task.tfds_sizes[split], (split, start, stop)


def test_groups_are_vtab_groups_json():
    groups = json.loads(GROUPS_FILE.read_text())["groups"]
    assert {name: t.group for name, t in TASKS.items()} == groups
    counts = {g: sum(t.group == g for t in TASKS.values()) for g in ("natural", "specialized", "structured")}
    assert counts == {"natural": 7, "specialized": 4, "structured": 8}


def test_tasks_that_share_images_share_dataset_and_splits():
    for a, b in [("clevr_count", "clevr_distance"), ("dsprites_location", "dsprites_orientation"),
                 ("smallnorb_azimuth", "smallnorb_elevation")]:
        assert (TASKS[a].tfds, TASKS[a].version, TASKS[a].splits) == (TASKS[b].tfds, TASKS[b].version, TASKS[b].splits)


# ----------------------------------------------------------------------------------------------------------------
# Label rules, each on a miniature example


def clevr(depths, xy=(100.0, 200.0)):
    coords = np.array([[xy[0], xy[1], d] for d in depths], dtype=np.float32).reshape(-1)
    return {"objects/size": np.zeros(len(depths), np.int64), "objects/pixel_coords": coords}


@pytest.mark.parametrize("objects", range(3, 11))
def test_clevr_count_is_objects_minus_three(objects):
    assert TASKS["clevr_count"].label(clevr([10.0] * objects)) == objects - 3


def test_clevr_count_refuses_counts_outside_its_classes():
    with pytest.raises(VtabLabelError, match="clevr_count.*2 objects"):
        TASKS["clevr_count"].label(clevr([10.0, 11.0]))


# (depth of the closest object, its bin): bins are (0, 8], (8, 8.5], (8.5, 9], (9, 9.5], (9.5, 10], (10, 100]
@pytest.mark.parametrize("closest,expected", [(7.0, 0), (8.0, 0), (8.01, 1), (8.5, 1), (8.6, 2), (9.0, 2),
                                              (9.2, 3), (9.7, 4), (10.0, 4), (10.01, 5), (60.0, 5)])
def test_clevr_distance_bins_the_closest_objects_depth(closest, expected):
    # farther objects, and pixel x / y coordinates far below the depth, must not matter
    example = clevr([closest + 3.0, closest, closest + 0.7], xy=(1.0, 2.0))
    assert TASKS["clevr_distance"].label(example) == expected


def test_clevr_distance_refuses_a_depth_beyond_its_bins():
    with pytest.raises(VtabLabelError, match="clevr_distance.*outside 0..5"):
        TASKS["clevr_distance"].label(clevr([150.0]))
    with pytest.raises(VtabLabelError, match="objects/pixel_coords"):
        TASKS["clevr_distance"].label({"objects/size": np.zeros(1, np.int64),
                                       "objects/pixel_coords": np.ones(4, np.float32)})


CAR, VAN, TRUCK, PEDESTRIAN, PERSON_SITTING, CYCLIST, TRAM, MISC = range(8)


def kitti(objects):
    """objects: [(type, z)] with x, y chosen so that only z can explain the label."""
    types = np.array([t for t, _ in objects], dtype=np.int64)
    location = np.array([[-50.0, 1.5, z] for _, z in objects], dtype=np.float32).reshape(-1)
    return {"objects/type": types, "objects/location": location}


@pytest.mark.parametrize("objects,expected", [
    ([(PEDESTRIAN, 3.0), (CAR, 15.0)], 1),  # a pedestrian closer than any car does not count
    ([(VAN, 7.9), (TRUCK, 25.0), (CAR, 12.0)], 0),
    ([(TRUCK, 21.0), (CYCLIST, 2.0)], 2),
    ([(CAR, 8.0)], 0), ([(CAR, 8.5)], 1), ([(CAR, 20.0)], 1), ([(VAN, 20.5)], 2), ([(TRUCK, 998.0)], 2),
    ([(PEDESTRIAN, 5.0), (PERSON_SITTING, 6.0), (CYCLIST, 7.0), (TRAM, 4.0), (MISC, 3.0)], 3),  # no vehicle
    ([], 3),
])
def test_kitti_distance_bins_the_nearest_car_van_or_truck(objects, expected):
    assert TASKS["kitti_distance"].label(kitti(objects)) == expected


def test_kitti_distance_refuses_mismatched_locations():
    with pytest.raises(VtabLabelError, match="2 objects but 3 location values"):
        TASKS["kitti_distance"].label({"objects/type": np.zeros(2, np.int64),
                                       "objects/location": np.ones(3, np.float32)})


def test_dsprites_location_pairs_the_32_positions():
    got = [TASKS["dsprites_location"].label({"label_x_position": np.array([v])}) for v in range(32)]
    assert got == [v // 2 for v in range(32)]


def test_dsprites_orientation_groups_the_40_orientations_into_16():
    got = [TASKS["dsprites_orientation"].label({"label_orientation": np.array([v])}) for v in range(40)]
    assert got == [2 * v // 5 for v in range(40)]  # floor(v / 2.5) in exact integer arithmetic
    sizes = np.bincount(got)
    assert len(sizes) == 16 and set(sizes) == {2, 3}
    assert TASKS["dsprites_orientation"].pixel_scale == 255  # dSprites' 0/1 pixels become 0/255


def test_smallnorb_labels_are_tfds_codes():
    assert [TASKS["smallnorb_azimuth"].label({"label_azimuth": np.array([c])}) for c in range(18)] == list(range(18))
    assert TASKS["smallnorb_elevation"].label({"label_elevation": np.array([8]), "label_azimuth": np.array([3])}) == 8
    with pytest.raises(VtabLabelError, match="smallnorb_elevation.*9 .*outside 0..8"):
        TASKS["smallnorb_elevation"].label({"label_elevation": np.array([9])})


@pytest.mark.parametrize("name", ["caltech101", "dmlab", "diabetic_retinopathy", "svhn", "eurosat"])
def test_stored_labels_and_missing_keys(name):
    n = len(TASKS[name].classes)
    assert TASKS[name].label({"label": np.array([n - 1], np.int64)}) == n - 1
    with pytest.raises(VtabLabelError, match=f"{name}.*no feature 'label'"):
        TASKS[name].label({"image": [b"..."]})
    with pytest.raises(VtabLabelError, match=f"outside 0..{n - 1}"):
        TASKS[name].label({"label": np.array([-1], np.int64)})  # TFDS's "no label" (retinopathy's sample split)


# ----------------------------------------------------------------------------------------------------------------
# Class names and templates


def test_class_names_sources_and_templates():
    for t in TASKS.values():
        assert t.class_source and t.template_source and t.templates
        assert all("{c}" in x for x in t.templates), t.name
    assert TASKS["kitti_distance"].classes[3] == "a photo i took with no car."
    assert TASKS["clevr_count"].classes == ("three", "four", "five", "six", "seven", "eight", "nine", "ten")
    assert TASKS["dmlab"].classes[0] == "nearby apple/melon" and TASKS["dmlab"].classes[5] == "very far lemon"
    # SUN397: TFDS sorts '/j/jail/indoor' before '/j/jail_cell'; the CLIP paper's list has them the other way
    assert TASKS["sun397"].classes[206:208] == ("jail indoor", "jail cell")
    assert TASKS["cifar100"].classes[:2] == ("apple", "aquarium fish")


@pytest.mark.skipif(not REFERENCE.exists(), reason="shared reference copy of CLIP_benchmark's class names absent")
def test_clip_benchmark_names_are_the_upstream_files():
    upstream = json.loads(REFERENCE.read_text())
    for t in TASKS.values():
        if t.class_source.startswith("CLIP_benchmark"):
            key = t.class_source.split("[")[1].split("]")[0].strip("'")
            assert list(t.classes) == upstream[key], t.name


def test_2019_percent_slices_fall_where_the_2020_counts_do():
    """task_adaptation 2019 sliced "train[:90%]" (TFDS rounds a percent boundary to the closest row); the 2020
    code slices at P * n // 100. At the pinned sizes both give the same rows for every task."""
    cases = {"caltech101": (90,), "cifar100": (90,), "svhn": (90,), "oxford_iiit_pet": (80,), "clevr_count": (90,),
             "eurosat": (60, 80), "resisc45": (60, 80), "dsprites_location": (80, 90), "smallnorb_azimuth": (50,)}
    for name, percents in cases.items():
        task = TASKS[name]
        n = task.tfds_sizes["test" if name == "smallnorb_azimuth" else "train"]
        boundaries = {stop for slices in task.splits.values() for _, _, stop in slices} | {
            start for slices in task.splits.values() for _, start, _ in slices}
        for p in percents:
            assert round(p * n / 100) == p * n // 100 and p * n // 100 in boundaries, (name, p)
