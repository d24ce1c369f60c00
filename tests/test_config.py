import re
import sys
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from stages import code as code_stage
from vlbench.cli import main as cli
from vlbench.compose import compose
from vlbench.conf import available
from vlbench.dataset_entries import dataset_entry, dataset_spec
from vlbench.models.finetuned import missing_finetuned
from vlbench.params import ParamsError, get, load_params

ROOT = Path(__file__).resolve().parent.parent


def test_committed_params_yaml_is_the_composition_of_the_defaults():
    assert yaml.safe_load((ROOT / "params.yaml").read_text()) == compose()


def test_every_model_and_suite_composes():
    for slug in available("model"):
        entry = yaml.safe_load((ROOT / "conf/model" / f"{slug}.yaml").read_text())
        if entry.get("finetune") and missing_finetuned(entry, ROOT) is not None:  # its weights not made here
            with pytest.raises(ParamsError, match=f"model '{slug}' needs .* it is made by .*: `dvc exp run -S "):
                compose([f"model={slug}"])
            continue
        params = compose([f"model={slug}"])
        assert params["model"]["slug"] == slug
        assert isinstance(params["model"]["pretrain"], list)
    for slug in available("suite"):
        suite = compose([f"suite={slug}"])["suite"]
        for analysis in ("embed", "zeroshot", "linear_probe"):
            assert set(suite.get(analysis, [])) <= set(suite["datasets"]), (slug, analysis)


def test_real_models_have_no_pretrain_stage_and_toys_do():
    assert compose(["model=vitb16"])["model"]["pretrain"] == []
    toy = compose(["model=toy-wide"])["model"]
    assert toy["pretrain"] == ["toy-wide"] and toy["train"]["steps"] > 0


def test_required_model_slugs_are_registered():
    assert {"vitb32", "vitb16", "vitl14", "rn50", "toy", "toy-wide"} <= set(available("model"))
    entries = {s: yaml.safe_load((ROOT / "conf/model" / f"{s}.yaml").read_text()) for s in available("model")}
    laion = [s for s, entry in entries.items() if "laion" in entry["pretrained"]]
    assert len(laion) >= 2


def test_get_names_missing_and_mistyped_keys(tmp_path):
    params = {"suite": {"datasets": {"shapes": "x"}}, "seed": "zero"}
    with pytest.raises(ParamsError, match=r"key 'suite.zeroshot' not found .*known: \['datasets'\]"):
        get(params, "suite.zeroshot")
    with pytest.raises(ParamsError, match=r"key 'seed' must be a int, got str 'zero'"):
        get(params, "seed", int)
    params = {**params, "suite": {**params["suite"], "slug": "demo"}}
    with pytest.raises(ParamsError, match=r"unknown dataset 'cifar10'.*\['shapes'\]"):
        dataset_spec(params, "cifar10")
    (tmp_path / "dataset").mkdir()
    (tmp_path / "config.yaml").write_text("suite: {}\n")
    with pytest.raises(ParamsError, match=r"dataset 'shapes' has no registry entry"):
        dataset_entry(params, "shapes", tmp_path)
    (tmp_path / "dataset/shapes.yaml").write_text("prepare: {source: synthetic}\n")
    with pytest.raises(ParamsError, match=r"dataset 'shapes' lacks key\(s\) \['input', 'texts'\]"):
        dataset_entry(params, "shapes", tmp_path)
    (tmp_path / "dataset/shapes.yaml").write_text("prepare: {source: synthetic}\ninput: y\ntexts: {}\n")
    with pytest.raises(ParamsError, match=r"datasets.shapes is 'x' but .* has input 'y'.*set `shapes: y`"):
        dataset_entry(params, "shapes", tmp_path)


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


@pytest.mark.parametrize("key", ["/tmp/victim", "../up", "a/b", "", ".hidden", "sp ace", None])
def test_names_that_would_leave_their_folder_are_refused(key):
    from vlbench.paths import features_dir, prepared_dir

    with pytest.raises(ParamsError, match="is not allowed: use letters, digits"):
        prepared_dir(key)
    with pytest.raises(ParamsError, match="is not allowed"):
        features_dir("toy", key)
    with pytest.raises(ParamsError, match="is not allowed"):
        features_dir(key, "shapes")


