"""Reading params.yaml (composed from conf/ by Hydra; each settings section completed with its defaults from
conf/settings/, which Hydra does not compose: `effective`) and the fixed layout of the pipeline's files.

Every output path is built here from a validated name (a dataset key, a model slug, a text-set name: letters,
digits, `-` and `_`), so a key can never point a stage at a folder it does not own.
"""

from __future__ import annotations

import copy
import difflib
import functools
import os
import re
import shlex
from pathlib import Path
from typing import Any, Mapping

import yaml

from vlbench.errors import VlbenchError

PARAMS_FILE = Path("params.yaml")
CONF = Path("conf")
PREPARED = Path("data/prepared")
TEXTS = Path("data/texts")
KNOWLEDGE = Path("data/knowledge")
LLM_ANSWERS = Path("data/llm")
MODELS = Path("data/models")
FEATURES = Path("features")
REPORTS = Path("reports")
OWN_DATA = Path("data/own")  # your own data: a link to VLBENCH_DATA_ROOT (`vlbench data-root`), or a plain folder
DATA_ROOT_VARIABLE = "VLBENCH_DATA_ROOT"
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]*$")
DATASET_KEYS = ("prepare", "input", "texts")
FINETUNE_FINGERPRINT = "fingerprint.json"  # beside a fine-tuned checkpoint (vlbench.finetune.artifacts writes both)


class ParamsError(VlbenchError):
    """params.yaml is missing, malformed, or lacks a key a stage needs; the message names the key."""


def load_params(path: str | Path = PARAMS_FILE) -> dict[str, Any]:
    """The params every stage reads: params.yaml checked, each settings section completed with its defaults
    (`effective`: conf/settings/<section>.yaml with params.yaml's section merged over it)."""
    path = Path(path)
    if not path.exists():
        raise ParamsError(f"{path}: not found; run from the repository root (or `dvc exp run`, which writes it)")
    try:
        params = yaml.safe_load(path.read_text())
    except yaml.YAMLError as err:
        raise ParamsError(f"{path}: not valid YAML ({err})") from err
    if not isinstance(params, dict):
        raise ParamsError(f"{path}: expected a mapping at the top level")
    if isinstance(params.get("suite"), Mapping):
        check_suite(params["suite"])  # `dvc exp run` composes params.yaml itself: every stage checks what it got
    check_known_keys(params)
    params = effective(params)
    if isinstance(params.get("suite"), Mapping) and (CONF / "config.yaml").is_file():
        check_text_sets(params, known_only=True)  # the first stage DVC runs stops, not the analysis after embedding
    return params


SETTINGS = "settings"  # conf/settings/<section>.yaml: a section's defaults, not composed by Hydra


class _SettingsLoader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):
    """YAML as Hydra (OmegaConf) reads it: `1e-6` is a float, as it would be in conf/config.yaml."""


_SettingsLoader.add_implicit_resolver("tag:yaml.org,2002:float", re.compile(
    r"^(?:[-+]?[0-9]+(?:_[0-9]+)*\.[0-9_]*(?:[eE][-+]?[0-9]+)?|[-+]?[0-9]+(?:_[0-9]+)*(?:[eE][-+]?[0-9]+)"
    r"|\.[0-9]+(?:_[0-9]+)*(?:[eE][-+][0-9]+)?|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"), list("-+0123456789."))


def section_defaults(config_dir: str | Path | None = None) -> dict[str, dict[str, Any]]:
    """{section: its defaults} from conf/settings/<section>.yaml (none outside a project checkout)."""
    folder = (Path(config_dir) if config_dir else CONF) / SETTINGS
    defaults = {}
    for path in sorted(folder.glob("*.yaml")):
        try:
            section = yaml.load(path.read_text(), Loader=_SettingsLoader)
        except yaml.YAMLError as err:
            raise ParamsError(f"{path}: not valid YAML ({str(err).splitlines()[0]})") from err
        if not isinstance(section, dict):
            raise ParamsError(f"{path}: expected a mapping of {path.stem}'s settings, got {type(section).__name__}")
        defaults[path.stem] = section
    return defaults


CHECKOUT_CONF = Path(__file__).resolve().parent.parent / CONF  # the conf/ of the checkout vlbench is imported from


