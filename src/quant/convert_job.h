// The job signature of a conversion: the options that decide its results, saved in
// OUT/.gyre-job/job.json so that a run started again resumes only the job it would redo.
#pragma once
#include <nlohmann/json.hpp>
#include <string>

#include "core/json_file.h"
#include "quant/convert.h"

namespace gyre::quant {

// Every option of o that changes the measurement, the choice or the quantized weights (the
// caller adds what names the model and its calibration text).
nlohmann::json job_options(const ConvertOptions& o);

}  // namespace gyre::quant
