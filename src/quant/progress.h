// A one-line progress bar with an ETA on stderr (redrawn in place; a newline at the end).
#pragma once
#include <chrono>
#include <string>

namespace gyre::quant {

class Progress {
 public:
  Progress(std::string what, int64_t total, bool enabled = true);
  void step(int64_t n = 1);            // n more units done
  void note(const std::string& line);  // prints a line above the bar
  void finish();

 private:
  void draw();
  std::string what_;
  int64_t total_, done_ = 0;
  bool enabled_, tty_, drawn_ = false;
  int64_t last_tenth_ = 0;
  std::chrono::steady_clock::time_point start_;
};

}  // namespace gyre::quant