def defaults_conf() -> Path:
    """Where the defaults are written: the conf/ of the checkout vlbench is imported from (an editable install, `make
    setup`), else, for an installed package (no checkout beside it), the project's conf/ that the command runs in."""
    if (CHECKOUT_CONF / "config.yaml").is_file():
        return CHECKOUT_CONF
    if (CONF / "config.yaml").is_file():
        return CONF.resolve()
    raise ParamsError(f"no conf/config.yaml beside the installed vlbench ({CHECKOUT_CONF.parent}) nor in this folder "
                      f"({Path.cwd()}): run vlbench from the project's root (the folder with conf/ and dvc.yaml)")


@functools.cache
def _defaults_at(conf: Path) -> dict[str, Any]:
    return effective(yaml.safe_load((conf / "config.yaml").read_text()) or {}, conf)


def defaults(dotted: str) -> Any:
    """A settings section (or a part of it, `adapt.vtab`) where nothing overrides it: conf/config.yaml's kept keys and
    conf/settings/<section>.yaml (`defaults_conf()`), the only place a default is written; module code reads its
    defaults here (a fresh copy) instead of keeping its own (tests/test_settings.py looks for second copies)."""
    conf = defaults_conf()
    node: Any = _defaults_at(conf)
    for part in dotted.split("."):
        if not isinstance(node, Mapping) or part not in node:
            raise ParamsError(f"{conf}: no default {dotted!r} (no {part!r} in conf/config.yaml nor "
                              f"conf/settings/{dotted.split('.')[0]}.yaml)")
        node = node[part]
    return copy.deepcopy(node)


def effective(params: Mapping[str, Any], config_dir: str | Path | None = None) -> dict[str, Any]:
    """`params` with each settings section complete: conf/settings/<section>.yaml with the params' section merged over
    it (mappings merged key by key, anything else replaced, as Hydra merges), so the stages see every setting while
    params.yaml, DVC's params and `dvc exp show`'s columns hold only what conf/config.yaml keeps, a suite sets or a
    `-S` override adds. Key order: the params' keys the defaults file lacks (conf/config.yaml's, first in every section
    that keeps one), then the file's, as the full composition ordered them. Sections without a file are as given."""
    merged = dict(params)
    for section, defaults in section_defaults(config_dir).items():
        given = params.get(section)
        if given is None or isinstance(given, Mapping):
            given = given or {}
            merged[section] = {**{k: v for k, v in given.items() if k not in defaults}, **_merge(defaults, given)}
        # else: not a mapping (`-S adapt=1`): left as given, for the stage to refuse naming the section
    return merged


def _merge(base: Any, over: Any) -> Any:
    if not (isinstance(base, Mapping) and isinstance(over, Mapping)):
        return over
    return {**{k: _merge(v, over[k]) if k in over else v for k, v in base.items()},
            **{k: v for k, v in over.items() if k not in base}}


GROUP_SECTIONS = ("model", "suite")  # chosen by a config group, checked by their own rules (check_suite, the model's)
# declared with an example entry (the demo's), yet any dataset may be a key
KEYED_BY_DATASET = ("robustness.lines", "adapt.elevater.search_subset", "adapt.vtab.groups", "retrieval.dataset_text_sets")


def check_known_keys(params: Mapping[str, Any], config_dir: str | Path | None = None) -> None:
    """Every key of the params is one conf/config.yaml or the section's conf/settings/<section>.yaml declares (below a
    mapping declared empty, such as `suite.entries`, or in a map keyed by dataset, anything goes). An unknown key (a
    typo, or `-S +zeroshot.x=1`) would be ignored by every stage yet make DVC rerun the stages of its section. Outside
    a project checkout (no conf/) nothing is checked."""
    conf = Path(config_dir) if config_dir else CONF
    config = conf / "config.yaml"
    if not config.is_file():
        return
    declared = effective(yaml.safe_load(config.read_text()) or {}, conf)
    unknown = [(key, list(declared)) for key in params if key not in declared and key not in GROUP_SECTIONS]
    for section in declared:
        if section not in GROUP_SECTIONS:
            unknown += _unknown_keys(params.get(section), declared[section], f"{section}.")
    if unknown:
        sections = dict.fromkeys(key.split(".")[0] for key, _ in unknown)
        files = [str(config), *(str(f) for f in (conf / SETTINGS / f"{s}.yaml" for s in sections) if f.is_file())]
        named = [f"{key}{_closest_key(key, near)}" for key, near in unknown[:5]]
        raise ParamsError(f"params: unknown key(s) {', '.join(named)}{' ...' if len(unknown) > 5 else ''}: not declared "
                          f"in {' nor '.join(files)}; check the spelling, or drop the `+` override (`-S +key=...`) "
                          f"that added it")