def test_output_paths_stay_inside_the_project(tmp_path, monkeypatch):
    from vlbench.paths import prepared_dir

    monkeypatch.chdir(tmp_path)
    (tmp_path / "data").symlink_to(tmp_path.parent)  # a link that would carry outputs elsewhere
    with pytest.raises(ParamsError, match="leaves the project folder"):
        prepared_dir("shapes")


def test_a_suite_that_leaves_out_an_analysis_runs_none_of_it(tmp_path):
    import shutil

    conf = tmp_path / "conf"
    shutil.copytree(ROOT / "conf", conf)
    (conf / "suite/mini.yaml").write_text("datasets: {shapes: vlbench/datasets/synthetic.py}\nslug: mini\nembed: [shapes]\nzeroshot: [shapes]\n")
    suite = compose(["suite=mini"], conf)["suite"]
    assert suite["linear_probe"] == [] and suite["zeroshot"] == ["shapes"] and list(suite["datasets"]) == ["shapes"]


def test_cli_reads_the_conf_of_the_current_directory_or_the_flag(tmp_path, monkeypatch):
    import shutil

    shutil.copytree(ROOT / "conf", tmp_path / "conf")
    (tmp_path / "conf/suite/mine.yaml").write_text("slug: mine\nembed: []\n")
    monkeypatch.chdir(tmp_path)
    runner = CliRunner()
    assert "mine" in runner.invoke(cli, ["suites"]).output.split()
    monkeypatch.chdir(tmp_path.parent)
    result = runner.invoke(cli, ["suites"])
    assert result.exit_code != 0 and "no config.yaml" in result.output and "--conf" in result.output
    assert "mine" in runner.invoke(cli, ["--conf", str(tmp_path / "conf"), "suites"]).output.split()


def test_datasets_catalogue_json(monkeypatch):
    import json

    monkeypatch.chdir(ROOT)
    result = CliRunner().invoke(cli, ["datasets", "--suite", "demo", "--json"])
    assert result.exit_code == 0, result.output
    rows = {r["name"]: r for r in json.loads(result.output)}
    assert set(rows) == set(compose()["suite"]["datasets"])
    assert rows["shapes"] == {"name": "shapes", "source": "synthetic", "classes": 12,
                              "splits": {"train": 2000, "val": 500, "test": 1000}, "metric": "accuracy",
                              "manual_download": False, "base": 10, "novel": 2}  # FewTrans' episodes (fewtrans_splits.json)
    assert rows["hierarchy"]["metric"] == "map_11point" and rows["hierarchy"]["classes"] == 22
    table = CliRunner().invoke(cli, ["datasets"]).output
    assert "shape_color" in table and "108" in table


def _conf_with_suite(tmp_path, text: str) -> Path:
    import shutil

    conf = tmp_path / "conf"
    shutil.copytree(ROOT / "conf", conf)
    (conf / "suite/typo.yaml").write_text(text)
    return conf


def test_a_misspelled_suite_key_fails_compose_with_the_allowed_keys_and_a_suggestion(tmp_path, monkeypatch):
    conf = _conf_with_suite(tmp_path, "datasets: {shapes: vlbench/datasets/synthetic.py}\n"
                                      "slug: typo\nembed: [shapes]\nzershot: [shapes]\n")
    with pytest.raises(ParamsError) as err:
        compose(["suite=typo"], conf)
    message = str(err.value)
    assert "'zershot'" in message and "did you mean 'zeroshot'" in message and "suite 'typo'" in message
    assert "linear_probe" in message and "extensibility_sets" in message  # the allowed keys are listed
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(cli, ["compose", "suite=typo", "-o", str(tmp_path / "p.yaml")])
    assert result.exit_code != 0 and "did you mean 'zeroshot'" in result.output
    assert not (tmp_path / "p.yaml").exists()


