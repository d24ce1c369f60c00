"""benchmarks/gpu_check.py in its CPU mode with tiny sizes: the command the GPU machine runs, so that it cannot rot."""

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "gpu_check.py"


def run_check(out: Path, budget_s: float) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, str(SCRIPT), "--tiny", "--device", "cpu", "--budget-s", str(budget_s),
                           "--out", str(out)], capture_output=True, text=True, env=env, timeout=300)


def test_cpu_mode_measures_every_section_and_writes_json_and_table(tmp_path):
    proc = run_check(tmp_path, 120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads((tmp_path / "gpu_check.json").read_text())
    assert result["errors"] == [] and result["skipped"] == []
    env = result["env"]
    assert {"device_name", "driver", "torch", "date", "budget_s"} <= set(env) and env["mode"] == "tiny"

    model = result["model_only"]["vlbench-toy"]
    assert model["images_per_s"] > 0 and model["gflop_per_image"] > 0
    assert result["features"]["ok"] and result["features"]["max_abs_diff"] == 0.0  # CPU vs CPU: the same numbers
    stage = result["embed_stage"]["vlbench-toy"]
    for size in ("64x48", "160x107"):
        for path in ("pil", "pil_draft", "torchvision", "pil_overlap", "torchvision_overlap", "imagefolder_baseline",
                     "pil_no_model", "pil_draft_no_model", "torchvision_no_model"):
            assert stage[size][path]["images_per_s"] > 0 and stage[size][path]["vs_model"] > 0
    variants = result["model_variants"]["vlbench-toy"]
    assert variants["batch_x2"]["batch"] == 2 * model["batch"] and variants["batch_x2"]["images_per_s"] > 0
    assert variants["batch_x2"]["min_cosine"] > 0.9999  # fp32 on the CPU: another batch size, (nearly) the same numbers
    assert 0 < variants["bf16_weights"]["max_abs_diff"] and variants["bf16_weights"]["min_cosine"] > 0.99
    search = result["elevater"]
    assert search["batched_s"] > 0 and search["toolkit_s"] > 0 and search["toolkit_max_score_diff"] < 0.02
    assert set(result["finetune"]) == {"lora", "bitfit", "full"}
    assert all(m["steps_per_s"] > 0 and m["trainable_params"] > 0 for m in result["finetune"].values())
    assert result["finetune"]["lora"]["trainable_params"] < result["finetune"]["full"]["trainable_params"]

    table = (tmp_path / "gpu_check.md").read_text()
    assert "| section | measurement | value | target | note |" in table
    assert f"torch {env['torch']}" in table and env["date"] in table
    for row in ("| model_only | vlbench-toy images/s", "| features |", "| embed_stage | vlbench-toy 160x107 pil_draft",
                "| embed_stage | vlbench-toy 64x48 imagefolder_baseline", "| elevater | batched search",
                "| finetune | vlbench-toy lora", "| model_variant | vlbench-toy bf16_weights",
                "| embed_stage | vlbench-toy 64x48 pil_overlap"):
        assert row in table


def test_a_budget_too_small_skips_sections_and_says_so(tmp_path):
    proc = run_check(tmp_path, 0.5)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads((tmp_path / "gpu_check.json").read_text())
    assert result["model_only"] == {} and {s["what"] for s in result["skipped"]} >= {"model_only vlbench-toy",
                                                                                       "elevater", "finetune lora"}
    assert "| skipped | elevater | - | - | needs ~" in (tmp_path / "gpu_check.md").read_text()
