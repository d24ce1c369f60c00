"""Fine-tuning's work units (vlbench/finetune/units.py) and the held-out search (vlbench/finetune/heldout.py) on the
toy model at tiny sizes: the local engine and Ray (2 workers) give the same table and unit files byte for byte; a run
killed with SIGKILL after some units resumes computing only the missing ones and writes the same table; a failing
unit is named; the held-out search picks the optimum an independent loop finds, and the episodes read its centres."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from tests.conftest import png
from vlbench.analyses.adapt.vtab import flush_denormals
from vlbench.datasets.canonical import ClassInfo, DatasetMeta, load_meta, write_dataset
from vlbench.embed import model_for_dataset
from vlbench.finetune import FinetuneError
from vlbench.finetune import fewtrans_episodic as fft
from vlbench.finetune import heldout, units
from vlbench.models.loading import load_model
from vlbench.texts import build_text_sets, write_text_sets

ROOT = Path(__file__).resolve().parent.parent
HUES = {"red": (220, 30, 30), "green": (30, 200, 30), "blue": (30, 30, 220), "yellow": (210, 210, 30),
        "cyan": (30, 200, 200), "magenta": (200, 30, 200)}
SAMPLER = {"episodes": 4, "splits": ["train", "test"], "novel_classes": {"hues": 2}, "max_query": 3, "max_shots": 3}
SMALL = {"lr_factors": [1.0], "two_lr_factors": [1.0], "epoch_offset": 0, "methods": ["text_ft", "lora"],
         "text_ft": {"lr": 1e-3, "epochs": 2}, "lora": {"lr": 1e-2, "head_lr": 1e-2, "epochs": 2}}


def write_world(root: Path, corrupt: str | None = None, per_split: int = 24) -> dict:
    """Six colour classes in two splits (row groups of 7 rows) and their prompts; `corrupt`: a sample id whose image
    bytes are garbage."""
    meta = DatasetMeta(name="hues", task="single-label", metric="accuracy",
                       classes=[ClassInfo(index=i, name=n) for i, n in enumerate(HUES)])

    def rows(split, n, offset):
        for k in range(n):
            sid = f"{split}/{k:03d}"
            image = b"not an image" if sid == corrupt else png(list(HUES.values())[k % 6], size=24, seed=offset + k)
            yield {"sample_id": sid, "label": k % 6, "image": image}

    prepared = root / "prepared" / "hues"
    write_dataset(prepared, meta, {"train": rows("train", per_split, 0), "test": rows("test", per_split, 500)})
    for split in ("train", "test"):
        path = prepared / "splits" / f"{split}.parquet"
        pq.write_table(pq.read_table(path), path, row_group_size=7)
    texts = root / "texts" / "hues"
    write_text_sets(texts, "hues", build_text_sets(load_meta(prepared), prepared, {"templates": ["a {c} square."]}))
    return {"prepared": prepared, "texts": texts / "prompts.parquet"}


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    return write_world(tmp_path_factory.mktemp("units"))


def episodes(world, model_cfg, units_dir, engine="local", cfg=SMALL, sampler=SAMPLER, **kw):
    return fft.run_episodes(model_cfg, world["prepared"], world["texts"], cfg, 3, "cpu", sampler,
                            units_dir=units_dir, engine=engine, gpus=0, **kw)


def table_bytes(table, path: Path) -> bytes:
    pq.write_table(table, path)
    return path.read_bytes()


def unit_files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.glob("*.json"))}


@pytest.fixture(scope="module")
def local_run(world, toy_model_cfg, tmp_path_factory):
    folder = tmp_path_factory.mktemp("local")
    summary, table = episodes(world, toy_model_cfg, folder / "units")
    return {"summary": summary, "table": table, "units": folder / "units",
            "bytes": table_bytes(table, folder / "episodes.parquet")}


def test_local_and_ray_give_the_same_table_and_unit_files_byte_for_byte(world, toy_model_cfg, local_run, local_ray,
                                                                         tmp_path):
    summary, table = episodes(world, toy_model_cfg, tmp_path / "units", engine="ray")
    assert table_bytes(table, tmp_path / "episodes.parquet") == local_run["bytes"]
    assert unit_files(tmp_path / "units") == unit_files(local_run["units"])
    assert len(unit_files(local_run["units"])) == 8  # 4 episodes x 2 methods, one file each
    assert summary["units"] == {"cached": 0, "computed": 8, "engine": "ray"}
    assert local_run["summary"]["units"] == {"cached": 0, "computed": 8, "engine": "local"}
    assert summary["metrics"] == local_run["summary"]["metrics"]
    # a unit file says what it is; its result is the table's number
    doc = next(json.loads(b) for b in unit_files(local_run["units"]).values()
               if json.loads(b)["identity"] == {"method": "lora", "episode": 2})
    rows = [r for r in local_run["table"].to_pylist() if r["split"] == "base" and r["episode"] == 2]
    assert doc["result"] == {"base": rows[0]["lora"]}


def test_a_rerun_finds_every_unit_and_a_new_method_reuses_the_others(world, toy_model_cfg, local_run, tmp_path):
    folder = tmp_path / "units"
    folder.mkdir()
    for name, data in unit_files(local_run["units"]).items():
        (folder / name).write_bytes(data)
    summary, table = episodes(world, toy_model_cfg, folder)
    assert summary["units"] == {"cached": 8, "computed": 0, "engine": "local"}
    assert table_bytes(table, tmp_path / "t.parquet") == local_run["bytes"]
    # lora alone: its 4 units are found, text_ft's are pruned from the folder (it holds exactly this run's units)
    summary, _ = episodes(world, toy_model_cfg, folder, cfg={**SMALL, "methods": ["lora"]})
    assert summary["units"] == {"cached": 4, "computed": 0, "engine": "local"}
    assert len(list(folder.glob("*.json"))) == 4


KILLED = """
import json, sys
from vlbench.finetune import fewtrans_episodic as fewtrans
a = json.loads(sys.argv[1])
fewtrans.run_episodes(a["model"], a["prepared"], a["texts"], a["cfg"], 3, "cpu", a["sampler"], units_dir=a["units"],
                      engine="local", gpus=0)
