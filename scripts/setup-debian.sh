#!/bin/sh
# Installs, with apt-get, everything this project needs on Debian 12, as root.
#   sh scripts/setup-debian.sh          build + quickstart (compilers, libraries, SentencePiece, npm for Brown)
#   sh scripts/setup-debian.sh --test   build + tests (Criterion, PyTorch, SentencePiece's tools, groff, Open MPI's
#                                       mpirun and headers, gnuplot, iproute2 for the emulated cluster; no npm)
#   sh scripts/setup-debian.sh --reproduce   build + scripts/reproduce.sh (npm for Brown, python3
#                                       and gnuplot for the results page, git for its commit line)
# Idempotent: packages already installed are left as they are. npm is wanted only when no npm
# is on PATH: a machine with Node.js from elsewhere (NodeSource's nodejs, say) keeps it, since
# Debian's npm package conflicts with such a nodejs and apt-get would refuse the whole install.
set -eu
pkgs="gcc g++ make pkg-config libc6-dev libopenblas-dev libopenblas0-openmp libdnnl-dev libyaml-dev zlib1g-dev libdeflate-dev
libjansson-dev liblbfgs-dev libsentencepiece-dev ca-certificates"
if [ "${1:-}" = "--test" ]; then
	pkgs="$pkgs libcriterion-dev python3-torch python3-numpy groff-base openmpi-bin libopenmpi-dev procps
	gnuplot-nox iproute2 sentencepiece python3-sentencepiece"
elif [ "${1:-}" = "--reproduce" ]; then
	pkgs="$pkgs python3 gnuplot-nox git"
	command -v npm >/dev/null 2>&1 || pkgs="$pkgs npm"
elif ! command -v npm >/dev/null 2>&1; then
	pkgs="$pkgs npm"
fi
missing=""
for p in $pkgs; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
if [ -z "$missing" ]; then
	echo "setup: all packages present"
	exit 0
fi
[ "$(id -u)" = 0 ] || { echo "setup: needs root to install:$missing" >&2; exit 1; }
echo "setup: installing$missing"
export DEBIAN_FRONTEND=noninteractive
apt-get -o DPkg::Lock::Timeout=600 update -qq
# shellcheck disable=SC2086
apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends $missing >/dev/null
