// audio.h — writing (and reading back) the engine's stereo output: WAV (16-bit, 24-bit, float), FLAC
// (16/24-bit) and MP3 through libsndfile, optional resampling with soxr, peak/clip reporting.
//
// MODEL.md §5.3: the vocoder's native output is 44,100 Hz stereo float in [-1, 1]; the official server
// resamples to 32,000 Hz and writes 16-bit WAV. Here resampling uses soxr's high-quality preset (SOXR_HQ,
// one thread, so it is deterministic) — not torchaudio's sinc_interp_hann, so a 32 kHz file is close to the
// server's but not bit-identical.
//
// PCM conversion is our own and documented (the server's rounding is UNCONFIRMED in MODEL.md): each sample
// is clamped to [-1, 1], multiplied by 2^(bits-1) - 1 and rounded to nearest (ties away from zero).
// Float WAV stores the samples unclamped. MP3 is handed float samples (clamped) and libsndfile encodes.
//
// Files are written to `path + ".partial"` and renamed into place only after a successful close, so a
// failure never leaves a truncated file at `path` (the partial file is removed on failure).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace mm3 {

enum class AudioFormat {
  wav16,      // RIFF WAVE, PCM 16-bit (the official server's format)
  wav24,      // RIFF WAVE, PCM 24-bit
  wav_float,  // RIFF WAVE, IEEE float 32-bit
  flac16,     // FLAC, 16-bit
  flac24,     // FLAC, 24-bit
  mp3,        // MPEG-1/2 Layer III (libsndfile + LAME), VBR
};

const char* audio_format_name(AudioFormat f);  // "wav16", "wav24", "wav_float", "flac16", "flac24", "mp3"
// Accepts the names above plus the aliases "wav" (wav16), "wav32f"/"float" (wav_float), "flac" (flac16).
// Throws InvalidInput listing the known names.
AudioFormat parse_audio_format(const std::string& name);
// From the path's extension: .wav -> wav16, .flac -> flac16, .mp3 -> mp3 (case-insensitive).
// Throws InvalidInput for any other extension.
AudioFormat audio_format_from_path(const std::string& path);
// Whether the linked libsndfile can write this format (sf_format_check). MP3 needs libsndfile >= 1.1
// built with LAME/mpg123.
bool audio_format_available(AudioFormat f);

// Peak / clipping of float samples (before any quantisation).
struct AudioStats {
  int64_t frames = 0;      // samples per channel
  int channels = 0;
  int sample_rate = 0;
  double peak = 0;         // max |x|
  double peak_dbfs = 0;    // 20·log10(peak); -inf for silence
  int64_t clipped = 0;     // samples with |x| >= 1 (at or beyond full scale; clamped when quantised)
  int64_t nonfinite = 0;   // NaN / inf samples (written as 0)
};
AudioStats audio_stats(const Tensor& audio /*[C, S] float*/, int sample_rate);

// Resample [C, S] float audio from in_rate to out_rate with soxr (SOXR_HQ, float32 planar, 1 thread).
// Returns [C, S'] with S' = round(S · out_rate / in_rate) (soxr's one-shot length). Same rate: a copy.
Tensor resample_audio(const Tensor& audio /*[C, S] float*/, int in_rate, int out_rate);

struct AudioWriteOptions {
  std::optional<AudioFormat> format;  // empty: from the path's extension
  int sample_rate = 0;                // output rate; 0 = the input rate (44100 native). Else resampled.
  double mp3_quality = 0.9;           // libsndfile SFC_SET_COMPRESSION_LEVEL for MP3 (0 best .. 1 smallest)
};

struct AudioWriteResult {
  std::string path;
  AudioFormat format = AudioFormat::wav16;
  AudioStats stats;  // of the samples written (after resampling, before quantisation)
};

// audio: [C, S] float (C = 1 or 2; [1, C, S] is accepted too) at in_rate Hz.
// Throws InvalidInput (bad path/format/shape), or Error(internal) when libsndfile fails; never leaves a
// partial file at `path`.
AudioWriteResult write_audio(const std::string& path, const Tensor& audio, int in_rate,
                             const AudioWriteOptions& opt = {});

// Reads any file libsndfile can read into [C, S] float (libsndfile's normalisation: PCM / 2^(bits-1)).
struct AudioData {
  Tensor samples;  // [C, S] float
  int sample_rate = 0;
  int sndfile_format = 0;  // SF_INFO.format
};
AudioData read_audio(const std::string& path);

}  // namespace mm3
