#!/usr/bin/env bash
# Installs the peers that bench/compare.py measures Clarion against, from package registries only,
# into bench/peers/.env/ (gitignored). Idempotent: a second run only checks.
#
#   bash bench/peers/setup.sh            # everything
#   bash bench/peers/setup.sh node py    # only some parts: apt, py, node
#
# - apt:  Debian's pushpin, nginx-light and libnginx-mod-nchan. Their services are never left
#         running: the packages are installed with service starts refused (policy-rc.d), and
#         any daemon the install started anyway is stopped and its autostart disabled.
# - py:   a venv with socketify (µWebSockets inside CPython) and websockets.
# - node: ws, socket.io and uwebsockets (a repackaging of the uWebSockets.js binaries; the
#         upstream project does not publish to npm), installed with scripts disabled.
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
ENV="$HERE/.env"
mkdir -p "$ENV"
parts=("$@")
[ ${#parts[@]} -eq 0 ] && parts=(apt py node)
want() { local p; for p in "${parts[@]}"; do [ "$p" = "$1" ] && return 0; done; return 1; }

if want apt; then
  if ! dpkg -s pushpin nginx-light libnginx-mod-nchan >/dev/null 2>&1; then
    SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO=sudo
    # Refuse service starts during the install: the benchmark runs its own instances on other ports.
    had_policy=0; [ -e /usr/sbin/policy-rc.d ] && had_policy=1
    if [ $had_policy -eq 0 ]; then
      printf '#!/bin/sh\nexit 101\n' | $SUDO tee /usr/sbin/policy-rc.d >/dev/null
      $SUDO chmod +x /usr/sbin/policy-rc.d
    fi
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends \
      pushpin nginx-light libnginx-mod-nchan
    [ $had_policy -eq 0 ] && $SUDO rm -f /usr/sbin/policy-rc.d
  fi
  # Whatever the packages set up to start on boot stays off; nothing of theirs stays running.
  for svc in nginx pushpin; do
    if command -v systemctl >/dev/null 2>&1 && [ -d /run/systemd/system ]; then
      systemctl disable --now "$svc" >/dev/null 2>&1 || true
    else
      command -v update-rc.d >/dev/null 2>&1 && update-rc.d "$svc" disable >/dev/null 2>&1 || true
      service "$svc" stop >/dev/null 2>&1 || true
    fi
  done
fi

if want py; then
  [ -x "$ENV/venv/bin/python" ] || python3 -m venv "$ENV/venv"
  "$ENV/venv/bin/python" -c 'import socketify, websockets' 2>/dev/null ||
    "$ENV/venv/bin/pip" install -q socketify websockets
fi

if want node; then
  if [ ! -d "$ENV/node_modules/ws" ] || [ ! -d "$ENV/node_modules/socket.io" ] ||
     [ ! -d "$ENV/node_modules/uwebsockets" ]; then
    [ -f "$ENV/package.json" ] || echo '{"name":"clarion-bench-peers","private":true}' >"$ENV/package.json"
    (cd "$ENV" && npm install --silent --no-audit --no-fund --ignore-scripts ws socket.io uwebsockets)
  fi
fi
echo "peers ready in $ENV"
