#!/usr/bin/env bash
# generate_test.sh MM3 GOLDEN_DIR — `mm3 generate` end to end on the golden checkpoint: a 44.1 kHz stereo
# WAV whose length is MODEL.md §5.2's prediction for the frames generated; replay with --codes is bitwise
# identical; a request file gives the same result as flags; bad input exits 2, a bad model exits 3,
# too little memory exits 4 (MM3_MEMORY_LIMIT), and a tight limit switches to low-memory mode.
set -u
mm3="$1"; golden="$2"; ck="$golden/checkpoint"
if [ ! -d "$ck" ]; then echo "SKIP: golden checkpoint not found at $ck"; exit 77; fi
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
fail=0
args=(--model "$ck" --caption "Genre: acoustic pop. BPM: 96." --lyrics $'[verse]\nMorning light\n[chorus]\nSoftly' --seed 0 --steps 2 --progress none)

"$mm3" generate "${args[@]}" --duration 4 -o "$tmp/a.wav" --save-codes "$tmp/a.npy" 2> "$tmp/a.log" \
  || { echo "FAIL: generate exited $?"; cat "$tmp/a.log"; exit 1; }
frames=$(sed -n 's/.* from \([0-9]*\) frames.*/\1/p' "$tmp/a.log")
[ -n "$frames" ] || { echo "FAIL: no frame count in: $(cat "$tmp/a.log")"; exit 1; }
# §5.2: S = 512·floor(T·441/128) for T <= 200; else windows of 200 with hop 100 and crops 258/86.
lat() { echo $(( $1 * 441 / 128 )); }
if [ "$frames" -le 200 ]; then want=$(( 512 * $(lat "$frames") )); else
  n=0; for ((s=0; s < frames - 100; s+=100)); do n=$((n+1)); last=$s; done
  tl=$(( frames - last )); want=$(( 512 * ( (689 - 258) + (n - 2) * (689 - 344) + ($(lat $tl) - 86) ) )); fi
read -r rate chans samples < <(python3 - "$tmp/a.wav" <<'PY'
import sys, wave
w = wave.open(sys.argv[1]); print(w.getframerate(), w.getnchannels(), w.getnframes())
PY
)
echo "frames=$frames rate=$rate channels=$chans samples=$samples predicted=$want"
[ "$rate" = 44100 ] || { echo "FAIL: rate $rate"; fail=1; }
[ "$chans" = 2 ] || { echo "FAIL: channels $chans"; fail=1; }
[ "$samples" = "$want" ] || { echo "FAIL: $samples samples, MODEL.md §5.2 predicts $want"; fail=1; }
[ "$frames" -ge 1 ] && [ "$frames" -le 100 ] || { echo "FAIL: frames $frames outside 1..100"; fail=1; }

"$mm3" generate "${args[@]}" --duration 4 --codes "$tmp/a.npy" -o "$tmp/b.wav" 2> "$tmp/b.log" \
  || { echo "FAIL: replay exited $?"; cat "$tmp/b.log"; fail=1; }
cmp -s "$tmp/a.wav" "$tmp/b.wav" && echo "ok: replay with --codes is bitwise identical" \
  || { echo "FAIL: replay differs"; fail=1; }

cat > "$tmp/req.json" <<'JSON'
{"caption": "Genre: acoustic pop. BPM: 96.", "lyrics": "[verse]\nMorning light\n[chorus]\nSoftly", "duration": 4,
 "seed": 0, "steps": 2, "format": "wav"}
JSON
"$mm3" generate --model "$ck" --request "$tmp/req.json" --progress none -o "$tmp/c.wav" 2>/dev/null \
  && cmp -s "$tmp/a.wav" "$tmp/c.wav" && echo "ok: --request file equals flags" || { echo "FAIL: request file run differs"; fail=1; }

