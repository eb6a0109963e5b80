#!/bin/sh
# bench/side_by_side.py --from: the table's limits and ratios from a hand-made results file whose
# figures make the expected cells easy to check by hand:
#   fp32 DiT: 4000 GFLOP at peak_f32_fma 400 / 500 -> limit 10.00 / 8.00 s; median 10 s -> ÷ 1.00-1.25;
#             torch 40 s -> 4.0x
#   int8 DiT: 3200 G int ops at peak_i8_dot 1600 -> 2.0 s, + attention's 400 GFLOP at peak_bf16_dot
#             800 / 1000 -> 0.5 / 0.4 s, + the rest's 200 GFLOP at 400 / 500 -> 0.5 / 0.4 s:
#             limit 3.00 / 2.80 s; median 3.0 s -> ÷ 1.00-1.07; torch 24 s -> 8.0x
#   ar_frame: torch 0.5 + 1.5 s over 0.5 s -> 4.0x
# and issue 8's targets (the last column):
#   ar_frame vs_floor 1.10 <= 1.2: yes; ar_frame_int8 vs_floor 1.60 > 1.5 (torch 4.0x: enough): no;
#   ar_frame_q4 vs_floor 1.20 but torch's bf16 frame only 1.6x it (< 2): no;
#   bf16 DiT: 2000 GFLOP at peak_bf16_dot 800 / 1000 -> 2.50 / 2.00 s, median 3.5 s -> 1.40-1.75: met
#             against the lower peak reading only, and no torch figure to check ">= torch" against;
#   vocoder: 2000 GFLOP at peak_f32_fma 400 / 500 -> 5.00 / 4.00 s, median 6 s -> 1.20-1.50 (<= 1.5), but
#            torch 20 s is 3.3x (< 4): no.
# RED: the limit taken from peak_bf16_dot, the int8 stage's fp32 or bf16 part left out, or its attention
# divided by peak_f32_fma, changes the cells; so do a target check that ignores the speed-up asked of
# a stage, or that compares the better ratio where it must compare the worse.
set -eu
script="$1"
py="${2:-python3}"
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
cat > "$dir/results.jsonl" <<'JSON'
{"stage": "ar_frame", "median_s": 0.5, "vs_floor": 1.1, "mem_probe_gb_per_s": 40.0}
{"stage": "ar_frame_int8", "median_s": 0.5, "vs_floor": 1.6}
{"stage": "ar_frame_q4", "median_s": 1.25, "vs_floor": 1.2}
{"stage": "dit_forward_L689_bf16", "median_s": 3.5, "flops": 2.0e12, "gflop_per_s": 571.4}
{"stage": "vocoder_L689", "median_s": 6.0, "flops": 2.0e12, "gflop_per_s": 333.3}
{"stage": "torch_vocoder_f32", "median_s": 20.0}
{"stage": "dit_forward_L689", "median_s": 10.0, "flops": 4.0e12, "gflop_per_s": 400.0}
{"stage": "dit_forward_L689_int8", "median_s": 3.0, "flops": 4.0e12, "int8_ops": 3.2e12, "bf16_flops_attention": 4.0e11, "f32_flops_rest": 2.0e11, "rel_rms_vs_f32": 0.06}
{"stage": "torch_depth_bf16", "median_s": 0.5}
{"stage": "torch_lm_step_bf16", "median_s": 1.5}
{"stage": "torch_dit_f32", "median_s": 40.0}
{"stage": "torch_dit_int8", "median_s": 24.0, "rel_rms_vs_f32": 0.3}
{"peaks": {"peak_f32_fma": [400.0, 500.0], "peak_bf16_dot": [800.0, 1000.0], "peak_i8_dot": [1600.0, 1600.0], "mem_bandwidth": [50.0, 50.0]}, "times": {"started": "01:00", "mm3_done": "01:10", "ended": "01:30"}}
JSON
out=$("$py" "$script" --from "$dir/results.jsonl")
echo "$out"
fail=0
expect() {
  if ! printf '%s\n' "$out" | grep -qF -- "$1"; then
    echo "FAIL: the table lacks: $1"
    fail=1
  fi
}
expect '| `ar_frame` bf16 | 0.500 s | vs_floor 1.10 (probe 40.0 GB/s) | 2.00 s (LM step 1.50 + depth 0.500) | 4.0× | yes |'
expect '| `ar_frame_int8` | 0.500 s | vs_floor 1.60 | (bf16) 2.00 s | 4.0× | no: 1.60 > 1.5 |'
expect '| `ar_frame_q4` | 1.250 s | vs_floor 1.20 | (bf16) 2.00 s | 1.6× | no: torch ÷ mm3 1.6 < 2 |'
expect '| `dit_forward_L689` | 10.00 s (400 GFLOP/s) | 8.00–10.00 s: 1.00–1.25 | 40.0 s | 4.0× | yes |'
expect '| `dit_forward_L689_bf16` | 3.50 s (571 GFLOP/s) | 2.00–2.50 s: 1.40–1.75 | – | – | against the lower peak reading only (1.40; 1.75 against the higher) (≥ 1× torch not checked: no torch figure) |'
expect '| `dit_forward_L689_int8` | 3.00 s (rel RMS 0.060 from fp32) | 2.80–3.00 s: 1.00–1.07 | 24.0 s'
expect '| 8.0× | yes |'
expect '| `vocoder_L689` fp32 / bf16 | 6.00 s (0.75 s per audio s) | 4.00–5.00 s direct form: 1.20–1.50 | 20.0 s (fp32) | 3.3× | no: torch ÷ mm3 3.3 < 4 |'
exit $fail
