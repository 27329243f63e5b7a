"""llama-sparse: block-sparse and self-calibrating attention for llama.cpp, as a patch set."""

from importlib import metadata as _metadata

try:
    __version__ = _metadata.version("llama-sparse")
except _metadata.PackageNotFoundError:  # running from a source tree without install
    __version__ = "0+unknown"
