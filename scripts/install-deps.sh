#!/usr/bin/env bash
# Installs mm3's Debian build and test dependencies. Idempotent: prints nothing and does nothing
# when every package is already present. Needs root (or sudo) only when something is missing.
set -euo pipefail

PKGS=(
  build-essential cmake pkg-config
  libopenblas-dev libdnnl-dev
  nlohmann-json3-dev libpcre2-dev libutf8proc-dev
  libsndfile1-dev libsoxr-dev
  libcli11-dev libfmt-dev libspdlog-dev libcpp-httplib-dev libssl-dev
  libgtest-dev libgmock-dev libbenchmark-dev
)

missing=()
for p in "${PKGS[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
[ ${#missing[@]} -eq 0 ] && exit 0

echo "install-deps: installing ${missing[*]}" >&2
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq >/dev/null
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "install-deps: done" >&2
