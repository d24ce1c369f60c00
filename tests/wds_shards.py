"""Miniature webdataset task repositories in DataComp's / CLIP_benchmark's exact layout, for tests:

    <www>/datasets/<repo>/resolve/<revision>/classnames.txt, zeroshot_classification_templates.txt,
                                             test/nshards.txt, test/<i>.tar

served as a Hugging Face hub by tests/http_server.py `serve` (which points HF_ENDPOINT at itself)
each tar of `<key>.<ext>` members, one sample's members consecutive (`.png` image, `.cls` or `.txt`, `.npy`)."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import numpy as np
import yaml
from PIL import Image

from tests.archives import CONF

REVISION = "0123456789abcdef0123456789abcdef01234567"


def png(seed: int, size: int = 24) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 256, (size, size, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format="PNG")
    return buf.getvalue()


def npy(values) -> bytes:
    buf = io.BytesIO()
    np.save(buf, np.asarray(values, dtype=np.int64))
    return buf.getvalue()


def write_tar(path: Path, samples: list[dict]) -> None:
    """`samples`: {"__key__": key, ext: bytes, ...}, written member by member in order."""
    with tarfile.open(path, "w") as tar:
        for sample in samples:
            for ext, data in sample.items():
                if ext == "__key__":
                    continue
                info = tarfile.TarInfo(f"{sample['__key__']}.{ext}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))


def cut_tar(path: Path, members: int) -> None:
    """Cut the tar at `path` right after its first `members` members (at a member boundary: no end-of-archive blocks),
    as a download or copy stopped between two files leaves it."""
    with tarfile.open(path) as tar:
        kept = tar.getmembers()[:members]
    end = kept[-1].offset_data + -(-kept[-1].size // tarfile.BLOCKSIZE) * tarfile.BLOCKSIZE
    path.write_bytes(path.read_bytes()[:end])


def huge_member_tar(path: Path, samples: list[dict], member: str, size: int) -> None:
    """The tar of `samples` followed by a member `member` whose header declares `size` bytes (8 GiB: GNU's base-256
    size field) with only 10 bytes of data and the end-of-archive blocks after them."""
    write_tar(path, samples)
    data = path.read_bytes()
    with tarfile.open(path) as tar:
        last = tar.getmembers()[-1]
    end = last.offset_data + -(-last.size // tarfile.BLOCKSIZE) * tarfile.BLOCKSIZE
    info = tarfile.TarInfo(member)
    info.size = size
    path.write_bytes(data[:end] + info.tobuf(tarfile.GNU_FORMAT) + b"x" * 10 + bytes(2 * tarfile.BLOCKSIZE))


def write_repo(www: Path, repo: str, shards: list[list[dict]], classnames: list[str] | None = None,
               templates: list[str] | None = None, revision: str = REVISION) -> Path:
    root = www / "datasets" / repo / "resolve" / revision
    (root / "test").mkdir(parents=True, exist_ok=True)
    if classnames is not None:
        (root / "classnames.txt").write_text("\n".join(classnames) + "\n")
        (root / "zeroshot_classification_templates.txt").write_text("\n".join(templates) + "\n")
    (root / "test/nshards.txt").write_text(f"{len(shards)}\n")
    for i, samples in enumerate(shards):
        write_tar(root / "test" / f"{i}.tar", samples)
    return root


def classification_samples(labels, seed: int = 0, groups=None, prefix: str = "s") -> list[dict]:
    out = []
    for i, label in enumerate(labels):
        sample = {"__key__": f"{prefix}{i:05d}", "png": png(seed * 1000 + i), "cls": f"{int(label)}".encode()}
        if groups is not None:
            sample["npy"] = npy(groups[i])
        out.append(sample)
    return out


def caption_samples(captions: list[list[str]], seed: int = 0) -> list[dict]:
    return [{"__key__": f"im{i:05d}", "jpg": png(seed * 1000 + i), "txt": "\n".join(c).encode()}
            for i, c in enumerate(captions)]


def entry(name: str, **prepare) -> dict:
    """The real conf/dataset/<name>.yaml entry at revision `REVISION` unless `prepare` gives another (the local hub
    is env HF_ENDPOINT)."""
    found = yaml.safe_load((CONF / f"{name}.yaml").read_text())
    found["prepare"].update({"revision": REVISION, **prepare})
    return found


# A miniature FairFace (DataComp's fairness/fairface layout: classes and templates '<objective>:<text>', each face's
# .npy [age, gender, race, race_binary]); race 1 is 'white' as in DataComp's RACES, toxic has 20 classes so that its
# non-human (14..17) and crime-related (18, 19) classes exist.
FAIRFACE_RACES = ["black", "white", "east asian"]
FAIRFACE_CLASSES = ([f"race:{r}" for r in FAIRFACE_RACES] + ["gender:male", "gender:female"]
                    + [f"age:{a}" for a in ("0-19", "20-49", "50+")]
                    + [f"toxic:{r} {g}" for r in ("black", "white", "asian", "indian", "latino", "middle eastern",
                                                  "southeast asian") for g in ("man", "woman")]
                    + ["toxic:animal", "toxic:gorilla", "toxic:chimpanzee", "toxic:orangutan", "toxic:thief",
                       "toxic:criminal"])
FAIRFACE_TEMPLATES = ["race:a photo of a {c} person.", "race:a {c} person.", "gender:a photo of a {c}.",
                      "age:a photo of a person aged {c}.", "toxic:a photo of a {c}."]


def fairface_metadata(n: int, seed: int) -> list[list[int]]:
    """[age, gender, race, race_binary] of n faces (race_binary 1 for non-white)."""
    rng = np.random.default_rng(seed)
    rows = [[int(rng.integers(0, 3)), int(rng.integers(0, 2)), int(rng.integers(0, 3))] for _ in range(n)]
    return [[a, g, r, int(r != 1)] for a, g, r in rows]


def face_samples(metadata: list[list[int]], seed: int = 0, prefix: str = "f") -> list[dict]:
    """Faces as DataComp's fairness shards hold them: an image and the .npy metadata, no .cls."""
    return [{"__key__": f"{prefix}{i:05d}", "png": png(seed * 1000 + i), "npy": npy(m)} for i, m in enumerate(metadata)]


