#!/usr/bin/env bash
# demo.sh MM3 GOLDEN_DIR — the main job: generate a song with the default model. When no real checkpoint
# is present and none can be downloaded, say so plainly and run the same pipeline on a tiny
# random-weight checkpoint, writing a valid WAV of noise — not music.
set -u
mm3="$1"; golden="$2"
out=${MM3_DEMO_OUT:-demo.wav}
caption="Genre: acoustic pop. BPM: 96. Key: C major. Warm and intimate, building gently into the chorus."
lyrics=$'[verse]\nMorning light filtering through the pine\nEvery quiet street is yours and mine\n[chorus]\nSoftly the world begins to breathe'

# A real checkpoint: $MM3_MODEL (a folder), else the default repo — from the Hugging Face cache, or
# downloaded into it on first use (about 28 GB; MM3_DEMO_NO_DOWNLOAD=1 or HF_HUB_OFFLINE=1 skips that).
model=${MM3_MODEL:-MiniMaxAI/MiniMax-Music3}
dl=()
[ -n "${MM3_DEMO_NO_DOWNLOAD:-}" ] && dl=(--no-download)
echo "demo: generating 30 s with $model -> $out"
"$mm3" generate --model "$model" "${dl[@]}" --caption "$caption" --lyrics "$lyrics" \
     --duration 30 --seed 0 --low-memory -o "$out"
rc=$?
[ $rc -eq 0 ] && exit 0
# Exit 3 is "no usable model" (not cached and not downloadable here, or a broken folder): fall back.
# Anything else is a real failure of the pipeline and must not be papered over.
[ $rc -ne 3 ] && { echo "demo: mm3 generate failed (exit $rc)" >&2; exit $rc; }

echo "demo: the real MiniMax-Music3 checkpoint is not available here (${model}: not in the Hugging Face"
echo "      cache and it could not be downloaded — see the error above). With network access, run"
echo "      'make demo' again (it downloads about 28 GB once), or pass MM3_MODEL=/path/to/checkpoint."
echo "      Running the same pipeline on a tiny RANDOM checkpoint instead: the output is noise, not music."
tiny=${MM3_DEMO_TINY:-build/tiny-random-checkpoint}
if [ ! -f "$tiny/modular_model_index.json" ]; then
  rm -rf "$tiny"
  "$mm3" synth-checkpoint --tiny "$tiny" -q || { echo "demo: could not build the tiny checkpoint" >&2; exit 1; }
fi
"$mm3" generate --model "$tiny" --caption "$caption" --lyrics "$lyrics" --duration 4 --seed 0 --steps 8 -o "$out"
echo "demo: wrote $out (random weights: noise)."
