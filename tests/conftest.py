import os
import tempfile
from pathlib import Path

import pytest
import torch

DATA = Path(__file__).parent / "data"
CLIPS = sorted(DATA.glob("*.flac"))

# Converted weights go to a cache of the test session's own, never the user's ~/.cache.
os.environ.setdefault("MEDUSA_WHISPER_CACHE", tempfile.mkdtemp(prefix="medusa_whisper_test_cache_"))

# Results must not depend on how many threads the machine gives; fixed and small, as CI has 2 cores.
torch.set_num_threads(int(os.environ.get("MEDUSA_TEST_THREADS", "2")))


@pytest.fixture(scope="session")
def clips():
    return CLIPS


@pytest.fixture(scope="session")
def tiny_en_cache(clips, tmp_path_factory):
    """The bundled clips packed two or three to a window, labelled by tiny.en itself (a training cache)."""
    import medusa_whisper
    from medusa_whisper.training import features, windows

    base = medusa_whisper.load_model("tiny.en", device="cpu")
    utterances = [windows.Utterance(path=str(c), group="all") for c in clips]
    packed = windows.pack(utterances, seed=0, min_seconds=8, max_seconds=12)
    out = tmp_path_factory.mktemp("cache")
    features.build_cache(base, packed, out, features.LabelOptions(timestamps_fraction=0.5))
    return out


@pytest.fixture
def measure_afresh(tmp_path, monkeypatch):
    """A function that makes every kernel choice from then on be measured again on first use (as a
    fresh install measures), into a table of this test's own; no choice measured so is left to
    later tests. Returns the routes module, whose ``table()`` is then that table."""
    from medusa_whisper.step import compute, routes

    memos = (compute._many_rows_kernel, compute._many_rows_from)

    def afresh():
        monkeypatch.setattr(routes, "cache_dir", lambda: tmp_path / "measured afresh")
        for memo in memos:
            memo.cache_clear()
        return routes

    yield afresh
    for memo in memos:
        memo.cache_clear()