expect_rc() {  # want, label, args...
  local want=$1 label=$2; shift 2
  "$mm3" generate "$@" -o "$tmp/bad.wav" > "$tmp/bad.log" 2>&1; local rc=$?
  if [ $rc -ne "$want" ]; then echo "FAIL: $label: exit $rc, want $want: $(cat "$tmp/bad.log")"; fail=1;
  else echo "ok: $label -> $rc: $(head -c 160 "$tmp/bad.log")"; fi
  [ -e "$tmp/bad.wav" ] && { echo "FAIL: $label left an output file"; fail=1; rm -f "$tmp/bad.wav"; }
}
# Compute profiles. Replaying a.npy's codes with --dump: the f32 reference run and a bf16 acoustic run
# give latents that differ (the flag reached the DiT) but stay close (same model, bf16 rounding); --quant
# int8 changes the LM's frame hiddens slightly; --dit-gemm int8 moves the latents by its quantization.
# A wrong flag value exits 2 before any work.
rel_rms() {  # A.npy B.npy -> "rel_rms" of float32 arrays of one shape (stdlib only: no numpy here)
  python3 - "$1" "$2" <<'PY'
import ast, struct, sys, math
def load(p):
    b = open(p, 'rb').read()
    hl = struct.unpack('<H', b[8:10])[0]
    h = ast.literal_eval(b[10:10 + hl].decode('latin1'))
    assert h['descr'] == '<f4', h
    n = math.prod(h['shape'])
    return h['shape'], struct.unpack('<%df' % n, b[10 + hl:10 + hl + 4 * n])
sa, a = load(sys.argv[1]); sb, b = load(sys.argv[2])
assert sa == sb, (sa, sb)
num = sum((x - y) ** 2 for x, y in zip(a, b)); den = sum(x * x for x in a)
print(math.sqrt(num / den) if den > 0 else float('inf'))
PY
}
within() { python3 -c "import sys; v=float(sys.argv[1]); sys.exit(0 if float(sys.argv[2]) < v < float(sys.argv[3]) else 1)" "$@"; }
"$mm3" generate "${args[@]}" --duration 4 --codes "$tmp/a.npy" --dump "$tmp/d32" -o "$tmp/p32.wav" 2>/dev/null \
  && "$mm3" generate "${args[@]}" --duration 4 --codes "$tmp/a.npy" --acoustic-precision bf16 --dump "$tmp/d16" \
       -o "$tmp/p16.wav" 2> "$tmp/p16.log" \
  || { echo "FAIL: --acoustic-precision bf16 run exited $?: $(cat "$tmp/p16.log")"; fail=1; }
if [ -f "$tmp/d16/latents_0.npy" ]; then
  r=$(rel_rms "$tmp/d32/latents_0.npy" "$tmp/d16/latents_0.npy")
  within "$r" 0 0.05 && echo "ok: --acoustic-precision bf16 latents rel RMS $r from f32 (nonzero, < 0.05)" \
    || { echo "FAIL: --acoustic-precision bf16 latents rel RMS $r from f32 (want 0 < r < 0.05)"; fail=1; }
  [ "$(stat -c %s "$tmp/p16.wav")" = "$(stat -c %s "$tmp/p32.wav")" ] && echo "ok: bf16 WAV has the f32 WAV's size" \
    || { echo "FAIL: bf16 WAV size differs from f32's"; fail=1; }
else echo "FAIL: the bf16 run dumped no latents"; fail=1; fi
"$mm3" generate "${args[@]}" --duration 4 --codes "$tmp/a.npy" --quant int8 --dump "$tmp/dq" -o "$tmp/q.wav" \
  2> "$tmp/q.log" || { echo "FAIL: --quant int8 run exited $?: $(cat "$tmp/q.log")"; fail=1; }
if [ -f "$tmp/dq/frame_hiddens.npy" ]; then
  r=$(rel_rms "$tmp/d32/frame_hiddens.npy" "$tmp/dq/frame_hiddens.npy")
  within "$r" 0 0.05 && echo "ok: --quant int8 frame hiddens rel RMS $r from bf16 (nonzero, < 0.05)" \
    || { echo "FAIL: --quant int8 frame hiddens rel RMS $r from bf16 (want 0 < r < 0.05)"; fail=1; }
