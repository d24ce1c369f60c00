"""WordNet for class hierarchies and knowledge texts, found offline wherever it already is.

`load_wordnet()` returns an NLTK `WordNetCorpusReader`, trying in order:

1. NLTK's own data (`corpora/wordnet` or `corpora/wordnet.zip` on `nltk.data.path`);
2. Debian's `wordnet-base` files (`/usr/share/wordnet`, or the `wordnet_dir` argument, or the
   `VLBENCH_WORDNET_DIR` environment variable), copied into a cache dir that NLTK is allowed to read;
3. `nltk.download('wordnet')`, at most once per process;

and raises `WordNetMissing`, saying what was tried and how to fix it, if all fail.

Debian's files need three work-arounds for NLTK >= 3.9: NLTK refuses corpus roots outside
`nltk.data.path` (and symlinks escaping them), so the regular files are copied into
`$VLBENCH_CACHE/wordnet/debian-<hash>` (default cache `~/.cache/vlbench`) which is appended to
`nltk.data.path`; Debian has no `lexnames` file, so it is generated; and the reader's constructor maps
offsets against NLTK's own WordNet (`map_wn`), which is not there, so that mapping is disabled.
"""

from __future__ import annotations

import functools
import hashlib
import os
import re
import shutil
import tempfile
import warnings
from collections import deque
from pathlib import Path

import nltk
from nltk.corpus.reader.wordnet import Synset, WordNetCorpusReader
from nltk.data import FileSystemPathPointer, ZipFilePathPointer

from vlbench.errors import VlbenchError
from vlbench.io import user_cache_dir

DEBIAN_DIR = "/usr/share/wordnet"
ENV_DIR = "VLBENCH_WORDNET_DIR"
FIX_HINT = "install it with `apt-get install wordnet-base` or `python -m nltk.downloader wordnet`"

# lexnames(5WN): the 45 lexicographer files, "<number>\t<name>\t<syntactic category>".
LEXNAMES = (
    "adj.all adj.pert adv.all noun.Tops noun.act noun.animal noun.artifact noun.attribute noun.body "
    "noun.cognition noun.communication noun.event noun.feeling noun.food noun.group noun.location "
    "noun.motive noun.object noun.person noun.phenomenon noun.plant noun.possession noun.process "
    "noun.quantity noun.relation noun.shape noun.state noun.substance noun.time verb.body verb.change "
    "verb.cognition verb.communication verb.competition verb.consumption verb.contact verb.creation "
    "verb.emotion verb.motion verb.perception verb.possession verb.social verb.stative verb.weather "
    "adj.ppl"
).split()
_LEX_CATEGORY = {"noun": 1, "verb": 2, "adj": 3, "adv": 4}
# Files without which the reader cannot be built from a directory.
REQUIRED_FILES = ("data.noun", "index.noun", "data.verb", "index.verb", "data.adj", "index.adj",
                  "data.adv", "index.adv")
WNID_RE = re.compile(r"^([nvasr])(\d{8})$")

_download_attempted = False


class WordNetMissing(VlbenchError):
    """No WordNet could be found or obtained; the message lists what was tried and the fix."""


class WnidError(LookupError):
    """A WordNet id (`n13873502`) is malformed or names no synset."""


class OfflineWordNetCorpusReader(WordNetCorpusReader):
    """A reader that does not map its offsets to NLTK's own WordNet (which may not be installed)."""

    def map_wn(self, version="wordnet"):
        return None


def lexnames_text() -> str:
    return "".join(f"{i:02d}\t{name}\t{_LEX_CATEGORY[name.split('.')[0]]}\n" for i, name in enumerate(LEXNAMES))


def default_cache_dir() -> Path:
    return user_cache_dir() / "wordnet"


