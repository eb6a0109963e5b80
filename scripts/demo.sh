#!/usr/bin/env bash
# demo.sh MM3 GOLDEN_DIR — the main job: generate a song with the default model. When no real checkpoint
# is present (and this build cannot download one), say so plainly and run the same pipeline on a tiny
# random-weight checkpoint, writing a valid WAV of noise — not music.
set -u
mm3="$1"; golden="$2"
out=${MM3_DEMO_OUT:-demo.wav}
caption="Genre: acoustic pop. BPM: 96. Key: C major. Warm and intimate, building gently into the chorus."
lyrics=$'[verse]\nMorning light filtering through the pine\nEvery quiet street is yours and mine\n[chorus]\nSoftly the world begins to breathe'

# A real checkpoint: $MM3_MODEL (a folder), or the default repo in the Hugging Face cache.
hub=${HF_HUB_CACHE:-${HF_HOME:-$HOME/.cache/huggingface}/hub}
model=""
if [ -n "${MM3_MODEL:-}" ] && [ -f "$MM3_MODEL/modular_model_index.json" ]; then model=$MM3_MODEL
elif ls "$hub"/models--MiniMaxAI--MiniMax-Music3/snapshots/*/modular_model_index.json >/dev/null 2>&1; then
  model=MiniMaxAI/MiniMax-Music3
fi
if [ -n "$model" ]; then
  echo "demo: generating 30 s with $model -> $out"
  exec "$mm3" generate --model "$model" --caption "$caption" --lyrics "$lyrics" \
       --duration 30 --seed 0 --low-memory -o "$out"
fi

echo "demo: the real MiniMax-Music3 checkpoint is not here (looked for ${MM3_MODEL:-MiniMaxAI/MiniMax-Music3}"
echo "      in the Hugging Face cache), and this build cannot download it. Get it with"
echo "      huggingface-cli download MiniMaxAI/MiniMax-Music3 --exclude 'qwen_7B/*' '*.pth'   (about 28 GB)"
echo "      Running the same pipeline on a tiny RANDOM checkpoint instead: the output is noise, not music."
tiny=${MM3_DEMO_TINY:-build/tiny-random-checkpoint}
if [ ! -f "$tiny/modular_model_index.json" ]; then
  rm -rf "$tiny"
  "$mm3" synth-checkpoint --tiny "$tiny" -q || { echo "demo: could not build the tiny checkpoint" >&2; exit 1; }
fi
"$mm3" generate --model "$tiny" --caption "$caption" --lyrics "$lyrics" --duration 4 --seed 0 --steps 8 -o "$out"
echo "demo: wrote $out (random weights: noise)."
