// What the HTTP layer needs from the serving engine (engine/engine.h). The server talks to this
// interface so its HTTP behaviour can be tested with a scripted engine as well as the real one.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "engine/engine.h"

namespace gyre {

class ServingEngine {
 public:
  virtual ~ServingEngine() = default;
  // As Engine::submit: throws gyre::Error (bad prompt) or QueueFullError.
  virtual uint64_t submit(std::vector<int> prompt_ids, const RequestOptions& options,
                          EventCallback cb) = 0;
  virtual void cancel(uint64_t id) = 0;
  virtual void drain() = 0;
  virtual EngineStats stats() const = 0;
  virtual const Tokenizer& tokenizer() const = 0;
};

// The real engine behind the interface.
std::unique_ptr<ServingEngine> make_serving_engine(const LoadedModel& model, Backend& backend,
                                                   const EngineConfig& config);

}  // namespace gyre
