"""Pack what a CUDA machine needs for ``tools/gpu/run.sh`` into pieces that fit one device call each.

    python -m tools.gpu pack --model base --out .gpu

A device call carries the working tree (about 40 MiB, the shipped heads included) plus at most 64
MiB in all, and the machine reaches no registry, so the converted weights, the recordings and the
wheels it lacks travel as one tar file cut into parts of ``--part-mib``, one part per call: the
first calls copy their part to /tmp/gpu, the last copies its part and runs ``tools/gpu/run.sh``,
which joins them, checks the SHA-256, installs the wheels and measures. The weights travel as float16:
the offline weights are CTranslate2 float16, so every value survives the trip (checked per tensor).

Writes OUT/call1 .. OUT/callN (one part each) and OUT/PLAN.md (the device calls, in order). With
``--before COMMIT`` it also writes that commit's ``medusa_whisper`` to ``.before/`` (ignored by git),
and the last call carries it and runs ``tools/gpu/ab.py`` for both versions before the bench
(``AB_BEFORE``): a before and after on the same machine.
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import io
import json
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import List, Optional

import torch

from medusa_whisper.checkpoints.weights import resolve
from tools import ROOT
from tools.bench.gpu import pick_clips

# what the device's Python lacks (tools/gpu/run.sh installs them): openai-whisper and what the
# package imports beyond the device image's own packages (/work/.library/device/KINDS.md)
WHEELS = ("openai-whisper==20250625", "more-itertools", "soundfile", "cffi", "pycparser", "soxr")
CALL_MIB = 64.0  # what one device call carries, the working tree included
MARGIN_MIB = 0.5  # for files the tree gains between packing and the calls


def tree_bytes() -> int:
    """Bytes of what a device call sends of this checkout: tracked files, and untracked ones git does
    not ignore."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                            check=True, capture_output=True).stdout.split(b"\0")
    return sum((ROOT / name.decode()).stat().st_size for name in listed if name and (ROOT / name.decode()).is_file())


def float16_checkpoint(name: str) -> bytes:
    """The model's whisper checkpoint with every float32 tensor that float16 holds exactly in float16."""
    checkpoint = torch.load(resolve(name).checkpoint, map_location="cpu", weights_only=True)
    state, kept = checkpoint["model_state_dict"], []
    for key, tensor in state.items():
        if tensor.dtype == torch.float32:
            half = tensor.half()
            if torch.equal(half.float(), tensor):
                state[key] = half
            else:
                kept.append(key)
    if kept:
        print(f"pack: {len(kept)} tensors stay float32 (float16 would change them): {kept[:3]}")
    buffer = io.BytesIO()
    torch.save(checkpoint, buffer)
    return buffer.getvalue()


def wheels(folder: Path, python: str) -> List[Path]:
    """Wheels for the device's Python (manylinux x86_64); openai-whisper, an sdist only, built here."""
    folder.mkdir(parents=True, exist_ok=True)
    pip = [sys.executable, "-m", "pip", "-q"]
    platforms = [f"--platform=manylinux_2_{n}_x86_64" for n in (17, 27, 28)] + ["--platform=manylinux2014_x86_64"]
    for spec in WHEELS:
        name = spec.split("==")[0]
        if spec.startswith("openai-whisper"):
            subprocess.run(pip + ["wheel", "--no-deps", "-w", str(folder), spec], check=True)
        else:
            subprocess.run(pip + ["download", "--no-deps", "--only-binary=:all:", "--python-version", python,
                                  "--implementation", "cp", *platforms, "-d", str(folder), name], check=True)
    return sorted(folder.glob("*.whl"))


BEFORE = ".before"  # where --before puts the earlier version's package (.gitignore has it)


