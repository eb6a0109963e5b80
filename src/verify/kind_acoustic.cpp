// kind_acoustic.cpp — golden kinds `condition_encoder`, `transformer`, `vocoder`, `acoustic` (issue 5).
// Not implemented yet.
#include "verify/kinds.h"

namespace mm3::verify {

CaseOutputs run_condition_encoder_case(const CaseInput&) { throw NotImplemented("condition_encoder runner"); }
CaseOutputs run_transformer_case(const CaseInput&) { throw NotImplemented("transformer runner"); }
CaseOutputs run_vocoder_case(const CaseInput&) { throw NotImplemented("vocoder runner"); }
CaseOutputs run_acoustic_case(const CaseInput&) { throw NotImplemented("acoustic runner"); }

}  // namespace mm3::verify

namespace mm3::verify {
void e2e_acoustic_part(const CaseInput&, CaseOutputs& out) {
  out.extra.push_back({"audio", "e2e", false, "", "not implemented"});
}
}  // namespace mm3::verify
