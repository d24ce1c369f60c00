"""Issue 32: each settings section's defaults live in conf/settings/<section>.yaml, which Hydra does not compose, so
params.yaml (and `dvc exp show`, a column per leaf) holds only what conf/config.yaml keeps, a suite sets or a `-S`
override adds; the stages read the effective settings (`vlbench.params.effective`), exactly what the full composition
gave before."""

from __future__ import annotations

import ast
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner
from omegaconf import OmegaConf

from vlbench.analyses import ANALYSES
from vlbench.cli import main as cli
from vlbench.compose import compose
from vlbench.conf import available
from vlbench.params import ParamsError, effective, load_params, section_defaults

ROOT = Path(__file__).resolve().parents[1]
SETTINGS = ROOT / "conf/settings"
MODELS = ["toy", "toy-wide", "vitb16", "siglip2-vitb16", "rn50"]


def test_the_demo_reads_the_settings_the_full_composition_gave(monkeypatch):
    """tests/data/params_before_settings.yaml is the demo's params.yaml before issue 32 (every section composed; plus
    issue 34's `suite.heldout` and `finetune.heldout`, issue 43's `embed.bf16_weights` and issue 40's key per dataset in
    `suite.entries`, added since): the stages now read the same settings, key for key, from the committed params.yaml and conf/settings/."""
    monkeypatch.chdir(ROOT)
    before = yaml.safe_load((ROOT / "tests/data/params_before_settings.yaml").read_text())
    params = load_params()
    assert params == before
    committed = yaml.safe_load((ROOT / "params.yaml").read_text())
    for section, defaults in section_defaults().items():  # what load_params merges, spelled out
        assert params[section] == OmegaConf.to_container(OmegaConf.merge(defaults, committed[section])), section
    # the sections whose results record their settings as given keep the full composition's key order too
    for section in ("adapt", "repe", "knowledge", "finetune", "linear_probe", "specificity"):
        assert list(params[section]) == list(before[section]), section


def full_composition_conf(tmp_path: Path) -> Path:
    """conf/ as it was before issue 32: every settings file composed into its section of config.yaml (OmegaConf's
    merge, not vlbench's), conf/settings/ gone."""
    conf = tmp_path / "conf"
    shutil.copytree(ROOT / "conf", conf)
    config = yaml.safe_load((conf / "config.yaml").read_text())
    for path in sorted((conf / "settings").glob("*.yaml")):
        merged = OmegaConf.merge(OmegaConf.load(path), config.get(path.stem) or {})
        config[path.stem] = OmegaConf.to_container(merged)
    shutil.rmtree(conf / "settings")
    (conf / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    return conf


def test_every_suite_and_model_reads_what_the_full_composition_gave(tmp_path):
    full = full_composition_conf(tmp_path)
    runs = [([f"suite={s}"], [f"suite={s}"]) for s in available("suite")]
    runs += [([f"model={m}"], [f"model={m}"]) for m in MODELS]
    # a deep setting: a plain override of the full composition, an append now
    runs.append((["suite=openness", "repe.index.kind=flat", "adapt.elevater.shots=[5]", "finetune.negclip.lr=0.1"],
                 ["suite=openness", "+repe.index.kind=flat", "+adapt.elevater.shots=[5]", "+finetune.negclip.lr=0.1"]))
    for old, new in runs:
        assert effective(compose(new, ROOT / "conf"), ROOT / "conf") == compose(old, full), new


def test_params_yaml_holds_only_the_kept_keys():
    """The demo's params.yaml: per section only what conf/config.yaml keeps (the keys dvc.yaml reads among them);
    every section present (a stage's `params: - <section>` needs the key), possibly empty."""
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    config = yaml.safe_load((ROOT / "conf/config.yaml").read_text())
    for section in section_defaults():
        assert params[section] == config[section], section
        assert not set(config[section]) & set(section_defaults()[section]), f"{section}: a key in both files"
        assert len(params[section]) <= 2, section
    dvc_yaml = (ROOT / "dvc.yaml").read_text()
    for dotted in set(re.findall(r"\$\{([a-z_]+\.[a-z_.]+)\}", dvc_yaml)):
        section, key = dotted.split(".", 1)
        if section in section_defaults():
            assert key in config[section], f"dvc.yaml interpolates {dotted}: it must be in params.yaml"


def test_each_stage_depends_on_the_settings_files_of_its_sections():
    stages = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]
    sections = set(section_defaults())
    for name, stage in stages.items():
        stage = stage.get("do", stage)
        wanted = {f"conf/settings/{p}.yaml" for p in stage.get("params") or [] if p in sections}
        assert wanted <= set(stage.get("deps") or []), name
    for name in ANALYSES:
        assert (SETTINGS / f"{name}.yaml").is_file(), name


