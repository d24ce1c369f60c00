import shutil
import zipfile
from pathlib import Path

import nltk
import pytest

from vlbench import wordnet as W
from vlbench.wordnet import (
    LEXNAMES,
    WnidError,
    WordNetMissing,
    hypernym_closure,
    load_wordnet,
    synset_from_wnid,
    wnid_of,
)

DEBIAN = Path(W.DEBIAN_DIR)


@pytest.fixture(scope="module")
def wn(tmp_path_factory):
    try:
        return load_wordnet(download=False, cache_dir=tmp_path_factory.mktemp("cache"))
    except WordNetMissing as err:
        pytest.skip(f"no WordNet on this machine: {err}")


def test_circle_lookup(wn):
    circle = wn.synset("circle.n.01")
    assert wnid_of(circle) == "n13873502"
    assert synset_from_wnid(wn, "n13873502") == circle
    assert circle.lexname() == "noun.shape"  # needs the lexnames file Debian lacks


def test_hypernym_closure(wn):
    names = [s.name() for s in hypernym_closure(wn.synset("circle.n.01"))]
    assert names[0] == "ellipse.n.01"
    assert {"plane_figure.n.01", "figure.n.06", "shape.n.02", "entity.n.01"} <= set(names)
    assert len(names) == len(set(names))
    # square has two hypernym paths: both are in the closure
    square = {s.name() for s in hypernym_closure(wn.synset("square.n.01"))}
    assert {"regular_polygon.n.01", "rectangle.n.01", "polygon.n.01"} <= square


@pytest.mark.parametrize("wnid", ["x13873502", "n1387350", "circle", "", "n99999999", "n00000001"])
def test_bad_wnid(wn, wnid):
    with pytest.raises(WnidError, match="WordNet id"):
        synset_from_wnid(wn, wnid)


def test_lexnames_standard():
    text = W.lexnames_text().splitlines()
    assert len(LEXNAMES) == 45
    assert text[0] == "00\tadj.all\t3" and text[25] == "25\tnoun.shape\t1" and text[44] == "44\tadj.ppl\t3"


def test_missing_everything(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(WordNetMissing) as info:
        load_wordnet(empty, use_nltk_data=False, download=False, cache_dir=tmp_path / "cache")
    message = str(info.value)
    assert str(empty) in message and "disabled" in message
    assert "apt-get install wordnet-base" in message and "nltk.downloader wordnet" in message


def test_download_tried_once(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(nltk, "download", lambda *a, **k: calls.append(a) or False)
    monkeypatch.setattr(W, "_download_attempted", False)
    for _ in range(2):
        with pytest.raises(WordNetMissing, match="download"):
            load_wordnet(tmp_path, use_nltk_data=False, download=True, cache_dir=tmp_path / "cache")
    assert calls == [("wordnet",)]


def test_env_dir_and_symlinks(tmp_path, monkeypatch):
    """Debian-style files reached through links that leave the dir are copied as regular files."""
    if not (DEBIAN / "data.noun").is_file():
        pytest.skip("Debian wordnet-base is not installed")
    linked = tmp_path / "linked"
    linked.mkdir()
    for f in DEBIAN.iterdir():
        if f.is_file():
            (linked / f.name).symlink_to(f)
    monkeypatch.setenv(W.ENV_DIR, str(linked))
    wn = load_wordnet(use_nltk_data=False, download=False, cache_dir=tmp_path / "cache")
    copies = list((tmp_path / "cache").glob("debian-*"))
    assert len(copies) == 1 and not any(p.is_symlink() for p in copies[0].iterdir())
    assert (copies[0] / "lexnames").is_file()
    assert synset_from_wnid(wn, "n13873502").name() == "circle.n.01"
    # a second load reuses the copy and the reader
    assert load_wordnet(use_nltk_data=False, download=False, cache_dir=tmp_path / "cache") is wn


@pytest.mark.parametrize("zipped", [False, True])
def test_nltk_data_first(tmp_path, monkeypatch, zipped):
    """NLTK's layout (corpora/wordnet or corpora/wordnet.zip) is preferred over Debian's files."""
    if not (DEBIAN / "data.noun").is_file():
        pytest.skip("Debian wordnet-base is not installed")
    data = tmp_path / "nltk_data"
    corpus = data / "corpora" / "wordnet"
    corpus.mkdir(parents=True)
    for f in DEBIAN.iterdir():
        if f.is_file():
            shutil.copyfile(f, corpus / f.name)
    (corpus / "lexnames").write_text(W.lexnames_text())
    if zipped:
        with zipfile.ZipFile(data / "corpora" / "wordnet.zip", "w") as z:
            for f in sorted(corpus.iterdir()):
                z.write(f, f"wordnet/{f.name}")
        shutil.rmtree(corpus)
    monkeypatch.setattr(nltk.data, "path", [str(data)])
    wn = load_wordnet(tmp_path / "not-there", download=False)
    assert str(data) in str(wn.root) and ("wordnet.zip" in str(wn.root)) == zipped
    assert wnid_of(wn.synset("circle.n.01")) == "n13873502"
