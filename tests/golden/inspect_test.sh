#!/usr/bin/env bash
# inspect_test.sh MM3 GOLDEN_DIR — `mm3 inspect` describes the golden checkpoint (all five weight
# components and the tokenizer), and a truncated or corrupted shard gives a one-line error, exit 2.
set -u
mm3="$1"; golden="$2"
if [ ! -d "$golden/checkpoint" ]; then
  echo "SKIP: golden checkpoint not found at $golden/checkpoint (clone ../shared beside the repository)"
  exit 77
fi
fail=0
out=$("$mm3" inspect "$golden/checkpoint") || { echo "FAIL: inspect of the golden checkpoint exited $?"; fail=1; }
for comp in language_model rvq_depth_decoder condition_encoder transformer vocoder tokenizer scheduler; do
  echo "$out" | grep -q "^$comp " || { echo "FAIL: inspect output lacks component $comp"; fail=1; }
done
echo "$out" | grep -q "sharded, index ok" || { echo "FAIL: sharded LM not reported"; fail=1; }

tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
expect_defect() {  # name, grep pattern for the message
  local err rc
  err=$("$mm3" inspect "$tmp/ck" 2>&1 >/dev/null); rc=$?
  if [ $rc -ne 2 ]; then echo "FAIL: $1: exit $rc, expected 2"; fail=1; fi
  if [ "$(printf '%s\n' "$err" | wc -l)" -ne 1 ]; then echo "FAIL: $1: error is not one line: $err"; fail=1; fi
  if ! printf '%s' "$err" | grep -q "$2"; then echo "FAIL: $1: message '$err' lacks '$2'"; fail=1; fi
  echo "ok: $1 -> $err"
}
fresh() { rm -rf "$tmp/ck"; cp -r "$golden/checkpoint" "$tmp/ck"; chmod -R u+w "$tmp/ck"; }

fresh; shard="$tmp/ck/language_model/model-00002-of-00003.safetensors"
truncate -s $(( $(stat -c %s "$shard") - 1000 )) "$shard"
expect_defect "truncated shard" "model-00002-of-00003.safetensors.*truncated"

fresh; shard="$tmp/ck/language_model/model-00003-of-00003.safetensors"
printf '\xff\xff\xff\xff' | dd of="$shard" bs=1 seek=0 conv=notrunc status=none
expect_defect "corrupted header length" "model-00003-of-00003.safetensors.*100 MB"

fresh; shard="$tmp/ck/vocoder/diffusion_pytorch_model.safetensors"
printf '@' | dd of="$shard" bs=1 seek=8 conv=notrunc status=none
expect_defect "corrupted header JSON" "diffusion_pytorch_model.safetensors.*not valid JSON"

fresh; rm "$tmp/ck/language_model/model-00001-of-00003.safetensors"
expect_defect "missing shard" "model-00001-of-00003.safetensors.*missing"

exit $fail
