"""What dvc.yaml derives from the code: each stage's code fingerprint, and the analysis stages from the analyses table.

A stage reruns only for code its command can run. It depends on one fingerprint file, `data/code/<stage>.txt` (one
line per file: sha256 and path), written by the `code` stage for the files its command reaches: its stage module and
everything that imports (at module top or inside a function), plus the "module:function" strings it resolves for the
entries it runs, and the data files of the packages on the way. Registry strings elsewhere are not followed: a
dataset source is in `prepare`'s fingerprint of the datasets that use it (`data/code/prepare/<dataset>.txt`) and in
`data/code/pretrain/<source>.txt` (the toy model's corpus); a fine-tuning method in `data/code/finetune/<method>.txt`.
The report's charts and summaries are functions in `vlbench.report.registry`, so `report`'s own imports reach them.
Any edit under vlbench/ or stages/ re-runs `code` (a second); a stage reruns when a file of its own fingerprint
changed (docs/architecture.md, "Edit this -> these stages rerun").

`generated_stages()` is the part of dvc.yaml written from `vlbench.analyses.ANALYSES` (`vlbench compose` refreshes it
between the two marker lines): the `code` stage, one block per analysis, and the report.
"""

from __future__ import annotations

import ast
import hashlib
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from vlbench.analyses import ANALYSES
from vlbench.dataset_entries import dataset_entry
from vlbench.datasets.registry import DATASET_SOURCES
from vlbench.errors import VlbenchError
from vlbench.finetune.registry import FINETUNE_METHODS, SECTIONS, TABLES
from vlbench.params import ParamsError, check_name
from vlbench.results import HEADLINE_FILE

ROOT = Path(__file__).resolve().parent.parent
CODE_DIR = Path("data/code")
PROJECT_PACKAGES = ("vlbench", "stages")

# stage -> the module its command runs (`python -m stages.<module>`); the analyses' stages: stages.analysis
COMMANDS: dict[str, str] = {stage: f"stages.{stage}" for stage in (
    "prepare", "texts", "knowledge", "pretrain", "train_plot", "embed_images", "embed_texts", "embed_knowledge",
    "share_images", "repe", "extensibility_sets", "heldout", "finetune", "report")}
# a bare "vlbench.pkg.{name}" f-string imports any module of the package (adapt's protocols)
MODULE_PREFIX = re.compile(r"^(?:vlbench|stages)(?:\.\w+)+$")


def by_analysis_stage() -> list[str]:
    """The analyses the generic stage (stages/analysis.py) runs: those of an analysis module (which loads no model);
    the others run in a stage of their own, `COMMANDS[name]` (fine-tuning)."""
    return [name for name, a in ANALYSES.items() if a.module is not None]


class PipelineError(VlbenchError):
    """dvc.yaml's generated part cannot be written (its markers are missing)."""