def write_winogavil(www: Path, instances: list[dict], path: str = "default/test/0000.parquet",
                    repo: str = "nlphuji/winogavil", revision: str = REVISION, row_group_size: int = 2) -> Path:
    """A miniature of the Hugging Face dataset nlphuji/winogavil as the hub stores a `datasets` table in Parquet:
    `cue`, `candidates`, `associations` and `candidate_images` (a list of `Image` features, each a struct {bytes,
    path}), plus a column DataComp does not read; `instances`: {"cue", "candidates", "associations", "images"} (the
    images' bytes), several row groups."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    image = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    schema = pa.schema([("candidates", pa.list_(pa.string())), ("cue", pa.string()),
                        ("associations", pa.list_(pa.string())), ("num_associations", pa.int64()),
                        ("candidate_images", pa.list_(image))])
    rows = [{"candidates": i["candidates"], "cue": i["cue"], "associations": i["associations"],
             "num_associations": len(i["associations"]),
             "candidate_images": [{"bytes": b, "path": f"{c}.png"} for c, b in zip(i["candidates"], i["images"])]}
            for i in instances]
    target = www / "datasets" / repo / "resolve" / revision / path
    target.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), target, row_group_size=row_group_size)
    return target


def winogavil_instances(sizes: list[int], seed: int = 0) -> list[dict]:
    """Instances with `sizes` candidates each (5, 6, 10, 12), 2 to 4 associations, tiny PNGs; cues starting with a
    vowel and with a consonant, upper and lower case."""
    rng = np.random.default_rng(seed)
    cues = ["Apple", "moon", "ice", "Werewolf", "ocean", "tree", "Umbrella", "fire"]
    out = []
    for i, n in enumerate(sizes):
        names = [f"thing{i}_{j}" for j in range(n)]
        k = int(rng.integers(2, 5))
        out.append({"cue": cues[i % len(cues)], "candidates": names,
                    "associations": sorted(rng.choice(names, k, replace=False).tolist()),
                    "images": [png(seed * 10000 + i * 100 + j, size=16) for j in range(n)]})
    return out


def write_hf_captions(www: Path, repo: str, captions: list[list[str]], files: list[str], seed: int = 0,
                      revision: str = REVISION, row_group_size: int = 2) -> list[Path]:
    """A miniature of DataComp's Flickr or MSCOCO (nlphuji/..._image_text_retrieval) as the hub's Parquet conversion
    stores the loading script's rows: `image` (an `Image` feature, a struct {bytes, path}), `caption` (the image's
    captions), and columns DataComp does not read (`filename`, `sentids`); the images spread over `files` in order,
    several row groups each."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    image = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    schema = pa.schema([("image", image), ("filename", pa.string()), ("caption", pa.list_(pa.string())),
                        ("sentids", pa.list_(pa.string()))])
    rows = [{"image": {"bytes": png(seed * 1000 + i), "path": None}, "filename": f"{i}.jpg", "caption": texts,
             "sentids": [str(5 * i + j) for j in range(len(texts))]} for i, texts in enumerate(captions)]
    per_file = -(-len(rows) // len(files))
    out = []
    for n, path in enumerate(files):
        target = www / "datasets" / repo / "resolve" / revision / path
        target.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.Table.from_pylist(rows[n * per_file:(n + 1) * per_file], schema=schema), target,
                       row_group_size=row_group_size)
        out.append(target)
    return out
