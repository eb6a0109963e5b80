#!/usr/bin/env bash
# run_browser_test.sh MM3 — the web page of `mm3 serve` in headless Debian chromium (issue 7), driven by
# playwright-core (browser_test.mjs). Skips (exit 77) with the reason when chromium, node or
# playwright-core is absent; .ci/run installs them (apt chromium, npm ci in this folder).
set -u
here="$(cd "$(dirname "$0")" && pwd)"
chromium="${MM3_CHROMIUM:-/usr/bin/chromium}"
if [ ! -x "$chromium" ]; then
  echo "SKIP: $chromium not found (Debian: apt-get install chromium)"; exit 77
fi
if ! command -v node >/dev/null 2>&1; then
  echo "SKIP: node not found"; exit 77
fi
if [ ! -f "$here/node_modules/playwright-core/package.json" ]; then
  echo "SKIP: playwright-core not installed (npm ci --prefix $here)"; exit 77
fi
exec node "$here/browser_test.mjs" "$1" "$chromium"