def test_a_dataset_missing_from_the_suite_fails_compose_naming_analysis_dataset_and_suite(tmp_path):
    conf = _conf_with_suite(tmp_path, "datasets: {shapes: vlbench/datasets/synthetic.py}\n"
                                      "slug: typo\nembed: [shapes]\nzeroshot: [shapes, nosuch]\n")
    with pytest.raises(ParamsError, match=r"suite 'typo': zeroshot lists dataset 'nosuch', which is not among "
                                          r"the suite's datasets \['shapes'\]"):
        compose(["suite=typo"], conf)
    conf = _conf_with_suite(tmp_path / "b", "datasets: {shapes: vlbench/datasets/synthetic.py, "
                                            "colors: vlbench/datasets/synthetic.py}\n"
                                            "slug: typo\nextensibility_sets: {pair: [shapes, colours]}\n")
    with pytest.raises(ParamsError, match=r"extensibility_sets.pair lists dataset 'colours'.*did you mean 'colors'"):
        compose(["suite=typo"], conf)


def test_every_stage_refuses_params_with_a_misspelled_suite_key(tmp_path):
    """`dvc exp run` composes params.yaml itself (no `vlbench compose`): the stages' common loader checks it."""
    params = compose()
    params["suite"]["zershot"] = ["shapes"]
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(params))
    with pytest.raises(ParamsError, match=r"'zershot'.*did you mean 'zeroshot'"):
        load_params(path)


def test_dvc_exp_show_has_a_column_per_suite_dataset_not_per_registry_leaf(tmp_path):
    """`dvc exp show` lists every leaf of params.yaml: registry entries stay in conf/dataset/ (file dependencies), so
    the demo suite adds one column per dataset (its input) and one per analysis list, not its entries' 80+ leaves."""
    import csv
    import io
    import sys

    from tests.pipeline_repo import make_repo, run

    repo = make_repo(tmp_path / "repo")
    for name in ("shapes", "hierarchy"):  # the demo's own entries (the smoke suite's have no prompt_sets for extensibility)
        (repo / "conf/dataset" / f"{name}.yaml").write_text((ROOT / "conf/dataset" / f"{name}.yaml").read_text())
    run(repo, sys.executable, "-m", "vlbench.cli", "compose", "suite=demo", "model=toy")
    run(repo, "git", "commit", "-qam", "demo")
    header = next(csv.reader(io.StringIO(run(repo, sys.executable, "-m", "dvc", "exp", "show", "--csv").stdout)))
    params = yaml.safe_load((repo / "params.yaml").read_text())
    suite = params["suite"]
    expected = ({f"suite.datasets.{d}" for d in suite["datasets"]} | {f"suite.extensibility_sets.{s}" for s in
                suite["extensibility_sets"]} | {f"suite.{k}" for k, v in suite.items()
                                                if k not in ("datasets", "extensibility_sets", "entries") and v != {}})
    # 20 + suite.retrieval, suite.robustness, suite.finetune, suite.compositionality, datasets.shapes_outline,
    # datasets.compositional (issues 22, 23), suite.heldout (issue 34)
    assert {c for c in header if c.startswith("suite.")} == expected and len(expected) == 27
    # issue 40: a key per dataset (each stage's param suite.entries.<name>), all {} on the demo: no column
    assert suite["entries"] == {d: {} for d in suite["datasets"]}
    assert not [c for c in header if c.startswith("suite.datasets.shapes.")]
    # each entry is one dependency column instead (its file hash)
    assert {c for c in header if c.startswith("conf/dataset/")} == {f"conf/dataset/{d}.yaml" for d in suite["datasets"]}
    def leaves(node, prefix=""):
        if isinstance(node, dict) and node:
            return [leaf for k, v in node.items() for leaf in leaves(v, f"{prefix}{k}.")]
        return [prefix[:-1]]

    param_columns = set(header) & set(leaves(params))
    # 242 on the demo when the entries were params, 197 when every settings section was (adapt 64, repe 22,
    # finetune 18, ...); issue 32: each section's defaults are conf/settings/<section>.yaml, a dependency column each
    sections = ("knowledge", "zeroshot", "linear_probe", "granularity", "repe", "specificity", "retrieval",
                "compositionality", "adapt", "extensibility", "robustness", "finetune", "downloads")
    assert {c.split(".")[0] for c in param_columns} - {"model", "suite", "seed", "embed"} <= set(sections)
    assert sum(c.split(".")[0] in sections for c in param_columns) <= 13 and len(param_columns) <= 60
    assert not [c for c in header if c.startswith(("adapt.elevater", "repe.index", "finetune.negclip"))]
    assert {"conf/settings/adapt.yaml", "conf/settings/zeroshot.yaml"} <= set(header)


