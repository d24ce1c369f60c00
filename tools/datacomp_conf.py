"""Write the `wds-<task>` entries (conf/dataset/wds-*.yaml) and the suites `datacomp` and `datacomp-fairness`
(conf/suite/) from one table: DataComp's tasklist.yml (mlfoundations/datacomp; task key, display name, test size,
class count, `main_metric`, default `acc1`) and where each task's shards are.

    python tools/datacomp_conf.py          # rewrites the files; commit them

Shards: DataComp's download_evalsets.py takes every task but the retrieval and misc ones from the Hugging Face
dataset repository djghosh/wds_<task with '/' as '-', 'fairness/' dropped>_test. Flickr and MSCOCO DataComp reads
as Hugging Face datasets (nlphuji/flickr_1k_test_image_text_retrieval, nlphuji/mscoco_2014_5k_test_image_text_retrieval,
Karpathy's 1k and 5k test splits; eval_utils/retr_eval.py, tasklist.yml as of commit 4afedc4): their entries
`wds-flickr30k` and `wds-mscoco`, in the suite, read those datasets' Parquet files (`source: hf_captions`,
vlbench/datasets/hf_captions.py; files, revision and caption counts: `HF_CAPTIONS`); the option `wds-flickr30k-shards`
and `wds-mscoco-shards` (not in the suite) read CLIP_benchmark's webdataset copies clip-benchmark/wds_flickr30k and
wds_mscoco_captions (`RETRIEVAL_REPOS`, see `NOTES`). WinoGAViL has no shards: DataComp reads the Hugging Face dataset
nlphuji/winogavil (eval_utils/wino_eval.py); its entry reads that dataset's Parquet files (`source: winogavil`,
vlbench/datasets/winogavil.py; the files and their revision: `WINOGAVIL`).
FairFace and UTKFace (`FAIRNESS`) label each face with several objectives: their entries name the .npy metadata
(`OBJECTIVES`) and the suite `datacomp-fairness` scores them zero-shot per objective (DataComp's
eval_utils/fairness_eval.py; not part of the average).

`REVISION` and `SHA256`: the hub's commit of each repository and the sha256 of each shard (the LFS oid the hub
publishes), written into the entries. None were known when this table was written (no network): every shard
repository is read at `main`, the Parquet ones (`HF_CAPTIONS`, `WINOGAVIL`) at their conversion branch
`refs%2Fconvert%2Fparquet`, which the first prepare pins to its commit in `hub.lock`, each file verified against the
hash the hub declares and recorded there (vlbench/datasets/hub.py, docs/downloads.md).
"""

from __future__ import annotations

import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from vlbench.metrics import DATACOMP_TASKS  # noqa: E402

# DataComp's main_metric -> the vlbench metric name (classes.json `metric`; retrieval: the retrieval analysis)
METRICS = {"acc1": "accuracy", "mean_per_class_recall": "mean_per_class", "F1-macro_all": "f1_macro",
           "acc_worst_region": "worst_group_accuracy", "acc_wg": "worst_group_accuracy",
           "acc_top5_wg": "worst_group_top5", "mean_recall@1": "accuracy", "jaccard_score_10-12": "winogavil_jaccard"}
