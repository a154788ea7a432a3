"""Errors a user can cause. The CLI prints `str(error)` as one line and exits non-zero.

Each message names the file or model it is about and the problem, so that in a batch the line
alone tells which input failed and why. Internal bugs are not wrapped in these: they keep their
traceback.
"""


class MedusaWhisperError(Exception):
    """Base class for errors caused by user input (bad file, unknown model, no network)."""


class AudioError(MedusaWhisperError, ValueError):
    """An audio file that is missing, unreadable, empty, silent or not finite."""


class ModelNotFoundError(MedusaWhisperError, ValueError):
    """A model name that is not known and not a path to a checkpoint."""


class CheckpointError(MedusaWhisperError, RuntimeError):
    """A checkpoint that is corrupt, truncated, of the wrong format or fails its SHA-256 check."""


class DownloadError(MedusaWhisperError, RuntimeError):
    """Weights that would have to be downloaded while no network is reachable."""
