"""vlbench.lazy_imports: a model stage's process imports torchvision and open_clip without torch._dynamo and the tower
libraries its architecture does not build, and loads the same model (the same features, byte for byte); a process that
is not a stage process (a test) keeps every library. The time it saves: benchmarks/startup.py."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from vlbench.lazy_imports import unused_tower_libraries

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
from startup import WATCHED, fresh_checkpoint  # noqa: E402


def python(*args: str) -> str:
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, check=True, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}).stdout.strip().splitlines()[-1]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return fresh_checkpoint("vlbench-toy", tmp_path_factory.mktemp("toy") / "checkpoint.pt")


def test_a_model_stage_loads_the_same_model_without_dynamo_timm_or_transformers(checkpoint):
    eager, deferred = (json.loads(python("benchmarks/startup.py", "--child", variant, "--arch", "vlbench-toy",
                                         "--checkpoint", checkpoint)) for variant in ("eager", "deferred"))
    assert eager["loaded"] == dict.fromkeys(WATCHED, True)  # what the libraries import by themselves
    assert deferred["loaded"] == dict.fromkeys(WATCHED, False)
    assert deferred["features"] == eager["features"]


def test_what_was_deferred_is_the_real_module_at_its_first_use():
    code = """import stages, sys
from stages.model_libraries import import_model_libraries
import_model_libraries({"model": {"arch": "vlbench-toy"}})
import torchvision, timm, torch._dynamo.utils
roi_align = sys.modules["torchvision.ops.roi_align"]
print(roi_align.is_compile_supported("cpu") == torch._dynamo.utils.is_compile_supported("cpu"),
      hasattr(sys.modules["torch._dynamo.utils"], "counters"),
      hasattr(timm, "create_model"))"""
    assert python("-c", code) == "True True True"


def test_an_architecture_with_a_timm_tower_builds_it():
    """timm's own import of torch._dynamo (its `torch.compiler.disable` decorators) gets the real module, not the
    stand-in torchvision loaded with: a timm tower builds, transformers is left out of open_clip alone."""
    code = """import stages, sys
from stages.model_libraries import import_model_libraries
import_model_libraries({"model": {"arch": "convnext_tiny"}})
import open_clip
model = open_clip.create_model("convnext_tiny", pretrained=None)
from transformers import AutoTokenizer  # as a Hugging Face tokenizer imports it when built
print(type(model.visual).__name__, open_clip.hf_model.transformers, "torch._dynamo" in sys.modules)"""
    assert python("-c", code) == "TimmModel None True"


def test_a_process_that_loaded_torch_before_the_stages_keeps_every_library():
    code = """import torch, stages
from stages.model_libraries import import_model_libraries
import_model_libraries({"model": {"arch": "vlbench-toy"}})
import open_clip
print(stages.STAGE_PROCESS, open_clip.timm_model.timm is not None, open_clip.hf_model.transformers is not None)"""
    assert python("-c", code) == "False True True"


def test_an_architecture_keeps_the_tower_libraries_its_config_names():
    assert unused_tower_libraries("vlbench-toy") == ["timm", "transformers"]
    assert unused_tower_libraries("ViT-B-16-SigLIP") == ["transformers"]  # a timm vision tower
    assert unused_tower_libraries("xlm-roberta-base-ViT-B-32") == ["timm"]  # a Hugging Face text tower
    assert unused_tower_libraries("hf-hub:timm/ViT-B-16-SigLIP") == []  # its config is in its repository: keep both
