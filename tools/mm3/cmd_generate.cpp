// cmd_generate.cpp — `mm3 generate`: caption + lyrics → a song file (issue 6).
#include <atomic>
#include <csignal>
#include <filesystem>
#include <fstream>

#include "commands.h"
#include "core/errors.h"
#include "download_display.h"
#include "io/audio.h"
#include "io/npy.h"
#include "pipeline/model_resolve.h"
#include "pipeline/pipeline.h"
#include "pipeline/request.h"
#include "profile_flags.h"
#include "progress_display.h"

namespace mm3::cli {
namespace {

std::atomic<bool> g_interrupted{false};
extern "C" void on_sigint(int) { g_interrupted.store(true); }

struct GenArgs {
  std::string model = kDefaultModelRepo, request_file, caption, lyrics, out = "song.wav", format, codes, save_codes,
              dump, progress = "auto";
  double duration = -1, ar_cfg = -1, dit_cfg = -1;
  long long seed = -1;
  int steps = -1, sample_rate = -1, threads = 0;
  bool low_memory = false, have_seed = false, no_download = false;
  std::string seed_text;
  ProfileArgs profile;
};

std::string read_text_arg(const std::string& v, const char* what) {
  if (v.empty() || v[0] != '@') return v;
  std::ifstream in(v.substr(1), std::ios::binary);
  if (!in) throw InvalidInput(fmt::format("{}: cannot read file '{}'", what, v.substr(1)));
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

Request build_request(const GenArgs& a) {
  Request r;
  if (!a.request_file.empty()) {
    std::ifstream in(a.request_file, std::ios::binary);
    if (!in) throw InvalidInput(fmt::format("--request: cannot read '{}'", a.request_file));
    r = parse_request_text(std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>()),
                           a.request_file);
  }
  // Flags override the request file.
  if (!a.caption.empty()) r.caption = read_text_arg(a.caption, "--caption");
  if (!a.lyrics.empty()) r.lyrics = read_text_arg(a.lyrics, "--lyrics");
  if (a.duration >= 0) r.duration = a.duration;
  if (!a.seed_text.empty()) {
    try {
      size_t pos = 0;
      if (a.seed_text[0] == '-') throw std::invalid_argument("negative");
      r.seed = std::stoull(a.seed_text, &pos);
      if (pos != a.seed_text.size()) throw std::invalid_argument("trailing");
    } catch (const std::exception&) {
      throw InvalidInput(fmt::format("--seed '{}': use an integer in [0, 2^64)", a.seed_text));
    }
  }
  if (a.steps >= 0) r.steps = a.steps;
  if (a.ar_cfg >= 0) r.ar_cfg = a.ar_cfg;
  if (a.dit_cfg >= 0) r.dit_cfg = a.dit_cfg;
  if (a.sample_rate >= 0) r.sample_rate = a.sample_rate;
  if (!a.format.empty()) r.format = a.format;
  else if (a.request_file.empty() || r.format == "wav") {
    // No explicit format: follow the output file's extension.
    r.format = audio_format_name(audio_format_from_path(a.out));
    if (r.format == "wav16") r.format = "wav";
    if (r.format == "flac16") r.format = "flac";
  }
  validate_request(r);
  return r;
}

int run_generate(const GenArgs& a) {
  Request req = build_request(a);
  const AudioFormat fmt = parse_audio_format(req.format);
  if (!audio_format_available(fmt))
    throw InvalidInput(fmt::format("format {} cannot be written by this libsndfile build; use wav or flac",
                                   audio_format_name(fmt)));
  {
    const std::filesystem::path parent = std::filesystem::absolute(a.out).parent_path();
    if (!std::filesystem::is_directory(parent))
      throw InvalidInput(fmt::format("-o {}: directory {} does not exist", a.out, parent.string()));
  }
  GenerateOptions gopt;
  if (!a.codes.empty()) gopt.codes = read_npy(a.codes);
  gopt.dump_dir = a.dump;

  PipelineOptions popt;
  popt.threads = a.threads;
  popt.low_memory = a.low_memory;
  apply_profile_flags(a.profile, popt);
  // A repo id missing from the HF cache is downloaded here; Ctrl-C keeps the .incomplete for the next run.
  ResolveOptions ropt;
  ropt.allow_download = !a.no_download;
  DownloadDisplay download(a.model, parse_progress_mode(a.progress));
  ropt.on_download = download.callback();
  ropt.should_cancel = [] { return g_interrupted.load(); };
  g_interrupted = false;
  std::string model_dir;
  {
    auto prev_handler = std::signal(SIGINT, on_sigint);
    try {
      model_dir = resolve_model(a.model, ropt);
    } catch (...) {
      std::signal(SIGINT, prev_handler);
      throw;
    }
    std::signal(SIGINT, prev_handler);
  }
  Pipeline pipe(model_dir, popt);

  ProgressDisplay display(parse_progress_mode(a.progress));
  RunControl ctl;
  ctl.on_progress = [&](const ProgressEvent& e) { display(e); };
  ctl.should_cancel = [] { return g_interrupted.load(); };
  g_interrupted = false;
  auto prev = std::signal(SIGINT, on_sigint);
  GenerationResult res;
  try {
    res = pipe.generate(req, ctl, gopt);
  } catch (...) {
    std::signal(SIGINT, prev);
    display.finish();
    throw;
  }
  std::signal(SIGINT, prev);
  display.finish();
  for (const std::string& n : res.notes) std::fprintf(stderr, "mm3: note: %s\n", n.c_str());

  AudioWriteOptions wopt;
  wopt.format = fmt;
  AudioWriteResult w = write_audio(a.out, res.audio, res.sample_rate, wopt);
  if (!a.save_codes.empty()) write_npy(a.save_codes, res.codes);
  if (w.stats.nonfinite > 0)
    std::fprintf(stderr,
                 "mm3: warning: %lld non-finite samples were written as 0 — the model produced NaN/inf (a checkpoint "
                 "tensor holding NaN, e.g. the v1 golden vocoder's conv_out.weight_g, does this)\n",
                 static_cast<long long>(w.stats.nonfinite));
  std::fprintf(stderr,
               "mm3: wrote %s (%s, %d Hz, %lld samples/channel = %.2f s) from %lld frames%s; peak %.1f dBFS, %lld clipped; "
               "AR %.1f s, acoustic %.1f s\n",
               w.path.c_str(), audio_format_name(w.format), w.stats.sample_rate, static_cast<long long>(w.stats.frames),
               static_cast<double>(w.stats.frames) / w.stats.sample_rate, static_cast<long long>(res.frames),
               res.stopped_on_end ? " (the song ended on its own)" : "", w.stats.peak_dbfs,
               static_cast<long long>(w.stats.clipped), res.seconds_ar, res.seconds_acoustic);
  return 0;
}

RegisterCommand reg{
    {"generate", 5,
     [](CLI::App& sub) -> std::function<int()> {
       auto a = std::make_shared<GenArgs>();
       sub.add_option("-m,--model", a->model,
                      "checkpoint folder, or a Hugging Face repo id: taken from the HF cache, downloaded into it on "
                      "first use (see Models below)")
           ->capture_default_str();
       sub.add_flag("--no-download", a->no_download, "never download the model: the HF cache or a folder only");
       sub.add_option("--caption", a->caption, "style description (text, or @file)");
       sub.add_option("--lyrics", a->lyrics, "lyrics with [verse]/[chorus]/... tags (text, or @file)");
       sub.add_option("--duration", a->duration, "upper bound in seconds (default 60, max 360); the song may end earlier");
       sub.add_option("--seed", a->seed_text, "seed, an integer in [0, 2^64) (default 0): same seed, same song");
       sub.add_option("--steps", a->steps, "DiT Euler steps per window (default 30)");
       sub.add_option("--ar-cfg", a->ar_cfg, "AR guidance scale (default 1.5)");
       sub.add_option("--dit-cfg", a->dit_cfg, "DiT guidance scale (default 1.7)");
       sub.add_option("--sample-rate", a->sample_rate, "44100 (native, default) or 32000 (the official server's rate)");
       sub.add_option("--format", a->format, "wav | wav24 | wav_float | flac | flac24 | mp3 (default: from -o)");
       sub.add_option("-o,--output", a->out, "output file (written whole or not at all)")->capture_default_str();
       sub.add_option("--request", a->request_file, "a JSON request file (keys caption, lyrics, duration, seed, steps, "
                                                   "ar_cfg, dit_cfg, sample_rate, format); flags override it");
       sub.add_option("--codes", a->codes, "replay: render these codes (.npy [F+1, 8] int64) without the AR stage");
       sub.add_option("--save-codes", a->save_codes, "write the codes (.npy) for replay");
       sub.add_option("--dump", a->dump, "write named intermediates (.npy) into this folder");
       sub.add_flag("--low-memory", a->low_memory, "free the LM before the DiT loads (needed for 24 GB machines)");
       add_profile_flags(sub, a->profile);
       sub.add_option("-t,--threads", a->threads, "threads (default: all cores)");
       sub.add_option("--progress", a->progress, "auto | bar | json | none (auto: a bar when stderr is a terminal)");
       sub.footer(
           "Examples:\n"
           "  mm3 generate --caption \"Genre: acoustic pop. BPM: 96. Warm female vocal\" \\\n"
           "               --lyrics @lyrics.txt --duration 30 --seed 7 -o song.flac\n"
           "  mm3 generate --request req.json --save-codes song.codes.npy -o song.wav\n"
           "  mm3 generate --codes song.codes.npy --caption ... --lyrics ... -o again.wav   # replay, bitwise equal\n\n"
           "Models: --model ORG/NAME (default MiniMaxAI/MiniMax-Music3) is looked up in the Hugging Face cache\n"
           "($HF_HUB_CACHE, else $HF_HOME/hub, else ~/.cache/huggingface/hub) and, when missing, downloaded into it\n"
           "(about 28 GB; the legacy qwen_7B/ and *.pth files are skipped). $HF_TOKEN for gated repos, $HF_ENDPOINT\n"
           "for a mirror, $HF_HUB_OFFLINE=1 or --no-download to stay offline. An interrupted download resumes.\n\n"
           "Exit codes: 2 bad input, 3 missing/corrupt model, 4 out of memory, 130 cancelled (Ctrl-C; no file).");
       return [a]() { return run_generate(*a); };
     },
     "generate a song from a caption and lyrics"}};

}  // namespace
}  // namespace mm3::cli