# key, display name, test size, classes, main metric (tasklist.yml order)
TABLE = [
    ("vtab/caltech101", "Caltech-101", 6085, 102, "mean_per_class_recall"),
    ("cifar10", "CIFAR-10", 10000, 10, "acc1"),
    ("vtab/cifar100", "CIFAR-100", 10000, 100, "acc1"),
    ("vtab/clevr_count_all", "CLEVR Counts", 15000, 8, "acc1"),
    ("vtab/clevr_closest_object_distance", "CLEVR Distance", 15000, 6, "acc1"),
    ("country211", "Country211", 21100, 211, "acc1"),
    ("vtab/dtd", "Describable Textures", 1880, 47, "acc1"),
    ("vtab/eurosat", "EuroSAT", 5400, 10, "acc1"),
    ("fgvc_aircraft", "FGVC Aircraft", 3333, 100, "mean_per_class_recall"),
    ("food101", "Food-101", 25250, 101, "acc1"),
    ("gtsrb", "GTSRB", 12630, 43, "acc1"),
    ("imagenet1k", "ImageNet 1k", 50000, 1000, "acc1"),
    ("imagenet_sketch", "ImageNet Sketch", 50889, 1000, "acc1"),
    ("imagenetv2", "ImageNet v2", 10000, 1000, "acc1"),
    ("imagenet-a", "ImageNet-A", 7500, 200, "acc1"),
    ("imagenet-o", "ImageNet-O", 2000, 200, "acc1"),
    ("imagenet-r", "ImageNet-R", 30000, 200, "acc1"),
    ("vtab/kitti_closest_vehicle_distance", "KITTI Vehicle Distance", 711, 4, "acc1"),
    ("mnist", "MNIST", 10000, 10, "acc1"),
    ("objectnet", "ObjectNet", 18574, 113, "acc1"),
    ("vtab/flowers", "Oxford Flowers-102", 6149, 102, "mean_per_class_recall"),
    ("vtab/pets", "Oxford-IIIT Pet", 3669, 37, "mean_per_class_recall"),
    ("voc2007", "Pascal VOC 2007", 14976, 20, "acc1"),
    ("vtab/pcam", "PatchCamelyon", 32768, 2, "acc1"),
    ("renderedsst2", "Rendered SST2", 1821, 2, "acc1"),
    ("vtab/resisc45", "RESISC45", 6300, 45, "acc1"),
    ("cars", "Stanford Cars", 8041, 196, "acc1"),
    ("stl10", "STL-10", 8000, 10, "acc1"),
    ("sun397", "SUN397", 108754, 397, "acc1"),
    ("vtab/svhn", "SVHN", 26032, 10, "acc1"),
    ("retrieval/flickr_1k_test_image_text_retrieval", "Flickr", 1000, None, "mean_recall@1"),
    ("retrieval/mscoco_2014_5k_test_image_text_retrieval", "MSCOCO", 5000, None, "mean_recall@1"),
    ("misc/winogavil", "WinoGAViL", 3563, None, "jaccard_score_10-12"),
    ("wilds/iwildcam", "iWildCam", 42791, 182, "F1-macro_all"),
    ("wilds/camelyon17", "Camelyon17", 85054, 2, "acc1"),
    ("wilds/fmow", "FMoW", 22108, 62, "acc_worst_region"),
    ("fairness/dollar_street", "Dollar Street", 3503, 58, "acc_top5_wg"),
    ("fairness/geode", "GeoDE", 12488, 40, "acc_wg"),
]
FAIRNESS = [("fairness/fairface", "FairFace", 10954), ("fairness/utkface", "UTKFace", 23703)]
# multi-objective tasks: the label objective and the .npy elements (fairness_eval.py FairFaceEvaluator's metadata
# fields, for both; FF_PRED_LABELS' first objective, race, is the label)
OBJECTIVES = {key: {"label": "race", "metadata": ["age", "gender", "race", "race_binary"]} for key, *_ in FAIRNESS}
# the group of a grouped task: the element of each sample's .npy metadata (DataComp's evaluators' metadata fields)
GROUPS = {"wilds/fmow": {"field": "region", "index": 0},  # FMoWEvaluator: [region, year, y]
          "fairness/dollar_street": {"field": "income_ds", "index": 0},  # [income_ds, income_meta, region]
          "fairness/geode": {"field": "region", "index": 0}}  # [region, country]
RETRIEVAL_REPOS = {"retrieval/flickr_1k_test_image_text_retrieval": "clip-benchmark/wds_flickr30k",
                   "retrieval/mscoco_2014_5k_test_image_text_retrieval": "clip-benchmark/wds_mscoco_captions"}
