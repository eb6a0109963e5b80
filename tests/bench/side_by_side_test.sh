#!/bin/sh
# bench/side_by_side.py --from: the table's limits and ratios from a hand-made results file whose
# figures make the expected cells easy to check by hand:
#   fp32 DiT: 4000 GFLOP at peak_f32_fma 400 / 500 -> limit 10.00 / 8.00 s; median 10 s -> ÷ 1.00-1.25;
#             torch 40 s -> 4.0x
#   int8 DiT: 3200 G int ops at peak_i8_dot 1600 -> 2.0 s, + attention's 400 GFLOP at peak_bf16_dot
#             800 / 1000 -> 0.5 / 0.4 s, + the rest's 200 GFLOP at 400 / 500 -> 0.5 / 0.4 s:
#             limit 3.00 / 2.80 s; median 3.0 s -> ÷ 1.00-1.07; torch 24 s -> 8.0x
#   ar_frame: torch 0.5 + 1.5 s over 0.5 s -> 4.0x
# RED: the limit taken from peak_bf16_dot, the int8 stage's fp32 or bf16 part left out, or its attention
# divided by peak_f32_fma, changes the cells.
set -eu
script="$1"
py="${2:-python3}"
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
cat > "$dir/results.jsonl" <<'JSON'
{"stage": "ar_frame", "median_s": 0.5, "vs_floor": 1.1}
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
expect '| `ar_frame` bf16 | 0.500 s | vs_floor 1.10 | 2.00 s (LM step 1.50 + depth 0.500) | 4.0× |'
expect '| `dit_forward_L689` | 10.00 s (400 GFLOP/s) | 8.00–10.00 s: 1.00–1.25 | 40.0 s | 4.0× |'
expect '| `dit_forward_L689_int8` | 3.00 s (rel RMS 0.060 from fp32) | 2.80–3.00 s: 1.00–1.07 | 24.0 s'
expect '| 8.0× |'
exit $fail