def _unknown_keys(value: Any, declared: Any, prefix: str) -> list[tuple[str, list[str]]]:
    """(dotted unknown key, the dotted keys declared beside it) under `prefix`."""
    free = not (isinstance(value, Mapping) and isinstance(declared, Mapping) and declared)
    if free or prefix[:-1] in KEYED_BY_DATASET:
        return []
    return [item for name, sub in value.items()
            for item in ([(f"{prefix}{name}", [f"{prefix}{d}" for d in declared])] if name not in declared
                         else _unknown_keys(sub, declared[name], f"{prefix}{name}."))]


def _closest_key(key: str, declared: list[str]) -> str:
    """ (did you mean 'a.b.shots'?) for 'a.b.shot', comparing the last part of the keys only."""
    last = {d.rsplit(".", 1)[-1]: d for d in declared}
    close = difflib.get_close_matches(key.rsplit(".", 1)[-1], list(last), n=1)
    return f" (did you mean {last[close[0]]!r}?)" if close else ""


def suite_keys(config_dir: str | Path | None = None) -> list[str] | None:
    """The keys a suite may set: those conf/config.yaml declares under `suite:`, plus `slug`; None outside a
    project checkout (no conf/)."""
    config = (Path(config_dir) if config_dir else CONF) / "config.yaml"
    if not config.is_file():
        return None
    declared = yaml.safe_load(config.read_text()).get("suite") or {}
    return sorted({"slug", *declared})


def _did_you_mean(word: str, choices) -> str:
    close = difflib.get_close_matches(word, list(choices), n=1)
    return f"did you mean {close[0]!r}? " if close else ""


def check_suite(suite: Mapping[str, Any], config_dir: str | Path | None = None) -> None:
    """Refuse a suite key no stage reads (a misspelled analysis would silently run nothing) and a dataset named
    by an analysis but absent from the suite's `datasets` (it would fail later inside DVC, without context)."""
    slug = suite.get("slug")
    allowed = suite_keys(config_dir)
    for key in suite if allowed is not None else ():
        if key not in allowed:
            raise ParamsError(f"suite {slug!r}: unknown key {key!r}; {_did_you_mean(key, allowed)}"
                              f"a suite sets only {allowed} (conf/config.yaml declares the analyses under `suite:`)")
    datasets = sorted(suite.get("datasets") or {})
    for name, value in (suite.get("datasets") or {}).items():
        if isinstance(value, str) and (Path(value).is_absolute() or ".." in Path(value).parts):
            raise ParamsError(f"suite {slug!r}: dataset {name!r} has input {value!r}, a path outside the project: "
                              f"dvc.lock would record it, and a teammate whose data lives elsewhere would see every stage "
                              f"changed; put your data under {OWN_DATA}/ (`vlbench data-root /your/data/root` links it) and "
                              f"use e.g. `{name}: {OWN_DATA}/{name}` here and in the entry's input")
        if not isinstance(value, str):
            raise ParamsError(f"suite {slug!r}: datasets.{name} must be the dataset's input path (its entry's `input`, "
                              f"e.g. `{name}: data/own/{name}`), got {value!r}; the entry itself lives in "
                              f"conf/dataset/{name}.yaml (a suite changes it under `entries: {{{name}: ...}}`)")
    lists = [(k, v) for k, v in suite.items() if isinstance(v, list)]
    lists += [(f"{k}.{name}", members) for k, v in suite.items() if k != "datasets" and isinstance(v, Mapping)
              for name, members in v.items() if isinstance(members, list)]
    lists.append(("entries", list(suite.get("entries") or {})))
    shared = suite.get("share_images") or {}
    lists.append(("share_images", [*shared, *shared.values()]))
    for analysis, names in lists:
        for name in names:
            if name not in datasets:
                raise ParamsError(f"suite {slug!r}: {analysis} lists dataset {name!r}, which is not among the suite's "
                                  f"datasets {datasets}; {_did_you_mean(str(name), datasets)}add "
                                  f"`{name}: <its input>` to the suite's datasets or remove it from {analysis}")
    check_shared_images(suite)


SUITE_FORMAT = ("a suite maps each dataset to its input and lists the datasets of each analysis, e.g. `datasets: "
                "{shapes: vlbench/datasets/synthetic.py}` and `zeroshot: [shapes]`; the entry stays in "
                "conf/dataset/<name>.yaml (a suite changes it under `entries: {<name>: {...}}`); see conf/suite/demo.yaml")


