"""Start-up of the stages that run a model: torchvision and open_clip imported without what the model never uses
(docs/benchmarks.md, "Stage start-up"; measured by benchmarks/startup.py). Nothing here changes a number: a module left
out is one the model does not run, and the deferred one is the same module, imported at its first use.

- torch._dynamo (torch.compile's tracer, with sympy and much of torch.distributed): torchvision's package import runs
  all of its subpackages, and `torchvision.ops.roi_align` imports `torch._dynamo.utils` for one function it calls only
  when roi_align runs. While torchvision loads, that module is a stand-in whose function imports the real one when
  called; after, any import of torch._dynamo is the real one.
- timm and transformers: open_clip imports both for its timm vision towers and Hugging Face text towers (and timm's
  model registry imports torch._dynamo again, for `torch.compiler.disable` decorators). For an architecture whose
  config names neither tower, open_clip is imported with them absent, as on an install without them; they can still be
  imported later (a Hugging Face tokenizer imports transformers when it is built), but this process's open_clip builds
  no such tower: only a process that runs this one model may call `import_for_model`.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import json
import sys
import types
from pathlib import Path

from vlbench.adapters import torch as torch_private
from vlbench.models import CONFIG_DIR

# the library that builds each optional open_clip tower, and the config key that asks for that tower
TOWER_LIBRARIES = {"timm": ("vision_cfg", "timm_model_name"), "transformers": ("text_cfg", "hf_model_name")}


def import_for_model(arch: str) -> None:
    """Import torchvision and open_clip for a process that runs the one open_clip architecture `arch`, without
    torch._dynamo and without the tower libraries `arch` does not build. Where they are loaded already, a no-op."""
    if any(name in sys.modules for name in ("torchvision", "open_clip")):
        return
    with _in_sys_modules({torch_private.DYNAMO_UTILS: _dynamo_utils_stand_in()}):
        importlib.import_module("torchvision")
    # not under the stand-in: timm's own import of torch._dynamo (for a timm tower) must get the real module
    with _in_sys_modules(dict.fromkeys(unused_tower_libraries(arch))):
        importlib.import_module("open_clip")


def unused_tower_libraries(arch: str) -> list[str]:
    """The tower libraries (timm, transformers) that `arch`'s config does not ask for; none when the config is not a
    local file (an hf-hub: architecture's comes from its repository) or open_clip is not installed."""
    spec = importlib.util.find_spec("open_clip")
    if spec is None or not spec.submodule_search_locations:
        return []
    for folder in (Path(spec.submodule_search_locations[0]) / "model_configs", CONFIG_DIR):
        path = folder / f"{arch}.json"
        if path.is_file():
            config = json.loads(path.read_text())
            return [lib for lib, (tower, key) in TOWER_LIBRARIES.items() if not (config.get(tower) or {}).get(key)]
    return []


def _dynamo_utils_stand_in() -> types.ModuleType:
    module = types.ModuleType(torch_private.DYNAMO_UTILS, "stand-in while torchvision loads (vlbench.lazy_imports)")
    module.is_compile_supported = torch_private.is_compile_supported
    return module


@contextlib.contextmanager
def _in_sys_modules(entries: dict):
    """`entries` in sys.modules for the block (None: absent, an import raises ImportError), except names already
    imported, which stay as they are; the entries are removed after."""
    added = {name: module for name, module in entries.items() if name not in sys.modules}
    sys.modules.update(added)
    try:
        yield
    finally:
        for name, module in added.items():
            if name in sys.modules and sys.modules[name] is module:
                del sys.modules[name]
