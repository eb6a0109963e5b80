// kinds.h — the runner of every golden kind. Each lives in its own file (kind_*.cpp) next to the stage
// it exercises; verify.cpp maps kind names to these functions.
#pragma once

#include "verify/verify.h"

namespace mm3::verify {

CaseOutputs run_scheduler_case(const CaseInput& in);          // kind_scheduler.cpp
CaseOutputs run_language_model_case(const CaseInput& in);     // kind_ar.cpp
CaseOutputs run_rvq_depth_decoder_case(const CaseInput& in);  // kind_ar.cpp
CaseOutputs run_condition_encoder_case(const CaseInput& in);  // kind_acoustic.cpp
CaseOutputs run_transformer_case(const CaseInput& in);        // kind_acoustic.cpp
CaseOutputs run_vocoder_case(const CaseInput& in);            // kind_acoustic.cpp
CaseOutputs run_acoustic_case(const CaseInput& in);           // kind_acoustic.cpp
CaseOutputs run_e2e_case(const CaseInput& in);                // kind_e2e.cpp: joins the three parts below

// The parts of an `e2e` case, each next to its stage; each adds its outputs / gated checks / notes.
void e2e_text_part(const CaseInput& in, CaseOutputs& out);      // kind_tokenizer.cpp: text_ids from caption+lyrics
void e2e_ar_part(const CaseInput& in, CaseOutputs& out);        // kind_ar.cpp: codes, frame_hiddens, guided rows
void e2e_acoustic_part(const CaseInput& in, CaseOutputs& out);  // kind_acoustic.cpp: latents_k, audio

// The tokenizer pseudo-kind: reads tokenize.jsonl / prompts.jsonl / prompt_errors.jsonl when present
// in the golden dir; one report per file (kind_tokenizer.cpp).
std::vector<CaseReport> run_tokenizer_files(const VerifyContext& ctx, const VerifyOptions& opt);

}  // namespace mm3::verify