def load_wordnet(
    wordnet_dir: str | os.PathLike | None = None,
    *,
    use_nltk_data: bool = True,
    download: bool = True,
    cache_dir: str | os.PathLike | None = None,
) -> WordNetCorpusReader:
    """Return a WordNet reader (cached per root); see the module docstring for the search order.

    `wordnet_dir` (else `$VLBENCH_WORDNET_DIR`, else `/usr/share/wordnet`) is a directory of WordNet
    3.0 database files in the Princeton layout; `cache_dir` is where they are copied for NLTK.
    """
    tried = []
    if use_nltk_data:
        root = _nltk_root()
        if root is not None:
            return _open_reader(root)
        tried.append(f"NLTK data: no corpora/wordnet on nltk.data.path {list(map(str, nltk.data.path))}")

    source = Path(wordnet_dir or os.environ.get(ENV_DIR) or DEBIAN_DIR)
    missing = [f for f in REQUIRED_FILES if not (source / f).is_file()]
    if not missing:
        root = _copy_to_cache(source, Path(cache_dir) if cache_dir else default_cache_dir())
        return _open_reader(root)
    tried.append(f"WordNet files in {source}: missing {', '.join(missing)}")

    global _download_attempted
    if download and not _download_attempted:
        _download_attempted = True
        try:
            ok = nltk.download("wordnet", quiet=True, raise_on_error=False)
        except Exception as err:  # network errors surface in many shapes
            ok = False
            tried.append(f"nltk.download('wordnet'): {type(err).__name__}: {err}")
        else:
            if not ok:
                tried.append("nltk.download('wordnet'): failed (offline?)")
        root = _nltk_root() if ok else None
        if root is not None:
            return _open_reader(root)
    elif download:
        tried.append("nltk.download('wordnet'): already failed once in this process")
    else:
        tried.append("nltk.download('wordnet'): disabled")

    raise WordNetMissing(
        "WordNet not found. Tried:\n  - " + "\n  - ".join(tried)
        + f"\nFix: {FIX_HINT}; or point ${ENV_DIR} at a directory of WordNet 3.0 database files."
    )


def _nltk_root() -> str | None:
    """NLTK's own WordNet, unpacked or zipped (as `LazyCorpusLoader` looks for it), as a root string."""
    for resource in ("corpora/wordnet", "corpora/wordnet.zip/wordnet/"):
        try:
            pointer = nltk.data.find(resource)
        except LookupError:
            continue
        if isinstance(pointer, ZipFilePathPointer):
            return f"{pointer.zipfile.filename}/{pointer.entry}"
        if isinstance(pointer, FileSystemPathPointer):
            return str(pointer.path)
    return None


def _fingerprint(source: Path) -> str:
    digest = hashlib.sha256(str(source.resolve()).encode())
    for entry in sorted(source.iterdir()):
        if entry.is_file():
            st = entry.stat()
            digest.update(f"{entry.name}:{st.st_size}:{st.st_mtime_ns}".encode())
    return digest.hexdigest()[:12]


def _copy_to_cache(source: Path, cache_dir: Path) -> str:
    """Copy the regular files of `source` (contents, never links) into the cache, atomically."""
    target = cache_dir / f"debian-{_fingerprint(source)}"
    if not (target / "lexnames").is_file():
        cache_dir.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=".wordnet.", suffix=".tmp", dir=cache_dir))
        try:
            os.chmod(tmp, 0o755)
            for entry in sorted(source.iterdir()):
                if entry.is_file():  # follows a link, so a linked file is copied as content
                    shutil.copyfile(entry, tmp / entry.name)
            if not (tmp / "lexnames").is_file():
                (tmp / "lexnames").write_text(lexnames_text())
            try:
                os.replace(tmp, target)
            except OSError:
                if not (target / "lexnames").is_file():  # not a concurrent writer winning the race
                    raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    root = str(target.resolve())
    if root not in nltk.data.path:
        nltk.data.path.append(root)
    return root


@functools.lru_cache(maxsize=None)
def _open_reader(root: str) -> WordNetCorpusReader:
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The multilingual functions")
        return OfflineWordNetCorpusReader(root, None)


def wnid_of(synset: Synset) -> str:
    """The ImageNet-style id of a synset: its POS letter and 8-digit offset, e.g. `n13873502`."""
    return f"{synset.pos()}{synset.offset():08d}"


def synset_from_wnid(wn: WordNetCorpusReader, wnid: str) -> Synset:
    match = WNID_RE.match(str(wnid))
    if not match:
        raise WnidError(f"malformed WordNet id {wnid!r}: expected a POS letter and 8 digits, e.g. 'n13873502'")
    pos, offset = match.group(1), int(match.group(2))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            synset = wn.synset_from_pos_and_offset(pos, offset)
        except Exception as err:
            raise WnidError(f"WordNet id {wnid!r} names no synset ({err})") from err
    if synset is None:
        raise WnidError(f"WordNet id {wnid!r} names no synset: no entry at offset {offset} of data.{_FILE[pos]}")
    return synset


_FILE = {"n": "noun", "v": "verb", "a": "adj", "s": "adj", "r": "adv"}


def hypernym_closure(synset: Synset, include_instances: bool = True) -> list[Synset]:
    """All ancestors of `synset` (not itself), nearest first, each once; all paths to the root."""
    seen = {synset}
    order = []
    queue = deque([synset])
    while queue:
        current = queue.popleft()
        parents = current.hypernyms() + (current.instance_hypernyms() if include_instances else [])
        for parent in parents:
            if parent not in seen:
                seen.add(parent)
                order.append(parent)
                queue.append(parent)
    return order
