#!/usr/bin/env bash
# deps.sh - the Debian packages cairn's build and tests need: installs the missing ones when it can
# (root, or sudo without a password), else names them with the command that installs them and
# fails. `make` runs it before the first build, `.ci/run` before everything.
#   tools/deps.sh          check, install what is missing
#   tools/deps.sh --list   print the package names
set -euo pipefail
pkgs=(build-essential cmake clang pkg-config libcmocka-dev libcjson-dev libxxhash-dev libpcre2-dev
      libutf8proc-dev libmicrohttpd-dev libedit-dev curl)
if [ "${1:-}" = "--list" ]; then
  echo "${pkgs[*]}"
  exit 0
fi
if ! command -v dpkg-query >/dev/null; then
  echo "deps: not a Debian or Ubuntu system: install the equivalents of: ${pkgs[*]}" >&2
  exit 0 # CMake names what it cannot find
fi
need=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || need+=("$p")
done
[ ${#need[@]} -eq 0 ] && exit 0
if [ "$(id -u)" -eq 0 ]; then
  sudo=()
elif command -v sudo >/dev/null && sudo -n true 2>/dev/null; then
  sudo=(sudo -n)
else
  echo "deps: missing Debian packages: ${need[*]}" >&2
  echo "deps: install them with: sudo apt-get install -y ${need[*]}" >&2
  exit 1
fi
echo "deps: installing ${need[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
for n in 1 2 3; do
  "${sudo[@]}" apt-get update -qq && "${sudo[@]}" apt-get install -y -qq --no-install-recommends "${need[@]}" && exit 0
  echo "deps: attempt $n failed" >&2
  sleep $((n * 10))
done
exit 1
