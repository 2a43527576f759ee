"""llogos: run GGUF language models from the command line."""

__version__ = "0.1.0"
