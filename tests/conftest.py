import os
from pathlib import Path

import pytest
import torch

DATA = Path(__file__).parent / "data"
CLIPS = sorted(DATA.glob("*.flac"))

# Results must not depend on how many threads the machine gives; fixed and small, as CI has 2 cores.
torch.set_num_threads(int(os.environ.get("MEDUSA_TEST_THREADS", "2")))


@pytest.fixture(scope="session")
def clips():
    return CLIPS
