"""A copy of this repository configured for fast end-to-end DVC runs: a smoke suite and few-step toy models."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent

def synthetic_entry(task: str, splits: dict, templates: list[str]) -> dict:
    """A registry entry of a synthetic dataset, defined inline in the smoke suite (its input is the generator)."""
    return {"prepare": {"source": "synthetic", "task": task, "seed": 0, "image_size": 32, "splits": splits},
            "input": "vlbench/datasets/synthetic.py", "texts": {"templates": templates}}


SMOKE_SUITE = {
    "slug": "smoke",
    "datasets": {
        "shapes": synthetic_entry("shapes", {"train": 48, "val": 24, "test": 36}, ["a {c}.", "a drawing of a {c}."]),
        "hierarchy": synthetic_entry("hierarchy", {"test": 30}, ["a {c}."]),
    },
    "embed": ["shapes", "hierarchy"],
    "zeroshot": ["shapes", "hierarchy"],
    "linear_probe": ["shapes"],
}


def smoke_model(slug: str, arch: str) -> dict:
    train = {"corpus": {"source": "synthetic", "task": "corpus", "seed": 1, "image_size": 32, "splits": {"train": 96}},
             "steps": 3, "batch_size": 16, "lr": 0.001, "weight_decay": 0.1, "warmup_steps": 1, "seed": 0}
    return {"slug": slug, "arch": arch, "pretrained": f"data/models/{slug}/checkpoint.pt",
            "weights_file": f"data/models/{slug}/checkpoint.pt", "precision": "fp32", "pretrain": [slug], "train": train}


def write_suite(repo: Path, suite: dict, name: str | None = None) -> None:
    """conf/suite/<name>.yaml from a suite whose `datasets` may hold whole entries (as these tests write them): each
    such entry goes to conf/dataset/<dataset>.yaml and the suite names its input, as a suite file does."""
    suite = {**suite, "datasets": dict(suite.get("datasets") or {})}
    for dataset, entry in suite["datasets"].items():
        if isinstance(entry, dict):
            (repo / "conf/dataset" / f"{dataset}.yaml").write_text(yaml.safe_dump(entry))
            suite["datasets"][dataset] = entry["input"]
    (repo / "conf/suite" / f"{name or suite['slug']}.yaml").write_text(yaml.safe_dump(suite))


def read_suite(repo: Path, name: str) -> dict:
    """conf/suite/<name>.yaml with each dataset's entry (conf/dataset/<dataset>.yaml) in place of its input."""
    suite = yaml.safe_load((repo / "conf/suite" / f"{name}.yaml").read_text())
    suite["datasets"] = {d: yaml.safe_load((repo / "conf/dataset" / f"{d}.yaml").read_text()) for d in suite["datasets"]}
    return suite


