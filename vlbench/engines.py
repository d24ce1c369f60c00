"""Where the embed stages run (docs/cluster.md): an engine is a module with `load_model`, `embed_images` and
`embed_texts` of the local engine's signatures, `local` (vlbench.embed: this process and its DataLoader workers) or
`ray` (vlbench.embed_ray: Ray Data, built on the local engine's decode, batches and writers). A runtime setting, never
a param: both give the same features. The choice sits above both engines, so neither names the other; the caller hands
the engine it chose to `embed_image_splits` / `embed_text_sets`."""

from __future__ import annotations

import importlib
import os
from types import ModuleType

from vlbench.embed import EngineError

ENGINE_VARIABLE = "VLBENCH_ENGINE"
ENGINES = {"local": "vlbench.embed", "ray": "vlbench.embed_ray"}


def engine(name: str | None = None) -> ModuleType:
    """The engine `name` names, else $VLBENCH_ENGINE, else local; imported only now (Ray is an optional extra)."""
    name = name or os.environ.get(ENGINE_VARIABLE) or "local"
    if name not in ENGINES:
        raise EngineError(f"engine {name!r} (--engine or ${ENGINE_VARIABLE}) is not one of {sorted(ENGINES)}")
    try:
        return importlib.import_module(ENGINES[name])
    except ModuleNotFoundError as err:
        raise EngineError(f"engine {name!r} needs {err.name!r}, which is not installed: "
                          f"pip install 'vlbench[{name}]'") from err
