"""The `vlbench` command: list what is registered, compose params.yaml, check a model's weights."""

from __future__ import annotations

import sys
from pathlib import Path

import click
import yaml

from vlbench.config import available, compose, conf_dir

PARAMS_HEADER = "# Composed from conf/ by Hydra; regenerate with `vlbench compose` (dvc exp run -S ... does the same).\n"


@click.group()
def main() -> None:
    """vlbench: a reproducible benchmark for CLIP-like vision-language models."""


@main.command()
def models() -> None:
    """List the model slugs (conf/model/*.yaml)."""
    for slug in available("model"):
        cfg = yaml.safe_load((conf_dir() / "model" / f"{slug}.yaml").read_text())
        click.echo(f"{slug:20s} {cfg['arch']:24s} {cfg['pretrained']}")


@main.command()
def suites() -> None:
    """List the suite slugs (conf/suite/*.yaml)."""
    for slug in available("suite"):
        click.echo(slug)


@main.command("compose")
@click.argument("overrides", nargs=-1)
@click.option("-o", "--output", default="params.yaml", show_default=True)
def compose_cmd(overrides: tuple[str, ...], output: str) -> None:
    """Write params.yaml from conf/ with Hydra OVERRIDES (e.g. model=toy-wide)."""
    _check_groups(overrides)
    Path(output).write_text(PARAMS_HEADER + yaml.safe_dump(compose(list(overrides)), sort_keys=False))
    click.echo(f"wrote {output}")


@main.command("check-weights")
@click.argument("slug")
def check_weights(slug: str) -> None:
    """Load model SLUG once (downloading its weights if there is network) and print its fingerprint."""
    from vlbench.models.loading import ModelError, load_model

    _check_groups([f"model={slug}"])
    try:
        loaded = load_model(compose([f"model={slug}"])["model"], device="cpu")
    except ModelError as err:
        raise click.ClickException(str(err)) from err
    click.echo(yaml.safe_dump(loaded.fingerprint, sort_keys=False))


def _check_groups(overrides) -> None:
    for override in overrides:
        group, _, option = override.partition("=")
        if group in ("model", "suite") and option not in available(group):
            raise click.ClickException(f"unknown {group} {option!r}; known {group}s: {', '.join(available(group))}")


if __name__ == "__main__":
    sys.exit(main())
