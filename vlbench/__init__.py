"""vlbench: a reproducible benchmark for CLIP-like vision-language models."""

__version__ = "0.1.0"
