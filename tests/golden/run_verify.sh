#!/usr/bin/env bash
# run_verify.sh MM3 GOLDEN_DIR KIND — one golden gate. Skips loudly (exit 77) when the golden set is absent.
set -u
mm3="$1"; dir="$2"; kind="$3"
if [ ! -f "$dir/manifest.json" ]; then
  echo "SKIP: golden set not found at $dir (clone ../shared beside the repository to run this gate)"
  exit 77
fi
exec "$mm3" verify "$dir" --kind "$kind"
