// web_page.h — the page `mm3 serve` answers at GET / (issue 7): plain HTML + JS embedded in the
// binary, no build step. Caption and lyrics (with section-tag buttons), duration, seed, format; live
// progress from the job's event stream; a player and a download when done; the recent jobs.
#pragma once

#include <string>

namespace mm3::server {

const std::string& web_page_html();

}  // namespace mm3::server
