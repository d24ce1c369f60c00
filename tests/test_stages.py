"""The shape of the pipeline: light stages, every imported module a declared dependency, one analysis table."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from vlbench.analyses import ANALYSES, load

ROOT = Path(__file__).resolve().parent.parent
MODEL_STAGES = ("embed_images", "embed_texts", "pretrain", "finetune")  # the only stages that run a model
STAGE_MODULES = sorted(p.stem for p in (ROOT / "stages").glob("*.py") if p.stem not in ("__init__", "common"))


def module_file(name: str) -> Path | None:
    """The file of a vlbench/stages module, or None for anything else (stdlib, third party)."""
    if name.split(".")[0] not in ("vlbench", "stages"):
        return None
    base = ROOT / Path(*name.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def imported_modules(path: Path) -> set[str]:
    """Every module `path` imports, at any depth of the file (function-level imports included)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def import_closure(start: list[Path]) -> set[Path]:
    """The project files reachable from `start` through imports (and each package's __init__ on the way)."""
    seen: set[Path] = set()
    todo = list(start)
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        seen.add(path)
        for name in imported_modules(path):
            parts = name.split(".")
            for i in range(1, len(parts) + 1):
                found = module_file(".".join(parts[:i]))
                if found and found not in seen:
                    todo.append(found)
    return seen


def stage_deps() -> dict[str, list[str]]:
    stages = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]
    return {name: (stage.get("do", stage)).get("deps", []) for name, stage in stages.items()}


def covered(path: Path, deps: list[str]) -> bool:
    rel = path.relative_to(ROOT).as_posix()
    return any(rel == d or rel.startswith(d.rstrip("/") + "/") for d in deps)


@pytest.mark.parametrize("stage", sorted(stage_deps()))
def test_every_imported_module_is_a_declared_dependency(stage):
    deps = stage_deps()[stage]
    if stage in ANALYSES:
        start = [ROOT / "stages/analysis.py", module_file(ANALYSES[stage].module)]
    else:
        start = [ROOT / "stages" / f"{stage}.py"]
    code = [p for p in import_closure(start) if p.read_text().strip()]  # an empty __init__.py changes nothing
    missing = sorted(p.relative_to(ROOT).as_posix() for p in code if not covered(p, deps))
    assert not missing, f"dvc.yaml stage {stage!r} imports {missing} but does not list them as deps"


@pytest.mark.parametrize("stage", [m for m in STAGE_MODULES if m not in MODEL_STAGES])
def test_stages_without_a_model_start_without_torch(stage):
    code = f"import sys, stages.{stage}; sys.exit(1 if 'torch' in sys.modules else 0)"
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, f"stages.{stage} imports torch at start-up\n{proc.stderr}"


@pytest.mark.parametrize("name", sorted(ANALYSES))
def test_analyses_never_import_torch_at_start_up(name):
    code = f"import sys, {ANALYSES[name].module}; sys.exit(1 if 'torch' in sys.modules else 0)"
    assert subprocess.run([sys.executable, "-c", code], cwd=ROOT).returncode == 0


def test_every_analysis_has_a_module_a_dvc_block_and_a_config_section():
    stages = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]
    config = yaml.safe_load((ROOT / "conf/config.yaml").read_text())
    for name in ANALYSES:
        assert callable(load(name).run), name
        block = stages[name]
        assert block["foreach"] == f"${{suite.{name}}}"
        assert f"--analysis {name} " in block["do"]["cmd"]
        assert name in block["do"]["params"]
        assert "embed.decode" in block["do"]["params"], f"{name}: its image reader demands embed.decode (Inputs)"
        assert name in config and config["suite"][name] == [], name
        assert f"reports/{name}" in stages["report"]["deps"]
    # the whole suite: every analysis list and the dataset-level vocabularies whose results the report reads, and a
    # misspelled suite key (which no other stage reads) still makes a stage run and check params.yaml
    assert stages["report"]["params"] == ["suite"]


def test_an_unknown_analysis_is_one_clear_line(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "stages.analysis", "--analysis", "nope", "--dataset", "shapes"],
                          cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == ["error: unknown analysis 'nope'; known analyses: " + ", ".join(ANALYSES)]
