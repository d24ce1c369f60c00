"""An unknown setting (`-S +zeroshot.x=1`, a typo in params.yaml) is refused naming the key, at compose and by every
stage (DVC composes params.yaml itself), instead of being ignored while it reruns its section's stages."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from vlbench.compose import compose
from vlbench.params import ParamsError, effective, load_params

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("override, key, files", [
    ("+zeroshot.x=1", "zeroshot.x", "conf/config.yaml nor .*conf/settings/zeroshot.yaml"),
    ("+newsection=1", "newsection", "conf/config.yaml"),
    ("+knowledge.llm.temp=0", "knowledge.llm.temp", "conf/config.yaml nor .*conf/settings/knowledge.yaml")])
def test_compose_refuses_an_added_key_naming_it(override, key, files):
    with pytest.raises(ParamsError, match=rf"^params: unknown key\(s\) {key}: not declared in .*{files}; check the "
                                          r"spelling, or drop the `\+` override"):
        compose([override], ROOT / "conf")


def test_maps_open_to_any_key_stay_open():
    params = compose(["+suite.entries.shapes.note=x", "+robustness.lines.shapes=identity"], ROOT / "conf")
    assert params["robustness"]["lines"]["shapes"] == "identity"
    # maps keyed by dataset whose defaults hold the demo's entry (conf/settings/): another dataset is no typo
    params = compose(["+adapt.elevater.search_subset.colors=10", "+adapt.vtab.groups.colors=specialized",
                      "+retrieval.dataset_text_sets.shapes=captions"], ROOT / "conf")
    assert params["adapt"]["elevater"]["search_subset"] == {"colors": 10}


def test_a_stage_refuses_a_params_file_with_an_unknown_key(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)  # the stages run in the project: its conf/config.yaml declares the keys
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    assert load_params(ROOT / "params.yaml") == effective(params)
    params["zeroshot"]["scorng"] = "elevater"
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    with pytest.raises(ParamsError, match=r"unknown key\(s\) zeroshot.scorng \(did you mean "
                                          r"'zeroshot.scoring'\?\): not declared in conf/config.yaml nor "
                                          r"conf/settings/zeroshot.yaml; check the spelling"):
        load_params(tmp_path / "params.yaml")


# ------------------------------------------------------------------ renamed keys: the old name names the new one
@pytest.mark.parametrize("override, message", [
    ("retrieve.corpus=corpus", "override 'retrieve.corpus=corpus': `retrieve` was renamed `repe`"),
    ("+retrieve.top_k=5", "override '+retrieve.top_k=5': `retrieve` was renamed `repe`"),
    ("suite.retrieve=[shapes]", "override 'suite.retrieve=[shapes]': `suite.retrieve` was renamed `suite.repe`")])
def test_compose_refuses_a_renamed_key_naming_the_new_one(override, message):
    with pytest.raises(ParamsError) as err:
        compose([override], ROOT / "conf")
    assert str(err.value) == message


@pytest.mark.parametrize("where, message", [
    ("section", "params: `retrieve` was renamed `repe`"),
    ("suite", "suite 'demo': `suite.retrieve` was renamed `suite.repe`")])
def test_a_stage_refuses_a_params_file_with_a_renamed_key(tmp_path, monkeypatch, where, message):
    """params.yaml written before the rename (`dvc exp run` composes it itself, so every stage checks)."""
    monkeypatch.chdir(ROOT)
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    holder = params if where == "section" else params["suite"]
    holder["retrieve"] = holder.pop("repe")
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    with pytest.raises(ParamsError) as err:
        load_params(tmp_path / "params.yaml")
    assert str(err.value) == message


@pytest.mark.parametrize("text, key", [
    ("slug: old\ndatasets: {shapes: data/raw/shapes}\nretrieve: [shapes]\n", "`retrieve` was renamed `repe`"),
    ("# @package _global_\nsuite:\n  slug: old\n  datasets: {shapes: data/raw/shapes}\nretrieve: {top_k: 5}\n",
     "`retrieve` was renamed `repe`"),
    ("# @package _global_\nsuite:\n  slug: old\n  datasets: {shapes: data/raw/shapes}\n  retrieve: [shapes]\n",
     "`suite.retrieve` was renamed `suite.repe`")])
def test_a_suite_file_with_a_renamed_key_names_the_new_one(tmp_path, text, key):
    """A suite file written before the rename: refused as it is loaded (`vlbench compose`, and `dvc exp run -S
    suite=old` through hydra_plugins/vlbench_suites.py, which runs the same check), naming the file."""
    conf = tmp_path / "conf"
    shutil.copytree(ROOT / "conf", conf)
    (conf / "suite" / "old.yaml").write_text(text)
    with pytest.raises(ParamsError) as err:
        compose(["suite=old"], conf)
    assert str(err.value) == f"{conf / 'suite' / 'old.yaml'}: {key}"
