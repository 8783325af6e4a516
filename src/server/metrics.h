// /metrics: the engine's counters and gauges in Prometheus' text exposition format.
#pragma once
#include <cstdint>
#include <map>
#include <string>

#include "engine/engine.h"

namespace gyre {

// http_statuses: responses sent so far, by HTTP status.
std::string prometheus_text(const EngineStats& s, const std::map<int, uint64_t>& http_statuses,
                            bool draining);

}  // namespace gyre
