#include "server/engine_api.h"

namespace gyre {

namespace {

class EngineAdapter final : public ServingEngine {
 public:
  EngineAdapter(const LoadedModel& model, Backend& backend, const EngineConfig& config)
      : engine_(model, backend, config) {}
  uint64_t submit(std::vector<int> prompt_ids, const RequestOptions& options,
                  EventCallback cb) override {
    return engine_.submit(std::move(prompt_ids), options, std::move(cb));
  }
  void cancel(uint64_t id) override { engine_.cancel(id); }
  void drain() override { engine_.drain(); }
  EngineStats stats() const override { return engine_.stats(); }
  const Tokenizer& tokenizer() const override { return engine_.tokenizer(); }

 private:
  Engine engine_;
};

}  // namespace

std::unique_ptr<ServingEngine> make_serving_engine(const LoadedModel& model, Backend& backend,
                                                   const EngineConfig& config) {
  return std::make_unique<EngineAdapter>(model, backend, config);
}

}  // namespace gyre