def test_settings_files_read_as_hydra_reads_yaml(tmp_path):
    for path in sorted(SETTINGS.glob("*.yaml")):
        assert section_defaults()[path.stem] == OmegaConf.to_container(OmegaConf.load(path)), path.name
    (tmp_path / "settings").mkdir()
    (tmp_path / "settings/zeroshot.yaml").write_text("lr: 1e-6\nsplit: test\n")
    assert section_defaults(tmp_path)["zeroshot"] == {"lr": 1e-6, "split": "test"}  # PyYAML alone: the string '1e-6'
    (tmp_path / "settings/zeroshot.yaml").write_text("[test]\n")
    with pytest.raises(ParamsError, match=r"settings/zeroshot.yaml: expected a mapping of zeroshot's settings"):
        section_defaults(tmp_path)


def test_compose_writes_an_appended_setting_and_the_stages_read_it_merged(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    out = tmp_path / "params.yaml"
    result = CliRunner().invoke(cli, ["compose", "+adapt.elevater.shots=[5]", "-o", str(out)])
    assert result.exit_code == 0, result.output
    written = yaml.safe_load(out.read_text())
    assert written["adapt"] == {"protocols": ["elevater", "vtab", "fewtrans"], "elevater": {"shots": [5]}}
    adapt = load_params(out)["adapt"]
    defaults = yaml.safe_load((SETTINGS / "adapt.yaml").read_text())
    assert adapt["elevater"] == {**defaults["elevater"], "shots": [5]}
    assert adapt["vtab"] == defaults["vtab"] and adapt["protocols"] == ["elevater", "vtab", "fewtrans"]
    # `++` sets a key whether params.yaml has it or not
    both = compose(["++adapt.elevater.shots=[5]", "++zeroshot.scoring=elevater"])
    assert both["adapt"]["elevater"] == {"shots": [5]} and both["zeroshot"] == {"scoring": "elevater"}


def test_a_plain_override_of_a_deep_setting_says_to_append_and_a_misspelt_one_is_refused_by_name(tmp_path,
                                                                                                  monkeypatch):
    monkeypatch.chdir(ROOT)
    out = tmp_path / "params.yaml"
    result = CliRunner().invoke(cli, ["compose", "adapt.elevater.shots=[5]", "-o", str(out)])
    assert result.exit_code != 0 and not out.exists()
    assert ("Could not override 'adapt.elevater.shots'. To append to your config use +adapt.elevater.shots=[5]"
            in result.output)
    with pytest.raises(ParamsError) as err:
        compose(["+adapt.elevater.shot=[5]"])
    assert str(err.value) == ("params: unknown key(s) adapt.elevater.shot (did you mean 'adapt.elevater.shots'?): not "
                              "declared in conf/config.yaml nor conf/settings/adapt.yaml; check the spelling, or drop "
                              "the `+` override (`-S +key=...`) that added it")
    # a hand-edited params.yaml: the stage stops the same way
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    params["repe"]["index"] = {"nprobes": 64}
    out.write_text(yaml.safe_dump(params))
    with pytest.raises(ParamsError, match=r"repe.index.nprobes \(did you mean 'repe.index.nprobe'\?\): not "
                                          r"declared in conf/config.yaml nor conf/settings/repe.yaml"):
        load_params(out)


def test_dvc_exp_run_composes_an_append_and_names_the_append_syntax_for_a_plain_deep_override(tmp_path):
    """DVC composes params.yaml itself: `+` reaches a deep setting (the same bytes as `vlbench compose`), and a plain
    override of a key params.yaml lacks stops before any stage with Hydra's hint (docs/pipeline.md quotes it)."""
    from dvc.utils.hydra import compose_and_dump

    from tests.pipeline_repo import make_repo, run

    overrides = ["+adapt.elevater.shots=[5]", "+finetune.negclip.max_steps=3", "++zeroshot.scoring=elevater"]
    compose_and_dump(tmp_path / "dvc.yaml", str(ROOT / "conf"), None, "config", str(ROOT), overrides)
    ours = CliRunner().invoke(cli, ["--conf", str(ROOT / "conf"), "compose", *overrides, "-o", str(tmp_path / "ours.yaml")])
    assert ours.exit_code == 0 and (tmp_path / "ours.yaml").read_text() == (tmp_path / "dvc.yaml").read_text()
    repo = make_repo(tmp_path / "repo")
    proc = run(repo, sys.executable, "-m", "dvc", "exp", "run", "-S", "adapt.elevater.shots=[5]", check=False,
               env={"PYTHONPATH": str(repo)})
    output = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert "Could not override 'adapt.elevater.shots'.\nTo append to your config use +adapt.elevater.shots=[5]" in output
    assert run(repo, "git", "status", "--porcelain").stdout == ""  # params.yaml as it was, nothing ran


# ---- one source for each default (issue 40): conf/settings/<section>.yaml, and conf/config.yaml's kept keys

# a mapping that holds some of a section's values on purpose, with the reason
NOT_COPIES = {("vlbench/finetune/fewtrans_episodic.py", "adapt.fewtrans.linear"):
              "finetune.fewtrans_episodic's own ensemble (FewTrans App. B.2), which adapt's linear head shares"}


def setting_mappings(conf: Path) -> list[tuple[str, dict]]:
    """(dotted name, mapping) for every section of conf/settings/ and each mapping inside it, as the stages see them."""
    full = effective(yaml.safe_load((conf / "config.yaml").read_text()) or {}, conf)
    found: list[tuple[str, dict]] = []

    def walk(name: str, node) -> None:
        if isinstance(node, dict) and node:
            found.append((name, node))
            for key, value in node.items():
                walk(f"{name}.{key}", value)

    for section in section_defaults(conf):
        walk(section, full[section])
    return found


def _literal(node):
    try:
        return True, ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return False, None


def _same(a, b) -> bool:
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return list(a) == list(b)
    return a == b and isinstance(a, bool) == isinstance(b, bool)


def default_copies(root: Path, conf: Path) -> list[str]:
    """'file:line: section: keys' for each dict literal or class body (a dataclass's field defaults) of the project's
    modules that writes 3 or more of one settings mapping's keys at that mapping's values: a second copy."""
    mappings = setting_mappings(conf)
    found = []
    for path in sorted(p for package in ("vlbench", "stages") for p in (root / package).rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Dict) and all(isinstance(k, ast.Constant) for k in node.keys):
                pairs = [(k.value, v) for k, v in zip(node.keys, node.values)]
            elif isinstance(node, ast.ClassDef):
                pairs = [(b.target.id, b.value) for b in node.body if isinstance(b, ast.AnnAssign)
                         and isinstance(b.target, ast.Name) and b.value is not None]
            else:
                continue
            for name, mapping in mappings:
                keys = [k for k, v in pairs if k in mapping and _same(_literal(v)[1], mapping[k]) and _literal(v)[0]]
                where = path.relative_to(root).as_posix()
                if len(keys) >= 3 and (where, name) not in NOT_COPIES:
                    found.append(f"{where}:{node.lineno}: {name}: {keys}")
    return found


def test_no_module_keeps_a_second_copy_of_a_sections_defaults():
    """Every default is written once, in conf/settings/<section>.yaml (or conf/config.yaml for the keys it keeps);
    module code reads it with vlbench.params.defaults (issue 40: 81 defaults of 6 sections had a second copy in a
    module dict, and three disagreed)."""
    copies = default_copies(ROOT, ROOT / "conf")
    assert not copies, "defaults written twice (read them with vlbench.params.defaults): " + "; ".join(copies)


def test_the_copy_finder_finds_a_dict_and_a_dataclass_copy(tmp_path):
    conf = tmp_path / "conf"
    (conf / "settings").mkdir(parents=True)
    (conf / "config.yaml").write_text("probe:\n  kind: a\n")
    (conf / "settings/probe.yaml").write_text("split: test\nsteps: [1, 2]\nlr: 0.1\nhead: {width: 3, depth: 2, act: relu}\n")
    (tmp_path / "vlbench").mkdir()
    (tmp_path / "stages").mkdir()
    (tmp_path / "vlbench/a.py").write_text('D = {"kind": "a", "split": "test", "steps": [1, 2], "lr": 0.2}\n')
    (tmp_path / "vlbench/b.py").write_text("class H:\n    width: int = 3\n    depth: int = 2\n    act: str = 'relu'\n")
    (tmp_path / "stages/c.py").write_text('D = {"split": "test", "steps": [1, 2]}\n')  # two keys: not a copy
    assert default_copies(tmp_path, conf) == ["vlbench/a.py:1: probe: ['kind', 'split', 'steps']",
                                              "vlbench/b.py:1: probe.head: ['width', 'depth', 'act']"]


def test_module_defaults_are_the_settings_files():
    """The three defaults that disagreed (issue 40) are the settings files' (the demo's, which its numbers use)."""
    from vlbench.analyses.adapt import elevater, vtab
    from vlbench.analyses.retrieval import DEFAULTS as RETRIEVAL
    from vlbench.params import defaults

    adapt = yaml.safe_load((SETTINGS / "adapt.yaml").read_text())
    assert RETRIEVAL["dataset_text_sets"] == {"captions": "captions"} == defaults("retrieval.dataset_text_sets")
    assert vtab.DEFAULTS["groups"] == adapt["vtab"]["groups"] and len(adapt["vtab"]["groups"]) == 4
    assert elevater.Settings().heads == tuple(adapt["elevater"]["heads"]) == ("random_2p", "language_2p", "language_1p")
    assert elevater.Settings.from_cfg({}) == elevater.Settings()
    with pytest.raises(ParamsError, match=r"no default 'adapt.vtab.group' \(no 'group' in conf/config.yaml nor "
                                          r"conf/settings/adapt.yaml\)"):
        defaults("adapt.vtab.group")


def test_an_installed_package_reads_the_defaults_of_the_project_it_runs_in(tmp_path):
    """Outside a checkout (a wheel in site-packages: no conf/ beside the package) the defaults are the conf/ of the
    project the command runs in; with none there, one line says where to run."""
    site, project = tmp_path / "site", tmp_path / "project"
    shutil.copytree(ROOT / "vlbench", site / "vlbench", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(ROOT / "conf", project / "conf")
    code = "from vlbench import params; print(params.defaults_conf()); print(params.defaults('adapt.elevater.heads'))"
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(site), "HOME": str(tmp_path)}
    out = subprocess.run([sys.executable, "-c", code], cwd=project, env=env, capture_output=True, text=True, check=True)
    expected = yaml.safe_load((SETTINGS / "adapt.yaml").read_text())["elevater"]["heads"]
    assert out.stdout.splitlines() == [str(project / "conf"), str(expected)]
    elsewhere = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert elsewhere.returncode == 1
    assert f"no conf/config.yaml beside the installed vlbench ({site}) nor in this folder ({tmp_path}): run vlbench " \
           f"from the project's root" in elsewhere.stderr
