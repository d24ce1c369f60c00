"""The shape of the pipeline: light stages, code dependencies by layer (vlbench.pipeline), stages generated from the
analyses table."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from vlbench import pipeline
from vlbench.analyses import ANALYSES, by_analysis_stage, load

ROOT = Path(__file__).resolve().parent.parent
MODEL_STAGES = ("embed_images", "embed_texts", "pretrain", "finetune")  # the only stages that run a model
STAGE_MODULES = sorted(p.stem for p in (ROOT / "stages").glob("*.py") if p.stem not in ("__init__", "common"))


def dvc_stages() -> dict[str, dict]:
    stages = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]
    return {name: stage.get("do", stage) for name, stage in stages.items()}


def test_the_generated_stages_are_what_the_analyses_table_gives():
    """dvc.yaml's generated part is `vlbench compose`'s output for today's ANALYSES (edit the table, not dvc.yaml)."""
    text = (ROOT / "dvc.yaml").read_text()
    section = text.split(pipeline.MARK_BEGIN + "\n", 1)[1].split(pipeline.MARK_END, 1)[0]
    assert section == pipeline.generated_text(), "dvc.yaml is stale: run `vlbench compose`"
    stages = dvc_stages()
    for name in by_analysis_stage():
        assert callable(load(name).run), name
        assert stages[name]["cmd"] == f"python -m stages.analysis --analysis {name} --dataset ${{item}}"
        assert name in stages[name]["params"] and "embed.decode" in stages[name]["params"]
        assert f"reports/{name}" in stages["report"]["deps"] and (ROOT / "reports" / name / ".gitkeep").is_file()
    assert stages["report"]["params"] == ["suite"]


@pytest.mark.parametrize("stage", sorted(dvc_stages()))
def test_no_stage_lists_source_files_each_depends_on_its_layer(stage):
    deps = [d for d in dvc_stages()[stage].get("deps", []) if isinstance(d, str)]
    if stage == "code":
        assert deps == ["vlbench", "stages"]
        return
    assert f"data/code/{pipeline.stage_layer(stage)}.txt" in deps
    assert not [d for d in deps if d.startswith(("vlbench/", "stages/"))], f"{stage} lists source files"


@pytest.mark.parametrize("stage", sorted(set(dvc_stages()) - {"code"}))
def test_each_stage_module_and_what_it_loads_by_name_is_in_its_layer(stage):
    """A layer's fingerprint covers its stages' modules and the modules they load by name ("module:function"
    strings: analyses, charts, fine-tuning methods, dataset sources)."""
    files = {p.relative_to(ROOT).as_posix() for p in pipeline.layer_files(pipeline.stage_layer(stage))}
    module = "stages/analysis.py" if stage in by_analysis_stage() else f"stages/{stage}.py"
    assert module in files
    if stage in by_analysis_stage():
        a = ANALYSES[stage]
        for name in (a.module, *(c.split(":")[0] for c in a.charts)):
            assert pipeline.module_file(name).relative_to(ROOT).as_posix() in files, name
    if stage == "prepare":
        assert {f"vlbench/datasets/{m}.py" for m in ("wds", "vtab", "fewtrans", "elevater")} <= files
        assert "vlbench/datasets/data/elevater.json" in files  # a package's data files come with it
    if stage == "finetune":
        assert {"vlbench/finetune/elevater.py", "vlbench/finetune/negclip.py", "vlbench/finetune/fewtrans.py"} <= files


def test_a_fingerprint_changes_with_a_file_of_its_layer_only(tmp_path):
    """data/code/<layer>.txt over a copy of the sources: an edit of the toy model's training changes pre-training's
    and fine-tuning's fingerprints, not the embedding's nor the analyses'; an edit of the statistics changes the
    analyses', not the embedding's."""
    for folder in pipeline.PROJECT_PACKAGES:
        shutil.copytree(ROOT / folder, tmp_path / folder, ignore=shutil.ignore_patterns("__pycache__"))
    before = {layer: pipeline.fingerprint(layer, tmp_path) for layer in pipeline.LAYERS}
    for name, changed in (("vlbench/models/toy.py", {"pretrain", "finetune"}),
                          ("vlbench/stats.py", {"analyses", "finetune"})):
        with (tmp_path / name).open("a") as f:
            f.write("\n# an edit\n")
        after = {layer: pipeline.fingerprint(layer, tmp_path) for layer in pipeline.LAYERS}
        assert {layer for layer in after if after[layer] != before[layer]} == changed, name
        before = after


@pytest.mark.parametrize("stage", [m for m in STAGE_MODULES if m not in MODEL_STAGES])
def test_stages_without_a_model_start_without_torch(stage):
    code = f"import sys, stages.{stage}; sys.exit(1 if 'torch' in sys.modules else 0)"
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, f"stages.{stage} imports torch at start-up\n{proc.stderr}"


@pytest.mark.parametrize("name", sorted(ANALYSES))
def test_analyses_never_import_torch_at_start_up(name):
    code = f"import sys, {ANALYSES[name].module}; sys.exit(1 if 'torch' in sys.modules else 0)"
    assert subprocess.run([sys.executable, "-c", code], cwd=ROOT).returncode == 0


def test_an_unknown_analysis_is_one_clear_line(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "stages.analysis", "--analysis", "nope", "--dataset", "shapes"],
                          cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == ["error: unknown analysis 'nope'; known analyses: " + ", ".join(ANALYSES)]
