"""The params reader: params.yaml checked as every stage reads it (`load_params`), each settings section completed
with its defaults from conf/settings/ (`effective`, `defaults`), a key's value with an error naming it (`get`), the
names that become folders (`check_name`), and the checks of what params.yaml holds: known keys, the suite's keys and
dataset lists. The ground floor: every stage reads its params here, so it imports nothing of the project but errors.
"""

from __future__ import annotations

import copy
import difflib
import functools
import re
from pathlib import Path
from typing import Any, Mapping

import yaml

from vlbench.errors import VlbenchError

PARAMS_FILE = Path("params.yaml")
CONF = Path("conf")
OWN_DATA = Path("data/own")  # your own data: a link to your data root (vlbench.data_root makes it), or a plain folder
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]*$")


class ParamsError(VlbenchError):
    """params.yaml is missing, malformed, or lacks a key a stage needs; the message names the key."""


def load_params(path: str | Path = PARAMS_FILE) -> dict[str, Any]:
    """The params every stage reads: params.yaml checked, each settings section completed with its defaults
    (`effective`: conf/settings/<section>.yaml with params.yaml's section merged over it). The text sets the suite's
    analyses need are checked by the stages that run first and those that read them
    (vlbench.analyses.text_sets.check_text_sets), not here: that is the analyses' knowledge."""
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
    return effective(params)


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


# params sections and suite keys renamed (old -> new): the old name fails with one line naming the new one (issue 40:
# REPE's section, suite key and stage say repe, beside the `retrieval` analysis)
RENAMED_KEYS = {"retrieve": "repe"}
GROUP_SECTIONS = ("model", "suite")  # chosen by a config group, checked by their own rules (check_suite, the model's)
# declared with an example entry (the demo's), yet any dataset may be a key
KEYED_BY_DATASET = ("robustness.lines", "adapt.elevater.search_subset", "adapt.vtab.groups", "retrieval.dataset_text_sets")


def check_renamed(keys, where: str, prefix: str = "") -> None:
    """A ParamsError naming the new name for the first of `keys` (written under `prefix`, e.g. "suite.") that
    RENAMED_KEYS lists."""
    old = next((key for key in keys if key in RENAMED_KEYS), None)
    if old is not None:
        raise ParamsError(f"{where}: `{prefix}{old}` was renamed `{prefix}{RENAMED_KEYS[old]}`")


def check_renamed_overrides(overrides: list[str]) -> None:
    """`retrieve.corpus=x`, `+suite.retrieve=[d]`: an override of a renamed key, before Hydra says only that the key
    is not in the config."""
    for override in overrides:
        section, _, rest = override.split("=", 1)[0].lstrip("+~").partition(".")
        if section == "suite":
            check_renamed([rest.split(".")[0]], f"override {override!r}", "suite.")
        check_renamed([section], f"override {override!r}")


def check_known_keys(params: Mapping[str, Any], config_dir: str | Path | None = None) -> None:
    """Every key of the params is one conf/config.yaml or the section's conf/settings/<section>.yaml declares (below a
    mapping declared empty, such as `suite.entries`, or in a map keyed by dataset, anything goes). An unknown key (a
    typo, or `-S +zeroshot.x=1`) would be ignored by every stage yet make DVC rerun the stages of its section. Outside
    a project checkout (no conf/) nothing is checked."""
    check_renamed(params, "params")
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
    check_renamed(suite, f"suite {slug!r}", "suite.")
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



def conf_dir(path: str | Path | None = None) -> Path:
    """The project's conf/: `path` if given, else ./conf (the checkout you run in, with your own suites)."""
    conf = Path(path) if path else CONF
    if not (conf / "config.yaml").is_file():
        raise ParamsError(f"{str(conf.resolve())!r} has no config.yaml: run from the project root or pass --conf PATH")
    return conf
