"""What the stages that run a model do first: import its libraries for that model alone (vlbench.lazy_imports). Apart
from stages.command, so that the stages that run no model do not depend on the model libraries' code."""

import stages
from vlbench import lazy_imports


def import_model_libraries(params: dict) -> None:
    """In a stage process, import torchvision and open_clip for the params' model alone, before anything else imports
    them: without torch._dynamo and the tower libraries the architecture does not build (vlbench.lazy_imports; about
    half a model stage's start-up). Elsewhere (a test importing a stage module) nothing changes."""
    arch = (params.get("model") or {}).get("arch")
    if stages.STAGE_PROCESS and arch:
        lazy_imports.import_for_model(str(arch))
