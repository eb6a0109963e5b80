/* capi_test.c — a plain C program against include/mm3.h: error classes, last-error text, request
 * validation, cancellation, and a short generation on the golden checkpoint (argv[1]) written to argv[2].
 * Exit 0 on success, 77 when the golden checkpoint is absent, 1 on any failed expectation. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "mm3.h"

static int failures = 0;
#define EXPECT(cond, ...)                                  \
  do {                                                     \
    if (!(cond)) {                                         \
      fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond); \
      fprintf(stderr, __VA_ARGS__);                        \
      fprintf(stderr, "\n");                               \
      failures++;                                          \
    }                                                      \
  } while (0)

static int progress_calls = 0;
static void on_progress(const mm3_progress* p, void* user) {
  (void)user;
  if (p && p->stage) progress_calls++;
}
static int cancel_now(void* user) {
  (void)user;
  return 1;
}

int main(int argc, char** argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: capi_test CHECKPOINT_DIR OUT.wav\n");
    return 2;
  }
  EXPECT(mm3_abi_version() == MM3_ABI_VERSION, "abi %d", mm3_abi_version());

  mm3_model* m = NULL;
  mm3_status s = mm3_model_load("/nonexistent/mm3-model", NULL, &m);
  EXPECT(s == MM3_ERR_BAD_MODEL, "status %s", mm3_status_name(s));
  EXPECT(m == NULL, "model set on failure");
  EXPECT(strstr(mm3_last_error(), "/nonexistent/mm3-model") != NULL, "last error: %s", mm3_last_error());

  mm3_request* bad = NULL;
  s = mm3_request_from_json("{\"caption\": \"c\", \"lyrics\": \"l\", \"tempo\": 3}", &bad);
  EXPECT(s == MM3_ERR_INVALID_INPUT && bad == NULL, "status %s", mm3_status_name(s));
  EXPECT(strstr(mm3_last_error(), "tempo") != NULL, "last error: %s", mm3_last_error());

  struct stat st;
  if (stat(argv[1], &st) != 0) {
    printf("SKIP: golden checkpoint not found at %s\n", argv[1]);
    return failures ? 1 : 77;
  }
  mm3_model_params mp = mm3_model_default_params();
  EXPECT(mp.acoustic_precision == MM3_PRECISION_F32 && mp.ar_weights == MM3_AR_WEIGHTS_DEFAULT,
         "defaults are the reference profile");
  mp.ar_weights = (mm3_ar_weights)9;
  s = mm3_model_load(argv[1], &mp, &m);
  EXPECT(s == MM3_ERR_INVALID_INPUT && m == NULL, "ar_weights 9: %s", mm3_status_name(s));
  EXPECT(strstr(mm3_last_error(), "ar_weights") != NULL, "last error: %s", mm3_last_error());
  mp = mm3_model_default_params();
  mp.acoustic_precision = (mm3_precision)5;
  s = mm3_model_load(argv[1], &mp, &m);
  EXPECT(s == MM3_ERR_INVALID_INPUT && m == NULL, "acoustic_precision 5: %s", mm3_status_name(s));
  mp = mm3_model_default_params();
  EXPECT(mp.dit_gemm == MM3_DIT_GEMM_EXACT, "dit_gemm defaults to exact");
  mp.dit_gemm = (mm3_dit_gemm)7;
  s = mm3_model_load(argv[1], &mp, &m);
  EXPECT(s == MM3_ERR_INVALID_INPUT && m == NULL, "dit_gemm 7: %s", mm3_status_name(s));
  EXPECT(strstr(mm3_last_error(), "dit_gemm") != NULL, "last error: %s", mm3_last_error());
  mp.dit_gemm = MM3_DIT_GEMM_INT8;
  mp.acoustic_precision = MM3_PRECISION_BF16;
  s = mm3_model_load(argv[1], &mp, &m);
  EXPECT(s == MM3_ERR_INVALID_INPUT && m == NULL, "int8 with bf16: %s", mm3_status_name(s));
  mp = mm3_model_default_params();
  s = mm3_model_load(argv[1], &mp, &m);
  EXPECT(s == MM3_OK, "load: %s: %s", mm3_status_name(s), mm3_last_error());
  if (s != MM3_OK) return 1;

  mm3_request* r = mm3_request_new();
  EXPECT(mm3_request_set_text(r, MM3_FIELD_CAPTION, "Genre: pop. BPM: 96.") == MM3_OK, "caption");
  EXPECT(mm3_request_set_text(r, MM3_FIELD_LYRICS, "[verse]\nHello there") == MM3_OK, "lyrics");
  EXPECT(mm3_request_set_duration(r, 1.0) == MM3_OK, "duration");
  EXPECT(mm3_request_set_steps(r, 2) == MM3_OK, "steps");

  /* Invalid duration is refused by generate with INVALID_INPUT. */
  mm3_result* res = NULL;
  mm3_request_set_duration(r, 0.0);
  s = mm3_generate(m, r, NULL, &res);
  EXPECT(s == MM3_ERR_INVALID_INPUT && res == NULL, "status %s", mm3_status_name(s));
  EXPECT(strstr(mm3_last_error(), "duration") != NULL, "last error: %s", mm3_last_error());
  mm3_request_set_duration(r, 1.0);

  /* Cancellation is its own outcome. */
  mm3_generate_params gp = mm3_generate_default_params();
  gp.should_cancel = cancel_now;
  s = mm3_generate(m, r, &gp, &res);
  EXPECT(s == MM3_CANCELLED && res == NULL, "status %s", mm3_status_name(s));

  gp = mm3_generate_default_params();
  gp.on_progress = on_progress;
  s = mm3_generate(m, r, &gp, &res);
  EXPECT(s == MM3_OK, "generate: %s: %s", mm3_status_name(s), mm3_last_error());
  if (s == MM3_OK) {
    EXPECT(mm3_result_sample_rate(res) == 44100, "rate %d", mm3_result_sample_rate(res));
    EXPECT(mm3_result_channels(res) == 2, "channels %d", mm3_result_channels(res));
    EXPECT(mm3_result_frames(res) > 0 && mm3_result_frames(res) <= 25, "frames %lld", (long long)mm3_result_frames(res));
    EXPECT(mm3_result_samples(res) > 0, "samples");
    int64_t ncf = 0;
    const int64_t* codes = mm3_result_codes(res, &ncf);
    EXPECT(codes != NULL && ncf == mm3_result_frames(res) + 1, "codes %lld", (long long)ncf);
    EXPECT(progress_calls > 0, "no progress callbacks");
    const float* a = mm3_result_audio(res);
    int finite = 1;
    for (int64_t i = 0; i < 2 * mm3_result_samples(res); ++i)
      if (!(a[i] >= -1.0f && a[i] <= 1.0f)) finite = 0;
    EXPECT(finite, "samples outside [-1, 1]");
    s = mm3_result_write(res, argv[2], NULL);
    EXPECT(s == MM3_OK, "write: %s", mm3_last_error());
    EXPECT(stat(argv[2], &st) == 0 && st.st_size > 44, "no wav written");
    s = mm3_result_write(res, "/nonexistent-dir/x.wav", NULL);
    EXPECT(s == MM3_ERR_INVALID_INPUT, "write to bad dir: %s", mm3_status_name(s));
    mm3_result_free(res);
  }
  mm3_model_free(m);

  /* The fast profile: bf16 acoustic stage, int8 AR weights (quantized at load). */
  mp = mm3_model_default_params();
  mp.acoustic_precision = MM3_PRECISION_BF16;
  mp.ar_weights = MM3_AR_WEIGHTS_INT8;
  s = mm3_model_load(argv[1], &mp, &m);
  EXPECT(s == MM3_OK, "load bf16/int8: %s: %s", mm3_status_name(s), mm3_last_error());
  if (s == MM3_OK) {
    s = mm3_generate(m, r, NULL, &res);
    EXPECT(s == MM3_OK, "generate bf16/int8: %s: %s", mm3_status_name(s), mm3_last_error());
    if (s == MM3_OK) {
      EXPECT(mm3_result_samples(res) > 0, "bf16/int8: no samples");
      mm3_result_free(res);
    }
    mm3_model_free(m);
  }
  mm3_request_free(r);
  printf("%s\n", failures ? "capi_test: FAILED" : "capi_test: ok");
  return failures ? 1 : 0;
}