else echo "FAIL: the int8 run dumped no frame hiddens"; fail=1; fi
"$mm3" generate "${args[@]}" --duration 4 --codes "$tmp/a.npy" --dit-gemm int8 --dump "$tmp/d8" -o "$tmp/p8.wav" \
  2> "$tmp/p8.log" || { echo "FAIL: --dit-gemm int8 run exited $?: $(cat "$tmp/p8.log")"; fail=1; }
if [ -f "$tmp/d8/latents_0.npy" ]; then
  r=$(rel_rms "$tmp/d32/latents_0.npy" "$tmp/d8/latents_0.npy")
  within "$r" 0 0.05 && echo "ok: --dit-gemm int8 latents rel RMS $r from f32 (nonzero, < 0.05)" \
    || { echo "FAIL: --dit-gemm int8 latents rel RMS $r from f32 (want 0 < r < 0.05)"; fail=1; }
else echo "FAIL: the --dit-gemm int8 run dumped no latents"; fail=1; fi
expect_rc 2 "--dit-gemm int8 with bf16" "${args[@]}" --duration 1 --dit-gemm int8 --acoustic-precision bf16
grep -q "acoustic-precision f32" "$tmp/bad.log" || { echo "FAIL: the message does not say what to change"; fail=1; }
expect_rc 2 "bad --dit-gemm" "${args[@]}" --duration 1 --dit-gemm int4
expect_rc 2 "bad --acoustic-precision" "${args[@]}" --duration 1 --acoustic-precision fp16
grep -q "use f32" "$tmp/bad.log" || { echo "FAIL: the message does not name the accepted values"; fail=1; }
expect_rc 2 "bad --quant" "${args[@]}" --duration 1 --quant q3
expect_rc 2 "empty lyrics" --model "$ck" --caption pop --lyrics " " --progress none
expect_rc 2 "duration 0" "${args[@]}" --duration 0
expect_rc 2 "duration 10000" "${args[@]}" --duration 10000
expect_rc 2 "unknown request key" --model "$ck" --request <(echo '{"caption":"c","lyrics":"l","tempo":1}') --progress none
expect_rc 2 "bad format" "${args[@]}" --duration 1 --format ogg
expect_rc 3 "missing model" --model "$tmp/nope" --caption pop --lyrics la --progress none
mkdir -p "$tmp/broken"; cp -r "$ck"/. "$tmp/broken"; chmod -R u+w "$tmp/broken"
truncate -s 100 "$tmp/broken/transformer/diffusion_pytorch_model.safetensors"
expect_rc 3 "corrupt model" --model "$tmp/broken" --caption pop --lyrics la --duration 1 --steps 1 --progress none
# Memory: a stage that cannot fit exits 4 naming what it needs; when only both stages together do not
# fit, the LM is freed before the acoustic stage automatically, with the same bits as a normal run.
MM3_MEMORY_LIMIT=1M expect_rc 4 "memory too small" "${args[@]}" --duration 4
grep -q "needs about" "$tmp/bad.log" || { echo "FAIL: the out-of-memory message does not say what is needed"; fail=1; }
MM3_MEMORY_LIMIT=bogus expect_rc 2 "bad MM3_MEMORY_LIMIT" "${args[@]}" --duration 4
ar=$(MM3_MEMORY_LIMIT=1M "$mm3" generate "${args[@]}" --duration 4 -o "$tmp/x.wav" 2>&1 | sed -n 's/.*AR stage needs about \([0-9]*\) MiB.*/\1/p')
if [ -n "$ar" ]; then
  MM3_MEMORY_LIMIT="$((ar + 20))M" "$mm3" generate "${args[@]}" --duration 4 -o "$tmp/d.wav" 2> "$tmp/d.log" \
    || { echo "FAIL: low-memory run exited $?"; cat "$tmp/d.log"; fail=1; }
  grep -q "freeing the LM" "$tmp/d.log" && cmp -s "$tmp/a.wav" "$tmp/d.wav" \
    && echo "ok: automatic low-memory mode at $((ar + 20)) MiB, same bits" \
    || { echo "FAIL: automatic low-memory run: $(cat "$tmp/d.log")"; fail=1; }
else echo "FAIL: could not read the AR stage's need from the message"; fail=1; fi
exit $fail
