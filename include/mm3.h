/* mm3.h — the only public header of mm3, a native inference engine for MiniMax-Music3.
 *
 * A stable C ABI: opaque handles, *_default_params() for every parameter struct, status codes with an
 * error class, a thread-local last-error string, progress and cancel callbacks with a user pointer.
 * Exceptions never cross this boundary. Only mm3_* symbols are exported from libmm3.so.
 *
 *   mm3_model* m;  if (mm3_model_load("MiniMax-Music3/", NULL, &m) != MM3_OK) puts(mm3_last_error());
 *   mm3_request* r = mm3_request_new();
 *   mm3_request_set_text(r, MM3_FIELD_CAPTION, "Genre: pop. BPM: 96");
 *   mm3_request_set_text(r, MM3_FIELD_LYRICS, "[verse]\nHello");
 *   mm3_result* out;  mm3_generate(m, r, NULL, &out);
 *   mm3_result_write(out, "song.wav", NULL);
 *   mm3_result_free(out); mm3_request_free(r); mm3_model_free(m);
 */
#ifndef MM3_H
#define MM3_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define MM3_ABI_VERSION 3 /* 2: mm3_model_params gained acoustic_precision and ar_weights; 3: dit_gemm */
#if defined(__GNUC__)
#define MM3_API __attribute__((visibility("default")))
#else
#define MM3_API
#endif

typedef enum mm3_status {
  MM3_OK = 0,
  MM3_ERR_INVALID_INPUT = 1, /* the caller passed something wrong: see mm3_last_error() */
  MM3_ERR_BAD_MODEL = 2,     /* checkpoint missing, corrupt or inconsistent */
  MM3_ERR_OUT_OF_MEMORY = 3, /* the message says how much was needed */
  MM3_CANCELLED = 4,         /* the cancel callback asked to stop: not an error */
  MM3_ERR_INTERNAL = 5       /* a bug in mm3 */
} mm3_status;

typedef struct mm3_model mm3_model;
typedef struct mm3_request mm3_request;
typedef struct mm3_result mm3_result;

MM3_API int mm3_abi_version(void);            /* == MM3_ABI_VERSION of the library */
MM3_API const char* mm3_status_name(mm3_status s);
/* Text of the last failure on this thread ("" if none). Valid until the next mm3 call on this thread. */
MM3_API const char* mm3_last_error(void);

/* ---- model ---- */
typedef enum mm3_precision { MM3_PRECISION_F32 = 0, MM3_PRECISION_BF16 = 1 } mm3_precision;
typedef enum mm3_ar_weights {
  MM3_AR_WEIGHTS_DEFAULT = 0, /* the checkpoint's own: mm3-quant/default.json (mm3 quantize), else bf16 */
  MM3_AR_WEIGHTS_BF16 = 1,    /* the reference */
  MM3_AR_WEIGHTS_INT8 = 2,    /* quantized at load unless the checkpoint has the sidecar */
  MM3_AR_WEIGHTS_Q4 = 3
} mm3_ar_weights;
typedef enum mm3_dit_gemm {
  MM3_DIT_GEMM_EXACT = 0, /* the reference: fp32 (or bf16 with MM3_PRECISION_BF16) */
  MM3_DIT_GEMM_INT8 = 1   /* W8A8 block GEMMs, opt-in (README 'Compute profiles'); needs MM3_PRECISION_F32 */
} mm3_dit_gemm;
typedef struct mm3_model_params {
  int n_threads;   /* 0 = all cores */
  int low_memory;  /* nonzero: free the LM and depth decoder before the DiT loads */
  mm3_precision acoustic_precision; /* DiT + vocoder compute; F32 = the reference profile (default).
                                       BF16 runs its GEMMs in oneDNN on OpenMP threads: start the program
                                       with OMP_WAIT_POLICY=PASSIVE in its environment (the mm3 command
                                       does this itself), or they spin against mm3's own threads (~5%) */
  mm3_ar_weights ar_weights;        /* LM + depth-decoder weights (default: the checkpoint's own) */
  mm3_dit_gemm dit_gemm;            /* the DiT's block GEMMs (default: exact) */
} mm3_model_params;
MM3_API mm3_model_params mm3_model_default_params(void);
/* dir: a MiniMax-Music3 checkpoint folder (diffusers componentized layout). params may be NULL. */
MM3_API mm3_status mm3_model_load(const char* dir, const mm3_model_params* params, mm3_model** out);
MM3_API void mm3_model_free(mm3_model* m);

