"""Model registry and loading: open_clip architectures, pretrained tags, local and toy checkpoints."""

from pathlib import Path

CONFIG_DIR = Path(__file__).parent / "configs"


def register_local_configs() -> None:
    """Make vlbench's own open_clip architecture configs (the toy models) known to open_clip."""
    import open_clip

    if CONFIG_DIR.is_dir() and any(CONFIG_DIR.glob("*.json")):
        open_clip.add_model_config(CONFIG_DIR)
