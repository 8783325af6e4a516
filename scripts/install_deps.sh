#!/usr/bin/env bash
# Installs Gyre's build dependencies from Debian's packages (idempotent; needs root or sudo).
set -euo pipefail
pkgs=(cmake ninja-build g++ clang clang-format pkg-config nlohmann-json3-dev libpcre2-dev
      libcli11-dev libgtest-dev libcpp-httplib-dev wrk python3-pip python3-venv unzip)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}"
fi
