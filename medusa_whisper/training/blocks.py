"""Training speech in blocks of an hour (``train --hours``), each packed and cached on its own.

``windows.pack`` shuffles windows over the whole data set, so one more hour of speech would repack,
and so re-cache, all of it. With ``--hours`` the CSV's utterances are taken in their order (a speech
build appends them in its seeded plan order, so a longer build only adds rows at the end) and cut
into consecutive blocks of ``BLOCK_HOURS`` of audio; block i is packed with a seed of its own and
cached under ``CACHE/train/block_{i:03d}``. A run with ``--hours H`` trains on the first
ceil(H / BLOCK_HOURS) whole blocks: a later run with more hours, another head type, or a
learning-curve run on fewer hours reuses the blocks already cached. Each block folder records a key
of its utterances and settings (``block.json``); a block whose rows changed is refused rather than
silently mixed with a stale cache.
"""

from __future__ import annotations

import hashlib
import json
import math
import sys
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from . import features
from .features import LabelOptions, Shard
from .windows import DataError, Utterance, Window, duration, pack, read_sources

BLOCK_HOURS = 1.0


@dataclass(frozen=True)
class Block:
    index: int
    utterances: Tuple[Utterance, ...]
    seconds: float

    def key(self, seed: int, window_seconds: Tuple[float, float], label: LabelOptions) -> str:
        """A digest of everything that decides the block's cache: its rows, packing and labelling."""
        spec = json.dumps(dict(rows=[(u.path, u.sentence, u.language, u.group, round(duration(u), 2))
                                     for u in self.utterances], packing="first-fit",
                               seed=seed, window_seconds=list(window_seconds), label=asdict(label)))
        return hashlib.sha256(spec.encode()).hexdigest()[:16]


class BlockCounter:
    """Counts whole blocks as utterances arrive in order: a block closes at the utterance that brings
    it to ``block_hours`` of audio. ``cut`` and the speech build (which stops once the blocks that
    ``train --hours`` asks for are whole) count with this one rule."""

    def __init__(self, block_hours: float = BLOCK_HOURS):
        self.limit = block_hours * 3600
        self.whole = 0  # blocks closed
        self.open_seconds = 0.0  # audio in the block not closed yet

    def add(self, seconds: float) -> Optional[float]:
        """Count one utterance; the seconds of the block it closed, or None."""
        self.open_seconds += seconds
        if self.open_seconds < self.limit:
            return None
        closed, self.whole, self.open_seconds = self.open_seconds, self.whole + 1, 0.0
        return closed


def cut(utterances: Sequence[Utterance], block_hours: float = BLOCK_HOURS) -> Tuple[List[Block], float]:
    """Consecutive blocks of at least ``block_hours`` of audio, in the rows' order, and the seconds of
    the incomplete block left over at the end (not used: it would change as the CSV grows)."""
    counter = BlockCounter(block_hours)
    blocks: List[Block] = []
    current: List[Utterance] = []
    for u in utterances:
        current.append(u)
        closed = counter.add(duration(u))
        if closed is not None:
            blocks.append(Block(len(blocks), tuple(current), closed))
            current = []
    return blocks, counter.open_seconds


def blocks_for(hours: float, block_hours: float = BLOCK_HOURS) -> int:
    """How many whole blocks ``train --hours`` trains on: ``hours`` rounded up to whole blocks."""
    return max(1, math.ceil(hours / block_hours - 1e-9))


def select(blocks: Sequence[Block], hours: float, block_hours: float = BLOCK_HOURS,
           leftover_seconds: float = 0.0) -> List[Block]:
    """The first blocks that hold ``hours`` (whole blocks, rounded up); a DataError when there are too few."""
    wanted = blocks_for(hours, block_hours)
    if wanted > len(blocks):
        have = sum(b.seconds for b in blocks) / 3600
        raise DataError(f"--hours {hours:g}: the training data holds {len(blocks)} whole block(s) of "
                        f"{block_hours:g} h ({have:.2f} h, plus {leftover_seconds / 3600:.2f} h in an "
                        "incomplete last block); build more speech or ask for fewer hours")
    return list(blocks[:wanted])


