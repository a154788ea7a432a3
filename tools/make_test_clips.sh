#!/usr/bin/env bash
# Re-creates the short English speech clips under tests/data/ that the test suite uses.
# Needs Debian's espeak-ng, flite and sox. The clips are committed, so tests never need these tools.
set -euo pipefail
out="${1:-tests/data}"
mkdir -p "$out"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

say_espeak() {  # name voice speed text
  espeak-ng -v "$2" -s "$3" -w "$tmp/$1.wav" "$4"
  sox "$tmp/$1.wav" -r 16000 -c 1 -b 16 "$out/$1.flac"
}
say_flite() {  # name voice text
  flite -voice "$2" -t "$3" -o "$tmp/$1.wav"
  sox "$tmp/$1.wav" -r 16000 -c 1 -b 16 "$out/$1.flac"
}

say_espeak espeak_weather en-us 160 \
  "The weather today will be mostly sunny, with a light breeze from the west and a high of twenty degrees."
say_espeak espeak_library en-gb 150 \
  "Please return your books to the library before the end of the month, or you will have to pay a small fine."
say_flite flite_train slt \
  "The next train to the city centre leaves from platform four in about ten minutes."
say_flite flite_recipe kal \
  "Mix the flour and the sugar in a large bowl, then add two eggs and a cup of warm milk."
say_espeak espeak_meeting en-us+f3 170 \
  "Thank you all for coming to the meeting. Today we will talk about the budget for next year and the new office."

# A stereo 44.1 kHz WAV, to exercise down-mixing and resampling.
sox "$out/flite_train.flac" -r 44100 -c 2 -b 16 "$out/stereo_44k.wav"
ls -l "$out"
