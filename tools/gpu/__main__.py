"""Measurements on a borrowed CUDA machine: what travels there, and how it runs (tools/gpu/run.sh)."""

from tools.commands import Command, dispatch

COMMANDS = {
    "pack": Command("tools.gpu.pack", "weights, recordings and wheels in parts of one device call each"),
    "ab": Command("tools.gpu.ab", "the same rows with two versions of the package, one process each"),
}

if __name__ == "__main__":
    dispatch("python -m tools.gpu", __doc__, COMMANDS)
