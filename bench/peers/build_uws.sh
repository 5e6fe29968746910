#!/bin/sh
# Builds bench/peers/uws_server.cpp against µWebSockets C++ and uSockets checkouts that are NOT
# part of this repository (fetch them yourself, e.g. `git clone
# https://github.com/uNetworking/uWebSockets && git clone https://github.com/uNetworking/uSockets`
# side by side), into OUT (default bench/peers/.env/uws_server): without TLS, or with
# `--tls` against the system's OpenSSL (libssl-dev), as µWebSockets' `WITH_OPENSSL=1` builds.
#
#   UWS_SRC=/path/to/uWebSockets [USOCKETS_SRC=/path/to/uSockets] sh bench/peers/build_uws.sh [--tls] [OUT]
#
# USOCKETS_SRC defaults to $UWS_SRC/uSockets (the submodule), then to uSockets next to it.
# Exits 3 with a note when the sources are absent, so callers can skip the peer.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
tls=0
if [ "${1:-}" = "--tls" ]; then tls=1; shift; fi
out=${1:-$here/.env/uws_server}
src=${UWS_SRC:-}
if [ -z "$src" ] || [ ! -f "$src/src/App.h" ]; then
    echo "µWebSockets C++: no source (set UWS_SRC to a checkout of uNetworking/uWebSockets)" >&2
    exit 3
fi
us=${USOCKETS_SRC:-}
if [ -z "$us" ]; then
    if [ -f "$src/uSockets/src/libusockets.h" ]; then us=$src/uSockets; else us=$(dirname "$src")/uSockets; fi
fi
if [ ! -f "$us/src/libusockets.h" ]; then
    echo "µWebSockets C++: no uSockets source (set USOCKETS_SRC)" >&2
    exit 3
fi
build=$(mktemp -d)
trap 'rm -rf "$build"' EXIT
mkdir -p "$(dirname "$out")"
# uSockets in C, epoll; then the server in C++20 with LTO, as µWebSockets' own Makefile.
if [ "$tls" = 1 ]; then
    ssl="-DLIBUS_USE_OPENSSL" libs="-lssl -lcrypto"
    (cd "$build" && ${CXX:-g++} $ssl -std=c++17 -O3 -flto -I"$us/src" -c "$us"/src/crypto/*.cpp)
else
    ssl="-DLIBUS_NO_SSL" libs=""
fi
(cd "$build" && ${CC:-cc} $ssl -std=c11 -O3 -flto -I"$us/src" -c \
    "$us"/src/*.c "$us"/src/eventing/*.c "$us"/src/crypto/*.c)
${CXX:-g++} -std=c++20 -O3 -flto $ssl -I"$src/src" -I"$us/src" \
    "$here/uws_server.cpp" "$build"/*.o -lz $libs -pthread -o "$out"
echo "built $out ($(git -C "$src" rev-parse --short HEAD 2>/dev/null || echo unknown) / $(git -C "$us" rev-parse --short HEAD 2>/dev/null || echo unknown))"
