// kind_e2e.cpp — golden kind `e2e` (issues 4-6). Not implemented yet.
#include "verify/kinds.h"

namespace mm3::verify {

CaseOutputs run_e2e_case(const CaseInput&) { throw NotImplemented("e2e runner"); }

}  // namespace mm3::verify