def check_suite_format(suite: Any, where: str, global_package: bool = False) -> None:
    """A suite file as written, before composition: vlbench's format, not a Hydra defaults list. `dvc exp run -S
    suite=<name>` composes with Hydra before any stage runs, and a suite that pulls entries in with `defaults: -
    /dataset@datasets.<name>: <name>` puts whole entries where dvc.yaml expects an input path (DVC: "Cannot
    interpolate data of type 'dict'"); this check runs inside that composition (hydra_plugins/vlbench_suites.py) and
    in `compose`. `global_package`: the file starts `# @package _global_` (it sets other params too, the suite
    under `suite:`)."""
    if suite is None:
        return
    if not isinstance(suite, Mapping):
        raise ParamsError(f"{where}: a suite file is a mapping, got {type(suite).__name__}; {SUITE_FORMAT}")
    if "defaults" in suite:
        raise ParamsError(f"{where}: a suite does not pull entries in with a Hydra `defaults:` list (e.g. `- "
                          f"/dataset@datasets.x: x`); {SUITE_FORMAT}")
    datasets = (suite.get("suite") or {}).get("datasets") if global_package else suite.get("datasets")
    bad = [name for name, value in (datasets or {}).items() if not isinstance(value, str)] \
        if isinstance(datasets, Mapping) else ["datasets"]
    if bad:
        raise ParamsError(f"{where}: datasets.{bad[0]} is not an input path (a suite does not hold entries); "
                          f"{SUITE_FORMAT}")


def with_every_entry(suite: Mapping[str, Any]) -> dict[str, Any]:
    """The suite's `entries` with a key for each of its datasets, in `datasets`' order: `{}` where the suite changes
    nothing of the entry. prepare@, texts@ and knowledge@ depend on their own dataset's `suite.entries.<name>`, a
    param DVC needs to exist, so that a change to one entry reruns that dataset's stages only (issue 40). Composition
    completes it (`compose`, and hydra_plugins/vlbench_suites.py as `dvc exp run` loads a suite file); a `{}` shows no
    `dvc exp show` column."""
    entries, datasets = suite.get("entries") or {}, suite.get("datasets") or {}
    return {**{name: entries.get(name, {}) for name in datasets},
            **{name: entry for name, entry in entries.items() if name not in datasets}}


GLOBAL_PACKAGE = re.compile(r"^#\s*@package\s+_global_\s*$", re.M)  # Hydra's package header of a file


def chosen_suite_file(overrides: list[str] | None, config_dir: str | Path | None = None) -> Path | None:
    """conf/suite/<name>.yaml of the last `suite=<name>` override, else of config.yaml's default suite."""
    conf = conf_dir(config_dir)
    names = [o.split("=", 1)[1] for o in overrides or [] if o.split("=", 1)[0].lstrip("+~") == "suite" and "=" in o]
    if not names:
        defaults = yaml.safe_load((conf / "config.yaml").read_text()).get("defaults") or []
        names = [d["suite"] for d in defaults if isinstance(d, Mapping) and isinstance(d.get("suite"), str)]
    path = conf / "suite" / f"{names[-1]}.yaml" if names else None
    return path if path is not None and path.is_file() else None


def made_text_sets(entry: Mapping[str, Any]) -> set[str]:
    """The text sets an entry makes from its own `texts` params, known before anything is prepared: `prompts`,
    `prompts_<name>` per `prompt_sets` entry, `captions_prompted` with a `caption_prompt`. (Sets made from the
    prepared data, such as `captions`, are not known here.)"""
    texts = entry.get("texts") or {}
    made = {"prompts", *(f"prompts_{name}" for name in (texts.get("prompt_sets") or {}))}
    return made | ({CAPTION_PROMPT_SET} if texts.get("caption_prompt") is not None else set())


CAPTION_PROMPT_SET = "captions_prompted"  # vlbench.texts.CAPTION_PROMPT_SET

