"""The `vlbench` command: list what is registered, compose params.yaml, check a model's weights.

Every command reads the project's own `conf/` (the current directory's, or `--conf PATH`), so the suites,
models and datasets of the checkout you stand in are the ones listed.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click
import yaml

from vlbench.compare_runs import compare, format_table, open_revision, write_page
from vlbench.compose import compose
from vlbench.conf import available
from vlbench.data_root import link_data_root
from vlbench.datasets.hub import lock_path, read_lock, repin
from vlbench.datasets.leaves import dataset_leaves
from vlbench.datasets.registry import catalogue, entries
from vlbench.errors import VlbenchError
from vlbench.io import atomic_path
from vlbench.knowledge.coverage import coverage_report, format_report
from vlbench.knowledge.hierarchy import build_hierarchy
from vlbench.leaderboard import format_leaderboard
from vlbench.models.finetuned import finetune_command, missing_finetuned
from vlbench.params import OWN_DATA, conf_dir
from vlbench.pipeline import refresh_dvc_yaml
from vlbench.plan import make_plan, summary
from vlbench.reference import load_tables


@click.group()
@click.option("--conf", "conf", default=None, metavar="PATH", help="the project's conf/ folder (default: ./conf)")
@click.pass_context
def main(ctx: click.Context, conf: str | None) -> None:
    """vlbench: a reproducible benchmark for CLIP-like vision-language models."""
    ctx.obj = conf


def _conf(ctx: click.Context) -> Path:
    try:
        return conf_dir(ctx.obj)
    except VlbenchError as err:
        raise click.ClickException(str(err)) from err


@main.command()
@click.pass_context
def models(ctx: click.Context) -> None:
    """List the model slugs (conf/model/*.yaml); a fine-tuned model's entry says which run makes its weights."""
    conf = _conf(ctx)
    for slug in available("model", conf):
        cfg = yaml.safe_load((conf / "model" / f"{slug}.yaml").read_text())
        needs = ""
        if cfg.get("finetune"):
            made = missing_finetuned(cfg, conf.parent) is None
            needs = f"  needs `{finetune_command(cfg)}` ({'made' if made else 'not made yet'})"
        click.echo(f"{slug:20s} {cfg['arch']:24s} {cfg['pretrained']}{needs}")


@main.command()
@click.pass_context
def suites(ctx: click.Context) -> None:
    """List the suite slugs (conf/suite/*.yaml)."""
    for slug in available("suite", _conf(ctx)):
        click.echo(slug)


@main.command()
@click.option("--suite", default=None, help="only the datasets of this suite")
@click.option("--json", "as_json", is_flag=True, help="machine-readable output")
@click.pass_context
def datasets(ctx: click.Context, suite: str | None, as_json: bool) -> None:
    """The catalogue: every registered dataset (conf/dataset/*.yaml) with source, classes, splits, metric."""
    conf = _conf(ctx)
    if suite is not None:
        _check_groups([f"suite={suite}"], conf)
    try:
        rows = catalogue(suite, conf)
    except VlbenchError as err:
        raise click.ClickException(str(err)) from err
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    width = max([len("dataset")] + [len(r["name"]) for r in rows])
    click.echo(f"{'dataset':{width}s} {'source':12s} {'classes':>7s}  {'metric':14s} {'manual':6s}  {'group/base+novel':16s}  splits")
    for r in rows:
        splits = ", ".join(f"{k} {v}" for k, v in r["splits"].items()) or "(sizes known once prepared)"
        classes = "?" if r["classes"] is None else str(r["classes"])
        manual = "yes" if r["manual_download"] else "no"
        group = r.get("group") or (f"{r['base']}+{r['novel']}" if "base" in r else "")  # VTAB group; FewTrans base+novel
        click.echo(f"{r['name']:{width}s} {r['source']:12s} {classes:>7s}  {r['metric']:14s} {manual:6s}  {group:16s}  {splits}")


@main.command("compose")
@click.argument("overrides", nargs=-1)
@click.option("-o", "--output", default="params.yaml", show_default=True)
@click.pass_context
def compose_cmd(ctx: click.Context, overrides: tuple[str, ...], output: str) -> None:
    """Write params.yaml from conf/ with Hydra OVERRIDES (e.g. model=toy-wide), and dvc.yaml's stages generated from
    the analyses table (vlbench.pipeline)."""
    conf = _conf(ctx)
    _check_groups(overrides, conf)
    try:
        params = compose(list(overrides), conf)
    except VlbenchError as err:
        raise click.ClickException(str(err)) from err
    with atomic_path(output) as tmp:
        tmp.write_text(params_yaml(params), encoding="utf-8")
    click.echo(f"wrote {output}")
    pipeline = Path(conf).resolve().parent / "dvc.yaml"
    if pipeline.is_file() and refresh_dvc_yaml(pipeline):
        click.echo("wrote dvc.yaml's generated stages (vlbench.analyses.ANALYSES changed)")


def params_yaml(params: dict) -> str:
    """params.yaml's text exactly as `dvc exp run` writes it (OmegaConf's YAML, no comment: DVC would drop one on
    every run, leaving a diff), so that both ways give the same bytes. The note about it is in conf/config.yaml."""
    from omegaconf import OmegaConf

    return OmegaConf.to_yaml(OmegaConf.create(params))


@main.command("lock")
@click.option("--update", "update", multiple=True, metavar="ENTRY",
              help="re-resolve the entry's revision at the hub and pin its current commit (repeatable)")
@click.option("--json", "as_json", is_flag=True, help="machine-readable output: the lock's pins")
@click.pass_context
def lock_cmd(ctx: click.Context, update: tuple[str, ...], as_json: bool) -> None:
    """Show the Hugging Face pins (hub.lock: each entry's repository, revision, commit and files' sha256), or move
    the pins of --update ENTRY on purpose (docs/downloads.md)."""
    try:
        registered = entries(config_dir=_conf(ctx)) if update else {}
        for name in update:
            _update_pin(name, registered)
        pins = read_lock()
    except VlbenchError as err:
        raise click.ClickException(str(err)) from err
    if as_json:
        click.echo(json.dumps({name: pin.as_yaml() for name, pin in pins.items()}, indent=2))
    elif not update:
        if not pins:
            click.echo(f"{lock_path()}: no pins yet (an entry is pinned at its first download)")
        width = max([0] + [len(name) for name in pins])
        for name, pin in sorted(pins.items()):
            size = sum(f["size"] for f in pin.files.values())
            click.echo(f"{name:{width}s} {pin.repository}@{pin.revision} -> {pin.commit}  {len(pin.files)} files, "
                       f"{size:,} bytes")


def _update_pin(name: str, registered: dict) -> None:
    prepare = (registered.get(name) or {}).get("prepare") or {}
    if not isinstance(prepare.get("repo"), str) or not isinstance(prepare.get("revision"), str):
        raise click.ClickException(f"{name!r} is not a registered Hugging Face dataset entry (conf/dataset/{name}.yaml "
                                   f"with prepare.repo and prepare.revision)")
    old, new = repin(name, prepare["repo"], prepare["revision"])
    where = f"{name}: {new.repository}@{new.revision}"
    if old is not None and old.commit == new.commit and old.files == new.files:
        click.echo(f"{where} is still at {new.commit}; {lock_path()} unchanged")
        return
    was = f"moved from {old.commit} ({len(old.files)} files forgotten)" if old is not None else "pinned"
    click.echo(f"{where} {was} to {new.commit} in {lock_path()}; its files are downloaded and verified against the "
               f"hub at the next prepare, which DVC does not rerun by itself (the lock is no stage dependency): "
               f"dvc repro -f -s prepare@{name}")


@main.command("data-root")
@click.argument("path", required=False)
def data_root(path: str | None) -> None:
    """Link data/own to your data root PATH (default: $VLBENCH_DATA_ROOT); once per clone."""
    try:
        target = link_data_root(path)
    except VlbenchError as err:
        raise click.ClickException(str(err)) from err
    click.echo(f"{OWN_DATA} -> {target}")


@main.command("check-weights")
@click.argument("slug")
@click.pass_context
def check_weights(ctx: click.Context, slug: str) -> None:
    """Load model SLUG once (downloading its weights if there is network) and print its fingerprint."""
    from vlbench.models.loading import load_model

    conf = _conf(ctx)
    _check_groups([f"model={slug}"], conf)
    try:
        loaded = load_model(compose([f"model={slug}"], conf)["model"], device="cpu")
    except VlbenchError as err:
        raise click.ClickException(str(err)) from err
    click.echo(yaml.safe_dump(loaded.fingerprint, sort_keys=False))


def _check_groups(overrides, conf: Path) -> None:
    for override in overrides:
        group, _, option = override.partition("=")
        if group in ("model", "suite") and option not in available(group, conf):
            raise click.ClickException(f"unknown {group} {option!r}; known {group}s: {', '.join(available(group, conf))}")


@main.command()
@click.argument("overrides", nargs=-1)
@click.option("-S", "--set-param", "set_params", multiple=True, metavar="KEY=VALUE",
              help="an override as `dvc exp run -S` spells it (same as a positional OVERRIDE)")
@click.option("--suite", default=None, help="the suite (same as suite=S)")
@click.option("--model", default=None, help="the model (same as model=M)")
@click.option("--device", default=None, help="where the warm-up runs: cuda or cpu (default: cuda when available)")
@click.option("--warmup/--no-warmup", default=True, show_default=True,
              help="measure the model's forward pass and the decode cost for the time estimate")
@click.option("--json", "as_json", is_flag=True,
              help='machine-readable: {"model", "suite", "stages": [{"name", "status", "cached": {"local", "remote"}, '
                   '"after", "images", "texts"}], "images", "texts", "manual_downloads", "remote", "estimate": '
                   '{"seconds", "device", "images_per_second", "rate": "measured" | "cached" | "estimated from FLOPs" '
                   '| null, "reason"}, "finetune": {"stages": [{"name", "kind", '
                   '"methods": {method: {"units", "runs", "steps", ...}}, "units", "runs", "steps", "unknown"}], '
                   '"estimate": {"seconds", "device_hours", "device", "seconds_per_step", "rate", "reason"} | null}}')
@click.pass_context
def plan(ctx: click.Context, overrides: tuple[str, ...], set_params: tuple[str, ...], suite: str | None,
         model: str | None, device: str | None, warmup: bool, as_json: bool) -> None:
    """What `dvc exp run` with these OVERRIDES would run, how many images and texts it embeds, what is cached, and a
    time estimate from a short warm-up; runs nothing and writes nothing (params.yaml untouched)."""
    conf = _conf(ctx)
    groups = [f"{group}={option}" for group, option in (("suite", suite), ("model", model)) if option is not None]
    chosen = [*overrides, *set_params, *groups]
    _check_groups(chosen, conf)
    try:
        params = compose(chosen, conf)
        result = make_plan(params, device=device, warmup=warmup)
    except VlbenchError as err:
        raise click.ClickException(str(err)) from err
    if as_json:
        click.echo(json.dumps(result, indent=2))
        return
    for row in result["stages"]:
        if row["status"] != "up to date":
            counts = "".join(f"  {row[k]} {k}" for k in ("images", "texts") if row[k] is not None)
            cached = "  (cached locally: restored, not run)" if row["cached"]["local"] else ""
            after = f"  (after {', '.join(row['after'])})" if row["after"] else ""
            click.echo(f"{row['status']:10s} {row['name']}{counts}{cached}{after}")
    fresh = sum(row["status"] == "up to date" for row in result["stages"])
    click.echo(f"{fresh} stage(s) up to date; remote: {result['remote']['reason'] or result['remote']['name']}")
    est = result["estimate"]
    click.echo(f"estimate on {est['device']}" + (f" (model rate {est['rate']})" if est["rate"] else "") +
               f": {est['reason']}")
    for row in result["finetune"]["stages"]:
        counts = ", ".join(f"{row[k] if row[k] is not None else '?'} {k}" for k in ("units", "runs", "steps"))
        click.echo(f"fine-tuning {row['name']}: {counts}" + "".join(f"; {u}" for u in row["unknown"]))
    if result["finetune"]["estimate"]:
        ft = result["finetune"]["estimate"]
        hours = f"~{ft['device_hours']:.2f} device-hours" if ft["device_hours"] is not None else "time unknown"
        click.echo(f"fine-tuning on {ft['device']}: {hours} ({ft['reason']})")
    click.echo(summary(result, params["model"]["arch"]))


@main.command()
@click.argument("dataset")
@click.option("--json", "as_json", is_flag=True, help="every coarse class with its level, name and leaves, as JSON")
@click.option("--dag", is_flag=True, help="all hypernym paths (a DAG) instead of each leaf's longest path (a tree)")
@click.pass_context
def hierarchy(ctx: click.Context, dataset: str, as_json: bool, dag: bool) -> None:
    """The WordNet hierarchy above DATASET's classes: coarse classes, count per level, depth."""
    from omegaconf import OmegaConf

    conf = _conf(ctx)
    if dataset not in available("dataset", conf):
        raise click.ClickException(f"unknown dataset {dataset!r}; known datasets: {', '.join(available('dataset', conf))}")
    entry = OmegaConf.to_container(OmegaConf.load(conf / "dataset" / f"{dataset}.yaml"), resolve=True)
    try:
        leaves = dataset_leaves(dataset, entry)
        tree = build_hierarchy(leaves.wnids, mode="dag" if dag else "tree")
    except VlbenchError as err:
        raise click.ClickException(str(err)) from err
    if as_json:
        click.echo(json.dumps(tree.to_json(dataset, leaves.origin), indent=2))
        return
    shape = "a DAG of all hypernym paths" if dag else "a tree of each leaf's longest hypernym path"
    click.echo(f"{dataset}: WordNet {tree.wordnet or '?'} hierarchy, {shape}; leaves from {leaves.origin}")
    click.echo(f"leaves {len(tree.leaves)}  coarse classes {len(tree.coarse_classes)}  depth {tree.depth}  "
               f"(levels from entity = 0; {len(tree.tied)} leaves had tied longest paths)")
    click.echo(f"{'level':>5s} {'coarse':>7s} {'leaves':>7s}")
    leaf_levels = tree.per_level(leaves=True)
    for level, count in tree.per_level().items():
        click.echo(f"{level:5d} {count:7d} {leaf_levels[level]:7d}")


@main.group()
def knowledge() -> None:
    """Knowledge for prompts: ELEVATER's Wiktionary, WordNet and GPT-3 files, CuPL, Menon & Vondrick."""


@knowledge.command("coverage")
@click.option("--suite", default=None, help="only the datasets of this suite")
@click.option("--json", "as_json", is_flag=True,
              help='machine-readable: {dataset: {source: {"classes", "covered", "empty", "null", "missing"}}}')
@click.pass_context
def knowledge_coverage(ctx: click.Context, suite: str | None, as_json: bool) -> None:
    """Per dataset and knowledge source: how many classes have a usable entry, an empty or null one, or none.

    Reads the knowledge files from the download cache or the local mirror folder (env VLBENCH_MIRROR) only; it
    never downloads, and says which files are absent."""
    conf = _conf(ctx)
    if suite is not None:
        _check_groups([f"suite={suite}"], conf)
    try:
        report = coverage_report(entries(suite, conf))
    except VlbenchError as err:
        raise click.ClickException(str(err)) from err
    if not as_json:
        click.echo(format_report(report))
        return
    click.echo(json.dumps(report.counts, indent=2))
    for line in report.notes():
        click.echo(line, err=True)


@main.command()
@click.option("--paper", default=None, metavar="P",
              help="only this paper's tables (elevater, vtab, openness, granularity, fewtrans, open_clip, "
                   "mobileclip2, pe, siglip2)")
@click.option("--json", "as_json", is_flag=True,
              help='machine-readable: {"tables": [{"file", "paper", "table", "title", "source", "settings", '
                   '"how_to_run", "notes", "models", "rows": [...]}]}')
def reference(paper: str | None, as_json: bool) -> None:
    """The papers' published numbers vlbench compares runs with: each table, its settings and how to run them."""
    try:
        tables = load_tables(paper)
    except VlbenchError as err:
        raise click.ClickException(str(err)) from err
    if as_json:
        click.echo(json.dumps({"tables": [t.summary() for t in tables]}, indent=2))
        return
    if not tables:
        click.echo(f"no reference tables for {paper} yet")
    for t in tables:
        models = sorted({r.model for r in t.rows if r.model}) or ["none of vlbench's"]
        click.echo(f"{t.paper} {t.table} ({t.file}): {t.title}")
        click.echo(f"  {len(t.rows)} numbers; models: {', '.join(models)}")
        for key, value in t.settings.items():
            shown = ", ".join(map(str, value)) if isinstance(value, list) else value
            shown = f"{len(value)} entries (see --json)" if isinstance(value, list) and len(value) > 8 else shown
            click.echo(f"  setting {key}: {shown}")
        click.echo(f"  run: {t.how_to_run}")
        for note in [t.notes] if isinstance(t.notes, str) else t.notes or []:
            click.echo(f"  note: {note}")


@main.command("compare")
@click.argument("revs", nargs=-1, required=True, metavar="REV REV ...")
@click.option("--json", "as_json", is_flag=True,
              help='machine-readable: {"experiments": [{"name", "rev"}], "rows": [{"analysis", "dataset", "metric", '
                   '"values", "differences", "winner"}], "correction", "leaderboard"?}')
@click.option("--out", default="reports/compare", show_default=True, help="folder of the comparison page (index.html)")
@click.option("--correction", type=click.Choice(["holm", "bh", "none"]), default="holm", show_default=True,
              help="adjust the p-values over every difference of the comparison: Holm (family-wise), "
                   "Benjamini-Hochberg (false discovery rate) or none; a winner is called on the adjusted ones")
@click.option("--unpaired", is_flag=True,
              help="compare what cannot be paired (no per-sample table, or a table missing from the cache and the "
                   "remote) from the two intervals (a normal approximation); without it such a difference has no p")
@click.option("--leaderboard/--no-leaderboard", default=None,
              help="one row per experiment, one column per analysis x dataset, ranks with bootstrap rank intervals "
                   "and the published models beside them [default: on for more than two revisions]")
def compare_cmd(revs: tuple[str, ...], as_json: bool, out: str, correction: str, unpaired: bool,
                leaderboard: bool | None) -> None:
    """Compare the results of git revisions or DVC experiments (read through DVC, never checked out): every metric
    with its interval, the paired significance of each difference (adjusted for the number of differences), the
    winner; with more than two revisions (or --leaderboard) a leaderboard."""
    if len(revs) < 2 or len(set(revs)) < len(revs):
        raise click.UsageError(f"give at least two different revisions, got {list(revs)}")
    if Path(out).exists() and not Path(out).is_dir():
        raise click.BadParameter(f"{out} is a file; --out names the folder of the comparison page (index.html)",
                                 param_hint="--out")
    try:
        experiments = [open_revision(rev) for rev in revs]
        data = compare(experiments, correction=correction, unpaired=unpaired, leaderboard=leaderboard)
    except VlbenchError as err:
        raise click.ClickException(str(err)) from err
    for e in (e for e in experiments if e.unavailable):
        click.echo(f"note: {e.name}: {len(e.unavailable)} per-sample file(s) in neither the DVC cache nor the remote "
                   f"(e.g. {e.unavailable[0]}; dvc pull): their differences are unpaired"
                   + ("" if unpaired else " and untested (--unpaired compares them from the intervals)"), err=True)
    if as_json:
        click.echo(json.dumps(data, indent=2))
    else:
        if "leaderboard" in data:
            click.echo(format_leaderboard(data["leaderboard"]) + "\n")
        click.echo(format_table(data))
    click.echo(f"wrote {write_page(data, Path(out))}", err=True)


if __name__ == "__main__":
    sys.exit(main())
