#include "quant/progress.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>

namespace gyre::quant {

namespace {
std::string duration(double s) {
  char buf[32];
  const long t = static_cast<long>(s + 0.5);
  if (t >= 3600)
    std::snprintf(buf, sizeof(buf), "%ldh%02ldm", t / 3600, (t / 60) % 60);
  else
    std::snprintf(buf, sizeof(buf), "%ldm%02lds", t / 60, t % 60);
  return buf;
}
}  // namespace

Progress::Progress(std::string what, int64_t total, bool enabled)
    : what_(std::move(what)),
      total_(std::max<int64_t>(total, 1)),
      enabled_(enabled),
      tty_(isatty(2) != 0),
      start_(std::chrono::steady_clock::now()) {
  draw();
}

void Progress::step(int64_t n) {
  done_ = std::min(total_, done_ + n);
  draw();
}

void Progress::note(const std::string& line) {
  if (!enabled_) return;
  std::fprintf(stderr, tty_ ? "\r\033[K%s\n" : "%s\n", line.c_str());
  draw();
}

void Progress::draw() {
  if (!enabled_) return;
  // Into a file or pipe: a plain line every tenth of the way instead of redrawing in place.
  const int64_t tenth = done_ * 10 / total_;
  if (!tty_ && (tenth == last_tenth_ || done_ == 0)) return;
  last_tenth_ = tenth;
  const double elapsed =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  const int width = 30, filled = static_cast<int>(width * done_ / total_);
  std::string bar(static_cast<size_t>(filled), '#');
  bar.resize(width, '.');
  std::string eta = "--";
  if (done_ > 0) eta = duration(elapsed * static_cast<double>(total_ - done_) / done_);
  std::fprintf(stderr, "%s%s [%s] %lld/%lld  %s elapsed, ETA %s", tty_ ? "\r\033[K" : "",
               what_.c_str(), bar.c_str(), static_cast<long long>(done_),
               static_cast<long long>(total_), duration(elapsed).c_str(), eta.c_str());
  if (!tty_) std::fprintf(stderr, "\n");
  std::fflush(stderr);
  drawn_ = true;
}

void Progress::finish() {
  if (enabled_ && drawn_ && tty_) std::fprintf(stderr, "\n");
  drawn_ = false;
}

}  // namespace gyre::quant
