#include "backends/cuda/timing_cache.h"

#include <cmath>
#include <vector>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <unistd.h>

namespace kiln::cuda {

namespace fs = std::filesystem;

std::string target_id(const TargetInfo& t) {
  std::string s = fmt::format("{} sm_{}{} cuda {} cublasLt {} cudnn {}", t.gpu, t.sm_major, t.sm_minor, t.cuda_runtime,
                              t.cublaslt, t.cudnn);
  for (char& c : s) {
    if (c == '|' || c == '\t' || c == '\n') c = '_';
  }
  return s;
}

std::optional<std::string> TimingCache::get(const std::string& kind, const std::string& signature) {
  std::lock_guard<std::mutex> lock(mu_);
  std::string key = target_ + "|" + kind + "|" + signature;
  auto it = entries_.find(key);
  if (it == entries_.end()) {
    ++misses_;
    return std::nullopt;
  }
  ++hits_;
  used_.insert(key);
  return it->second;
}

void TimingCache::put(const std::string& kind, const std::string& signature, std::string value) {
  std::lock_guard<std::mutex> lock(mu_);
  std::string key = target_ + "|" + kind + "|" + signature;
  entries_[key] = std::move(value);
  used_.insert(key);
}

namespace {

// The numbers of a signature's DIMS part; false when it has no ` @ `.
bool split_signature(const std::string& sig, std::string& form, std::vector<double>& dims) {
  size_t at = sig.find(" @ ");
  if (at == std::string::npos) return false;
  form = sig.substr(0, at);
  dims.clear();
  for (size_t i = at + 3; i < sig.size();) {
    if (sig[i] < '0' || sig[i] > '9') {
      ++i;
      continue;
    }
    size_t j = i;
    while (j < sig.size() && sig[j] >= '0' && sig[j] <= '9') ++j;
    dims.push_back(std::stod(sig.substr(i, j - i)));
    i = j;
  }
  return true;
}

}  // namespace

std::optional<std::string> TimingCache::nearest(const std::string& kind, const std::string& signature) {
  std::string form, other_form;
  std::vector<double> dims, other;
  if (!split_signature(signature, form, dims)) return std::nullopt;
  const std::string prefix = target_ + "|" + kind + "|" + form + " @ ";
  std::lock_guard<std::mutex> lock(mu_);
  std::map<std::string, std::string>::iterator best = entries_.end();
  double best_d = 0;
  for (auto it = entries_.lower_bound(prefix); it != entries_.end() && it->first.compare(0, prefix.size(), prefix) == 0; ++it) {
    if (!split_signature(it->first.substr(target_.size() + kind.size() + 2), other_form, other) ||
        other.size() != dims.size()) {
      continue;
    }
    double d = 0;
    for (size_t i = 0; i < dims.size(); ++i) d += std::abs(std::log((dims[i] + 1) / (other[i] + 1)));
    if (best == entries_.end() || d < best_d) {
      best = it;
      best_d = d;
    }
  }
  if (best == entries_.end()) return std::nullopt;
  used_.insert(best->first);
  return best->second;
}

std::string TimingCache::to_text(bool only_used) const {
  std::lock_guard<std::mutex> lock(mu_);
  std::string out;
  for (const auto& [key, value] : entries_) {
    if (!only_used || used_.count(key)) out += key + "\t" + value + "\n";
  }
  return out;
}

Status TimingCache::merge_text(const std::string& text, const std::string& name) {
  std::lock_guard<std::mutex> lock(mu_);
  std::istringstream in(text);
  std::string line;
  for (int n = 1; std::getline(in, line); ++n) {
    if (line.empty()) continue;
    size_t tab = line.find('\t');
    size_t bars = line.find('|') == std::string::npos ? std::string::npos : line.find('|', line.find('|') + 1);
    if (tab == std::string::npos || bars == std::string::npos || bars > tab || line.find('\t', tab + 1) != std::string::npos) {
      return KILN_ERROR(kInvalidModel, "{}:{}: not a timing-cache entry (TARGET|KIND|SIGNATURE<tab>VALUE)", name, n);
    }
    entries_[line.substr(0, tab)] = line.substr(tab + 1);
  }
  return Status::ok();
}

Status TimingCache::merge_file(const std::string& path) {
  std::error_code ec;
  if (!fs::exists(path, ec)) return Status::ok();
  std::ifstream f(path, std::ios::binary);
  if (!f) return KILN_ERROR(kIo, "{}: cannot open the timing cache", path);
  std::stringstream ss;
  ss << f.rdbuf();
  return merge_text(ss.str(), path);
}

Status TimingCache::save_file(const std::string& path) const {
  std::error_code ec;
  fs::path p(path);
  if (p.has_parent_path()) fs::create_directories(p.parent_path(), ec);
  std::string tmp = path + fmt::format(".partial.{}", ::getpid());
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    f << to_text(false);
    f.close();
    if (!f) {
      fs::remove(tmp, ec);
      return KILN_ERROR(kIo, "{}: cannot write the timing cache", path);
    }
  }
  fs::rename(tmp, path, ec);
  if (ec) {
    fs::remove(tmp, ec);
    return KILN_ERROR(kIo, "{}: cannot write the timing cache: {}", path, ec.message());
  }
  return Status::ok();
}

size_t TimingCache::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return entries_.size();
}

}  // namespace kiln::cuda