# DataComp's own source of Flickr and MSCOCO: the hub's Parquet conversion of each dataset's loading script (branch
# refs/convert/parquet, config TEST, split test), assumptions written offline from the hub's pages as the search index
# stored them (MSCOCO: TEST/test/0000.parquet 510 MB and 0001.parquet 311 MB, branch head fb42856 of 2024-03-08;
# Flickr: one file assumed, its listing not seen); captions: Karpathy's splits (every Flickr30k image has 5 captions;
# MSCOCO's 5,000 test images 25,010, the figure issue 42 gives)
HF_CAPTIONS = {
    "retrieval/flickr_1k_test_image_text_retrieval": {
        "repo": "nlphuji/flickr_1k_test_image_text_retrieval", "files": ["TEST/test/0000.parquet"], "captions": 5000},
    "retrieval/mscoco_2014_5k_test_image_text_retrieval": {
        "repo": "nlphuji/mscoco_2014_5k_test_image_text_retrieval",
        "files": ["TEST/test/0000.parquet", "TEST/test/0001.parquet"], "captions": 25010},
}
HF_REVISION = "refs%2Fconvert%2Fparquet"
NOTES = {
    "retrieval/flickr_1k_test_image_text_retrieval": "The option to DataComp's own source (entry wds-flickr30k, "
    "nlphuji/flickr_1k_test_image_text_retrieval, Karpathy's 1k test; an earlier tasklist.yml, commit 2d7bde7, named "
    "nlphuji/flickr30k, all 31,014 images): CLIP_benchmark's shards of Karpathy's test split, whose images and "
    "captions were not compared with it (docs/protocols.md).",
    "retrieval/mscoco_2014_5k_test_image_text_retrieval": "The option to DataComp's own source (entry wds-mscoco, "
    "nlphuji/mscoco_2014_5k_test_image_text_retrieval, Karpathy's 5k test): CLIP_benchmark's shards of the same split, "
    "whose images and captions were not compared with it (docs/protocols.md).",
}
UNSUPPORTED: dict[str, str] = {}  # task key -> why its entry cannot be prepared (every task can be, today)
# WinoGAViL's Parquet files: the hub's Parquet conversion of nlphuji/winogavil (branch refs/convert/parquet, config
# `default`), an assumption written offline: check the repository's file list and pin `revision` to the branch's
# commit and `sha256` to the files' LFS oids (docs/datasets.md, "WinoGAViL")
WINOGAVIL = {"repo": "nlphuji/winogavil", "revision": "refs%2Fconvert%2Fparquet",
             "files": ["default/test/0000.parquet"]}
REVISION = {}  # task key -> the repository's commit (unknown offline: `main`)
SHA256 = {}  # task key -> {"test/<i>.tar": sha256} (unknown offline: the hub's declared hashes, hub.lock)


def shards_slug(key: str) -> str:
    """The entry of a retrieval task's webdataset option (CLIP_benchmark's shards)."""
    return slug(key) + "-shards"


def slug(key: str) -> str:
    short = {"retrieval/flickr_1k_test_image_text_retrieval": "flickr30k",
             "retrieval/mscoco_2014_5k_test_image_text_retrieval": "mscoco",
             "misc/winogavil": "winogavil"}
    return "wds-" + short.get(key, key.removeprefix("fairness/").replace("/", "-"))


def repo(key: str) -> str:
    if key in HF_CAPTIONS:
        return HF_CAPTIONS[key]["repo"]
    if key == "misc/winogavil":
        return WINOGAVIL["repo"]
    if key in UNSUPPORTED:
        return "nlphuji/" + key.split("/", 1)[1]
    return f"djghosh/wds_{key.removeprefix('fairness/').replace('/', '-')}_test"


def input_file(key: str) -> str:
    if key in HF_CAPTIONS:
        return "vlbench/datasets/hf_captions.py"
    return "vlbench/datasets/winogavil.py" if key == "misc/winogavil" else "vlbench/datasets/wds.py"