def text_set_needs(params: Mapping[str, Any]) -> list[tuple[str, str, str]]:
    """(analysis, dataset, text set) for every text set that an analysis of the suite reads and that the entry alone
    decides (`prompts_<name>`, `captions_prompted`): extensibility's variants (datasets and set members), adapt
    FewTrans' zeroshot method, retrieve's prompts, retrieval's captions."""
    def setting(dotted: str) -> Any:  # the default where params leave the key out
        node: Any = params
        for key in dotted.split("."):
            node = node.get(key) if isinstance(node, Mapping) else None
        return defaults(dotted) if node is None else node

    suite = params["suite"]
    members = list(suite.get("extensibility") or []) + [d for ds in (suite.get("extensibility_sets") or {}).values()
                                                          for d in ds]
    needs = [("extensibility", d, f"prompts_{v}") for d in dict.fromkeys(members)
             for v in setting("extensibility.variants") if v != "repe"]
    if "fewtrans" in setting("adapt.protocols") and "zeroshot" in setting("adapt.fewtrans.methods"):
        needs += [("adapt", d, setting("adapt.fewtrans.text_set")) for d in suite.get("adapt") or []]
    needs += [("retrieve", d, setting("retrieve.prompts")) for d in suite.get("retrieve") or []]
    per_dataset = setting("retrieval.dataset_text_sets")
    needs += [("retrieval", d, per_dataset.get(d, setting("retrieval.text_set"))) for d in suite.get("retrieval") or []]
    return [(a, d, t) for a, d, t in needs if t.startswith("prompts_") or t == CAPTION_PROMPT_SET]


def check_text_sets(params: Mapping[str, Any], config_dir: str | Path | None = None, known_only: bool = False) -> None:
    """Every text set an analysis of the suite needs (`text_set_needs`) is made by the dataset's entry: else one
    line naming the analysis, the dataset, the set and the entry key that makes it, before anything runs.
    `known_only`: skip datasets without an entry file (their prepare stage says so)."""
    slug = params["suite"].get("slug")
    for analysis, dataset, name in text_set_needs(params):
        path = conf_dir(config_dir) / "dataset" / f"{dataset}.yaml"
        if known_only and not path.is_file():
            continue
        if name in made_text_sets(dataset_entry(params, dataset, config_dir)):
            continue
        key = "caption_prompt: 'a photo of {c}'" if name == CAPTION_PROMPT_SET else \
            f"prompt_sets: {{{name.removeprefix('prompts_')}: [...]}}"
        raise ParamsError(f"suite {slug!r}: {analysis} on dataset {dataset!r} needs text set {name!r}, which "
                          f"{path} does not make: add `{key}` under its `texts` (or the suite's `entries: "
                          f"{{{dataset}: {{texts: ...}}}}`), or change the {analysis} params that ask for it")


def check_shared_images(suite: Mapping[str, Any]) -> None:
    """`share_images: {B: A}` (B reuses A's image features): A's images are embedded, B's are not, and every dataset
    of `embed` gets image features one way: `embed` is within `embed_images` plus the keys of `share_images`. A dataset
    of `embed_images` that `embed` lacks gets image features only (no text features: a distribution shift that the
    robustness analysis scores with its reference dataset's class prompts)."""
    slug, shared = suite.get("slug"), suite.get("share_images") or {}
    embed = list(suite.get("embed") or [])
    embedded = list(suite.get("embed_images", embed) or [])
    if not isinstance(shared, Mapping) or not all(isinstance(v, str) for v in shared.values()):
        raise ParamsError(f"suite {slug!r}: share_images must map a dataset to the dataset whose image features it "
                          f"reuses ({{B: A}}), got {shared!r}")
    for target, source in shared.items():
        if source not in embedded:
            raise ParamsError(f"suite {slug!r}: share_images.{target} is {source!r}, whose images are not embedded: "
                              f"list {source!r} in embed_images (a dataset can only reuse features the model made)")
    both, missing = sorted(set(shared) & set(embedded)), sorted(set(embed) - set(embedded) - set(shared))
    extra = sorted(set(shared) - set(embed))
    for problem, names in (("are in both embed_images and share_images (embedded twice)", both),
                           ("are in embed but neither in embed_images nor a key of share_images (no image features)",
                            missing), ("are keys of share_images but not in embed", extra)):
        if names:
            raise ParamsError(f"suite {slug!r}: datasets {names} {problem}; embed must be within embed_images plus the "
                              f"keys of share_images (a suite that shares images lists embed_images itself)")


def get(params: Mapping[str, Any], dotted: str, kind: type | tuple[type, ...] | None = None) -> Any:
    """params['a']['b'] for 'a.b', with an error naming the key when it is absent or of the wrong type."""
    node: Any = params
    for i, part in enumerate(dotted.split(".")):
        if not isinstance(node, Mapping) or part not in node:
            known = sorted(node) if isinstance(node, Mapping) else []
            raise ParamsError(f"params.yaml: key {dotted!r} not found (no {part!r} under {'.'.join(dotted.split('.')[:i]) or 'top level'}; known: {known})")
        node = node[part]
    if kind is not None and not isinstance(node, kind):
        names = kind.__name__ if isinstance(kind, type) else "/".join(k.__name__ for k in kind)
        raise ParamsError(f"params.yaml: key {dotted!r} must be a {names}, got {type(node).__name__} {node!r}")
    return node


