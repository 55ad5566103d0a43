// `conveyor cache warm|info|clear`: the node-wide decoded-frame cache (pipeline/frame_store.h,
// docs/pipeline.md "The decoded-frame cache"), and the frame cache flags every command that runs
// a pipeline shares (batches, serve).
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "base/json_text.h"
#include "absl/strings/str_format.h"
#include "base/status_macros.h"
#include "base/strings.h"
#include "pipeline/cache_warm.h"
#include "pipeline/frame_cache.h"
#include "pipeline/pipeline.h"
#include "pipeline/source.h"
#include "tools/command.h"
#include "tools/commands.h"

namespace conveyor::tools {

void AddFrameCacheFlags(CLI::App* c, FrameCacheFlags* f) {
  c->add_option("--frame-cache-bytes", f->bytes,
                "Keep decoded frames in this process's memory across epochs and streams, up to this many bytes "
                "(0: none; docs/pipeline.md)")->transform(CLI::AsSizeValue(true))
      ->capture_default_str();
  c->add_option("--frame-cache-policy", f->policy, "pin (keep what fits) or lru")
      ->capture_default_str()
      ->check(CLI::IsMember({"pin", "lru"}));
  c->add_option("--frame-cache-dir", f->dir,
                "Share decoded frames with this user's processes on this node through this directory (/dev/shm/...: "
                "shared memory; a local disk; created 0700)")
      ->envname("CONVEYOR_FRAME_CACHE_DIR");
  c->add_option("--frame-cache-shared-key", f->shared_key,
                "Share --frame-cache-dir with a group: a node secret file (32+ random bytes, readable by that group "
                "only) that authenticates every frame (docs/serving.md \"Shared nodes\"); without it the directory "
                "is private to this user")
      ->envname("CONVEYOR_FRAME_CACHE_SHARED_KEY");
  c->add_option("--frame-cache-dir-bytes", f->dir_bytes,
                "The directory's bound for the whole node (0: a quarter of its filesystem)")->transform(CLI::AsSizeValue(true))
      ->envname("CONVEYOR_FRAME_CACHE_DIR_BYTES");
  c->add_option("--frame-cache-compression", f->compression, "How the directory keeps frames: none, lz4 or zstd")
      ->capture_default_str()
      ->check(CLI::IsMember({"none", "lz4", "zstd"}));
  c->add_flag("--frame-cache-prefault", f->prefault,
              "Before the first batch, map the pages the memory tier will keep in one epoch (at most "
              "--frame-cache-bytes), so that epoch 1 pays no page faults for them (costs that memory "
              "and about 0.4 CPU s per GB at start)");
}

FrameCacheConfig ToConfig(const FrameCacheFlags& f) {
  FrameCacheConfig c;
  c.bytes = f.bytes;
  c.policy = f.policy;
  c.dir = f.dir;
  c.shared_key = f.shared_key;
  c.dir_bytes = f.dir_bytes;
  c.compression = f.compression;
  return c;
}

void ApplyFrameCache(const FrameCacheFlags& f, ServerOptions* so) {
  so->frame_cache_bytes = f.bytes;
  so->frame_cache_policy = f.policy;
  so->frame_cache_dir = f.dir;
  so->frame_cache_shared_key = f.shared_key;
  so->frame_cache_dir_bytes = f.dir_bytes;
  so->frame_cache_compression = f.compression;
}

std::string FrameCacheSummary(const FrameCacheStats& fc, const std::string& policy) {
  std::string out;
  if (fc.max_bytes > 0) {
    out += absl::StrFormat("memory (%s): holds %llu frames, %.1f of %.1f MB; %llu rejected, %.1f MB evicted", policy.c_str(),
                     static_cast<unsigned long long>(fc.frames), fc.bytes / 1e6, fc.max_bytes / 1e6,
                     static_cast<unsigned long long>(fc.rejected), fc.evicted_bytes / 1e6);
    if (fc.prefaulted_bytes > 0) {
      out += absl::StrFormat("; pre-faulted %.1f MB, %llu buffers lent to decoders, %.1f MB left in the pool",
                             fc.prefaulted_bytes / 1e6, static_cast<unsigned long long>(fc.buffers_lent),
                             fc.pool_bytes / 1e6);
    }
  }
  if (fc.has_store) {
    const FrameStoreStats& s = fc.store;
    if (!out.empty()) out += "; ";
    const double lookups = static_cast<double>(s.hits + s.misses);
    out += absl::StrFormat(
        "node store: %llu hits (%.1f%%), %llu misses, %llu published (%.1f MB), %llu already there, %llu "
        "rejected, %.1f MB evicted, %llu corrupt, %llu write errors; the node holds %.1f of %.1f MB",
        static_cast<unsigned long long>(s.hits), lookups > 0 ? 100.0 * static_cast<double>(s.hits) / lookups : 0.0,
        static_cast<unsigned long long>(s.misses), static_cast<unsigned long long>(s.published), s.published_bytes / 1e6,
        static_cast<unsigned long long>(s.already_present), static_cast<unsigned long long>(s.rejected),
        s.evicted_bytes / 1e6, static_cast<unsigned long long>(s.corrupt),
        static_cast<unsigned long long>(s.write_errors), s.usage_bytes / 1e6, s.max_bytes / 1e6);
  }
  return out;
}

namespace {

struct CacheOptions {
  std::string dataset;
  std::string config;
  int threads = 0;  // 0: one per core
  FrameCacheFlags frame_cache;
  std::string dataset_prefix;  // clear: only this dataset key
  bool json = false;
};

absl::StatusOr<std::string> ReadText(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return absl::NotFoundError(StrCat("cannot open config ", path));
  std::stringstream text;
  text << f.rdbuf();
  return text.str();
}

absl::Status RunWarm(const CacheOptions& o) {
  if (o.frame_cache.prefault) {
    return absl::InvalidArgumentError("--frame-cache-prefault is for the memory tier; warming fills the node's store");
  }
  if (o.frame_cache.dir.empty()) {
    return absl::InvalidArgumentError("--frame-cache-dir (or CONVEYOR_FRAME_CACHE_DIR) is required: warming fills the node's store");
  }
  ASSIGN_OR_RETURN(std::unique_ptr<Source> source, Source::Open(o.dataset));
  ASSIGN_OR_RETURN(std::string text, ReadText(o.config));
  ASSIGN_OR_RETURN(SampleSpec spec, SampleSpec::FromYaml(text, source->manifest(), o.config));
  FrameCacheFlags flags = o.frame_cache;
  flags.bytes = 0;  // the process ends: only the node's store is worth filling
  ASSIGN_OR_RETURN(std::shared_ptr<DecodedFrameCache> cache, MakeFrameCache(ToConfig(flags)));
  WarmOptions wo;
  const long cores = ::sysconf(_SC_NPROCESSORS_ONLN);
  wo.threads = o.threads > 0 ? o.threads : static_cast<int>(std::max(1L, cores));
  const bool tty = ::isatty(STDERR_FILENO) != 0;
  auto last = std::chrono::steady_clock::now();
  wo.progress = [&](const WarmProgress& p) {
    const auto now = std::chrono::steady_clock::now();
    if (p.episodes_done != p.episodes && now - last < std::chrono::seconds(1)) return;
    last = now;
    std::fprintf(stderr, "%swarm: %llu/%llu episodes, %llu frames decoded (%.0f frames/s, %.1f MB/s), %llu already cached%s",
                 tty ? "\r" : "", static_cast<unsigned long long>(p.episodes_done),
                 static_cast<unsigned long long>(p.episodes), static_cast<unsigned long long>(p.frames_decoded),
                 p.frames_decoded / std::max(p.seconds, 1e-9), p.bytes_decoded / 1e6 / std::max(p.seconds, 1e-9),
                 static_cast<unsigned long long>(p.frames_present), tty ? "   " : "\n");
  };
  ASSIGN_OR_RETURN(WarmProgress p, WarmFrameCache(*source, spec, cache.get(), wo));
  if (tty) std::fprintf(stderr, "\n");
  const FrameCacheStats fc = cache->stats();
  std::printf(
      "warmed %s for %s: %llu episodes (%llu failed), %llu frames needed, %llu decoded in %.2f s (%.0f frames/s), "
      "%llu already cached; %s\n",
      o.frame_cache.dir.c_str(), o.config.c_str(), static_cast<unsigned long long>(p.episodes_done),
      static_cast<unsigned long long>(p.episodes_failed), static_cast<unsigned long long>(p.frames_needed),
      static_cast<unsigned long long>(p.frames_decoded), p.seconds, p.frames_decoded / std::max(p.seconds, 1e-9),
      static_cast<unsigned long long>(p.frames_present), FrameCacheSummary(fc, o.frame_cache.policy).c_str());
  if (fc.store.rejected > 0) {
    std::printf("note: %llu frames did not fit the store's bound (%.1f MB); raise --frame-cache-dir-bytes to hold them all\n",
                static_cast<unsigned long long>(fc.store.rejected), fc.store.max_bytes / 1e6);
  }
  if (p.episodes_failed > 0) {
    return absl::DataLossError(StrCat(p.episodes_failed, " of ", p.episodes, " episodes could not be warmed (see the warnings)"));
  }
  return absl::OkStatus();
}

void PrintUsage(const FrameStoreUsage& u, const std::string& dir, bool json) {
  if (json) {
    nlohmann::json j = {{"dir", dir},
                        {"entries", u.entries},
                        {"bytes", u.bytes},
                        {"pixel_bytes", u.pixel_bytes},
                        {"accounted_bytes", u.accounted_bytes},
                        {"tmp_files", u.tmp_files},
                        {"tmp_bytes", u.tmp_bytes},
                        {"datasets", nlohmann::json::array()}};
    for (const auto& d : u.datasets) {
      j["datasets"].push_back({{"key", d.key}, {"name", d.name}, {"entries", d.entries}, {"bytes", d.bytes},
                               {"pixel_bytes", d.pixel_bytes}});
    }
    std::printf("%s\n", JsonText(j).c_str());
    return;
  }
  std::printf("frame cache %s: %llu frames, %.1f MB on disk (%.1f MB of pixels, %.2fx), accounted %.1f MB; %llu tmp files (%.1f MB)\n",
              dir.c_str(), static_cast<unsigned long long>(u.entries), u.bytes / 1e6, u.pixel_bytes / 1e6,
              u.bytes > 0 ? static_cast<double>(u.pixel_bytes) / static_cast<double>(u.bytes) : 0.0,
              u.accounted_bytes / 1e6, static_cast<unsigned long long>(u.tmp_files), u.tmp_bytes / 1e6);
  for (const auto& d : u.datasets) {
    std::printf("  %s  %llu frames  %.1f MB  %s\n", d.key.c_str(), static_cast<unsigned long long>(d.entries),
                d.bytes / 1e6, d.name.c_str());
  }
}

class CacheCommand final : public Command {
 public:
  CLI::App* Register(CLI::App& app) override {
    CLI::App* c = app.add_subcommand("cache", "The node's decoded-frame cache: warm it ahead of a job, inspect or clear it");
    c->require_subcommand(1);
    warm_ = c->add_subcommand("warm", "Decode every frame a config's samples need into the node's frame cache directory, with progress");
    warm_->add_option("dataset", o_.dataset, "Dataset path, URL or mixture file")->required();
    warm_->add_option("--config", o_.config, "Config (YAML): the streams and decode settings the jobs will use")->required();
    warm_->add_option("--threads", o_.threads, "Decode threads (0: one per core)")->check(CLI::NonNegativeNumber);
    AddFrameCacheFlags(warm_, &o_.frame_cache);
    info_ = c->add_subcommand("info", "What the frame cache directory holds, per dataset");
    info_->add_option("dir", o_.frame_cache.dir, "The directory (default: CONVEYOR_FRAME_CACHE_DIR)")
        ->envname("CONVEYOR_FRAME_CACHE_DIR");
    info_->add_flag("--json", o_.json, "One JSON object");
    clear_ = c->add_subcommand("clear", "Remove the frames of the frame cache directory (all, or one dataset's)");
    clear_->add_option("dir", o_.frame_cache.dir, "The directory (default: CONVEYOR_FRAME_CACHE_DIR)")
        ->envname("CONVEYOR_FRAME_CACHE_DIR");
    clear_->add_option("--dataset", o_.dataset_prefix, "Only the dataset whose key starts with this (see cache info)");
    return c;
  }
  absl::Status Run() override {
    if (warm_->parsed()) return RunWarm(o_);
    if (o_.frame_cache.dir.empty()) return absl::InvalidArgumentError("give the directory (or set CONVEYOR_FRAME_CACHE_DIR)");
    if (info_->parsed()) {
      ASSIGN_OR_RETURN(FrameStoreUsage u, FrameStore::Scan(o_.frame_cache.dir));
      PrintUsage(u, o_.frame_cache.dir, o_.json);
      return absl::OkStatus();
    }
    ASSIGN_OR_RETURN(FrameStoreUsage before, FrameStore::Clear(o_.frame_cache.dir, o_.dataset_prefix));
    ASSIGN_OR_RETURN(FrameStoreUsage after, FrameStore::Scan(o_.frame_cache.dir));
    std::printf("cleared %s: %llu frames (%.1f MB) removed, %llu left\n", o_.frame_cache.dir.c_str(),
                static_cast<unsigned long long>(before.entries - after.entries), (before.bytes - after.bytes) / 1e6,
                static_cast<unsigned long long>(after.entries));
    return absl::OkStatus();
  }

 private:
  CacheOptions o_;
  CLI::App* warm_ = nullptr;
  CLI::App* info_ = nullptr;
  CLI::App* clear_ = nullptr;
};

}  // namespace

std::unique_ptr<Command> NewCacheCommand() {
  return std::make_unique<CacheCommand>();
}

}  // namespace conveyor::tools
