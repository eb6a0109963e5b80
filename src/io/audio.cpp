// audio.cpp — libsndfile / soxr backed audio output (audio.h; MODEL.md §5.3).
#include "io/audio.h"

#include <sndfile.h>
#include <soxr.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <filesystem>
#include <limits>

#include "core/errors.h"

namespace mm3 {

namespace {

struct FormatInfo {
  AudioFormat f;
  const char* name;
  int sf_format;
};

constexpr FormatInfo kFormats[] = {
    {AudioFormat::wav16, "wav16", SF_FORMAT_WAV | SF_FORMAT_PCM_16},
    {AudioFormat::wav24, "wav24", SF_FORMAT_WAV | SF_FORMAT_PCM_24},
    {AudioFormat::wav_float, "wav_float", SF_FORMAT_WAV | SF_FORMAT_FLOAT},
    {AudioFormat::flac16, "flac16", SF_FORMAT_FLAC | SF_FORMAT_PCM_16},
    {AudioFormat::flac24, "flac24", SF_FORMAT_FLAC | SF_FORMAT_PCM_24},
    {AudioFormat::mp3, "mp3", SF_FORMAT_MPEG | SF_FORMAT_MPEG_LAYER_III},
};

const FormatInfo& info_of(AudioFormat f) {
  for (const auto& i : kFormats)
    if (i.f == f) return i;
  throw InternalError("audio: unknown AudioFormat");
}

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

std::string known_names() {
  std::string s;
  for (const auto& i : kFormats) s += std::string(s.empty() ? "" : ", ") + i.name;
  return s + " (aliases: wav, wav32f, float, flac)";
}

// [C, S] float view of `audio` ([C, S] or [1, C, S]).
Tensor as_channels(const Tensor& audio) {
  Tensor a = audio;
  if (a.ndim() == 3 && a.dim(0) == 1) a = a.select(0, 0);
  if (a.ndim() != 2 || a.dim(0) < 1 || a.dim(0) > 2)
    throw InvalidInput(fmt::format("audio: expected [channels, samples] with 1 or 2 channels, got {}", a.describe()));
  if (a.dtype() != DType::F32) a = a.to(DType::F32);
  return a.contiguous();
}

// Interleaves [C, S] into frames, with `conv` applied per sample.
template <class T, class F>
std::vector<T> interleave(const Tensor& a, F conv) {
  const int64_t C = a.dim(0), S = a.dim(1);
  const float* p = a.data<float>();
  std::vector<T> out(static_cast<size_t>(C * S));
  for (int64_t c = 0; c < C; ++c)
    for (int64_t s = 0; s < S; ++s) out[static_cast<size_t>(s * C + c)] = conv(p[c * S + s]);
  return out;
}

float sanitize(float x) { return std::isfinite(x) ? x : 0.0f; }
float clamp1(float x) { return std::clamp(sanitize(x), -1.0f, 1.0f); }

struct SndCloser {
  SNDFILE* f = nullptr;
  ~SndCloser() {
    if (f) sf_close(f);
  }
};

}  // namespace

const char* audio_format_name(AudioFormat f) { return info_of(f).name; }

AudioFormat parse_audio_format(const std::string& name) {
  const std::string n = lower(name);
  for (const auto& i : kFormats)
    if (n == i.name) return i.f;
  if (n == "wav") return AudioFormat::wav16;
  if (n == "wav32f" || n == "float") return AudioFormat::wav_float;
  if (n == "flac") return AudioFormat::flac16;
  throw InvalidInput(fmt::format("audio format '{}' is not known; known: {}", name, known_names()));
}

AudioFormat audio_format_from_path(const std::string& path) {
  const std::string ext = lower(std::filesystem::path(path).extension().string());
  if (ext == ".wav") return AudioFormat::wav16;
  if (ext == ".flac") return AudioFormat::flac16;
  if (ext == ".mp3") return AudioFormat::mp3;
  throw InvalidInput(fmt::format("{}: cannot tell the audio format from the extension '{}' (use .wav, .flac or "
                                 ".mp3, or name the format explicitly: {})",
                                 path, ext, known_names()));
}

bool audio_format_available(AudioFormat f) {
  SF_INFO si{};
  si.samplerate = 44100;
  si.channels = 2;
  si.format = info_of(f).sf_format;
  return sf_format_check(&si) == SF_TRUE;
}

AudioStats audio_stats(const Tensor& audio, int sample_rate) {
  const Tensor a = as_channels(audio);
  AudioStats st;
  st.channels = static_cast<int>(a.dim(0));
  st.frames = a.dim(1);
  st.sample_rate = sample_rate;
  const float* p = a.data<float>();
  for (int64_t i = 0; i < a.numel(); ++i) {
    const float x = p[i];
    if (!std::isfinite(x)) {
      ++st.nonfinite;
      continue;
    }
    const double ax = std::fabs(static_cast<double>(x));
    st.peak = std::max(st.peak, ax);
    if (ax >= 1.0) ++st.clipped;
  }
  st.peak_dbfs = st.peak > 0 ? 20.0 * std::log10(st.peak) : -std::numeric_limits<double>::infinity();
  return st;
}

Tensor resample_audio(const Tensor& audio, int in_rate, int out_rate) {
  if (in_rate <= 0 || out_rate <= 0)
    throw InvalidInput(fmt::format("resample: sample rates must be positive (got {} -> {})", in_rate, out_rate));
  const Tensor a = as_channels(audio);
  if (in_rate == out_rate) return a.clone();
  const int64_t C = a.dim(0), S = a.dim(1);
  const double ratio = static_cast<double>(out_rate) / in_rate;
  const int64_t S_out = static_cast<int64_t>(std::llround(static_cast<double>(S) * ratio));
  Tensor out = Tensor::zeros(DType::F32, {C, S_out});
  if (S == 0 || S_out == 0) return out;
  const soxr_io_spec_t io = soxr_io_spec(SOXR_FLOAT32_S, SOXR_FLOAT32_S);  // planar (split) channels
  const soxr_quality_spec_t q = soxr_quality_spec(SOXR_HQ, 0);
  const soxr_runtime_spec_t rt = soxr_runtime_spec(1);  // one thread: deterministic, no oversubscription
  std::vector<const float*> in_ptrs(static_cast<size_t>(C));
  std::vector<float*> out_ptrs(static_cast<size_t>(C));
  for (int64_t c = 0; c < C; ++c) {
    in_ptrs[c] = a.data<float>() + c * S;
    out_ptrs[c] = out.data<float>() + c * S_out;
  }
  size_t idone = 0, odone = 0;
  soxr_error_t err = soxr_oneshot(in_rate, out_rate, static_cast<unsigned>(C), in_ptrs.data(),
                                  static_cast<size_t>(S), &idone, out_ptrs.data(), static_cast<size_t>(S_out),
                                  &odone, &io, &q, &rt);
  if (err) throw InternalError(fmt::format("soxr resample {} -> {} Hz failed: {}", in_rate, out_rate, err));
  if (static_cast<int64_t>(odone) != S_out)
    throw InternalError(fmt::format("soxr resample {} -> {} Hz produced {} of {} samples", in_rate, out_rate,
                                    odone, S_out));
  return out;
}

AudioWriteResult write_audio(const std::string& path, const Tensor& audio, int in_rate,
                             const AudioWriteOptions& opt) {
  if (path.empty()) throw InvalidInput("write_audio: empty output path");
  const AudioFormat fmt_ = opt.format ? *opt.format : audio_format_from_path(path);
  const FormatInfo& fi = info_of(fmt_);
  Tensor a = as_channels(audio);
  const int rate = opt.sample_rate > 0 ? opt.sample_rate : in_rate;
  if (rate != in_rate) a = resample_audio(a, in_rate, rate);

  AudioWriteResult res;
  res.path = path;
  res.format = fmt_;
  res.stats = audio_stats(a, rate);

  SF_INFO si{};
  si.samplerate = rate;
  si.channels = static_cast<int>(a.dim(0));
  si.format = fi.sf_format;
  if (sf_format_check(&si) != SF_TRUE)
    throw InvalidInput(fmt::format("{}: this libsndfile ({}) cannot write {} at {} Hz, {} channel(s){}", path,
                                   sf_version_string(), fi.name, rate, si.channels,
                                   fmt_ == AudioFormat::mp3 ? " (MP3 needs libsndfile >= 1.1 built with LAME)" : ""));

  const std::string partial = path + ".partial";
  std::error_code ec;
  auto fail = [&](const std::string& what) -> void {
    std::filesystem::remove(partial, ec);
    throw InvalidInput(fmt::format("{}: {}", path, what));
  };
  {
    SndCloser h;
    h.f = sf_open(partial.c_str(), SFM_WRITE, &si);
    if (!h.f) fail(fmt::format("cannot open {} for writing: {}", partial, sf_strerror(nullptr)));
    if (fmt_ == AudioFormat::mp3) {
      double q = std::clamp(opt.mp3_quality, 0.0, 1.0);
      int mode = SF_BITRATE_MODE_VARIABLE;
      sf_command(h.f, SFC_SET_BITRATE_MODE, &mode, sizeof(mode));
      sf_command(h.f, SFC_SET_COMPRESSION_LEVEL, &q, sizeof(q));
    }
    const sf_count_t frames = a.dim(1);
    sf_count_t wrote = 0;
    switch (fmt_) {
      case AudioFormat::wav16:
      case AudioFormat::flac16: {
        auto buf = interleave<short>(a, [](float x) { return static_cast<short>(std::lround(clamp1(x) * 32767.0f)); });
        wrote = sf_writef_short(h.f, buf.data(), frames);
        break;
      }
      case AudioFormat::wav24:
      case AudioFormat::flac24: {
        // libsndfile's int path is left-justified: a 24-bit sample q is passed as q · 256.
        auto buf = interleave<int>(
            a, [](float x) { return static_cast<int>(std::lround(static_cast<double>(clamp1(x)) * 8388607.0)) * 256; });
        wrote = sf_writef_int(h.f, buf.data(), frames);
        break;
      }
      case AudioFormat::wav_float: {
        auto buf = interleave<float>(a, sanitize);
        wrote = sf_writef_float(h.f, buf.data(), frames);
        break;
      }
      case AudioFormat::mp3: {
        auto buf = interleave<float>(a, clamp1);
        wrote = sf_writef_float(h.f, buf.data(), frames);
        break;
      }
    }
    if (wrote != frames) {
      const std::string e = sf_strerror(h.f);
      sf_close(h.f);
      h.f = nullptr;
      fail(fmt::format("wrote {} of {} frames: {}", wrote, frames, e));
    }
    const int rc = sf_close(h.f);
    h.f = nullptr;
    if (rc != 0) fail(fmt::format("closing {} failed: {}", partial, sf_error_number(rc)));
  }
  std::filesystem::rename(partial, path, ec);
  if (ec) fail(fmt::format("cannot rename {} to it: {}", partial, ec.message()));
  return res;
}

AudioData read_audio(const std::string& path) {
  SF_INFO si{};
  SndCloser h;
  h.f = sf_open(path.c_str(), SFM_READ, &si);
  if (!h.f) throw InvalidInput(fmt::format("{}: cannot read audio: {}", path, sf_strerror(nullptr)));
  std::vector<float> inter;
  // Read in blocks: some decoders (MP3) do not know the exact frame count up front.
  const sf_count_t block = 65536;
  std::vector<float> buf(static_cast<size_t>(block * si.channels));
  for (;;) {
    const sf_count_t n = sf_readf_float(h.f, buf.data(), block);
    if (n <= 0) break;
    inter.insert(inter.end(), buf.begin(), buf.begin() + n * si.channels);
  }
  const int64_t C = si.channels, S = static_cast<int64_t>(inter.size()) / std::max<int64_t>(C, 1);
  AudioData d;
  d.sample_rate = si.samplerate;
  d.sndfile_format = si.format;
  d.samples = Tensor::zeros(DType::F32, {C, S});
  float* o = d.samples.data<float>();
  for (int64_t s = 0; s < S; ++s)
    for (int64_t c = 0; c < C; ++c) o[c * S + s] = inter[static_cast<size_t>(s * C + c)];
  return d;
}

}  // namespace mm3