def block_windows(block: Block, seed: int, window_seconds: Tuple[float, float]) -> List[Window]:
    """The block's windows, packed with a seed of its own (the same windows whatever follows the block)."""
    return pack(block.utterances, seed=seed * 1000 + block.index, min_seconds=window_seconds[0],
                max_seconds=window_seconds[1], first_fit=True)


def block_dir(cache_dir: Path, block: Block) -> Path:
    return Path(cache_dir) / f"block_{block.index:03d}"


def build(model, blocks: Sequence[Block], cache_dir: Path, label: LabelOptions, seed: int,
          window_seconds: Tuple[float, float]) -> Dict:
    """Cache every block not cached yet (a block half done resumes at its next shard); the summary.

    Every block's key is checked before any is cached: a stale block is refused at once, not after
    the hours spent caching the blocks before it.
    """
    # each block draws its own timestamped windows (the same draw would repeat in every block)
    options = [replace(label, seed=label.seed * 1000 + block.index) for block in blocks]
    keys = [block.key(seed, window_seconds, o) for block, o in zip(blocks, options)]
    for block, key in zip(blocks, keys):
        record = block_dir(cache_dir, block) / "block.json"
        if record.is_file() and json.loads(record.read_text()).get("key") != key:
            raise DataError(f"{record.parent}: cached from other rows or settings than block {block.index} of "
                            "this data (key differs); delete the folder, or give the --cache-dir of this data")
    summaries = []
    for block, key, block_options in zip(blocks, keys, options):
        folder = block_dir(cache_dir, block)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "block.json").write_text(json.dumps(dict(key=key, index=block.index, utterances=len(block.utterances),
                                                           hours=round(block.seconds / 3600, 4)), indent=1))
        summaries.append(features.build_cache(model, block_windows(block, seed, window_seconds), folder,
                                              block_options, f"cache block {block.index + 1}/{len(blocks)}"))
    return dict(blocks=len(blocks), hours=round(sum(b.seconds for b in blocks) / 3600, 3),
                windows=sum(s["windows"] for s in summaries),
                target_tokens=sum(s["target_tokens"] for s in summaries),
                windows_with_timestamps=sum(s["windows_with_timestamps"] for s in summaries))


def load(cache_dir: Path, blocks: Sequence[Block], audio_features: bool = True) -> Shard:
    """The cached windows of the blocks, in block order, as one shard."""
    return features.merge([features.load_cache(block_dir(cache_dir, b), audio_features=audio_features)
                           for b in blocks])


def window_seconds(shard: Shard, utterances: Sequence[Utterance]) -> List[float]:
    """Seconds of audio in each cached window (its utterances and the pauses before them), from the
    cache's record of which files it played: what the learning curve counts as speech seen."""
    seconds = {u.path: duration(u) for u in utterances}
    return [sum(seconds.get(p, 0.0) for p in m["audio"]) + sum(m["pauses"]) for m in shard.meta]


def from_args(args, base, cache: Path, label: LabelOptions):
    """train --hours: the blocks of the training rows to train on, cached (train and its CTC variant).

    returns (blocks, the training utterances, the cache summary)
    """
    if args.max_windows:
        raise DataError("train: --hours and --max-windows both choose the data; give one")
    block_hours = args.block_hours or BLOCK_HOURS
    utterances = read_sources(args.data, args.audio_dir, args.language)
    every, leftover = cut(utterances, block_hours)
    chosen = select(every, args.hours, block_hours, leftover)
    print(f"--hours {args.hours:g}: {len(chosen)} block(s) of {block_hours:g} h, "
          f"{sum(b.seconds for b in chosen) / 3600:.2f} h of audio", file=sys.stderr)
    summary = build(base, chosen, cache / "train", label, args.seed, tuple(args.window_seconds))
    return chosen, utterances, summary
