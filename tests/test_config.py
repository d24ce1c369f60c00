from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from vlbench.cli import main as cli
from vlbench.config import (
    ParamsError,
    available,
    compose,
    dataset_spec,
    get,
    load_params,
)

ROOT = Path(__file__).resolve().parent.parent


def test_committed_params_yaml_is_the_composition_of_the_defaults():
    assert yaml.safe_load((ROOT / "params.yaml").read_text()) == compose()


def test_every_model_and_suite_composes():
    for slug in available("model"):
        params = compose([f"model={slug}"])
        assert params["model"]["slug"] == slug
        assert isinstance(params["model"]["pretrain"], dict)
    for slug in available("suite"):
        suite = compose([f"suite={slug}"])["suite"]
        for analysis in ("embed", "zeroshot", "linear_probe"):
            assert set(suite.get(analysis, [])) <= set(suite["datasets"]), (slug, analysis)


def test_real_models_have_no_pretrain_stage_and_toys_do():
    assert compose(["model=vitb16"])["model"]["pretrain"] == {}
    assert list(compose(["model=toy-wide"])["model"]["pretrain"]) == ["toy-wide"]


def test_required_model_slugs_are_registered():
    assert {"vitb32", "vitb16", "vitl14", "rn50", "toy", "toy-wide"} <= set(available("model"))
    laion = [s for s in available("model") if "laion" in compose([f"model={s}"])["model"]["pretrained"]]
    assert len(laion) >= 2


def test_get_names_missing_and_mistyped_keys():
    params = {"suite": {"datasets": {"shapes": {"source": "synthetic"}}}, "seed": "zero"}
    with pytest.raises(ParamsError, match=r"key 'suite.zeroshot' not found .*known: \['datasets'\]"):
        get(params, "suite.zeroshot")
    with pytest.raises(ParamsError, match=r"key 'seed' must be a int, got str 'zero'"):
        get(params, "seed", int)
    with pytest.raises(ParamsError, match=r"unknown dataset 'cifar10'.*\['shapes'\]"):
        dataset_spec({**params, "suite": {**params["suite"], "slug": "demo"}}, "cifar10")


def test_malformed_params_file(tmp_path):
    bad = tmp_path / "params.yaml"
    bad.write_text("model: [unclosed\n")
    with pytest.raises(ParamsError, match="not valid YAML"):
        load_params(bad)
    with pytest.raises(ParamsError, match="not found"):
        load_params(tmp_path / "missing.yaml")


def test_cli_lists_models_and_refuses_unknown_slugs(tmp_path):
    runner = CliRunner()
    listing = runner.invoke(cli, ["models"])
    assert listing.exit_code == 0 and "vitb16" in listing.output and "ViT-B-16-quickgelu" in listing.output
    bad = runner.invoke(cli, ["compose", "model=vitb17", "-o", str(tmp_path / "p.yaml")])
    assert bad.exit_code != 0 and "unknown model 'vitb17'" in bad.output and "vitb16" in bad.output
    ok = runner.invoke(cli, ["compose", "model=toy-wide", "-o", str(tmp_path / "p.yaml")])
    assert ok.exit_code == 0
    assert yaml.safe_load((tmp_path / "p.yaml").read_text())["model"]["arch"] == "vlbench-toy-wide"