def check_name(kind: str, name: Any) -> str:
    """A dataset key, model slug or text-set name: used in paths, so letters, digits, '-' and '_' only."""
    if not isinstance(name, str) or not NAME.match(name):
        raise ParamsError(f"{kind} name {name!r} is not allowed: use letters, digits, '-' and '_' (it becomes a folder name)")
    return name


def load_entry(path: Path, overrides: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """A registry entry file (conf/dataset/<name>.yaml) with a suite's overrides merged in, interpolations resolved."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    try:
        entry = OmegaConf.merge(OmegaConf.load(path), OmegaConf.create(dict(overrides or {})))
        return OmegaConf.to_container(entry, resolve=True)
    except (OmegaConfBaseException, yaml.YAMLError) as err:
        raise ParamsError(f"{path}: not a valid dataset entry ({str(err).strip().splitlines()[0]})") from err


def check_suite_dataset(params: Mapping[str, Any], name: str) -> str:
    """`name` if it is a dataset of the suite (a key of suite.datasets); an error listing them otherwise."""
    check_name("dataset", name)
    datasets = get(params, "suite.datasets", Mapping)
    if name not in datasets:
        slug = get(params, "suite", Mapping).get("slug")
        raise ParamsError(f"params.yaml: unknown dataset {name!r} in suite {slug!r}; known: {sorted(datasets)}")
    return name


def dataset_entry(params: Mapping[str, Any], name: str, config_dir: str | Path | None = None) -> dict[str, Any]:
    """The registry entry of dataset `name` of the suite: conf/dataset/<name>.yaml (a file dependency of the stages
    that read it) with the suite's `entries.<name>` overrides: {prepare: spec, input: path, texts: {...}}.

    params.yaml names only the datasets and their inputs (`suite.datasets: {name: input}`), so that the registry
    entries' leaves are not params (`dvc exp show` would list each as a column)."""
    slug = get(params, "suite", Mapping).get("slug")
    datasets = get(params, "suite.datasets", Mapping)
    check_suite_dataset(params, name)
    path = conf_dir(config_dir) / "dataset" / f"{name}.yaml"
    if not path.is_file():
        raise ParamsError(f"suite {slug!r}: dataset {name!r} has no registry entry {str(path)!r}; add one (README, "
                          f"'Your own data') or remove it from the suite")
    entry = load_entry(path, (params["suite"].get("entries") or {}).get(name))
    missing = [k for k in DATASET_KEYS if k not in entry]
    if missing:
        raise ParamsError(f"{path}: dataset {name!r} lacks key(s) {missing}; an entry has {list(DATASET_KEYS)} (see conf/dataset/)")
    if str(entry["input"]) != str(datasets[name]):
        raise ParamsError(f"suite {slug!r}: datasets.{name} is {datasets[name]!r} but {str(path)!r} has input "
                          f"{entry['input']!r}; the suite names each dataset's input (what DVC hashes for prepare@{name}): "
                          f"set `{name}: {entry['input']}` under the suite's datasets")
    return entry


def dataset_spec(params: Mapping[str, Any], name: str) -> dict[str, Any]:
    """What `prepare` builds from: the entry's `prepare` mapping (source + source-specific keys)."""
    spec = dataset_entry(params, name)["prepare"]
    if not isinstance(spec, Mapping):
        raise ParamsError(f"conf/dataset/{name}.yaml: key 'prepare' must be a mapping, got {spec!r}")
    return dict(spec)


def _inside(path: Path, root: Path = Path(".")) -> Path:
    """`path` if it stays inside `root` once resolved; an error otherwise (no key may escape the project)."""
    if not path.resolve().is_relative_to(root.resolve()):
        raise ParamsError(f"output path {str(path)!r} leaves the project folder {str(root.resolve())!r}")
    return path


def prepared_dir(dataset: str) -> Path:
    return _inside(PREPARED / check_name("dataset", dataset))


def texts_dir(dataset: str) -> Path:
    return _inside(TEXTS / check_name("dataset", dataset))


def knowledge_dir(dataset: str) -> Path:
    """The knowledge stage's text sets (one per knowledge variant), apart from the texts stage's data/texts/<dataset>."""
    return _inside(KNOWLEDGE / check_name("dataset", dataset))


def llm_answers_path(dataset: str) -> Path:
    """The knowledge stage's cache of LLM answers (a persistent DVC output: kept when the stage reruns)."""
    return _inside(LLM_ANSWERS / f"{check_name('dataset', dataset)}.jsonl")


def model_dir(slug: str) -> Path:
    return _inside(MODELS / check_name("model", slug))


def features_dir(model_slug: str, dataset: str) -> Path:
    return _inside(FEATURES / check_name("model", model_slug) / check_name("dataset", dataset))


def link_data_root(target: str | Path | None = None, link: Path | None = None) -> Path:
    """Make `link` (default: data/own of the project this is run in, git-ignored) point at your data root: `target`,
    else $VLBENCH_DATA_ROOT. Entries name your data as data/own/<...>, so params.yaml and dvc.lock hold the same
    relative paths in every clone while DVC hashes the data itself through the link (a changed image still makes
    prepare@ stale). A root that would hold the link itself (the project, data/, data/own) is refused."""
    target = target or os.environ.get(DATA_ROOT_VARIABLE)
    if not target:
        raise ParamsError(f"no data root given: pass its path or set {DATA_ROOT_VARIABLE}")
    link = link or project_root() / OWN_DATA
    target = Path(target).expanduser().resolve()
    if not target.is_dir():
        raise ParamsError(f"data root {str(target)!r} is not a folder")
    where = link.parent.resolve() / link.name
    if where == target or where.is_relative_to(target) or target.is_relative_to(where):
        raise ParamsError(f"data root {str(target)!r} would hold the link {str(where)!r} itself (a loop): give the "
                          f"folder of your data, outside {str(where.parent)!r}")
    if link.exists() and not link.is_symlink():
        raise ParamsError(f"{str(link)!r} is a real folder, not a link: keep your data there, or move it away and "
                          f"run `vlbench data-root {target}` again")
    link.parent.mkdir(parents=True, exist_ok=True)
    tmp = link.with_name(f".{link.name}.tmp")
    tmp.unlink(missing_ok=True)
    tmp.symlink_to(target, target_is_directory=True)
    tmp.replace(link)  # atomic: a concurrent reader sees the old link or the new one
    return target


def project_root(start: Path | None = None) -> Path:
    """The project folder this is run in: the nearest of the current folder and its parents with a dvc.yaml."""
    here = (start or Path.cwd()).resolve()
    for folder in (here, *here.parents):
        if (folder / "dvc.yaml").is_file():
            return folder
    raise ParamsError(f"{str(here)!r} is not inside a vlbench project (no dvc.yaml here or above): run it in your "
                      f"clone")


def check_data_root(path: str | Path, name: str) -> None:
    """A dataset whose input lies under data/own needs the link made first; say how instead of 'not found'."""
    path = Path(path)
    if path.parts[:2] != OWN_DATA.parts or OWN_DATA.exists():
        return
    if OWN_DATA.is_symlink():
        raise ParamsError(f"dataset {name!r} reads {str(path)!r} but {str(OWN_DATA)!r} points at "
                          f"{os.readlink(OWN_DATA)!r}, which does not exist (moved, renamed or not mounted?): "
                          f"mount it, or run `vlbench data-root /path/to/your/data` again")
    raise ParamsError(f"dataset {name!r} reads {str(path)!r} but {str(OWN_DATA)!r} does not exist in this clone: "
                      f"run `vlbench data-root /path/to/your/data` (or set {DATA_ROOT_VARIABLE} and run "
                      f"`vlbench data-root`) once per clone")


def conf_dir(path: str | Path | None = None) -> Path:
    """The project's conf/: `path` if given, else ./conf (the checkout you run in, with your own suites)."""
    conf = Path(path) if path else CONF
    if not (conf / "config.yaml").is_file():
        raise ParamsError(f"{str(conf.resolve())!r} has no config.yaml: run from the project root or pass --conf PATH")
    return conf


def compose(overrides: list[str] | None = None, config_dir: str | Path | None = None) -> dict[str, Any]:
    """Compose conf/ exactly as `dvc exp run -S group=option` does and return a plain dict: params.yaml's content,
    whose settings sections hold only what conf/config.yaml keeps, the suite sets and the overrides add (the settings
    the stages read: `effective(compose(...))`)."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from omegaconf import OmegaConf

    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    suite_file = chosen_suite_file(overrides, config_dir)
    if suite_file is not None:
        text = suite_file.read_text()
        check_suite_format(yaml.safe_load(text), str(suite_file), GLOBAL_PACKAGE.search(text) is not None)
    register_resolvers()  # conf/model entries of fine-tuned models check their weights (`${vlbench.finetuned:}`)
    try:
        with initialize_config_dir(config_dir=str(conf_dir(config_dir).resolve()), version_base=None):
            cfg = hydra_compose(config_name="config", overrides=overrides or [])
        params = OmegaConf.to_container(cfg, resolve=True)
    except (HydraException, OmegaConfBaseException) as err:
        lines = str(err).strip().splitlines() or [type(err).__name__]
        first = " ".join(lines[:2] if lines[1:2] and lines[1].startswith("To append") else lines[:1])  # Hydra's hint: `+`
        raise ParamsError(f"cannot compose conf/ with overrides {overrides or []}: {first}") from err
    params["suite"]["entries"] = with_every_entry(params["suite"])
    check_suite(params["suite"], config_dir)
    check_known_keys(params, conf_dir(config_dir))
    for name in params["suite"]["datasets"]:
        dataset_entry(params, name, config_dir)  # each entry exists and names the suite's input
    check_text_sets(effective(params, conf_dir(config_dir)), config_dir)
    return params


def available(group: str, config_dir: str | Path | None = None) -> list[str]:
    return sorted(p.stem for p in (conf_dir(config_dir) / group).glob("*.yaml"))


# --------------------------------------------------------------------------------------------------
# fine-tuned model entries (conf/model/<slug>.yaml with `finetune: {dataset, method}`): what makes their weights


class FinetunedModelError(VlbenchError):
    """A model config names a fine-tuned checkpoint that is missing, or whose fingerprint.json does not match it."""


def finetune_command(model: Mapping[str, Any]) -> str:
    """The command that makes a fine-tuned entry's checkpoint: the finetune run of its base model on its dataset with
    its method (`finetune: {dataset, method}`), plus the entry's `finetune.overrides` (what that dataset needs, e.g. a
    train split)."""
    spec = model["finetune"]
    overrides = [*([f"model={model['base']}"] if model.get("base") else []), f"suite.finetune=[{spec['dataset']}]",
                 f"finetune.method={spec['method']}", *spec.get("overrides", [])]
    return "dvc exp run " + " ".join(f"-S {shlex.quote(o)}" for o in overrides)


def missing_finetuned(model: Mapping[str, Any], root: Path | None = None) -> FinetunedModelError | None:
    """The error for a fine-tuned entry whose checkpoint or fingerprint.json is not there (paths relative to `root`,
    default the working directory), naming the file and the run that makes it; None when both are there."""
    checkpoint = Path(model["pretrained"])
    for path in (checkpoint, checkpoint.with_name(FINETUNE_FINGERPRINT)):
        if not (root / path if root and not path.is_absolute() else path).is_file():
            return FinetunedModelError(
                f"model {model.get('slug')!r} needs {path}, which is not there: it is made by fine-tuning "
                f"{model.get('base')!r} on {model['finetune']['dataset']!r} with {model['finetune']['method']}: "
                f"`{finetune_command(model)}`, then rerun this command")
    return None


def finetuned_weights(*, _parent_) -> str:
    """OmegaConf resolver `${vlbench.finetuned:}`, a fine-tuned entry's `weights_file`: the entry's `pretrained` path
    once its checkpoint and fingerprint are there, else the one-line FinetunedModelError naming the run that makes
    them. It runs when Hydra composes (`dvc exp run -S model=...`, `vlbench compose`), before DVC hashes the weights
    as a dependency (which would fail with a bare `No such file or directory`)."""
    from omegaconf import OmegaConf

    model = {k: OmegaConf.to_container(_parent_[k], resolve=True) if OmegaConf.is_config(_parent_[k]) else _parent_[k]
             for k in ("slug", "base", "pretrained", "finetune") if k in _parent_}
    cwd = Path.cwd()
    root = next((p for p in (cwd, *cwd.parents) if (p / "dvc.yaml").is_file()), cwd)
    error = missing_finetuned(model, root)
    if error is not None:
        raise error
    return str(model["pretrained"])


def register_resolvers() -> None:
    """Register `vlbench.finetuned` with OmegaConf (conf/model entries of fine-tuned models use it); idempotent."""
    from omegaconf import OmegaConf

    OmegaConf.register_new_resolver("vlbench.finetuned", finetuned_weights, replace=True)
