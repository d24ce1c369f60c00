"""The shape of the pipeline: light stages, code dependencies per stage (vlbench.pipeline), stages generated from the
analyses table."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from vlbench import pipeline
from vlbench.analyses import ANALYSES, load
from vlbench.datasets.registry import DATASET_SOURCES
from vlbench.finetune.registry import FINETUNE_METHODS
from vlbench.params import load_params
from vlbench.report.registry import CHARTS, SUMMARIES

from tests.test_imports import LAYERS

ROOT = Path(__file__).resolve().parent.parent
MODEL_STAGES = ("embed_images", "embed_texts", "pretrain", "finetune")  # the only stages that run a model
STAGE_MODULES = sorted(p.stem for p in (ROOT / "stages").glob("*.py")
                       if p.stem not in ("__init__", "common", "model_libraries"))


def dvc_stages() -> dict[str, dict]:
    stages = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]
    return {name: stage.get("do", stage) for name, stage in stages.items()}


def test_the_generated_stages_are_what_the_analyses_table_gives():
    """dvc.yaml's generated part is `vlbench compose`'s output for today's ANALYSES (edit the table, not dvc.yaml)."""
    text = (ROOT / "dvc.yaml").read_text()
    section = text.split(pipeline.MARK_BEGIN + "\n", 1)[1].split(pipeline.MARK_END, 1)[0]
    assert section == pipeline.generated_text(), "dvc.yaml is stale: run `vlbench compose`"
    stages = dvc_stages()
    for name in pipeline.by_analysis_stage():
        assert callable(load(name).run), name
        assert stages[name]["cmd"] == f"python -m stages.analysis --analysis {name} --dataset ${{item}}"
        assert name in stages[name]["params"] and "embed.decode" in stages[name]["params"]
        assert f"reports/{name}" in stages["report"]["deps"] and (ROOT / "reports" / name / ".gitkeep").is_file()
    assert stages["report"]["params"] == ["suite"]


def own_fingerprint(stage: str) -> str:
    """The fingerprint file a dvc.yaml stage depends on (vlbench.pipeline.stage_modules)."""
    return {"prepare": "data/code/prepare/${key}.txt", "pretrain": "data/code/pretrain/${model.train.corpus.source}.txt",
            "finetune": "data/code/finetune/${finetune.method}.txt"}.get(stage, f"data/code/{stage}.txt")


@pytest.mark.parametrize("stage", sorted(dvc_stages()))
def test_no_stage_lists_source_files_each_depends_on_its_own_fingerprint(stage):
    deps = [d for d in dvc_stages()[stage].get("deps", []) if isinstance(d, str)]
    if stage == "code":
        assert deps == ["vlbench", "stages", "conf/dataset"]
        return
    assert [d for d in deps if d.startswith("data/code")] == [own_fingerprint(stage)]
    assert not [d for d in deps if d.startswith(("vlbench/", "stages/"))], f"{stage} lists source files"


def demo_fingerprints(root: Path = ROOT) -> dict[str, set[str]]:
    """{fingerprint file: the files it covers} for the demo's params."""
    params = load_params(ROOT / "params.yaml")
    return {name: {p.relative_to(root).as_posix() for p in pipeline.files_of(modules, root)}
            for name, modules in pipeline.stage_modules(params, root).items()}


def test_each_fingerprint_covers_its_command_and_the_registry_strings_it_resolves():
    """A fingerprint covers its stage's module and the modules it loads by name for the entries it runs: prepare the
    dataset's source only, an analysis its own module only, the report the charts and summaries, a fine-tuning
    method its own module."""
    files = demo_fingerprints()
    params = load_params(ROOT / "params.yaml")
    assert set(files) == {*(f"prepare/{d}" for d in params["suite"]["datasets"]), *pipeline.by_analysis_stage(),
                          *(f"finetune/{m}" for m in FINETUNE_METHODS), *(f"pretrain/{s}" for s in DATASET_SOURCES),
                          *(s for s in pipeline.COMMANDS if s not in ("prepare", "pretrain", "finetune"))}
    for name in params["suite"]["datasets"]:
        assert "vlbench/datasets/synthetic.py" in files[f"prepare/{name}"] or name == "compositional", name
        assert "vlbench/datasets/coco.py" not in files[f"prepare/{name}"], name
    assert "vlbench/datasets/compositional.py" in files["prepare/compositional"]
    assert not {f"vlbench/datasets/{m}.py" for m in ("wds", "vtab", "fewtrans", "elevater")} & files["prepare/shapes"]
    assert "vlbench/datasets/synthetic.py" in files["pretrain/synthetic"]  # the toy model's training corpus
    assert "vlbench/datasets/coco.py" not in files["pretrain/synthetic"]
    modules = {a.module: pipeline.module_file(a.module).relative_to(ROOT).as_posix() for a in ANALYSES.values()
               if a.module}
    for name in pipeline.by_analysis_stage():
        assert {"stages/analysis.py", modules[ANALYSES[name].module]} <= files[name], name
        assert modules["vlbench.analyses.linear_probe"] not in files[name] or name == "linear_probe", name
    for chart in {f.__module__ for functions in (*CHARTS.values(), SUMMARIES.values()) for f in functions}:
        assert pipeline.module_file(chart).relative_to(ROOT).as_posix() in files["report"], chart
    for name, m in FINETUNE_METHODS.items():
        assert pipeline.module_file(m.module).relative_to(ROOT).as_posix() in files[f"finetune/{name}"]
    assert "vlbench/datasets/data/elevater.json" in files["prepare/shapes"]  # a package's data files come with it


