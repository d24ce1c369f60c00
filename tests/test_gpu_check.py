"""benchmarks/gpu_check.py in its CPU mode with tiny sizes: the command the GPU machine runs, so that it cannot rot."""

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "gpu_check.py"


def run_check(out: Path, budget_s: float, *extra: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, str(SCRIPT), "--tiny", "--device", "cpu", "--budget-s", str(budget_s),
                           "--out", str(out), *extra], capture_output=True, text=True, env=env, timeout=1200)


try:
    import nvidia.dali  # noqa: F401

    DECODERS = ("pil", "pil_draft", "torchvision", "dali")
except ImportError:  # the stage's `dali` rows are skipped, and the table says why
    DECODERS = ("pil", "pil_draft", "torchvision")


def test_cpu_mode_measures_every_section_and_writes_json_and_table(tmp_path):
    proc = run_check(tmp_path, 900)  # a budget no section hits, even on a loaded 2-core machine
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads((tmp_path / "gpu_check.json").read_text())
    assert result["errors"] == []
    assert all("dali" in s["what"] and "nvidia.dali is not installed" in s["reason"] for s in result["skipped"])
    assert bool(result["skipped"]) == ("dali" not in DECODERS)
    env = result["env"]
    assert {"device_name", "driver", "torch", "date", "budget_s"} <= set(env) and env["mode"] == "tiny"

    model = result["model_only"]["vlbench-toy"]
    assert model["images_per_s"] > 0 and model["gflop_per_image"] > 0
    assert result["features"]["ok"] and result["features"]["max_abs_diff"] == 0.0  # CPU vs CPU: the same numbers
    stage = result["embed_stage"]["vlbench-toy"]
    for size in ("64x48", "160x107"):
        for path in (*DECODERS, "pil_overlap", "imagefolder_baseline", *(f"{d}_no_model" for d in DECODERS),
                     *(f"{d}_no_overlap" for d in DECODERS if d in ("torchvision", "dali"))):
            assert stage[size][path]["images_per_s"] > 0 and stage[size][path]["vs_model"] > 0, (size, path)
    agreement = result["decode_agreement"]
    assert set(agreement) == set(DECODERS) and agreement["pil"]["min_cosine"] > 0.99999
    assert all(0.99 < row["min_cosine"] <= row["mean_cosine"] < 1.00001 for row in agreement.values())
    variants = result["model_variants"]["vlbench-toy"]
    assert variants["batch_x2"]["batch"] == 2 * model["batch"] and variants["batch_x2"]["images_per_s"] > 0
    assert variants["batch_x2"]["min_cosine"] > 0.9999  # fp32 on the CPU: another batch size, (nearly) the same numbers
    # the embed stage's option (bf16 weights under bf16 autocast) vs fp32 on the CPU, on perturbed LayerNorms and biases
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
                "| embed_stage | vlbench-toy 64x48 pil_overlap",
                "| embed_stage | vlbench-toy 160x107 torchvision_no_overlap",
                "| decode_agreement | torchvision vs pil"):
        assert row in table


def test_a_budget_too_small_skips_sections_and_says_so(tmp_path):
    proc = run_check(tmp_path, 0.5)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads((tmp_path / "gpu_check.json").read_text())
    assert result["model_only"] == {} and {s["what"] for s in result["skipped"]} >= {"model_only vlbench-toy",
                                                                                       "elevater", "finetune lora"}
    assert "| skipped | elevater | - | - | needs ~" in (tmp_path / "gpu_check.md").read_text()


def test_sections_choose_what_runs_and_an_unknown_one_is_refused(tmp_path):
    proc = run_check(tmp_path, 60, "--sections", "model_only,decode_agreement")
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads((tmp_path / "gpu_check.json").read_text())
    assert result["model_only"] and result["decode_agreement"] and result["env"]["sections"] == ["model_only",
                                                                                                 "decode_agreement"]
    assert result["embed_stage"] == {} and result["elevater"] == {} and result["finetune"] == {}
    proc = run_check(tmp_path, 60, "--sections", "model_only,decoding")
    assert proc.returncode == 2 and "--sections: unknown ['decoding']" in proc.stderr
