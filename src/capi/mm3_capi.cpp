// mm3_capi.cpp — the extern "C" ABI of include/mm3.h: the one place exceptions stop. Every entry point
// catches everything, maps it to a status code and stores the message in a thread-local string.
#include <cstring>
#include <exception>
#include <new>
#include <string>

#include "core/errors.h"
#include "io/audio.h"
#include "mm3.h"
#include "pipeline/pipeline.h"
#include "pipeline/request.h"

struct mm3_model {
  std::unique_ptr<mm3::Pipeline> pipeline;
};
struct mm3_request {
  mm3::Request req;
};
struct mm3_result {
  mm3::GenerationResult res;
};

namespace {

thread_local std::string g_last_error;

mm3_status status_of(mm3::ErrorKind k) {
  switch (k) {
    case mm3::ErrorKind::invalid_input: return MM3_ERR_INVALID_INPUT;
    case mm3::ErrorKind::bad_model: return MM3_ERR_BAD_MODEL;
    case mm3::ErrorKind::out_of_memory: return MM3_ERR_OUT_OF_MEMORY;
    case mm3::ErrorKind::cancelled: return MM3_CANCELLED;
    default: return MM3_ERR_INTERNAL;
  }
}

// Runs f, translating every exception into a status and the thread's last-error text.
template <class F>
mm3_status guarded(F&& f) {
  try {
    g_last_error.clear();
    f();
    return MM3_OK;
  } catch (const mm3::Error& e) {
    g_last_error = e.what();
    return status_of(e.kind());
  } catch (const std::bad_alloc&) {
    g_last_error = "out of memory";
    return MM3_ERR_OUT_OF_MEMORY;
  } catch (const std::exception& e) {
    g_last_error = e.what();
    return MM3_ERR_INTERNAL;
  } catch (...) {
    g_last_error = "unknown exception";
    return MM3_ERR_INTERNAL;
  }
}

void need(const void* p, const char* what) {
  if (!p) throw mm3::InvalidInput(std::string(what) + " is NULL");
}

}  // namespace

