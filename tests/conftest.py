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
