"""Loaded by Hydra's plugin discovery when DVC composes params.yaml (`dvc exp run -S ...`; DVC puts the project root on
the plugin path): registers vlbench's OmegaConf resolvers, so that a fine-tuned model entry's `${vlbench.finetuned:}`
fails at composition, naming the run that makes its weights (vlbench.models.finetuned.finetuned_weights). Not a Hydra
plugin itself; `vlbench compose` registers the same resolvers without it."""

from vlbench.models.finetuned import register_resolvers

register_resolvers()
