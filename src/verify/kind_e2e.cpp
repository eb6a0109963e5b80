// kind_e2e.cpp — golden kind `e2e`: checked stage by stage, each stage fed the golden inputs of that
// stage (golden/README.md): text_ids from caption and lyrics; codes from text_ids and the seed;
// frame_hiddens with codes forced; latents_k and audio from the golden frame_hiddens and noise_k.
#include "verify/kinds.h"

namespace mm3::verify {

CaseOutputs run_e2e_case(const CaseInput& in) {
  CaseOutputs out;
  e2e_text_part(in, out);
  e2e_ar_part(in, out);
  e2e_acoustic_part(in, out);
  return out;
}

}  // namespace mm3::verify
