// core_audio_io.cpp — io/audio: every format written and read back through libsndfile (length, rate,
// channels, values within the format's quantisation), resampling length/content, peak/clip stats, the
// partial-file rename, format selection.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <numbers>

#include "io/audio.h"

namespace mm3 {
namespace {

namespace fs = std::filesystem;

fs::path tmp_dir() {
  fs::path d = fs::temp_directory_path() / ("mm3_audio_test_" + std::to_string(::getpid()));
  fs::create_directories(d);
  return d;
}

// Stereo test signal: a 441 Hz sine on the left, a 1 kHz sine on the right, amplitude 0.8, plus a few
// full-scale and beyond-full-scale samples to exercise clamping.
Tensor test_signal(int64_t S, int rate) {
  Tensor t = Tensor::zeros(DType::F32, {2, S});
  float* p = t.data<float>();
  for (int64_t s = 0; s < S; ++s) {
    p[s] = 0.8f * static_cast<float>(std::sin(2 * std::numbers::pi * 441.0 * s / rate));
    p[S + s] = 0.8f * static_cast<float>(std::sin(2 * std::numbers::pi * 1000.0 * s / rate));
  }
  return t;
}

double max_abs_diff(const Tensor& a, const Tensor& b) {
  double m = 0;
  const float* x = a.data<float>();
  const float* y = b.data<float>();
  for (int64_t i = 0; i < a.numel(); ++i) m = std::max(m, std::fabs(static_cast<double>(x[i]) - y[i]));
  return m;
}

TEST(AudioIo, FormatNamesAndExtensions) {
  EXPECT_EQ(audio_format_from_path("a/b/song.WAV"), AudioFormat::wav16);
  EXPECT_EQ(audio_format_from_path("x.flac"), AudioFormat::flac16);
  EXPECT_EQ(audio_format_from_path("x.mp3"), AudioFormat::mp3);
  EXPECT_THROW(audio_format_from_path("x.ogg"), InvalidInput);
  EXPECT_THROW(audio_format_from_path("noext"), InvalidInput);
  EXPECT_EQ(parse_audio_format("wav24"), AudioFormat::wav24);
  EXPECT_EQ(parse_audio_format("float"), AudioFormat::wav_float);
  EXPECT_EQ(parse_audio_format("FLAC"), AudioFormat::flac16);
  EXPECT_THROW(parse_audio_format("aiff"), InvalidInput);
  for (AudioFormat f : {AudioFormat::wav16, AudioFormat::wav24, AudioFormat::wav_float, AudioFormat::flac16,
                        AudioFormat::flac24, AudioFormat::mp3})
    EXPECT_EQ(parse_audio_format(audio_format_name(f)), f);
}

TEST(AudioIo, StatsPeakAndClip) {
  Tensor t = Tensor::from_f32({0.5f, -1.0f, 0.25f, 1.5f, 0.0f, -0.1f}, {2, 3});
  AudioStats s = audio_stats(t, 44100);
  EXPECT_EQ(s.channels, 2);
  EXPECT_EQ(s.frames, 3);
  EXPECT_DOUBLE_EQ(s.peak, 1.5);
  EXPECT_NEAR(s.peak_dbfs, 20 * std::log10(1.5), 1e-12);
  EXPECT_EQ(s.clipped, 2);
  AudioStats z = audio_stats(Tensor::zeros(DType::F32, {2, 4}), 44100);
  EXPECT_TRUE(std::isinf(z.peak_dbfs) && z.peak_dbfs < 0);
  EXPECT_EQ(z.clipped, 0);
}

struct Case {
  AudioFormat f;
  double tol;  // max |read - written| for in-range samples
};

TEST(AudioIo, WriteReadBackEveryLosslessFormat) {
  const fs::path dir = tmp_dir();
  const int rate = 44100;
  const int64_t S = 12345;
  Tensor sig = test_signal(S, rate);
  // Out-of-range samples: clamped by the PCM formats, kept by float.
  sig.data<float>()[10] = 1.25f;
  sig.data<float>()[S + 20] = -3.0f;
  const Case cases[] = {
      // q = round(x·32767) written, q/32768 read back: |error| ≤ |x|/32768 + 0.5/32767.
      {AudioFormat::wav16, 1.0 / 32768 + 0.5 / 32767 + 1e-9},
      {AudioFormat::flac16, 1.0 / 32768 + 0.5 / 32767 + 1e-9},
      {AudioFormat::wav24, 1.0 / 8388608 + 0.5 / 8388607 + 1e-11},
      {AudioFormat::flac24, 1.0 / 8388608 + 0.5 / 8388607 + 1e-11},
      {AudioFormat::wav_float, 0.0},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(audio_format_name(c.f));
    const fs::path p = dir / (std::string("t_") + audio_format_name(c.f) + ".bin");
    AudioWriteOptions o;
    o.format = c.f;
    AudioWriteResult r = write_audio(p.string(), sig, rate, o);
    EXPECT_EQ(r.stats.clipped, 2);
    EXPECT_DOUBLE_EQ(r.stats.peak, 3.0);
    EXPECT_TRUE(fs::exists(p));
    EXPECT_FALSE(fs::exists(p.string() + ".partial"));
    AudioData d = read_audio(p.string());
    EXPECT_EQ(d.sample_rate, rate);
    ASSERT_EQ(d.samples.dim(0), 2);
    ASSERT_EQ(d.samples.dim(1), S);
    Tensor expect = sig.clone();
    if (c.f != AudioFormat::wav_float)
      for (int64_t i = 0; i < expect.numel(); ++i)
        expect.data<float>()[i] = std::clamp(expect.data<float>()[i], -1.0f, 1.0f);
    EXPECT_LE(max_abs_diff(d.samples, expect), c.tol);
  }
  fs::remove_all(dir);
}

TEST(AudioIo, Pcm16QuantisationIsRoundToNearest) {
  // Exactly representable steps survive the round trip bit-exactly in their integer form.
  const fs::path dir = tmp_dir();
  std::vector<float> v = {0.0f, 1.0f, -1.0f, 0.5f, 100.0f / 32767, -12345.0f / 32767};
  Tensor t = Tensor::from_f32(v, {1, static_cast<int64_t>(v.size())});
  const fs::path p = dir / "q.wav";
  write_audio(p.string(), t, 32000);
  AudioData d = read_audio(p.string());
  ASSERT_EQ(d.samples.dim(0), 1);
  const int expect_q[] = {0, 32767, -32767, 16384, 100, -12345};  // 0.5·32767 = 16383.5 -> 16384
  for (size_t i = 0; i < v.size(); ++i) EXPECT_EQ(std::lround(d.samples.data<float>()[i] * 32768.0f), expect_q[i]);
  fs::remove_all(dir);
}

TEST(AudioIo, Mp3WhenAvailable) {
  if (!audio_format_available(AudioFormat::mp3)) GTEST_SKIP() << "this libsndfile cannot write MP3";
  const fs::path dir = tmp_dir();
  const int rate = 44100;
  const int64_t S = 44100;
  Tensor sig = test_signal(S, rate);
  const fs::path p = dir / "x.mp3";
  write_audio(p.string(), sig, rate);
  EXPECT_FALSE(fs::exists(p.string() + ".partial"));
  AudioData d = read_audio(p.string());
  EXPECT_EQ(d.sample_rate, rate);
  ASSERT_EQ(d.samples.dim(0), 2);
  // Lossy, with encoder delay/padding: the length is within a couple of MP3 frames (1152 samples).
  EXPECT_NEAR(static_cast<double>(d.samples.dim(1)), static_cast<double>(S), 3 * 1152.0);
  // Energy of each channel is preserved to within 10%.
  for (int c = 0; c < 2; ++c) {
    double e_in = 0, e_out = 0;
    const int64_t n = std::min<int64_t>(S, d.samples.dim(1));
    for (int64_t s = 2048; s < n - 2048; ++s) {
      e_in += std::pow(sig.data<float>()[c * S + s], 2);
      e_out += std::pow(d.samples.data<float>()[c * d.samples.dim(1) + s], 2);
    }
    EXPECT_NEAR(e_out / e_in, 1.0, 0.1) << "channel " << c;
  }
  fs::remove_all(dir);
}

TEST(AudioIo, ResampleTo32k) {
  const int64_t S = 44100;
  Tensor sig = test_signal(S, 44100);
  Tensor r = resample_audio(sig, 44100, 32000);
  ASSERT_EQ(r.dim(0), 2);
  EXPECT_EQ(r.dim(1), 32000);
  // Content: the resampled signal matches the analytic sines at 32 kHz away from the edges.
  double m = 0;
  for (int64_t s = 1000; s < 31000; ++s) {
    const double l = 0.8 * std::sin(2 * std::numbers::pi * 441.0 * s / 32000);
    const double rr = 0.8 * std::sin(2 * std::numbers::pi * 1000.0 * s / 32000);
    m = std::max({m, std::fabs(r.data<float>()[s] - l), std::fabs(r.data<float>()[32000 + s] - rr)});
  }
  EXPECT_LT(m, 1e-3);
  // Deterministic.
  Tensor r2 = resample_audio(sig, 44100, 32000);
  EXPECT_EQ(max_abs_diff(r, r2), 0.0);
  // Writing at another rate resamples.
  const fs::path dir = tmp_dir();
  const fs::path p = dir / "r.wav";
  AudioWriteOptions o;
  o.sample_rate = 32000;
  AudioWriteResult w = write_audio(p.string(), sig, 44100, o);
  EXPECT_EQ(w.stats.sample_rate, 32000);
  AudioData d = read_audio(p.string());
  EXPECT_EQ(d.sample_rate, 32000);
  EXPECT_EQ(d.samples.dim(1), 32000);
  fs::remove_all(dir);
}

TEST(AudioIo, FailureLeavesNoFile) {
  const fs::path dir = tmp_dir();
  Tensor sig = test_signal(100, 44100);
  // A directory that does not exist: open fails, nothing is left behind.
  const fs::path p = dir / "missing_dir" / "x.wav";
  EXPECT_THROW(write_audio(p.string(), sig, 44100), InvalidInput);
  EXPECT_FALSE(fs::exists(p));
  EXPECT_FALSE(fs::exists(p.string() + ".partial"));
  // Bad shapes.
  EXPECT_THROW(write_audio((dir / "y.wav").string(), Tensor::zeros(DType::F32, {3, 10}), 44100), InvalidInput);
  EXPECT_FALSE(fs::exists(dir / "y.wav"));
  // An existing file is replaced atomically, not appended to.
  const fs::path q = dir / "z.wav";
  { std::ofstream(q) << "old"; }
  write_audio(q.string(), sig, 44100);
  EXPECT_EQ(read_audio(q.string()).samples.dim(1), 100);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace mm3