def module_file(name: str, root: Path = ROOT) -> Path | None:
    """The file of a vlbench/stages module, or None for anything else (stdlib, third party)."""
    if name.split(".")[0] not in PROJECT_PACKAGES:
        return None
    base = root / Path(*name.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def imported_names(path: Path, root: Path = ROOT) -> set[str]:
    """Every module `path` imports: imports at any depth of the file, and for an f-string "vlbench.pkg.{name}" every
    module of the package ("module:function" strings of registries are resolved per stage: `stage_modules`)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.JoinedStr) and node.values and isinstance(node.values[0], ast.Constant):
            prefix = str(node.values[0].value)
            if prefix.endswith(".") and MODULE_PREFIX.match(prefix[:-1]):
                package = root / Path(*prefix[:-1].split("."))
                names.update(f"{prefix}{p.stem}" for p in package.glob("*.py"))
    return names


def import_closure(modules: list[str], root: Path = ROOT) -> set[Path]:
    """The project files reachable from `modules` through imports (each package's __init__ on the way included)."""
    seen: set[Path] = set()
    todo = [f for f in (module_file(m, root) for m in modules) if f]
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        seen.add(path)
        for name in imported_names(path, root):
            parts = name.split(".")
            for i in range(1, len(parts) + 1):
                found = module_file(".".join(parts[:i]), root)
                if found and found not in seen:
                    todo.append(found)
    return seen


def data_files(code: set[Path]) -> set[Path]:
    """The non-Python files of the packages `code` lies in, with their data folders (a folder with no module but
    an `__init__.py`, such as data/ or configs/)."""
    found: set[Path] = set()
    for folder in {p.parent for p in code}:
        found.update(_data_under(folder))
    return found


def _data_under(folder: Path) -> set[Path]:
    found = {p for p in folder.iterdir() if p.is_file() and p.suffix not in (".py", ".pyc")}
    for sub in folder.iterdir():
        if sub.is_dir() and sub.name != "__pycache__" and not any(p.name != "__init__.py" for p in sub.glob("*.py")):
            found.update(_data_under(sub))
    return found


def module_of(entry: str) -> str:
    """The module of a registry's "module:function" string."""
    return entry.split(":")[0]


def source_modules(spec: Any) -> list[str]:
    """The module of the dataset source a `prepare` spec names (none for a spec without a known source: its stage
    then fails with the registry's own message)."""
    source = spec.get("source") if isinstance(spec, Mapping) else None
    return [module_of(DATASET_SOURCES[source])] if source in DATASET_SOURCES else []


def stage_modules(params: Mapping[str, Any], root: Path = ROOT) -> dict[str, list[str]]:
    """{fingerprint file under data/code (without .txt): the modules its stages' command runs}: one per stage, one
    per analysis of the generic stage, one per dataset of the suite for `prepare` (its source), one per fine-tuning
    method, one per dataset source for `pretrain` (the source of the toy model's training corpus)."""
    out = {stage: [module] for stage, module in COMMANDS.items()
           if stage not in ("prepare", "pretrain", "finetune", "report")}
    out.update({name: ["stages.analysis", ANALYSES[name].module] for name in by_analysis_stage()})
    out["report"] = [COMMANDS["report"]]
    out.update({f"finetune/{name}": [COMMANDS["finetune"], m.module] for name, m in FINETUNE_METHODS.items()})
    out.update({f"pretrain/{source}": [COMMANDS["pretrain"], module_of(entry)]
                for source, entry in DATASET_SOURCES.items()})
    conf = root / "conf"
    for name in (params.get("suite") or {}).get("datasets") or {}:
        check_name("dataset", name)  # it names a file
        try:
            spec = dataset_entry(params, name, conf)["prepare"]
        except ParamsError:
            spec = None  # prepare@<name> says what is wrong with the entry
        out[f"prepare/{name}"] = [COMMANDS["prepare"], *source_modules(spec)]
    return out


def files_of(modules: list[str], root: Path = ROOT) -> list[Path]:
    code = import_closure(modules, root)
    return sorted(code | data_files(code))


def fingerprint(modules: list[str], root: Path = ROOT) -> str:
    """A fingerprint file's text: `<sha256>  <path>` per file `modules` reach, sorted by path."""
    lines = [f"{hashlib.sha256(p.read_bytes()).hexdigest()}  {p.relative_to(root).as_posix()}"
             for p in files_of(modules, root)]
    return "\n".join(lines) + "\n"


def code_file(stage: str, key: str | None = None) -> str:
    """The fingerprint a dvc.yaml stage depends on: data/code/<stage>.txt, or data/code/<stage>/<key>.txt."""
    return f"{CODE_DIR.as_posix()}/{stage}{f'/{key}' if key else ''}.txt"


# --- the generated part of dvc.yaml ---

MARK_BEGIN = "  # >>> generated by `vlbench compose` from vlbench.analyses.ANALYSES and vlbench.pipeline.COMMANDS: do not edit"
MARK_END = "  # <<< end of the generated stages"
REPORT_OUTS = ("reports/metrics.json", "reports/model.json", "reports/reference.json", "reports/plots",
               "reports/index.html")
ANALYSIS_PARAMS = ["seed", "model.slug", "model.arch", "model.pretrained", "embed.decode"]
READS = {  # an analysis's `reads` names -> the dvc.yaml dependency
    "prepared": "data/prepared/${item}",
    "texts": "data/texts/${item}",
    "features": "features/${model.slug}/${item}",
    "images": "features/${model.slug}/${item}/images",  # the image features only: a prompt edit never re-runs it
}


def settings_file(section: str, root: Path = ROOT) -> list[str]:
    """conf/settings/<section>.yaml where the section's defaults live in one (a file dependency of its stages)."""
    path = Path("conf/settings") / f"{section}.yaml"
    return [path.as_posix()] if (root / path).is_file() else []


def code_stage() -> dict:
    """The fingerprints: the sources in; the suite's datasets (each one's source: its entry) decide which `prepare`
    fingerprints there are and which source each holds. Its params: the whole suite, so that it is the first stage of
    any run that changes the suite, and checks the text sets the suite's analyses need (stages/code.py) before anything
    is embedded; a suite change that moves no fingerprint leaves its outputs, and so every other stage, as they were."""
    return {"cmd": "python -m stages.code",
            "deps": [*PROJECT_PACKAGES, "conf/dataset"],
            "params": ["suite"],
            "outs": [CODE_DIR.as_posix()]}


def analysis_stage(name: str, root: Path = ROOT) -> dict:
    a = ANALYSES[name]
    outs = [{f"reports/{name}/${{item}}.json": {"cache": False}},
            *(f"reports/{name}/${{item}}.{table}.parquet" for table in a.table_names)]
    return {"foreach": f"${{suite.{name}}}",
            "do": {"cmd": f"python -m stages.analysis --analysis {name} --dataset ${{item}}",
                   "deps": [code_file(name), *settings_file(name, root),
                            *(READS.get(r, r) for r in a.reads)],
                   "params": [*ANALYSIS_PARAMS, name],
                   "outs": outs}}


def report_stage() -> dict:
    """Every analysis's result folder (each holds a .gitkeep, so it exists for any suite) in; the page and the
    aggregates out. Its params: the whole suite, so a misspelled suite key always reaches a stage's check of
    params.yaml (vlbench.params.check_suite)."""
    return {"cmd": "python -m stages.report",
            "deps": [code_file("report"), *(f"reports/{name}" for name in ANALYSES)],
            "params": ["suite"],
            "metrics": [{HEADLINE_FILE.as_posix(): {"cache": False}}],
            "outs": [{path: {"cache": False}} for path in REPORT_OUTS]}


def finetune_stage(root: Path = ROOT) -> dict:
    """finetune@<dataset>: the method `finetune.method` names; its params are the sections any method declares
    (vlbench.finetune.registry.FINETUNE_METHODS), every table of TABLES an output (empty where not the method's)."""
    sections = ["finetune", *SECTIONS]
    return {"foreach": "${suite.finetune}",
            "do": {"cmd": "python -m stages.finetune --dataset ${item}",
                   "deps": [code_file("finetune", "${finetune.method}"), *(f for s in sections for f in settings_file(s, root)),
                            "data/prepared/${item}", "data/texts/${item}", "${model.weights_file}"],
                   "params": ["seed", "model.slug", "model.arch", "model.pretrained", "model.precision", *sections],
                   # persist: the work units a killed run left are kept for the rerun (vlbench.finetune.units)
                   "outs": [{"data/finetuned/${item}/${finetune.method}": {"persist": True}},
                            {"reports/finetune/${item}.json": {"cache": False}},
                            *(f"reports/finetune/${{item}}.{t}.parquet" for t in TABLES),
                            "reports/finetune/${item}.svg"]}}


def heldout_stage(root: Path = ROOT) -> dict:
    """heldout@<dataset>: FewTrans's held-out search (vlbench.finetune.heldout) that sets the episodic methods'
    centres; its units persist for a rerun after a kill."""
    return {"foreach": "${suite.heldout}",
            "do": {"cmd": "python -m stages.heldout --dataset ${item}",
                   "deps": [code_file("heldout"), *settings_file("finetune", root),
                            *settings_file("adapt", root), "data/prepared/${item}", "data/texts/${item}",
                            "${model.weights_file}"],
                   "params": ["seed", "model.slug", "model.arch", "model.pretrained", "model.precision",
                              "finetune", "adapt"],
                   "outs": [{"data/heldout/${item}/units": {"persist": True}},
                            {"reports/heldout/${item}.json": {"cache": False}},
                            "reports/heldout/${item}.search.parquet"]}}


def generated_stages(root: Path = ROOT) -> dict:
    return {"code": code_stage(), **{name: analysis_stage(name, root) for name in by_analysis_stage()},
            "heldout": heldout_stage(root), "finetune": finetune_stage(root), "report": report_stage()}


def generated_text(root: Path = ROOT) -> str:
    """The stages as dvc.yaml's text, indented under `stages:`, a blank line between two."""
    blocks = [yaml.safe_dump({name: stage}, sort_keys=False, width=120, default_flow_style=False)
              for name, stage in generated_stages(root).items()]
    return "\n".join("\n".join("  " + line for line in block.splitlines()) + "\n" for block in blocks)


def refresh_dvc_yaml(path: Path = ROOT / "dvc.yaml") -> bool:
    """Rewrite the generated part of dvc.yaml (and the report's inputs); create reports/<analysis>/.gitkeep. True
    when the file changed."""
    text = path.read_text()
    if MARK_BEGIN not in text or MARK_END not in text:
        raise PipelineError(f"{path}: the markers of the generated stages are missing ({MARK_BEGIN.strip()!r} ... "
                            f"{MARK_END.strip()!r})")
    head, rest = text.split(MARK_BEGIN + "\n", 1)
    _, tail = rest.split(MARK_END, 1)
    new = head + MARK_BEGIN + "\n" + generated_text(path.parent) + MARK_END + tail
    for name in ANALYSES:
        keep = path.parent / "reports" / name / ".gitkeep"
        keep.parent.mkdir(parents=True, exist_ok=True)
        keep.touch()
    if new != text:
        path.write_text(new)
    return new != text