# ---------------------------------------------------------------------------------------------------------------------
# Issue 30: a suite written the Hydra way, and a text set an analysis needs, caught where the suite is composed

HYDRA_SUITE = "defaults:\n  - /dataset@datasets.shapes: shapes\nslug: hyd\nembed: [shapes]\nzeroshot: [shapes]\n"


def test_a_hydra_style_suite_stops_dvc_exp_run_with_the_suite_file_and_its_format(tmp_path):
    """`dvc exp run -S suite=hyd` composes with Hydra inside DVC (hydra_plugins/vlbench_suites.py checks the suite
    file there); before, DVC stopped at dvc.yaml with "Cannot interpolate data of type 'dict'"."""
    import sys

    from tests.pipeline_repo import make_repo, run

    repo = make_repo(tmp_path / "repo")
    (repo / "conf/suite/hyd.yaml").write_text(HYDRA_SUITE)
    run(repo, "git", "add", "-A")
    run(repo, "git", "commit", "-qm", "a Hydra-style suite")
    env = {"PYTHONPATH": str(repo)}
    proc = run(repo, sys.executable, "-m", "dvc", "exp", "run", "-S", "suite=hyd", check=False, env=env)
    errors = [line for line in (proc.stdout + proc.stderr).splitlines() if line.startswith("ERROR")]
    assert proc.returncode != 0 and len(errors) == 1, proc.stdout + proc.stderr
    assert errors[0].startswith("ERROR: conf/suite/hyd.yaml: a suite does not pull entries in with a Hydra `defaults:`")
    assert "`datasets: {shapes: vlbench/datasets/synthetic.py}` and `zeroshot: [shapes]`" in errors[0]
    assert "Cannot interpolate" not in proc.stdout + proc.stderr
    assert run(repo, "git", "status", "--porcelain").stdout == ""  # params.yaml as it was
    cli_proc = run(repo, sys.executable, "-m", "vlbench.cli", "compose", "suite=hyd", "-o", "p.yaml", check=False,
                   env=env)
    assert cli_proc.returncode != 0 and "conf/suite/hyd.yaml: a suite does not pull entries in" in cli_proc.stderr
    # an entry written inside the suite (not as its input path) is the same mistake, named by its key
    (repo / "conf/suite/hyd.yaml").write_text("datasets: {shapes: {prepare: {source: synthetic}}}\nslug: hyd\n")
    with pytest.raises(ParamsError, match=r"hyd.yaml: datasets.shapes is not an input path.*conf/suite/demo.yaml"):
        compose(["suite=hyd"], repo / "conf")
    # a text set an analysis needs and the entry does not make: the first stage DVC runs stops, nothing is embedded
    (repo / "conf/suite/hyd.yaml").write_text("datasets: {shapes: vlbench/datasets/synthetic.py}\nslug: hyd\n"
                                              "embed: [shapes]\nextensibility: [shapes]\n")  # smoke shapes: no prompt_sets
    run(repo, "git", "add", "-A")
    run(repo, "git", "commit", "-qm", "a suite whose extensibility lacks a text set")
    proc = run(repo, sys.executable, "-m", "dvc", "exp", "run", "-S", "suite=hyd", check=False, env=env)
    assert proc.returncode != 0
    assert "suite 'hyd': extensibility on dataset 'shapes' needs text set 'prompts_single'" in proc.stdout + proc.stderr
    # a first stage (the code fingerprints read the params too): nothing embedded
    assert re.search(r"failed to reproduce '(code|prepare@|pretrain@)", proc.stderr)
    assert not list((repo / "features").rglob("*.parquet"))


def test_the_plugin_leaves_the_composition_of_valid_suites_unchanged(tmp_path):
    """DVC's own compose with the repository's Hydra plugins gives the committed params.yaml, as `compose` does."""
    from dvc.utils.hydra import compose_and_dump

    compose_and_dump(tmp_path / "params.yaml", str(ROOT / "conf"), None, "config", str(ROOT), [])
    assert yaml.safe_load((tmp_path / "params.yaml").read_text()) == compose()
    compose_and_dump(tmp_path / "elevater.yaml", str(ROOT / "conf"), None, "config", str(ROOT), ["suite=elevater"])
    assert yaml.safe_load((tmp_path / "elevater.yaml").read_text()) == compose(["suite=elevater"])


