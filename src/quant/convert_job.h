// The job signature of a conversion: the options that decide its results, saved in
// OUT/.gyre-job/job.json so that a run started again resumes only the job it would redo.
#pragma once
#include <nlohmann/json.hpp>
#include <string>

#include "quant/convert.h"

namespace gyre::quant {

// Every option of o that changes the measurement, the choice or the quantized weights (the
// caller adds what names the model and its calibration text).
nlohmann::json job_options(const ConvertOptions& o);

// The JSON of a file; gyre::Error naming the file when it is not JSON.
nlohmann::json read_json_file(const std::string& path);

}  // namespace gyre::quant