/* ---- request ---- */
typedef enum mm3_text_field { MM3_FIELD_CAPTION = 0, MM3_FIELD_LYRICS = 1, MM3_FIELD_FORMAT = 2 } mm3_text_field;
MM3_API mm3_request* mm3_request_new(void); /* defaults: duration 60, seed 0, steps 30, cfg 1.5/1.7, 44100 Hz, wav */
/* Parses a strict JSON request (keys caption, lyrics, duration, seed, steps, ar_cfg, dit_cfg, sample_rate, format). */
MM3_API mm3_status mm3_request_from_json(const char* json, mm3_request** out);
MM3_API mm3_status mm3_request_set_text(mm3_request* r, mm3_text_field field, const char* utf8);
MM3_API mm3_status mm3_request_set_duration(mm3_request* r, double seconds);
MM3_API mm3_status mm3_request_set_seed(mm3_request* r, uint64_t seed);
MM3_API mm3_status mm3_request_set_steps(mm3_request* r, int steps);
MM3_API mm3_status mm3_request_set_cfg(mm3_request* r, double ar_cfg, double dit_cfg);
MM3_API mm3_status mm3_request_set_sample_rate(mm3_request* r, int hz); /* 44100 or 32000 */
MM3_API void mm3_request_free(mm3_request* r);

/* ---- generation ---- */
typedef struct mm3_progress {
  const char* stage; /* "ar", "dit", "vocoder" */
  int64_t done, total;
  double rate;       /* units per second */
  const char* unit;  /* "frames", "steps", "windows" */
} mm3_progress;
typedef void (*mm3_progress_fn)(const mm3_progress* p, void* user);
typedef int (*mm3_cancel_fn)(void* user); /* return nonzero to cancel */

typedef struct mm3_generate_params {
  mm3_progress_fn on_progress; /* may be NULL */
  mm3_cancel_fn should_cancel; /* may be NULL; polled between frames and steps */
  void* user;
  const int64_t* codes;        /* replay: [n_code_frames, 8] codes (row 0 = the non-emitted first frame), or NULL */
  int64_t n_code_frames;
} mm3_generate_params;
MM3_API mm3_generate_params mm3_generate_default_params(void);
/* params may be NULL. On MM3_CANCELLED *out is NULL and nothing was written anywhere. */
MM3_API mm3_status mm3_generate(mm3_model* m, const mm3_request* r, const mm3_generate_params* params,
                                mm3_result** out);

/* ---- result ---- */
MM3_API int mm3_result_sample_rate(const mm3_result* res);
MM3_API int mm3_result_channels(const mm3_result* res);       /* 2 */
MM3_API int64_t mm3_result_samples(const mm3_result* res);    /* per channel */
/* Planar float samples: channel c starts at audio + c * mm3_result_samples(). */
MM3_API const float* mm3_result_audio(const mm3_result* res);
MM3_API int64_t mm3_result_frames(const mm3_result* res);     /* emitted AR frames */
/* [n_code_frames, 8] int64 codes; *n_code_frames = frames + 1. */
MM3_API const int64_t* mm3_result_codes(const mm3_result* res, int64_t* n_code_frames);
/* Writes WAV/FLAC/MP3 (format NULL: from the extension). Never leaves a partial file. */
MM3_API mm3_status mm3_result_write(const mm3_result* res, const char* path, const char* format);
MM3_API void mm3_result_free(mm3_result* res);

#ifdef __cplusplus
}
#endif

#endif /* MM3_H */
