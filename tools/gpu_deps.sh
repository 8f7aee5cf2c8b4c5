#!/bin/sh
# gpu_deps.sh - the build's Debian libraries for a GPU machine that lacks them and cannot fetch
# them (the device machine: no registry reachable, no libcjson, libmicrohttpd, ... installed).
#   sh tools/gpu_deps.sh fetch DIR   here: downloads the .deb files into DIR (carry DIR along,
#                                    e.g. a folder that .git/info/exclude ignores)
#   . tools/gpu_deps.sh use DIR      there, sourced by bash: unpacks them under /tmp/deps (never
#                                    into /) and exports CMAKE_PREFIX_PATH and LD_LIBRARY_PATH
# The list is the libraries CMakeLists.txt finds, their runtime packages and what those link.
pkgs="libcjson-dev libcjson1 libxxhash-dev libxxhash0 libmicrohttpd-dev libmicrohttpd12
libpcre2-dev libpcre2-8-0 libpcre2-16-0 libpcre2-32-0 libpcre2-posix3 libutf8proc-dev libutf8proc2
libedit-dev libedit2 libbsd0 libmd0 libcmocka-dev libcmocka0 libgnutls30 libnettle8 libhogweed6
libidn2-0 libunistring2 libtasn1-6 libp11-kit0 libgmp10 libffi8"
case "$1" in
fetch)
    mkdir -p "${2:?usage: gpu_deps.sh fetch DIR}" && (cd "$2" && apt-get download $pkgs)
    ;;
use)
    mkdir -p /tmp/deps
    for f in "${2:?usage: . gpu_deps.sh use DIR}"/*.deb; do dpkg -x "$f" /tmp/deps || return 1; done
    export CMAKE_PREFIX_PATH=/tmp/deps/usr LD_LIBRARY_PATH=/tmp/deps/usr/lib/x86_64-linux-gnu
    ;;
*)
    echo "usage: sh tools/gpu_deps.sh fetch DIR | . tools/gpu_deps.sh use DIR" >&2
    ;;
esac
