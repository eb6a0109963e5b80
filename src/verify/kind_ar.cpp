// kind_ar.cpp — golden kinds `language_model` and `rvq_depth_decoder` (issue 4). Not implemented yet.
#include "verify/kinds.h"

namespace mm3::verify {

CaseOutputs run_language_model_case(const CaseInput&) { throw NotImplemented("language_model runner"); }
CaseOutputs run_rvq_depth_decoder_case(const CaseInput&) { throw NotImplemented("rvq_depth_decoder runner"); }

}  // namespace mm3::verify

namespace mm3::verify {
void e2e_ar_part(const CaseInput&, CaseOutputs& out) {
  for (const char* o : {"codes", "frame_hiddens"}) out.extra.push_back({o, "e2e", false, "", "not implemented"});
}
}  // namespace mm3::verify