def test_a_text_set_an_analysis_needs_is_checked_at_compose_naming_analysis_dataset_and_set(tmp_path, monkeypatch):
    """Extensibility's variant `single` reads `prompts_single`, made by the entry's `texts.prompt_sets`; a dataset
    without it used to fail at extensibility@ after embedding."""
    conf = _conf_with_suite(tmp_path, "datasets: {captions: vlbench/datasets/synthetic.py}\nslug: typo\n"
                                      "embed: [captions]\nextensibility: [captions]\n")
    with pytest.raises(ParamsError) as err:
        compose(["suite=typo"], conf)
    message = str(err.value)
    assert message.startswith("suite 'typo': extensibility on dataset 'captions' needs text set 'prompts_single'")
    assert "captions.yaml does not make: add `prompt_sets: {single: [...]}` under its `texts`" in message
    assert "\n" not in message
    # the suite's own entry change makes it (and `repe` needs none)
    (conf / "suite/typo.yaml").write_text("datasets: {captions: vlbench/datasets/synthetic.py}\nslug: typo\n"
                                          "embed: [captions]\nextensibility: [captions]\nentries: {captions: {texts: "
                                          "{templates: ['a photo of a {c}.'], prompt_sets: {single: ['a {c}.'], "
                                          "ensemble: templates}}}}\n")
    assert compose(["suite=typo"], conf)["suite"]["extensibility"] == ["captions"]
    # retrieval's default captions_prompted needs the entry's caption_prompt
    conf = _conf_with_suite(tmp_path / "b", "datasets: {shapes: vlbench/datasets/synthetic.py}\nslug: typo\n"
                                            "embed: [shapes]\nretrieval: [shapes]\n")
    with pytest.raises(ParamsError, match=r"retrieval on dataset 'shapes' needs text set 'captions_prompted'.*"
                                          r"add `caption_prompt: 'a photo of \{c\}'`"):
        compose(["suite=typo"], conf)
    # what `dvc exp run` composes is checked by the first stage of every run (`code`, whose params are the whole
    # suite), before anything is embedded (load_params, which every stage runs, leaves it to the analyses' module)
    monkeypatch.chdir(ROOT)
    params = compose()
    params["suite"]["extensibility"] = ["captions"]
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(params))
    assert load_params(path)["suite"]["extensibility"] == ["captions"]
    monkeypatch.setattr(code_stage, "CODE_DIR", tmp_path / "code")
    monkeypatch.setattr(sys, "argv", ["code", "--params", str(path)])
    with pytest.raises(ParamsError, match="extensibility on dataset 'captions' needs text set 'prompts_single'"):
        code_stage.main()
    assert not (tmp_path / "code").exists()
    for suite in available("suite"):  # every shipped suite composes (each entry makes what its analyses read)
        compose([f"suite={suite}"])


def test_the_text_set_defaults_compose_assumes_are_the_analyses_own():
    """text_set_needs falls back on the one source of each default, conf/config.yaml and conf/settings/ (issue 40: it
    kept a third copy of 7 of them), the analyses' own defaults."""
    from vlbench.analyses.adapt.fewtrans import DEFAULTS as FEWTRANS
    from vlbench.analyses.retrieval import DEFAULTS as RETRIEVAL
    from vlbench.analyses.text_sets import text_set_needs
    from vlbench.texts import CAPTION_PROMPT_SET

    assert RETRIEVAL["text_set"] == CAPTION_PROMPT_SET and FEWTRANS["text_set"] == "prompts"
    bare = {"suite": {"extensibility": ["a"], "retrieval": ["b"], "adapt": ["c"]}}  # no analysis section: defaults
    assert text_set_needs(bare) == [("extensibility", "a", "prompts_single"), ("extensibility", "a", "prompts_ensemble"),
                                    ("retrieval", "b", "captions_prompted")]
