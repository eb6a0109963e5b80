// bench_runner_test.cpp — the `mm3 bench` runner's derived figures (bench_stages.h): vs_floor pairs
// each run with the memory probe read just before it, the probe runs only for memory_floor stages,
// and stream_sum (the probe's and mem_bandwidth's read) adds up what it reads.
#include <gtest/gtest.h>

#include <cmath>
#include <numeric>
#include <vector>

#include "bench_stages.h"
#include "core/aligned.h"
#include "core/errors.h"
#include "kernels/tuning.h"

namespace mm3::bench {
namespace {

// Run i is held against the faster of probes i (before it) and i + 1 (after it). RED: median(seconds)
// x median(probes) / bytes gives 1.8 here, the probe before each run alone 1.6; the pairing gives 2.4.
TEST(BenchRunner, VsFloorPairsEachRunWithItsProbes) {
  StageResult r;
  r.seconds = {0.1, 0.2, 0.3};
  r.probe_gbps = {50, 40, 60, 30};  // before runs 0, 1, 2 and after run 2
  r.bytes = 5e9;
  const auto j = result_json(r, 2);
  ASSERT_TRUE(j.contains("vs_floor"));
  EXPECT_NEAR(j["vs_floor"].get<double>(), 2.4, 1e-12);  // runs at 1.0, 2.4 and 3.6 x their floors
  EXPECT_NEAR(j["mem_probe_gb_per_s"].get<double>(), 45.0, 1e-12);
  EXPECT_NEAR(j["gb_per_s"].get<double>(), 25.0, 1e-9);
}

TEST(BenchRunner, NoFloorFieldsWithoutAProbe) {
  StageResult r;
  r.seconds = {0.1};
  r.bytes = 5e9;
  const auto j = result_json(r, 2);
  EXPECT_FALSE(j.contains("vs_floor"));
  EXPECT_FALSE(j.contains("mem_probe_gb_per_s"));
}

TEST(BenchRunner, ProbesOnlyMemoryFloorStages) {
  const ThreadPool pool(2);
  const BenchContext ctx(pool, "");
  for (bool floor : {false, true}) {
    Stage s;
    s.name = "probe_test";
    s.memory_floor = floor;
    s.setup = [](const BenchContext&) {
      StageRun run;
      run.run = [] {};
      run.bytes = 1e9;
      return run;
    };
    const StageResult r = run_stage(s, ctx, RunOptions{3, 0, std::nullopt});
    EXPECT_EQ(r.seconds.size(), 3u);
    if (!floor) {
      EXPECT_TRUE(r.probe_gbps.empty());
      continue;
    }
    ASSERT_EQ(r.probe_gbps.size(), 4u);  // before each run and after the last
    for (double g : r.probe_gbps) EXPECT_GT(g, 0.1) << "a 256 MiB read cannot take seconds";
  }
}

// --alternate: run i (warm-up runs too) sees the knob at values[i % n], every result object holds its
// value's runs, ratio_to_first is the median over the cycles of each run ÷ the first value's run in
// the same cycle, and the knob is back where it was after the stage. RED: the ratio of the two values'
// medians (5 / 4 = 1.25 below) in place of the per-cycle median (1.5).
TEST(BenchRunner, AlternateRunsEachValueInTurn) {
  using kern::tuning::Knob;
  const ThreadPool pool(1);
  const BenchContext ctx(pool, "");
  const int before = kern::tuning::forced(Knob::GemvRows);
  std::vector<int> seen;
  Stage s;
  s.name = "alternate_test";
  s.setup = [&seen](const BenchContext&) {
    StageRun run;
    run.run = [&seen] { seen.push_back(kern::tuning::forced(Knob::GemvRows)); };
    return run;
  };
  RunOptions opt{6, 1, parse_alternate("gemv_rows=1,4")};
  StageResult r = run_stage(s, ctx, opt);
  EXPECT_EQ(seen, (std::vector<int>{1, 4, 1, 4, 1, 4, 1, 4})) << "2 warm-up runs (one per value), then 6 timed";
  EXPECT_EQ(r.variant, (std::vector<int>{0, 1, 0, 1, 0, 1}));
  EXPECT_EQ(kern::tuning::forced(Knob::GemvRows), before) << "the knob is restored after the stage";

  // Cycles (value 1, value 4): (1, 3), (10, 5), (4, 6): per-cycle ratios 3, 0.5, 1.5.
  r.seconds = {1, 3, 10, 5, 4, 6};
  const auto js = result_jsons(r, 1);
  ASSERT_EQ(js.size(), 2u);
  EXPECT_EQ(js[0]["alternate"], "gemv_rows=1");
  EXPECT_EQ(js[1]["alternate"], "gemv_rows=4");
  EXPECT_EQ(js[0]["runs"], 3);
  EXPECT_DOUBLE_EQ(js[0]["median_s"].get<double>(), 4.0);
  EXPECT_DOUBLE_EQ(js[1]["median_s"].get<double>(), 5.0);
  EXPECT_DOUBLE_EQ(js[0]["ratio_to_first"].get<double>(), 1.0);
  EXPECT_DOUBLE_EQ(js[1]["ratio_to_first"].get<double>(), 1.5);
}

TEST(BenchRunner, AlternateRefusesWhatItCannotRun) {
  EXPECT_THROW(parse_alternate("gemv_rows"), InvalidInput);      // no values
  EXPECT_THROW(parse_alternate("gemv_rows=1"), InvalidInput);    // nothing to alternate with
  EXPECT_THROW(parse_alternate("gemv_rows=1,x"), InvalidInput);  // not a number
  EXPECT_THROW(parse_alternate("gemv_rows=1,2"), InvalidInput);  // a value the knob does not take
  EXPECT_THROW(parse_alternate("no_such_knob=0,1"), InvalidInput);
  const Alternate a = parse_alternate("quant_prefetch=0,1");
  EXPECT_EQ(a.knob, kern::tuning::Knob::QuantPrefetch);
  EXPECT_EQ(a.values, (std::vector<int>{0, 1}));
}

TEST(BenchRunner, StreamSumAddsWhatItReads) {
  for (int64_t n : {int64_t(64), int64_t(64 * 37)}) {
    aligned_vector<float> v(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) v[size_t(i)] = static_cast<float>((i * 7) % 13) - 6.f;  // small integers: exact
    const double want = std::accumulate(v.begin(), v.end(), 0.0);
    EXPECT_EQ(static_cast<double>(stream_sum(v.data(), n)), want) << "n=" << n;
  }
}

}  // namespace
}  // namespace mm3::bench