def winogavil_entry(key: str, name: str, size: int, main_metric: str) -> dict:
    """WinoGAViL's Parquet files (`source: winogavil`); its class prompts are the cues as DataComp words them."""
    prepare = {"source": "winogavil", "task": key, "datacomp": {"name": name, "main_metric": main_metric},
               "repo": WINOGAVIL["repo"], "revision": REVISION.get(key, WINOGAVIL["revision"]), "split": "test",
               "files": WINOGAVIL["files"], "metric": METRICS[main_metric], "size": size, "sha256": SHA256.get(key, {})}
    return {"prepare": prepare, "input": input_file(key), "texts": {"templates": ["{c}"]}}


def captions_entry(key: str, name: str, size: int, main_metric: str) -> dict:
    """Flickr's or MSCOCO's Parquet files from DataComp's own source (`source: hf_captions`)."""
    prepare = {"source": "hf_captions", "task": key, "datacomp": {"name": name, "main_metric": main_metric},
               "repo": repo(key), "revision": REVISION.get(key, HF_REVISION), "split": "test",
               "files": HF_CAPTIONS[key]["files"], "metric": METRICS[main_metric], "size": size,
               "captions": HF_CAPTIONS[key]["captions"], "sha256": SHA256.get(key, {})}
    return {"prepare": prepare, "input": input_file(key), "texts": {"templates": ["{c}"], "caption_prompt": "{c}"}}


def entry(key: str, name: str, size: int, classes: int | None, main_metric: str | None, shards: bool = False) -> dict:
    """The entry of a task; `shards`: a retrieval task's webdataset option (CLIP_benchmark's shards)."""
    if key == "misc/winogavil":
        return winogavil_entry(key, name, size, main_metric)
    if key in HF_CAPTIONS and not shards:
        return captions_entry(key, name, size, main_metric)
    retrieval = key in RETRIEVAL_REPOS
    prepare = {"source": "wds", "task": key, "datacomp": {"name": name, "main_metric": main_metric},
               "repo": RETRIEVAL_REPOS[key] if retrieval else repo(key), "revision": REVISION.get(key, "main"),
               "split": "test", "kind": "retrieval" if retrieval else "classification",
               "metric": METRICS[main_metric] if main_metric else "accuracy",
               "size": size, "classes": classes, "sha256": {} if retrieval else SHA256.get(key, {})}
    if key in GROUPS:
        prepare["group"] = GROUPS[key]
    if key in OBJECTIVES:
        prepare["objectives"] = OBJECTIVES[key]
    if key in UNSUPPORTED:
        prepare["unsupported"] = UNSUPPORTED[key]
    texts = {"templates": ["{c}"], "caption_prompt": "{c}"} if retrieval else {"templates": "prepared"}
    return {"prepare": prepare, "input": "vlbench/datasets/wds.py", "texts": texts}


def header(key: str, name: str, size: int, main_metric: str | None, shards: bool = False) -> str:
    lines = [f"DataComp task {key} ({name}): tasklist.yml test size {size:,}, main metric "
             f"{main_metric or 'none (not in the average)'}."]
    if shards:
        lines += [f"Shards: huggingface.co/datasets/{RETRIEVAL_REPOS[key]}.", NOTES[key]]
    elif key in HF_CAPTIONS:
        lines += [f"Parquet files: huggingface.co/datasets/{repo(key)} (DataComp's own source, "
                  f"eval_utils/retr_eval.py; the hub's Parquet conversion), {HF_CAPTIONS[key]['captions']:,} "
                  f"captions; the option {shards_slug(key)} reads CLIP_benchmark's shards."]
    else:
        lines += [f"{'Parquet files' if key == 'misc/winogavil' else 'Shards'}: huggingface.co/datasets/{repo(key)}."]
    lines += [f"Each face: classes and templates '<objective>:<text>' (race, gender, age, toxic), its .npy "
              f"{OBJECTIVES[key]['metadata']}; scored zero-shot per objective with DataComp's fairness metrics "
              f"(eval_utils/fairness_eval.py, docs/protocols.md)."] if key in OBJECTIVES else []
    lines += [UNSUPPORTED[key]] if key in UNSUPPORTED else []
    lines.append("generated by tools/datacomp_conf.py; do not edit by hand.")
    return "".join(f"# {line}\n" for line in lines)