def run(cwd: Path, *args: str, check: bool = True, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run a command with this interpreter's bin first on PATH (so `dvc` and `python` are the venv's)."""
    full_env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
                "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
                "GIT_COMMITTER_EMAIL": "t@t", **(env or {})}
    proc = subprocess.run(list(args), cwd=cwd, env=full_env, capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise AssertionError(f"{' '.join(args)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc


def copy_repo(src: Path, dest: Path) -> Path:
    """A copy of a test repository made by make_repo, with its git history, DVC cache and outputs: new files
    throughout (no hard link), so whatever a test does in `dest` never reaches `src` or another copy."""
    shutil.copytree(src, dest, symlinks=True)
    return dest


def tree_state(root: Path) -> dict[str, tuple[int, int]]:
    """(size, mtime in ns) of every file under `root`: equal states mean no file was written in between."""
    state = {}
    for folder, _, names in os.walk(root):
        for name in names:
            path = os.path.join(folder, name)
            info = os.lstat(path)
            state[os.path.relpath(path, root)] = (info.st_size, info.st_mtime_ns)
    return state


def make_repo(dest: Path) -> Path:
    """Copy the tracked (and untracked, not ignored) files to `dest`, configure the smoke suite and toy-smoke
    model as defaults, compose params.yaml and commit everything in a fresh git repository."""
    files = run(ROOT, "git", "ls-files", "--cached", "--others", "--exclude-standard").stdout.split()
    for name in files:
        if (ROOT / name).is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, dest / name)
    write_suite(dest, SMOKE_SUITE)
    (dest / "conf/model/toy-smoke.yaml").write_text(yaml.safe_dump(smoke_model("toy-smoke", "vlbench-toy")))
    (dest / "conf/model/toy-wide-smoke.yaml").write_text(yaml.safe_dump(smoke_model("toy-wide-smoke", "vlbench-toy-wide")))
    config = (dest / "conf/config.yaml").read_text().replace("model: toy\n", "model: toy-smoke\n").replace("suite: demo\n", "suite: smoke\n")
    (dest / "conf/config.yaml").write_text(config)
    run(dest, sys.executable, "-m", "vlbench.cli", "compose")
    run(dest, "git", "init", "-q")
    run(dest, "git", "add", "-A")
    run(dest, "git", "commit", "-qm", "copy")
    return dest


def add_all(dest: Path) -> None:
    """`git add -A`, and the toy models' checkpoints and logs that .gitignore keeps out (only the demo's `toy` is
    kept in git): a team's repository here carries its smoke model as a clone of the project carries `toy`, so a
    teammate's clone and `dvc pull` find it (pretrain's outputs are uncached)."""
    run(dest, "git", "add", "-A")
    models = [str(p.relative_to(dest)) for p in sorted((dest / "data/models").glob("*/*"))
              if p.name in ("checkpoint.pt", "train_log.csv")] if (dest / "data/models").is_dir() else []
    if models:
        run(dest, "git", "add", "-f", *models)


def make_smoke_run(dest: Path) -> Path:
    """make_repo, then `dvc repro` of the smoke suite with the toy-smoke model, committed: the miniature demo run that
    tests share (tests/conftest.py, `smoke_run`)."""
    make_repo(dest)
    run(dest, sys.executable, "-m", "dvc", "repro")
    run(dest, "git", "add", "-A")
    run(dest, "git", "commit", "-qm", "toy-smoke results")
    return dest


# The demo suite's analyses at miniature sizes (the demo: conf/suite/demo.yaml)
FLOWS_SUITE = {
    "slug": "flows",
    "datasets": {**SMOKE_SUITE["datasets"],
                 "shapes_outline": synthetic_entry("shapes_outline", {"test": 24}, ["a {c}."])},
    "embed": ["shapes", "hierarchy", "captions", "compositional"],
    "embed_images": ["shapes", "hierarchy", "captions", "compositional", "shapes_outline"],  # outline: images only
    "zeroshot": ["shapes", "hierarchy"],  # hierarchy: multi-label (its predictions table has `labels`)
    "linear_probe": ["shapes"],
    "robustness": ["shapes_outline"],  # its predictions table: predicted_reference_class, correct
    "retrieval": ["captions"],
    "compositionality": ["compositional"],
    "adapt": ["shapes"],
}
# lines of conf/ files -> miniature settings (each line must be found once: a renamed setting fails here first)
MINIATURE = {
    "conf/config.yaml": {
        "  protocols: [elevater, vtab, fewtrans]": "  protocols: [elevater, fewtrans]",
        "suite: smoke\n": "suite: flows\n",
    },
    "conf/settings/adapt.yaml": {
        "  shots: [5, 20, 50, full]": "  shots: [2]",
        "  seeds: [0, 1, 2]": "  seeds: [0]",
        "  heads: [random_2p, language_2p, language_1p]": "  heads: [random_2p]",
        "  search_epochs: 10": "  search_epochs: 1",
        "  final_epochs: 50": "  final_epochs: 2",
        "  lr_grid: {log_lower: -6, log_upper: -1, num: 6}": "  lr_grid: {log_lower: -2, log_upper: -1, num: 2}",
        "  knowledge: [wiktionary, gpt3, wiktionary_gpt3]": "  knowledge: []",
        "  episodes: 600": "  episodes: 2",
        "    epochs: 80 ": "    epochs: 2 ",
        "    lr_factors: [0.04, 0.2, 1.0, 5.0, 25.0]": "    lr_factors: [1.0]",
    },
}


def dataset_entry(name: str, **prepare) -> dict:
    """conf/dataset/<name>.yaml of this repository with `prepare` settings replaced (smaller splits)."""
    entry = yaml.safe_load((ROOT / "conf/dataset" / f"{name}.yaml").read_text())
    entry["prepare"].update(prepare)
    return entry


def replace_lines(repo: Path, files: dict[str, dict[str, str]]) -> None:
    """In each of `files` (a path in `repo`: {line: its replacement}), each line, found exactly once, replaced."""
    for name, lines in files.items():
        text = (repo / name).read_text()
        for line, replacement in lines.items():
            assert text.count(line) == 1, f"{name}: {line!r} not found once"
            text = text.replace(line, replacement)
        (repo / name).write_text(text)


def make_flows_demo(repo: Path) -> Path:
    """The README flows' miniature demo in `repo`, a copy of the smoke run (its toy model, features and results are
    reused): FLOWS_SUITE and MINIATURE, `dvc repro`, committed (HEAD~1); then docs/pipeline.md's `dvc exp run -n a -S
    zeroshot.scoring=elevater`, applied and committed with the same setting in conf/ (HEAD). Shared by the README
    flows' modules (tests/conftest.py, `flows_demo`)."""
    suite = {**FLOWS_SUITE, "datasets": {**FLOWS_SUITE["datasets"],
                                         "captions": dataset_entry("captions", splits={"test": 24}),
                                         "compositional": dataset_entry("compositional", size=12)}}
    write_suite(repo, suite)
    replace_lines(repo, MINIATURE)
    config = (repo / "conf/config.yaml").read_text()
    dvc = (sys.executable, "-m", "dvc")
    run(repo, sys.executable, "-m", "vlbench.cli", "compose")
    run(repo, *dvc, "repro")
    run(repo, "git", "add", "-A")
    run(repo, "git", "commit", "-qm", "demo results")
    run(repo, *dvc, "exp", "run", "-n", "a", "-S", "zeroshot.scoring=elevater")
    run(repo, *dvc, "exp", "apply", "a")
    (repo / "conf/config.yaml").write_text(config.replace("  scoring: logits\n", "  scoring: elevater\n"))
    run(repo, sys.executable, "-m", "vlbench.cli", "compose")
    assert json.loads(run(repo, *dvc, "status", "--json").stdout) == {}
    run(repo, "git", "add", "-A")
    run(repo, "git", "commit", "-qm", "zeroshot.scoring: elevater")
    return repo
