#!/usr/bin/env bash
# run_capi_test.sh MM3 CAPI_TEST GOLDEN_DIR WORKDIR — runs the C ABI test on a tiny random checkpoint made
# by `mm3 synth-checkpoint --tiny` (finite weights; the v1 golden vocoder holds a NaN gain, so its audio is
# NaN). The synthetic checkpoint copies the golden tokenizer, hence the skip without ../shared.
set -u
mm3="$1"; capi="$2"; golden="$3"; work="$4"
if [ ! -d "$golden/checkpoint/tokenizer" ]; then
  echo "SKIP: golden tokenizer not found at $golden/checkpoint/tokenizer (clone ../shared beside the repository)"
  exit 77
fi
rm -rf "$work"; mkdir -p "$work"
"$mm3" synth-checkpoint --tiny "$work/ck" --tokenizer-from "$golden/checkpoint/tokenizer" -q || exit 1
exec "$capi" "$work/ck" "$work/out.wav"