"""


def test_a_run_killed_after_some_units_resumes_with_only_the_missing_ones(world, toy_model_cfg, local_run, tmp_path):
    folder = tmp_path / "units"
    args = {"model": toy_model_cfg, "prepared": str(world["prepared"]), "texts": str(world["texts"]), "cfg": SMALL,
            "sampler": SAMPLER, "units": str(folder)}
    proc = subprocess.Popen([sys.executable, "-c", KILLED, json.dumps(args)], cwd=ROOT)
    deadline = time.monotonic() + 300
    while len(list(folder.glob("*.json"))) < 3 and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert proc.poll() is None, "the run ended before it could be killed"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    before = {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in folder.glob("*.json")}
    assert 3 <= len(before) < 8
    assert all(json.loads(data)["key"] == Path(name).stem for name, (data, _) in before.items())  # whole files only
    summary, table = episodes(world, toy_model_cfg, folder)
    assert summary["units"] == {"cached": len(before), "computed": 8 - len(before), "engine": "local"}
    after = {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in folder.glob("*.json")}
    assert {k: after[k] for k in before} == before  # nothing computed twice: the finished units were not rewritten
    assert table_bytes(table, tmp_path / "t.parquet") == local_run["bytes"]
    assert unit_files(folder) == unit_files(local_run["units"])
    assert sorted(p.name for p in folder.iterdir()) == sorted(after)  # no temporary left behind


def test_a_failing_unit_is_named_by_its_identity_and_the_units_before_it_are_kept(toy_model_cfg, tmp_path, local_ray):
    clean = write_world(tmp_path / "clean")
    _, _, pool, _, _, pairs = fft.draw_episodes(clean["prepared"], SAMPLER, 3)
    first = set(pairs[0][0].rows("support")[0]) | set(pairs[0][0].rows("query")[0]) | set(pairs[0][1].rows("query")[0])
    later = [r for r in pairs[1][0].rows("support")[0] if r not in first]
    bad = str(pool.sample_ids[later[0]])
    world = write_world(tmp_path / "bad", corrupt=bad)
    for engine in ("local", "ray"):
        folder = tmp_path / engine
        with pytest.raises(units.UnitError) as err:
            episodes(world, toy_model_cfg, folder, engine=engine, cfg={**SMALL, "methods": ["lora"]})
        assert "unit method lora, episode 1 " in str(err.value) and repr(bad) in str(err.value)
        if engine == "local":  # episode 0 came first and was kept
            assert [json.loads(b)["identity"] for b in unit_files(folder).values()] == [{"method": "lora", "episode": 0}]


# ----------------------------------------------------------------------------------------------------------------
# A unit file is used only as it was written (its checksum)


class Doubling:
    """A work whose unit result is twice the unit's number (no model: the cache's own behaviour)."""

    token, threads = "doubling", 1

    def setup(self):
        return 2

    def compute(self, state, identity):
        return {"value": state * identity["n"]}


def doubled(folder: Path, strict: bool | None = None) -> tuple[list[dict], units.Tally]:
    work_units = units.make_units({"work": "doubling"}, [{"n": n} for n in range(3)])
    return units.run_units(Doubling(), work_units, units.UnitCache(folder, strict=strict))


def unit_file(folder: Path, n: int) -> Path:
    return next(p for p in folder.glob("*.json") if json.loads(p.read_text())["identity"] == {"n": n})


def edit(path: Path, change) -> None:
    doc = json.loads(path.read_text())
    change(doc)
    path.write_text(json.dumps(doc, indent=2) + "\n")


def drop_checksum(doc):
    del doc["sha256"]


def drop_result(doc):
    del doc["result"]


def edit_result(doc):
    doc["result"]["value"] = 99


@pytest.mark.parametrize("change, why", [
    (edit_result, "does not match its checksum (edited after it was written)"),
    (drop_result, "has no `result`"),
    (drop_checksum, "has no checksum (written before unit files carried one)"),
])
def test_an_edited_or_incomplete_unit_file_is_recomputed_with_a_warning_naming_it(tmp_path, capsys, change, why):
    results, tally = doubled(tmp_path)
    assert results == [{"value": 0}, {"value": 2}, {"value": 4}] and (tally.cached, tally.computed) == (0, 3)
    path = unit_file(tmp_path, 1)
    written = path.read_bytes()
    assert json.loads(written)["sha256"] == units.checksum(json.loads(written))
    edit(path, change)
    capsys.readouterr()
    results, tally = doubled(tmp_path)
    assert results == [{"value": 0}, {"value": 2}, {"value": 4}] and (tally.cached, tally.computed) == (2, 1)
    assert capsys.readouterr().err == f"warning: {path}: unit file {why}: recomputing the unit (n 1)\n"
    assert path.read_bytes() == written  # rewritten as it was first written


@pytest.mark.parametrize("change, why", [(edit_result, "does not match its checksum"),
                                         (drop_result, "has no `result`")])
def test_in_strict_mode_an_edited_unit_file_stops_the_run_in_one_line(tmp_path, monkeypatch, change, why):
    doubled(tmp_path)
    path = unit_file(tmp_path, 2)
    edit(path, change)
    edited = path.read_bytes()
    monkeypatch.setenv(units.STRICT_VARIABLE, "1")
    with pytest.raises(units.UnitError) as err:
        doubled(tmp_path)
    message = str(err.value)
    assert message.startswith(f"{path}: unit file {why}") and "(n 2)" in message and "\n" not in message
    assert path.read_bytes() == edited  # neither used nor replaced


def test_a_truncated_or_swapped_unit_file_is_still_named_in_one_line(tmp_path):
    doubled(tmp_path)
    first, second = unit_file(tmp_path, 0), unit_file(tmp_path, 1)
    swapped = second.read_bytes()
    first_bytes = first.read_bytes()
    second.write_bytes(first_bytes)
    with pytest.raises(units.UnitError, match=rf"^{second}: holds unit '{first.stem}', not '{second.stem}'; delete it"):
        doubled(tmp_path)
    second.write_bytes(swapped[: len(swapped) // 2])
    with pytest.raises(units.UnitError, match=rf"^{second}: unreadable unit file \(.*\); delete it to recompute the "
                                              r"unit \(n 1\)$"):
        doubled(tmp_path, strict=False)


def test_an_episode_whose_stored_result_was_edited_is_recomputed_and_the_table_is_unchanged(
        world, toy_model_cfg, local_run, tmp_path, capsys):
    """The flow the issue met: a stored result edited by hand was used as it was ("0 units computed")."""
    folder = tmp_path / "units"
    folder.mkdir()
    for name, data in unit_files(local_run["units"]).items():
        (folder / name).write_bytes(data)
    path = next(p for p in sorted(folder.glob("*.json")) if json.loads(p.read_text())["identity"]["method"] == "lora")
    edit(path, lambda doc: doc["result"].update(base=1.0))
    capsys.readouterr()
    summary, table = episodes(world, toy_model_cfg, folder)
    assert summary["units"] == {"cached": 7, "computed": 1, "engine": "local"}
    assert f"warning: {path}: unit file does not match its checksum" in capsys.readouterr().err
    assert table_bytes(table, tmp_path / "t.parquet") == local_run["bytes"]
    assert unit_files(folder) == unit_files(local_run["units"])


# ----------------------------------------------------------------------------------------------------------------
# The held-out search

LADDER = [1e-5, 2e-5, 5e-5, 1e-4, 2e-4, 5e-4, 1e-3, 2e-3, 5e-3, 1e-2, 2e-2, 5e-2, 0.1, 0.2, 0.5, 1.0]  # written out
EPOCHS = [1, 2, 3, 5]
SEARCH = {"methods": ["text_ft"], "sampler": {"episodes": 3, "novel_fraction": 0, "novel_classes": {}},
          "epochs": EPOCHS, "lr_min": 1e-5, "lr_max": 1.0, "coarse": {"lr": [0.5], "epochs": [5]}}
# the random toy scores 28% of its 3 tasks' queries at lr 0.5 x 5 epochs and 36% one step away: the search must move
SEARCH_SAMPLER = {"splits": ["train", "test"], "max_query": 3, "max_shots": 3}


def independent_climb(world, model_cfg) -> tuple[tuple, dict]:
    """App. A's search written out with the building blocks: each point's mean accuracy over the tasks from direct
    training runs; from the coarse point, move to the best neighbour (ties: fewer epochs, then smaller lr) while it
    is strictly better."""
    sampler = {**SEARCH_SAMPLER, **SEARCH["sampler"]}
    meta, s_pool, pool, _, _, pairs = fft.draw_episodes(world["prepared"], sampler, 3)
    loaded = model_for_dataset(load_model(model_cfg, "cpu"), meta)
    s = fft.settings({"methods": ["text_ft"]})
    ctx = fft.Context(loaded.model, fft.Prompts(world["texts"], loaded.tokenizer, 6), s, loaded.device,
                      loaded.autocast, 3)
    images = fft.PoolImages(world["prepared"], sampler["splits"], loaded.preprocess, pool.sample_ids)
    data = [fft.episode_data(b, n, images, loaded.device) for b, n in pairs]
    scores: dict[tuple, float] = {}

    def score(lr, epochs) -> float:
        if (lr, epochs) not in scores:
            accs = []
            for i, d in enumerate(data):
                with flush_denormals():
                    trained = fft.train_member(ctx, "text_ft", d, fft.Member(lr, None, epochs, (epochs,)), i, 0)
                accs.append(float((trained.logits[epochs][0].argmax(1).numpy() == d.query_labels).mean()))
            scores[lr, epochs] = float(np.mean(accs))
        return scores[lr, epochs]

    best = (0.5, 5)
    score(*best)
    while True:
        li, ei = LADDER.index(best[0]), EPOCHS.index(best[1])
        for a in (li - 1, li, li + 1):
            for b in (ei - 1, ei, ei + 1):
                if 0 <= a < len(LADDER) and 0 <= b < len(EPOCHS):
                    score(LADDER[a], EPOCHS[b])
        top = min(scores, key=lambda p: (-scores[p], p[1], p[0]))
        if scores[top] <= scores[best]:
            return best, scores
        best = top


def test_the_held_out_searchs_own_methods_are_checked_as_fine_tunings_are_before_any_data_is_read(tmp_path):
    """finetune.heldout.search.methods replaces the fine-tuning's methods, checked by fewtrans_episodic.check_settings
    and named as the held-out search's key (not the fine-tuning's section, which holds no such value)."""
    with pytest.raises(FinetuneError, match=r"^params.yaml: finetune.heldout.search.methods must name methods of "
                                            r"\[.*\], got \['coop'\]$"):
        heldout.search({}, tmp_path / "absent", None, {"methods": ["coop"]}, {"methods": ["text_ft"]}, 0)


def test_the_held_out_search_picks_the_optimum_an_independent_loop_finds(world, toy_model_cfg, tmp_path):
    doc, table, tally = heldout.search(toy_model_cfg, world["prepared"], world["texts"], SEARCH,
                                       {"methods": ["text_ft"]}, 3, SEARCH_SAMPLER, "cpu", units_dir=tmp_path / "u",
                                       engine="local", gpus=0)
    best, scores = independent_climb(world, toy_model_cfg)
    assert doc["centres"]["text_ft"] == {"lr": best[0], "epochs": best[1], "accuracy": scores[best]}
    rows = table.to_pylist()
    assert {(r["lr"], r["epochs"]): r["accuracy"] for r in rows} == scores  # the same points, the same numbers
    assert [r["chosen"] for r in rows].count(True) == 1 and rows[0]["round"] == 0
    assert best != (0.5, 5) and max(r["round"] for r in rows) >= 2  # the search moved from the coarse point
    assert scores[best] > scores[0.5, 5]
    assert all(len(r["per_task"]) == 3 for r in rows) and doc["tasks"] == 3
    assert tally.computed == 3 * len(rows) and len(list((tmp_path / "u").glob("*.json"))) == 3 * len(rows)
    # the episodes read the centres: their source is said, and a centre given in params wins
    summary, _ = episodes(world, toy_model_cfg, None, cfg={"lr_factors": [1.0], "epoch_offset": 0,
                                                             "methods": ["text_ft"]}, heldout=doc)
    assert summary["centres_source"] == {"text_ft": "heldout:hues"}
    assert summary["centres"]["text_ft"] == {"lr": best[0], "epochs": best[1]}
    summary, _ = episodes(world, toy_model_cfg, None, cfg={**SMALL, "methods": ["text_ft"]}, heldout=doc)
    assert summary["centres_source"] == {"text_ft": "params"}


def test_the_climb_moves_to_better_neighbours_on_the_1_2_5_ladder():
    s = heldout.settings({"coarse": {"lr": [1e-6, 1e-5], "epochs": [30, 50]}})
    assert heldout.steps(s, "lr", 1e-8) == [2e-8] and heldout.steps(s, "lr", 1e-5) == [5e-6, 2e-5]
    assert heldout.steps(s, "epochs", 1) == [2] and heldout.steps(s, "epochs", 100) == [90]
    assert heldout.steps(s, "lr", 5e3) == [2e3, 1e4]  # no upper limit
    target = (2e-4, 60)

    def evaluate(points):  # a smooth bowl around the target on the ladder's and the epoch list's indices
        return [-abs(heldout.rung(lr) - heldout.rung(target[0])) - abs(s["epochs"].index(e) - s["epochs"].index(60))
                for lr, e in points]

    best, order = heldout.climb(evaluate, s, ("lr", "epochs"), "visual_ft")
    assert best == target and order[0][2] == 0 and len({p for p, _, _ in order}) == len(order)
    # a plateau is not walked: the coarse grid's best by the tie rule (fewer epochs, smaller rate), one round of
    # neighbours, no move
    best, order = heldout.climb(lambda points: [0.5] * len(points), s, ("lr", "epochs"), "visual_ft")
    assert best == (1e-6, 30) and max(r for _, _, r in order) == 1


def test_centres_come_from_the_search_or_the_authors_code_and_say_so(world, toy_model_cfg):
    s = fft.settings({"methods": ["finetune", "lora"], "centres": "authors_fixed"})
    resolved, sources = fft.resolve_centres(s, None)
    assert sources == {"finetune": "authors_fixed", "lora": "authors_fixed"}
    assert resolved["lora"] == {"batch_size": 64, "rank": 4, "alpha": 4.0, "lr": 2e-3, "head_lr": 1e-2, "epochs": 30}
    with pytest.raises(FinetuneError, match="authors' code fixes no centre for 'visual_ft'"):
        fft.resolve_centres(fft.settings({"methods": ["visual_ft"], "centres": "authors_fixed"}), None)
    with pytest.raises(FinetuneError, match="reports/heldout/imagenet.json: no held-out search result"):
        fft.resolve_centres(fft.settings({"methods": ["visual_ft"]}), Path("reports/heldout/imagenet.json"))
    other = {"dataset": "hues", "model": {"model": "another"}, "centres": {"visual_ft": {"lr": 1e-5, "epochs": 10}}}
    with pytest.raises(FinetuneError, match="searched for model 'another'"):
        fft.resolve_centres(fft.settings({"methods": ["visual_ft"]}), other, {"model": "toy-random"})
    with pytest.raises(FinetuneError, match="give \\['epochs', 'lr'\\] together"):
        fft.settings({"visual_ft": {"lr": 1e-5}})
    assert "lr" not in fft.DEFAULTS["visual_ft"] and "lr" not in fft.DEFAULTS["finetune"]  # no placeholder centre


# ----------------------------------------------------------------------------------------------------------------
# ELEVATER full fine-tuning's search runs go through the same path


def test_elevater_search_runs_are_units_with_the_same_numbers_on_both_engines(toy_model_cfg, local_ray, tmp_path):
    from tests.conftest import make_dataset, make_texts
    from vlbench.finetune.registry import method
    from vlbench.finetune.training import Job, Runtime

    make_dataset(tmp_path / "prepared/tiny", per_class=4)
    make_texts(tmp_path / "prepared/tiny", tmp_path / "texts/tiny")
    adapt = {"elevater": {"shots": [2], "seeds": [0], "batch_size": 8, "search_epochs": 1, "final_epochs": 1,
                          "lr_grid": {"log_lower": -3, "log_upper": -2, "num": 2}}}

    def run(folder: Path, engine: str):
        job = Job("tiny", tmp_path / "prepared/tiny", tmp_path / "texts/tiny", toy_model_cfg, {"head": "language_2p"},
                  {"precision": "fp32"}, 0, {"adapt": adapt},
                  Runtime(device="cpu", progress=False, engine=engine, gpus=0, units_dir=folder))
        return method("elevater_full")(job)

    local, on_ray = run(tmp_path / "local", "local"), run(tmp_path / "ray", "ray")
    search = local.tables["search"]
    assert on_ray.tables["search"].equals(search) and on_ray.metrics == local.metrics
    files = unit_files(tmp_path / "local")
    assert files == unit_files(tmp_path / "ray") and len(files) == local.run["units"]["computed"] > 0
    identities = sorted((json.loads(b)["identity"]["li"], json.loads(b)["identity"]["wi"]) for b in files.values())
    assert len(identities) == len(set(identities)) == len(search)  # one unit per distinct search run of the table
    again = run(tmp_path / "local", "local")
    assert again.run["units"] == {"cached": len(files), "computed": 0, "engine": "local"}
    assert again.tables["search"].equals(search) and again.metrics == local.metrics


def test_the_heldout_stage_writes_the_centres_and_a_rerun_computes_nothing(world, toy_model_cfg, tmp_path):
    """`python -m stages.heldout --dataset hues` in a project folder: reports/heldout/hues.json (centres) and
    .search.parquet, units in data/heldout/hues/units; the rerun finds every unit and writes the same bytes."""
    import shutil

    import yaml

    from vlbench.compose import compose

    shutil.copytree(world["prepared"], tmp_path / "data" / "prepared" / "hues")
    shutil.copytree(world["texts"].parent, tmp_path / "data" / "texts" / "hues")
    params = compose([], ROOT / "conf")
    params["suite"]["datasets"]["hues"] = "data/own/hues"
    params["seed"] = 3
    params["model"] = {**params["model"], **toy_model_cfg}
    params["adapt"]["fewtrans"] = SEARCH_SAMPLER
    params["finetune"]["fewtrans_episodic"] = {"methods": ["text_ft"]}
    params["finetune"]["heldout"] = {"dataset": "hues", "search": SEARCH}
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    command = [sys.executable, "-m", "stages.heldout", "--dataset", "hues", "--engine", "local", "--device", "cpu",
               "--no-progress"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    first = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True)
    assert first.returncode == 0, first.stderr
    out = tmp_path / "reports" / "heldout"
    doc = json.loads((out / "hues.json").read_text())
    table = pq.read_table(out / "hues.search.parquet")
    assert set(doc["centres"]) == {"text_ft"} and doc["dataset"] == "hues" and doc["tasks"] == 3
    assert table.num_rows == doc["points"]["text_ft"] and table.column("chosen").to_pylist().count(True) == 1
    units_dir = tmp_path / "data" / "heldout" / "hues" / "units"
    assert len(list(units_dir.glob("*.json"))) == 3 * table.num_rows
    assert f"({3 * table.num_rows} units computed, 0 cached)" in first.stdout
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    again = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True)
    assert again.returncode == 0, again.stderr
    assert f"(0 units computed, {3 * table.num_rows} cached)" in again.stdout
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
