// Pieces shared by the pretraining report (report.cc) and the RL report (rl_report.cc): reading
// JSON lines strictly, formatting numbers and text for HTML, the page's head, and writing the
// page atomically. Internal to strider_report; the public interface is report/report.h.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/status.h"

namespace strider::report_html {

// `text` with &, <, >, " and ' escaped, for element text and attribute values.
std::string Escape(const std::string& text);

// `value` with `digits` significant digits; "-" when not finite (a null or missing field).
std::string Number(double value, int digits = 4);

// Every non-blank line of `path` as a JSON object, and when `line_numbers` is given each one's
// line number (from 1; blank lines are skipped, so they differ from the index). NotFound when
// the file cannot be read; a line that is not a JSON object is InvalidArgument
// "PATH:LINE: not a JSON object".
Result<std::vector<nlohmann::json>> ReadJsonLines(const std::string& path,
                                                  std::vector<int64_t>* line_numbers = nullptr);

// The field as a number, NAN when missing, null or of another type.
double NumberField(const nlohmann::json& json, const char* key);
// The field as a string, "" when missing or of another type.
std::string StringField(const nlohmann::json& json, const char* key);

// "<!DOCTYPE html>...<body>" with the title and the tables' style sheet, `style` (CSS rules)
// appended to it.
std::string PageHead(const std::string& title, const std::string& style = "");

// Writes `text` to `path` with WriteFileDurably, so a reader never sees half a page.
Status WriteAtomically(const std::string& path, const std::string& text);

}  // namespace strider::report_html
