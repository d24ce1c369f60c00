"""`vlbench plan`'s fine-tuning passes (vlbench/finetune/passes.py): the held-out search's and a FewTrans table's
units, training runs and optimiser steps on a tiny prepared dataset, equal to the counts computed here from the
settings; the device-time estimate from a measured step rate of the toy model, or why there is none."""

from __future__ import annotations

import itertools
import math
import shutil
from pathlib import Path

import pytest
import torch

from tests.test_finetune_units import write_world
from vlbench.compose import compose
from vlbench.finetune import fewtrans_episodic as fft
from vlbench.models import rates
from vlbench.plan import finetune_plan

ROOT = Path(__file__).resolve().parent.parent
SAMPLER = {"episodes": 4, "splits": ["train", "test"], "novel_classes": {"hues": 2}, "max_query": 3, "max_shots": 3}
TABLE = {"methods": ["text_ft", "lora"], "lr_factors": [0.5, 1.0, 2.0], "two_lr_factors": [1.0, 2.0],
         "epoch_offset": 4, "text_ft": {"lr": 1e-3, "epochs": 2, "batch_size": 4},
         "lora": {"lr": 1e-2, "head_lr": 1e-2, "epochs": 5, "batch_size": 3, "rank": 2, "alpha": 2.0}}
SEARCH = {"sampler": {"episodes": 3}, "coarse": {"lr": [1e-5, 1e-4], "head_lr": [1e-2], "epochs": [1, 2]}}


@pytest.fixture(autouse=True)
def rate_cache(tmp_path, monkeypatch) -> Path:
    """The measured rates' cache of this test alone (never the user's ~/.cache/vlbench)."""
    monkeypatch.setenv("VLBENCH_CACHE", str(tmp_path / "rates"))
    return tmp_path / "rates" / rates.CACHE_FILE


@pytest.fixture
def project(tmp_path_factory, toy_model_cfg, monkeypatch):
    root = tmp_path_factory.mktemp("planft")
    world = write_world(root / "world")
    shutil.copytree(world["prepared"], root / "data" / "prepared" / "hues")
    monkeypatch.chdir(root)
    params = compose([], ROOT / "conf")
    params["seed"] = 3
    params["model"] = {**params["model"], **toy_model_cfg}
    params["adapt"]["fewtrans"] = SAMPLER
    params["finetune"] = {"method": "fewtrans_episodic", "fewtrans_episodic": TABLE,
                          "heldout": {"dataset": "hues", "search": SEARCH}}
    return params


def supports(sampler: dict) -> list[int]:
    pairs = fft.draw_episodes(Path("data/prepared/hues"), sampler, 3)[5]
    return [sum(b.shots) for b, _ in pairs]


def test_counts_of_the_search_and_the_table_equal_the_settings(project):
    plan = finetune_plan(project, ["prepare@hues", "heldout@hues", "finetune@hues"], "cpu", warmup=False)
    search, table = plan["stages"]

    tasks = supports({**SAMPLER, "episodes": 3, "novel_fraction": 0})
    assert search["name"] == "heldout@hues" and search["tasks"] == 3
    # text_ft: lr x epochs = 2 x 2 points; lora: lr x head_lr x epochs = 2 x 1 x 2
    for name, batch, neighbours in (("text_ft", 4, 8), ("lora", 3, 26)):
        row = search["methods"][name]
        assert (row["coarse_points"], row["units"], row["neighbours_per_round_max"]) == (4, 4 * 3, neighbours)
        assert row["steps"] == sum(2 * e * math.ceil(n / batch) for e in (1, 2) for n in tasks)
    assert search["units"] == 24 and search["steps"] == sum(m["steps"] for m in search["methods"].values())

    support = supports(SAMPLER)
    assert table["name"] == "finetune@hues" and table["episodes"] == 4
    text, lora = table["methods"]["text_ft"], table["methods"]["lora"]
    # text_ft: 3 rates x epochs {2, 4, 6} (E' = 2 + 4); lora: 2 x 2 rates x epochs {3, 6, 9} (E' = 5 + 4)
    assert (text["members"], text["runs"], text["units"]) == (9, 4 * 9, 4)
    assert text["steps"] == sum(3 * e * math.ceil(n / 4) for e in (2, 4, 6) for n in support)
    assert (lora["members"], lora["runs"]) == (12, 4 * 12)
    assert lora["steps"] == sum(4 * e * math.ceil(n / 3) for e in (3, 6, 9) for n in support)
    assert table["steps"] == text["steps"] + lora["steps"] and table["units"] == 8
    assert plan["estimate"]["seconds"] is None and "no step rate measured" in plan["estimate"]["reason"]


def test_device_hours_from_the_toy_models_measured_step_rate(project):
    plan = finetune_plan(project, ["finetune@hues"], "cpu", warmup=True)
    est, (table,) = plan["estimate"], plan["stages"]
    per_step = {int(b): s for b, s in est["seconds_per_step"].items()}
    assert set(per_step) == {3, 4} and all(s > 0 for s in per_step.values()) and est["device"] == "cpu"
    expected = sum(m["steps"] * per_step[m["batch_size"]] for m in table["methods"].values())
    assert est["seconds"] == pytest.approx(expected) and est["device_hours"] == pytest.approx(expected / 3600)
    assert set(est["rate"]) == {"3", "4"} and set(est["rate"].values()) <= {"measured", "estimated from FLOPs"}
    assert all(f"at batch {b} " in est["reason"] and f"[{source}]" in est["reason"] for b, source in est["rate"].items())


def test_a_step_rate_over_the_cap_is_estimated_from_flops_and_a_measured_one_is_cached(project, rate_cache,
                                                                                         monkeypatch):
    arch = rates.architecture(project["model"])
    cpu = torch.device("cpu")
    est = rates.step_seconds(project["model"], arch, cpu, 4, cap_s=1e-6)
    assert est.source == "estimated from FLOPs" and "over the warm-up's cap of 1e-06 s" in est.how
    assert not rate_cache.exists()
    measured = rates.step_seconds(project["model"], arch, cpu, 4, cap_s=600)
    assert measured.source == "measured" and measured.value > 0
    monkeypatch.setattr(rates.subprocess, "run", lambda *a, **k: pytest.fail("a child process was started"))
    again = rates.step_seconds(project["model"], arch, cpu, 4)
    assert (again.source, again.value) == ("cached", measured.value)


def test_unknown_centres_and_unprepared_data_are_named(project):
    project["finetune"]["fewtrans_episodic"] = {**TABLE, "text_ft": {"batch_size": 4}}  # centre from the search
    plan = finetune_plan(project, ["finetune@hues", "heldout@birds"], "cpu", warmup=True)
    table, search = plan["stages"]
    assert table["methods"]["text_ft"]["steps"] is None and table["steps"] is None
    assert any("reports/heldout/hues.json: no held-out search result" in u for u in table["unknown"])
    assert search["steps"] is None and any("'birds' not prepared yet" in u for u in search["unknown"])
    assert search["units"] == 24  # the coarse grid x the sampler's episodes, without data
    assert plan["estimate"]["seconds"] is None and "steps unknown for finetune@hues, heldout@birds" in \
        plan["estimate"]["reason"]


def test_no_fine_tuning_stage_imports_nothing():
    assert finetune_plan({}, ["embed_images@shapes"], None, True) == {"stages": [], "estimate": None}
