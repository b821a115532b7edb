#!/usr/bin/env bash
# Make sure Debian's Chromium is at /usr/bin/chromium for the browser tests.
# Idempotent: does nothing when it is already there. Never downloads a browser build of
# its own: only Debian's packages (chromium, chromium-driver) through apt-get.
set -euo pipefail

CHROMIUM=/usr/bin/chromium

if [ -x "$CHROMIUM" ]; then
    echo "install-chromium: $CHROMIUM is present"
    exit 0
fi

if [ "$(id -u)" -eq 0 ]; then
    SUDO=()
elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
    SUDO=(sudo -n)
else
    echo "install-chromium: $CHROMIUM is missing and this user can neither install packages" \
         "(not root) nor use sudo without a password." >&2
    echo "install-chromium: install Debian's packages by hand:" \
         "apt-get install -y --no-install-recommends chromium chromium-driver" >&2
    echo "install-chromium: (without it the browser tests skip, or fail when" \
         "OAIPMH_REQUIRE_BROWSER=1)" >&2
    exit 1
fi

if ! command -v apt-get >/dev/null 2>&1; then
    echo "install-chromium: $CHROMIUM is missing and apt-get is not available here;" \
         "install Chromium from your distribution's packages at $CHROMIUM" >&2
    exit 1
fi

echo "install-chromium: installing Debian's chromium and chromium-driver"
export DEBIAN_FRONTEND=noninteractive
"${SUDO[@]}" apt-get update -q
"${SUDO[@]}" apt-get install -y -q --no-install-recommends chromium chromium-driver

if [ ! -x "$CHROMIUM" ]; then
    echo "install-chromium: apt-get finished but $CHROMIUM is still missing" >&2
    exit 1
fi
echo "install-chromium: $("$CHROMIUM" --version 2>/dev/null || echo "$CHROMIUM installed")"