def suite(slug_: str, keys: list[str], comment: str, analyses: dict[str, list[str]]) -> str:
    body = {"datasets": {slug(k): input_file(k) for k in keys}, "slug": slug_, **analyses}
    return comment + yaml.safe_dump(body, sort_keys=False, width=120)


def main() -> None:
    assert [row[1] for row in TABLE] == list(DATACOMP_TASKS), "the table's tasks are DataComp's 38"
    for key, name, size, classes, metric in TABLE:
        (ROOT / "conf/dataset" / f"{slug(key)}.yaml").write_text(
            header(key, name, size, metric) + yaml.safe_dump(entry(key, name, size, classes, metric), sort_keys=False,
                                                             width=120))
        if key in RETRIEVAL_REPOS:
            (ROOT / "conf/dataset" / f"{shards_slug(key)}.yaml").write_text(
                header(key, name, size, metric, shards=True)
                + yaml.safe_dump(entry(key, name, size, classes, metric, shards=True), sort_keys=False, width=120))
    for key, name, size in FAIRNESS:
        (ROOT / "conf/dataset" / f"{slug(key)}.yaml").write_text(
            header(key, name, size, None) + yaml.safe_dump(entry(key, name, size, None, None), sort_keys=False,
                                                           width=120))
    runnable = [k for k, *_ in TABLE if k not in UNSUPPORTED]
    classify = [slug(k) for k in runnable if k not in RETRIEVAL_REPOS]
    (ROOT / "conf/suite/datacomp.yaml").write_text(suite("datacomp", [k for k, *_ in TABLE], (
        "# DataComp's 38 zero-shot tasks (Gadre et al. 2023; mlfoundations/datacomp tasklist.yml) on the data its\n"
        "# evaluation reads (docs/datasets.md \"DataComp's 38 tasks\"): the webdataset shards (source wds);\n"
        "# Flickr and MSCOCO from its Hugging Face datasets' Parquet files (source hf_captions; CLIP_benchmark's\n"
        "# shards are the option wds-flickr30k-shards and wds-mscoco-shards); WinoGAViL from its Parquet files.\n"
        "# Each is scored by its main metric (the entry's `metric`; Flickr and MSCOCO by the retrieval analysis,\n"
        "# mean of i2t and t2i Recall@1; WinoGAViL by the zero-shot analysis' Jaccard).\n"
        "# dvc exp run -S suite=datacomp -S model=vitb32\n"
        "# generated by tools/datacomp_conf.py; do not edit by hand.\n"),
        {"embed": classify + [slug(k) for k in RETRIEVAL_REPOS], "zeroshot": classify,
         "retrieval": [slug(k) for k in RETRIEVAL_REPOS]}))
    fair = [k for k, *_ in FAIRNESS]
    (ROOT / "conf/suite/datacomp-fairness.yaml").write_text(suite("datacomp-fairness", fair, (
        "# DataComp's fairness extras FairFace and UTKFace (not part of the DataComp average): each face's race,\n"
        "# gender, age and toxic objectives scored zero-shot over their own classes, with DataComp's fairness\n"
        "# tables' numbers per group (eval_utils/fairness_eval.py; docs/protocols.md).\n"
        "# dvc exp run -S suite=datacomp-fairness -S model=vitb32\n"
        "# generated by tools/datacomp_conf.py; do not edit by hand.\n"),
        {"embed": [slug(k) for k in fair], "zeroshot": [slug(k) for k in fair]}))


if __name__ == "__main__":
    main()
