#!/usr/bin/env bash
# Make sure Debian's headless-capable Chromium is present for the browser test
# (tests/browser). Playwright drives /usr/bin/chromium directly, so no
# `playwright install` download is needed. Installs `chromium` and
# `chromium-driver` with apt-get when /usr/bin/chromium is missing; needs root
# (as on CI) or passwordless sudo.
set -euo pipefail

CHROMIUM=/usr/bin/chromium

if [ -x "$CHROMIUM" ]; then
    exit 0
fi

fail() {
    echo "ensure_chromium: $*" >&2
    echo "ensure_chromium: install it by hand: apt-get update && apt-get install -y chromium chromium-driver" >&2
    exit 1
}

command -v apt-get >/dev/null 2>&1 \
    || fail "$CHROMIUM is missing and apt-get is not available (not a Debian/Ubuntu system)"

if [ "$(id -u)" -eq 0 ]; then
    SUDO=()
elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
    SUDO=(sudo -n)
else
    fail "$CHROMIUM is missing and installing it needs root (run as root or with passwordless sudo)"
fi

echo "ensure_chromium: installing chromium and chromium-driver with apt-get ..."
log=$(mktemp)
trap 'rm -f "$log"' EXIT
export DEBIAN_FRONTEND=noninteractive
if ! "${SUDO[@]}" apt-get update -qq >"$log" 2>&1; then
    cat "$log" >&2
    fail "apt-get update failed"
fi
if ! "${SUDO[@]}" apt-get install -y -qq chromium chromium-driver >"$log" 2>&1; then
    tail -n 30 "$log" >&2
    fail "apt-get install chromium chromium-driver failed"
fi
[ -x "$CHROMIUM" ] || fail "apt-get finished but $CHROMIUM is still missing"
echo "ensure_chromium: $("$CHROMIUM" --version 2>/dev/null || echo "$CHROMIUM installed")"
