#!/usr/bin/env bash
# The docs tests open the built site in headless Chromium (Debian's chromium package; no
# browser download by a test tool). Installed here when missing and this is a root shell
# with apt-get, as on CI; otherwise say how, and those tests skip naming the reason.
set -euo pipefail
if command -v chromium >/dev/null 2>&1; then
    exit 0
fi
if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
    echo "installing Debian's chromium for the docs tests (apt-get)"
    if ! apt-get install -y -qq --no-install-recommends chromium >/dev/null 2>&1; then
        apt-get update -qq && apt-get install -y -qq --no-install-recommends chromium >/dev/null
    fi
    exit 0
fi
echo "note: no chromium; the docs' browser tests will skip." >&2
echo "  Debian/Ubuntu: sudo apt-get install -y chromium" >&2
