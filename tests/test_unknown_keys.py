"""An unknown setting (`-S +zeroshot.x=1`, a typo in params.yaml) is refused naming the key, at compose and by every
stage (DVC composes params.yaml itself), instead of being ignored while it reruns its section's stages."""

from __future__ import annotations

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
