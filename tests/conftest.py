import atexit
import os
import shutil
import tempfile
from pathlib import Path

import pytest
import torch

DATA = Path(__file__).parent / "data"
CLIPS = sorted(DATA.glob("*.flac"))

# The row kernels `make setup` built stay where it built them; converted weights go to a cache of the
# test session's own, never the user's ~/.cache, removed when the session ends (a session converts
# 0.2-1.7 GB of weights there).
from medusa_whisper.step import native  # noqa: E402

os.environ.setdefault(native.KERNELS_ENV, str(native.kernels_dir()))
if "MEDUSA_WHISPER_CACHE" not in os.environ:
    os.environ["MEDUSA_WHISPER_CACHE"] = tempfile.mkdtemp(prefix="medusa_whisper_test_cache_")
    atexit.register(shutil.rmtree, os.environ["MEDUSA_WHISPER_CACHE"], ignore_errors=True)

# Results must not depend on how many threads the machine gives; fixed and small, as CI has 2 cores.
torch.set_num_threads(int(os.environ.get("MEDUSA_TEST_THREADS", "2")))

# No test times the machine unless timing is what it tests (``unpinned``, ``measure_afresh``): every
# choice the package would time replays a recorded CPU kind's (step/kinds.py), by default the kind
# nearest this CPU; MEDUSA_WHISPER_KIND=<kind> pins another, and the suite must pass with each.
from medusa_whisper.step import kinds  # noqa: E402

os.environ.setdefault(kinds.PIN_ENV, kinds.ranked()[0])


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


def pytest_report_header(config):
    return f"choices replayed from the recorded CPU kind {os.environ.get(kinds.PIN_ENV)} ({kinds.PIN_ENV})"


@pytest.fixture
def unpinned(tmp_path, monkeypatch):
    """A test of timing itself: choices are timed as a user's are on a CPU kind never recorded (no
    kind to replay: a test that wants some sets ``kinds.profiles``), into a routes table of this
    test's own (its folder returned; the weights cache stays the session's), and none of its
    timings is left to later tests."""
    from medusa_whisper.step import compute, routes

    monkeypatch.delenv(kinds.PIN_ENV, raising=False)
    monkeypatch.setattr(kinds, "profiles", lambda: {})
    monkeypatch.setattr(routes, "streamed_bytes", lambda: 1 << 20)  # a route timed on 1 MB, not hundreds
    folder = tmp_path / "unpinned"
    monkeypatch.setattr(routes, "cache_dir", lambda: folder)
    memos = (compute._many_rows_kernel, compute._many_rows_from, compute._few_rows_kernel)
    for memo in memos:
        memo.cache_clear()
    yield folder
    for memo in memos:
        memo.cache_clear()


@pytest.fixture
def measure_afresh(tmp_path, monkeypatch):
    """A function that makes every kernel choice from then on be measured again on first use (as a
    fresh install on a kind never recorded measures), into a table of this test's own; no choice measured so is left to
    later tests. Returns the routes module, whose ``table()`` is then that table."""
    from medusa_whisper.step import compute, routes

    memos = (compute._many_rows_kernel, compute._many_rows_from, compute._few_rows_kernel)

    def afresh():
        monkeypatch.delenv(kinds.PIN_ENV, raising=False)
        monkeypatch.setattr(kinds, "profiles", lambda: {})  # as on a kind never recorded: every choice timed
        monkeypatch.setattr(routes, "cache_dir", lambda: tmp_path / "measured afresh")
        for memo in memos:
            memo.cache_clear()
        return routes

    yield afresh
    for memo in memos:
        memo.cache_clear()