def test_a_fingerprint_changes_with_a_file_its_command_runs_only(tmp_path):
    """The fingerprints over a copy of the sources: an edit of a dataset source the demo does not use changes none a
    demo stage depends on;
    of the toy model's training, pre-training's and NegCLIP's (which trains the toy way); of one analysis, its own."""
    for folder in (*pipeline.PROJECT_PACKAGES, "conf"):
        shutil.copytree(ROOT / folder, tmp_path / folder, ignore=shutil.ignore_patterns("__pycache__"))
    params = load_params(ROOT / "params.yaml")
    modules = pipeline.stage_modules(params, tmp_path)
    before = {name: pipeline.fingerprint(m, tmp_path) for name, m in modules.items()}
    for name, changed in (("vlbench/datasets/coco.py", {"pretrain/coco", "pretrain/karpathy"}),  # (Karpathy's splits
                          # import COCO's reader) corpus sources no demo stage uses
                          ("vlbench/models/toy.py", {f"pretrain/{s}" for s in DATASET_SOURCES} | {"finetune/negclip"}),
                          ("vlbench/analyses/linear_probe.py", {"linear_probe"}),
                          # the text sets the analyses need: the stages that check them (not prepare, texts, embedding)
                          ("vlbench/analyses/text_sets.py", {*pipeline.by_analysis_stage(), "repe"}),
                          ("vlbench/data_root.py", {f"prepare/{d}" for d in params["suite"]["datasets"]}),
                          ("vlbench/report/html.py", {"report"})):
        with (tmp_path / name).open("a") as f:
            f.write("\n# an edit\n")
        after = {name: pipeline.fingerprint(m, tmp_path) for name, m in modules.items()}
        assert {n for n in after if after[n] != before[n]} == changed, name
        before = after


def test_only_the_ground_floor_is_in_every_stages_fingerprint():
    """Issue 40: an edit to a module that every stage's command runs reruns the whole demo, so only the ground floor
    (LAYERS[0]: errors, io, portable, the params reader and the output layout) and the stages' own runner
    (stages/command.py) may be one; vlbench/config.py was, with its eight jobs, until it was split by job."""
    every = set.intersection(*demo_fingerprints().values())
    modules = {".".join(Path(f).with_suffix("").parts).removesuffix(".__init__") for f in every if f.endswith(".py")}
    assert modules == {"vlbench", "vlbench.errors", "vlbench.io", "vlbench.portable", "vlbench.params", "vlbench.paths",
                       "stages", "stages.command"}
    assert {m for m in modules if not m.startswith("stages")} <= set(LAYERS[0])


@pytest.mark.parametrize("stage", [m for m in STAGE_MODULES if m not in MODEL_STAGES])
def test_stages_without_a_model_start_without_torch(stage):
    code = f"import sys, stages.{stage}; sys.exit(1 if 'torch' in sys.modules else 0)"
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, f"stages.{stage} imports torch at start-up\n{proc.stderr}"


@pytest.mark.parametrize("name", sorted(pipeline.by_analysis_stage()))
def test_analyses_never_import_torch_at_start_up(name):
    code = f"import sys, {ANALYSES[name].module}; sys.exit(1 if 'torch' in sys.modules else 0)"
    assert subprocess.run([sys.executable, "-c", code], cwd=ROOT).returncode == 0


def test_an_unknown_analysis_is_one_clear_line(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "stages.analysis", "--analysis", "nope", "--dataset", "shapes"],
                          cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == ["error: unknown analysis 'nope'; known analyses: " + ", ".join(ANALYSES)]