def build(model: str, real_csv: Path, long_audio: Optional[Path], out: Path, part_mib: float, python: str,
          longest: int = 30, librivox: int = 5, before: bool = False) -> List[Path]:
    out.mkdir(parents=True, exist_ok=True)
    staging = out / "staging"
    shutil.rmtree(staging, ignore_errors=True)
    (staging / "cache").mkdir(parents=True)
    data = float16_checkpoint(model)
    (staging / "cache" / f"{model}.pt").write_bytes(data)
    manifest = {model: {"file": f"{model}.pt", "sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data),
                        "source": f"tools.gpu pack: float16 copy of {model}"}}
    (staging / "cache" / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    clips = pick_clips(real_csv, longest, librivox)
    (staging / "clips").mkdir()
    with open(staging / "clips" / "clips.csv", "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=["audio", "sentence", "seconds"])
        writer.writeheader()
        for row in clips:
            name = Path(row["audio"]).name
            shutil.copy(real_csv.parent / row["audio"], staging / "clips" / name)
            writer.writerow(dict(audio=name, sentence=row["sentence"], seconds=row["seconds"]))
    if long_audio is not None:
        shutil.copy(long_audio, staging / "clips" / "long.flac")
    wheels(staging / "wheels", python)
    tar_path = out / "payload.tar"
    with tarfile.open(tar_path, "w") as tar:
        for path in sorted(staging.rglob("*")):
            if path.is_file():
                tar.add(path, arcname=str(path.relative_to(staging)))
    payload = tar_path.read_bytes()
    digest = hashlib.sha256(payload).hexdigest()
    size = int(part_mib * 2**20)
    parts = []
    for old in out.glob("call*"):
        shutil.rmtree(old)
    for i, begin in enumerate(range(0, len(payload), size), start=1):
        folder = out / f"call{i}"
        folder.mkdir()
        part = folder / f"payload.tar.part{i:02d}"
        part.write_bytes(payload[begin:begin + size])
        parts.append(part)
    (out / "payload.sha256").write_text(digest + "\n")
    shutil.copy(out / "payload.sha256", parts[-1].parent / "payload.sha256")
    tar_path.unlink()
    shutil.rmtree(staging)
    seconds = sum(float(r["seconds"]) for r in clips)
    print(f"pack: {model} (float16, {len(data) / 2**20:.0f} MiB), {len(clips)} recordings ({seconds:.0f} s)"
          f"{', a long recording' if long_audio else ''}, wheels for Python {python}: "
          f"{len(payload) / 2**20:.1f} MiB in {len(parts)} parts; sha256 {digest[:12]}")
    write_plan(out, len(parts), before)
    return parts


def earlier_package(commit: str) -> Path:
    """``commit``'s ``medusa_whisper`` in ROOT/.before (what run.sh's AB_BEFORE runs)."""
    folder = ROOT / BEFORE
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir()
    archive = subprocess.run(["git", "archive", commit, "medusa_whisper"], cwd=ROOT, check=True,
                             capture_output=True).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(folder, filter="data")
    return folder / "medusa_whisper"


def write_plan(out: Path, n: int, before: bool = False) -> None:
    folder = out.name
    lines = ["# The device calls, in order (each within 30 s of the last, so the machine stays warm)", ""]
    for i in range(1, n + 1):
        copy = f"mkdir -p /tmp/gpu && cp {folder}/call{i}/* /tmp/gpu/ && ls -la /tmp/gpu"
        if i < n:
            lines.append(f"{i}. carry [\"{folder}/call{i}\"], command: `{copy}`")
        elif before:
            lines.append(f"{i}. carry [\"{folder}/call{i}\", \"{BEFORE}\"], timeout_s 600, command: "
                         f"`{copy} && AB_BEFORE={BEFORE} bash tools/gpu/run.sh`")
        else:
            lines.append(f"{i}. carry [\"{folder}/call{i}\"], timeout_s 600, command: "
                         f"`{copy} && bash tools/gpu/run.sh`")
    lines += ["", "run.sh's results come back under $OUT: tests.log, gpu.json, gpu.md, gpu.png, bench.log."]
    (out / "PLAN.md").write_text("\n".join(lines) + "\n", encoding="utf-8")
    print((out / "PLAN.md").read_text())


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="base")
    parser.add_argument("--real", type=Path, default=ROOT / "data" / "real" / "real.csv")
    parser.add_argument("--long", type=Path, default=None, help="a long recording (python -m tools.data long)")
    parser.add_argument("--out", type=Path, default=ROOT / ".gpu")
    parser.add_argument("--part-mib", type=float, default=None,
                        help="the most one call carries besides the working tree (default: what the tree leaves)")
    parser.add_argument("--python", default="3.12", help="the device's Python, for the wheels")
    parser.add_argument("--before", default=None, metavar="COMMIT",
                        help="also measure COMMIT's package against the tree's, on the same machine (tools/gpu/ab.py)")
    args = parser.parse_args(argv)
    if not args.real.is_file():
        sys.exit(f"pack: error: {args.real}: no real recordings (python -m tools.data real --out data/real)")
    if args.before:
        print(f"pack: {args.before}'s package in {earlier_package(args.before)}")
    part_mib = args.part_mib or CALL_MIB - MARGIN_MIB - tree_bytes() / 2**20
    build(args.model, args.real, args.long, args.out, part_mib, args.python, before=bool(args.before))
    return 0


if __name__ == "__main__":
    sys.exit(main())
