#!/usr/bin/env bash
# Install Debian packages a make target needs, as .ci/run does for ffmpeg:
#   tools/install_packages.sh "WHAT NEEDS THEM" PACKAGE...
# Nothing to do without packages. As root with apt-get: installed quietly (the log is kept when it
# fails). Otherwise: one line saying what to install, and exit status 1.
set -uo pipefail
what="$1"
shift
[ "$#" -eq 0 ] && exit 0
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "$what: installing Debian packages: $*"
  log="$(mktemp -t install_packages.XXXXXX.log)"
  if { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@"; } >"$log" 2>&1; then
    rm -f "$log"
    exit 0
  fi
  echo "$what: error: apt-get could not install $* ($(grep -E '^E:' "$log" | tail -1 || true); full log: $log)" >&2
  exit 1
fi
if command -v apt-get >/dev/null 2>&1; then
  echo "$what: error: needs the Debian packages $*; install them with: sudo apt-get install $*" >&2
else
  echo "$what: error: needs the programs of the Debian packages $* (no apt-get here: install their equivalents)" >&2
fi
exit 1