extern "C" {

int mm3_abi_version(void) { return MM3_ABI_VERSION; }

const char* mm3_status_name(mm3_status s) {
  switch (s) {
    case MM3_OK: return "ok";
    case MM3_ERR_INVALID_INPUT: return "invalid input";
    case MM3_ERR_BAD_MODEL: return "bad model";
    case MM3_ERR_OUT_OF_MEMORY: return "out of memory";
    case MM3_CANCELLED: return "cancelled";
    case MM3_ERR_INTERNAL: return "internal error";
  }
  return "unknown status";
}

const char* mm3_last_error(void) { return g_last_error.c_str(); }

mm3_model_params mm3_model_default_params(void) {
  return mm3_model_params{0, 0, MM3_PRECISION_F32, MM3_AR_WEIGHTS_DEFAULT, MM3_DIT_GEMM_EXACT};
}

mm3_status mm3_model_load(const char* dir, const mm3_model_params* params, mm3_model** out) {
  return guarded([&] {
    need(dir, "dir");
    need(out, "out");
    *out = nullptr;
    const mm3_model_params p = params ? *params : mm3_model_default_params();
    mm3::PipelineOptions opt;
    opt.threads = p.n_threads;
    opt.low_memory = p.low_memory != 0;
    switch (p.acoustic_precision) {
      case MM3_PRECISION_F32: opt.acoustic_precision = mm3::DType::F32; break;
      case MM3_PRECISION_BF16: opt.acoustic_precision = mm3::DType::BF16; break;
      default:
        throw mm3::InvalidInput(fmt::format("mm3_model_params.acoustic_precision {}: use MM3_PRECISION_F32 or "
                                            "MM3_PRECISION_BF16", static_cast<int>(p.acoustic_precision)));
    }
    switch (p.ar_weights) {
      case MM3_AR_WEIGHTS_DEFAULT: break;
      case MM3_AR_WEIGHTS_BF16: opt.ar_quant = mm3::kern::QuantType::None; break;
      case MM3_AR_WEIGHTS_INT8: opt.ar_quant = mm3::kern::QuantType::Int8; break;
      case MM3_AR_WEIGHTS_Q4: opt.ar_quant = mm3::kern::QuantType::Q4; break;
      default:
        throw mm3::InvalidInput(fmt::format("mm3_model_params.ar_weights {}: use one of MM3_AR_WEIGHTS_DEFAULT, "
                                            "_BF16, _INT8, _Q4", static_cast<int>(p.ar_weights)));
    }
    switch (p.dit_gemm) {
      case MM3_DIT_GEMM_EXACT:
        break;
      case MM3_DIT_GEMM_INT8:
        opt.dit_gemm = mm3::DitGemm::Int8;
        break;
      default:
        throw mm3::InvalidInput(
            fmt::format("mm3_model_params.dit_gemm {}: use MM3_DIT_GEMM_EXACT or "
                        "MM3_DIT_GEMM_INT8",
                        static_cast<int>(p.dit_gemm)));
    }
    if (opt.dit_gemm == mm3::DitGemm::Int8 && opt.acoustic_precision != mm3::DType::F32)
      throw mm3::InvalidInput(
          "mm3_model_params: dit_gemm MM3_DIT_GEMM_INT8 needs acoustic_precision "
          "MM3_PRECISION_F32");
    auto m = std::make_unique<mm3_model>();
    m->pipeline = std::make_unique<mm3::Pipeline>(dir, opt);
    *out = m.release();
  });
}

void mm3_model_free(mm3_model* m) { delete m; }

mm3_request* mm3_request_new(void) {
  try {
    return new mm3_request();
  } catch (...) {
    g_last_error = "out of memory";
    return nullptr;
  }
}

mm3_status mm3_request_from_json(const char* json, mm3_request** out) {
  return guarded([&] {
    need(json, "json");
    need(out, "out");
    *out = nullptr;
    auto r = std::make_unique<mm3_request>();
    r->req = mm3::parse_request_text(json, "request");
    *out = r.release();
  });
}

mm3_status mm3_request_set_text(mm3_request* r, mm3_text_field field, const char* utf8) {
  return guarded([&] {
    need(r, "request");
    need(utf8, "text");
    switch (field) {
      case MM3_FIELD_CAPTION: r->req.caption = utf8; break;
      case MM3_FIELD_LYRICS: r->req.lyrics = utf8; break;
      case MM3_FIELD_FORMAT: r->req.format = utf8; break;
      default: throw mm3::InvalidInput("unknown text field " + std::to_string(static_cast<int>(field)));
    }
  });
}

mm3_status mm3_request_set_duration(mm3_request* r, double seconds) {
  return guarded([&] {
    need(r, "request");
    r->req.duration = seconds;
  });
}
mm3_status mm3_request_set_seed(mm3_request* r, uint64_t seed) {
  return guarded([&] {
    need(r, "request");
    r->req.seed = seed;
  });
}
mm3_status mm3_request_set_steps(mm3_request* r, int steps) {
  return guarded([&] {
    need(r, "request");
    r->req.steps = steps;
  });
}
mm3_status mm3_request_set_cfg(mm3_request* r, double ar_cfg, double dit_cfg) {
  return guarded([&] {
    need(r, "request");
    r->req.ar_cfg = ar_cfg;
    r->req.dit_cfg = dit_cfg;
  });
}
mm3_status mm3_request_set_sample_rate(mm3_request* r, int hz) {
  return guarded([&] {
    need(r, "request");
    r->req.sample_rate = hz;
  });
}

void mm3_request_free(mm3_request* r) { delete r; }

mm3_generate_params mm3_generate_default_params(void) { return mm3_generate_params{nullptr, nullptr, nullptr, nullptr, 0}; }

mm3_status mm3_generate(mm3_model* m, const mm3_request* r, const mm3_generate_params* params, mm3_result** out) {
  return guarded([&] {
    need(m, "model");
    need(r, "request");
    need(out, "out");
    *out = nullptr;
    mm3::validate_request(r->req);
    const mm3_generate_params p = params ? *params : mm3_generate_default_params();
    mm3::RunControl ctl;
    if (p.on_progress) {
      ctl.on_progress = [p](const mm3::ProgressEvent& e) {
        mm3_progress cp{e.stage.c_str(), e.done, e.total, e.rate, e.unit.c_str()};
        p.on_progress(&cp, p.user);
      };
    }
    if (p.should_cancel) ctl.should_cancel = [p]() { return p.should_cancel(p.user) != 0; };
    mm3::GenerateOptions gopt;
    if (p.codes) {
      if (p.n_code_frames < 2) throw mm3::InvalidInput("codes: need at least 2 code frames (the first is not emitted)");
      gopt.codes = mm3::Tensor::from_i64(std::vector<int64_t>(p.codes, p.codes + p.n_code_frames * 8),
                                         {p.n_code_frames, 8});
    }
    auto res = std::make_unique<mm3_result>();
    res->res = m->pipeline->generate(r->req, ctl, gopt);
    *out = res.release();
  });
}

int mm3_result_sample_rate(const mm3_result* res) { return res ? res->res.sample_rate : 0; }
int mm3_result_channels(const mm3_result* res) { return res ? static_cast<int>(res->res.audio.dim(0)) : 0; }
int64_t mm3_result_samples(const mm3_result* res) { return res ? res->res.audio.dim(1) : 0; }
const float* mm3_result_audio(const mm3_result* res) { return res ? res->res.audio.data<float>() : nullptr; }
int64_t mm3_result_frames(const mm3_result* res) { return res ? res->res.frames : 0; }

const int64_t* mm3_result_codes(const mm3_result* res, int64_t* n_code_frames) {
  if (!res) return nullptr;
  if (n_code_frames) *n_code_frames = res->res.codes.numel() ? res->res.codes.dim(0) : 0;
  return res->res.codes.numel() ? res->res.codes.data<int64_t>() : nullptr;
}

mm3_status mm3_result_write(const mm3_result* res, const char* path, const char* format) {
  return guarded([&] {
    need(res, "result");
    need(path, "path");
    mm3::AudioWriteOptions opt;
    if (format) opt.format = mm3::parse_audio_format(format);
    mm3::write_audio(path, res->res.audio, res->res.sample_rate, opt);
  });
}

void mm3_result_free(mm3_result* res) { delete res; }

}  // extern "C"
