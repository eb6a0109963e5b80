#!/usr/bin/env bash
# demo.sh MM3 GOLDEN_DIR — the main job, as far as the pipeline has landed: describe the golden
# checkpoint and run its golden set.
set -u
mm3="$1"; golden="$2"
if [ ! -d "$golden/checkpoint" ]; then
  echo "demo: no golden checkpoint at $golden/checkpoint (clone ../shared beside the repository)." >&2
  exit 2
fi
"$mm3" inspect "$golden/checkpoint"
echo
"$mm3" verify "$golden" || true
