// decode_bench: per-modality decode throughput of Conveyor's decoders on one core, each figure
// beside the reference tool run on the same file in the same run.
//
// Inputs are made with the `conveyor` CLI next to this binary (synth, import, extract) and with
// ffmpeg, in --work_dir (kept and reused when given; a temp dir removed at exit otherwise). Then
// the process pins itself to one CPU (--cpu; the reference tools it starts inherit the pinning),
// so every figure, Conveyor's and the tools', is per core. Workloads (--only picks groups):
//
//   video     sequential decode + RGB24 of every frame of an episode's camera, one frame per
//             VideoDecoder::Decode call (224x224 and 1280x720 H.264, GOP 30, 2 B-frames), against
//               ffmpeg -threads 1 -i F -pix_fmt rgb24 -f null -   (decode + convert: the headline)
//               ffmpeg -threads 1 -i F -f null -                  (decode only)
//             on the stream remuxed back to .mp4 by `conveyor extract`, timed by the wall clock
//             of the whole process. Both sides loop over the episode (ffmpeg: -stream_loop) until
//             enough frames are decoded that ffmpeg's start-up (measured, printed) is small. Also
//             libavcodec alone on the same packets (in process, no conversion): a decode-only
//             floor. Random access: single frames uniform over the episode (fixed seed), with the
//             decoder's amplification (frames decoded per frame delivered) and the ideal, the
//             sequential rate divided by the amplification.
//   assembly  SampleAssembler::Assemble with examples/aloha_like.yaml (3 cameras 224x224, state,
//             50 actions, 1 s of audio, instruction), sample indices in order and shuffled;
//             frames delivered per second against ffmpeg's sequential decode + RGB24 of one of
//             the same cameras (each delivered frame costs at least one decode and conversion).
//   jpeg      ImageDecoder::Decode of one file in a loop (full size and min size half) against
//             tjbench -rgb on the same file (its "Frame rate", images/s).
//   audio     AudioDecoder::DecodeWindow over consecutive 1 s windows at the stream's own rate and
//             channels (16 kHz mono AAC from synth, 44.1 kHz stereo AAC imported), with
//             --audio_method (chunks: what new jobs get, the default; per_window: pipeline
//             versions 1-2; it applies to the assembly group's audio too; --audio_cold: no chunk
//             kept from one window to the next, the cost of windows far apart), against
//             ffmpeg -threads 1 -i F -f null - (and -c:a pcm_f32le, float output like Conveyor's)
//             on the extracted .m4a, looped the same number of times.
//   lowdim    Dataset::ReadLowdim windows of 50 steps x 14 dims at random positions, and the same
//             through SampleAssembler with normalization, against `zstd -b3 -B14336` (in-process
//             zstd benchmark, 14336-byte chunks like Conveyor's 256-step blocks) decompressing the
//             same array, byte-shuffled the way the blocks are.
//
// Each figure is the best of --reps runs; Conveyor's and the reference's runs alternate. The
// machine is shared, so before each run it waits (within --max_wait_s in all) until the rest of
// the machine has used less than --quiet_below CPUs for a second, and it reports for every row how
// much CPU the rest of the machine used during the runs compared ("others"). It prints a table
// (benchmark | value | reference | ratio) and one JSON line, and writes the JSON to --json.
//
// Usage: decode_bench [--quick] [--reps=3] [--cpu=0] [--work_dir=DIR] [--json=FILE]
//                     [--only=video,assembly,jpeg,audio,lowdim] [--conveyor=PATH]
//                     [--quiet_below=0.25] [--max_wait_s=900] [--audio_method=chunks]

#include <fcntl.h>
#include <sched.h>
#include <spawn.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <limits>
#include <memory>
#include <optional>
#include <random>
#include <set>
#include <span>
#include <sstream>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "bench/machine_info.h"
#include "base/status_macros.h"
#include "base/strings.h"
#include "conveyor/format/v1/shard.pb.h"
#include "media/audio_decoder.h"
#include "media/image_decoder.h"
#include "sample/sample_assembler.h"
#include "sample/sample_spec.h"
#include "media/video_decoder.h"
#include "nlohmann/json.hpp"
#include "datasets/dataset.h"
#include "format/npy.h"

extern "C" {
#include <libavcodec/avcodec.h>
#include <libavutil/pixdesc.h>
}

extern char** environ;

namespace conveyor {
namespace {

namespace pb = format::v1;
using Clock = std::chrono::steady_clock;
using json = nlohmann::json;

double SecondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// ---------------------------------------------------------------------------------------------
// Flags

struct Flags {
  bool quick = false;
  int reps = 3;
  int cpu = 0;                // -1: do not pin
  double quiet_below = 0.25;  // CPUs the rest of the machine may use before a run (< 0: no wait)
  double max_wait_s = 900;    // total time to wait for such quiet moments
  std::string work_dir;
  std::string json_path;
  std::string conveyor;
  std::set<std::string> only;
  AudioMethod audio_method = AudioMethod::kChunks;
  bool audio_cold = false;  // chunks: forget the kept chunks before every window
};

const std::set<std::string> kGroups = {"video", "assembly", "jpeg", "audio", "lowdim"};

constexpr char kUsage[] =
    "usage: decode_bench [--quick] [--reps=3] [--cpu=0] [--work_dir=DIR] [--json=FILE]\n"
    "                    [--only=video,assembly,jpeg,audio,lowdim] [--conveyor=PATH]\n"
    "                    [--quiet_below=0.25] [--max_wait_s=900]\n"
    "                    [--audio_method=chunks|per_window] [--audio_cold]";

[[noreturn]] void Die(std::string_view message) {
  std::cerr << "decode_bench: " << message << "\n" << kUsage << "\n";
  std::exit(2);
}

Flags ParseFlags(int argc, char** argv) {
  Flags flags;
#ifdef CONVEYOR_CLI
  flags.conveyor = CONVEYOR_CLI;
#endif
  bool reps_set = false;
  for (int i = 1; i < argc; ++i) {
    absl::string_view arg = argv[i];
    if (arg == "--quick") {
      flags.quick = true;
    } else if (absl::ConsumePrefix(&arg, "--reps=")) {
      if (!absl::SimpleAtoi(arg, &flags.reps) || flags.reps < 1) Die("--reps needs a number >= 1");
      reps_set = true;
    } else if (absl::ConsumePrefix(&arg, "--cpu=")) {
      if (!absl::SimpleAtoi(arg, &flags.cpu) || flags.cpu < -1)
        Die("--cpu needs a CPU number or -1");
    } else if (absl::ConsumePrefix(&arg, "--quiet_below=")) {
      if (!absl::SimpleAtod(arg, &flags.quiet_below)) Die("--quiet_below needs a number of CPUs");
    } else if (absl::ConsumePrefix(&arg, "--max_wait_s=")) {
      if (!absl::SimpleAtod(arg, &flags.max_wait_s) || flags.max_wait_s < 0) {
        Die("--max_wait_s needs a number of seconds >= 0");
      }
    } else if (absl::ConsumePrefix(&arg, "--work_dir=")) {
      flags.work_dir = std::string(arg);
    } else if (absl::ConsumePrefix(&arg, "--json=")) {
      flags.json_path = std::string(arg);
    } else if (absl::ConsumePrefix(&arg, "--conveyor=")) {
      flags.conveyor = std::string(arg);
    } else if (arg == "--audio_cold") {
      flags.audio_cold = true;
    } else if (absl::ConsumePrefix(&arg, "--audio_method=")) {
      if (arg == "chunks") {
        flags.audio_method = AudioMethod::kChunks;
      } else if (arg == "per_window") {
        flags.audio_method = AudioMethod::kPerWindow;
      } else {
        Die("--audio_method is chunks or per_window");
      }
    } else if (absl::ConsumePrefix(&arg, "--only=")) {
      for (absl::string_view g : absl::StrSplit(arg, ',', absl::SkipEmpty())) {
        if (kGroups.count(std::string(g)) == 0) Die(StrCat("unknown group in --only: ", g));
        flags.only.insert(std::string(g));
      }
    } else if (arg == "--help" || arg == "-h") {
      std::cout << kUsage << "\n";
      std::exit(0);
    } else {
      Die(StrCat("unknown flag ", argv[i]));
    }
  }
  if (flags.only.empty()) flags.only = kGroups;
  if (flags.quick && !reps_set) flags.reps = 1;
  if (flags.quick) flags.quiet_below = -1;
  if (flags.conveyor.empty()) Die("no conveyor CLI compiled in: pass --conveyor=PATH");
  return flags;
}

// ---------------------------------------------------------------------------------------------
// Child processes

struct ProcessRun {
  double wall_s = 0;   // spawn to exit
  double cpu_s = 0;    // user + system of the child
  std::string output;  // stdout and stderr together
};

std::string ReadWholeFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string QuoteArg(const std::string& s) {
  if (!s.empty() && s.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                        "0123456789-_./=:,+") == std::string::npos) {
    return s;
  }
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

std::string CommandLine(const std::vector<std::string>& argv) {
  std::string s;
  for (const std::string& a : argv) StrAppend(&s, s.empty() ? "" : " ", QuoteArg(a));
  return s;
}

// Runs argv (no shell; PATH is searched) with stdin from /dev/null and stdout+stderr into
// `log_path`, and times it: the wall clock from spawn to exit, and the child's CPU time.
absl::StatusOr<ProcessRun> Exec(const std::vector<std::string>& argv, const std::string& log_path) {
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&actions, 1, log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC,
                                   0644);
  posix_spawn_file_actions_adddup2(&actions, 1, 2);
  pid_t pid = 0;
  const Clock::time_point start = Clock::now();
  const int err = posix_spawnp(&pid, args[0], &actions, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (err != 0) {
    return absl::FailedPreconditionError(
        StrCat("cannot run ", argv[0], ": ", std::strerror(err), " (is it installed?)"));
  }
  int status = 0;
  rusage usage{};
  if (wait4(pid, &status, 0, &usage) < 0) {
    return absl::InternalError(StrCat("waiting for ", argv[0], ": ", std::strerror(errno)));
  }
  ProcessRun run;
  run.wall_s = SecondsSince(start);
  run.cpu_s = static_cast<double>(usage.ru_utime.tv_sec + usage.ru_stime.tv_sec) +
              static_cast<double>(usage.ru_utime.tv_usec + usage.ru_stime.tv_usec) * 1e-6;
  run.output = ReadWholeFile(log_path);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    const std::string tail =
        run.output.size() > 2000 ? run.output.substr(run.output.size() - 2000) : run.output;
    return absl::InternalError(
        StrCat("command failed (status ", status, "): ", CommandLine(argv), "\n", tail));
  }
  return run;
}

bool HaveTool(const std::string& name) {
  const char* path = std::getenv("PATH");
  for (absl::string_view dir : absl::StrSplit(path != nullptr ? path : "/usr/bin", ':')) {
    const std::string p = StrCat(dir, "/", name);
    if (access(p.c_str(), X_OK) == 0) return true;
  }
  return false;
}

// ---------------------------------------------------------------------------------------------
// Results

// A reference tool's figure: the best of its runs.
struct Reference {
  std::string name;     // short label for the table
  std::string command;  // what was run (paths shortened in the table, full in the JSON)
  std::string timing;   // where the time comes from
  double value = 0;     // in `unit`
  std::string unit;
  json extra = json::object();
};

struct Row {
  std::string group;
  std::string name;
  double value = 0;
  std::string unit;
  std::string reference;  // label of the reference, or a description
  double reference_value = 0;
  std::optional<double> goal;  // minimum ratio, where the brief sets one
  std::string note;
  json extra = json::object();
  double others_cpus = -1;  // the rest of the machine's CPU use during the runs; < 0: unknown
  double ratio() const { return reference_value > 0 ? value / reference_value : 0; }
};

struct Report {
  std::vector<Reference> references;
  std::vector<Row> rows;
  std::vector<std::string> notes;
};

// Runs `conveyor_run` and each of `reference_runs` `reps` times, alternating, and keeps each
// one's shortest time.
// Busy CPU time of the whole machine from /proc/stat, seconds summed over all CPUs.
struct CpuTicks {
  double busy_s = 0;
};

CpuTicks ReadCpuTicks() {
  std::ifstream in("/proc/stat");
  std::string name;
  uint64_t user = 0, nice = 0, system = 0, idle = 0, iowait = 0, irq = 0, softirq = 0, steal = 0;
  in >> name >> user >> nice >> system >> idle >> iowait >> irq >> softirq >> steal;
  static const double hz = static_cast<double>(sysconf(_SC_CLK_TCK));
  return CpuTicks{static_cast<double>(user + nice + system + irq + softirq + steal) / hz};
}

// Before each run, waits until the rest of the machine has been nearly idle for a second (other
// people's builds on a shared machine land in the measurements otherwise), within a total
// budget; then goes ahead anyway and counts that.
class QuietGate {
 public:
  QuietGate(double below_cpus, double max_wait_s) : below_(below_cpus), budget_s_(max_wait_s) {}

  void Wait() {
    if (below_ < 0) return;
    while (true) {
      const CpuTicks a = ReadCpuTicks();
      const Clock::time_point start = Clock::now();
      std::this_thread::sleep_for(std::chrono::seconds(1));
      const double dt = SecondsSince(start);
      const double busy = (ReadCpuTicks().busy_s - a.busy_s) / dt;
      if (busy < below_) return;
      waited_s_ += dt;
      if (waited_s_ >= budget_s_) {
        ++gave_up_;
        return;
      }
    }
  }
  double waited_s() const { return waited_s_; }
  int gave_up() const { return gave_up_; }

 private:
  double below_;
  double budget_s_;
  double waited_s_ = 0;
  int gave_up_ = 0;
};

struct RunPolicy {
  int reps = 3;
  QuietGate* gate = nullptr;
};

struct Timings {
  double conveyor_s = std::numeric_limits<double>::infinity();
  double conveyor_cpu_s = 0;   // CPU time of this process in the fastest run
  double conveyor_others = 0;  // CPUs the rest of the machine used during the fastest run
  std::vector<double> conveyor_all_s;
  std::vector<double> conveyor_all_others;
  std::vector<double> reference_s;
  std::vector<ProcessRun> reference_runs;  // the fastest run of each
  std::vector<double> reference_others;    // as conveyor_others, for each reference's fastest
  std::vector<std::vector<double>> reference_all_s;
  std::vector<std::vector<double>> reference_all_others;

  // The most CPU the rest of the machine used during the runs a ratio is made of (the fastest
  // Conveyor run and the fastest run of reference `ref`, or only Conveyor's when ref < 0).
  double Others(int ref = -1) const {
    double o = conveyor_all_s.empty() ? 0 : conveyor_others;
    if (ref >= 0) o = std::max(o, reference_others[static_cast<size_t>(ref)]);
    return o;
  }
};

double ProcessCpuSeconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

// Runs `conveyor_run` and each of `reference_runs` policy.reps times, alternating, each after a
// quiet moment, and keeps each one's shortest time and how busy the rest of the machine was then
// (the machine's busy CPUs minus the run's own CPU time, per second of the run).
absl::StatusOr<Timings> Alternate(
    const RunPolicy& policy, const std::function<absl::StatusOr<double>()>& conveyor_run,
    const std::vector<std::function<absl::StatusOr<ProcessRun>()>>& reference_runs) {
  Timings t;
  const size_t n = reference_runs.size();
  t.reference_s.assign(n, std::numeric_limits<double>::infinity());
  t.reference_runs.resize(n);
  t.reference_others.assign(n, 0);
  t.reference_all_s.resize(n);
  t.reference_all_others.resize(n);
  auto others = [&](const CpuTicks& before, double own_cpu_s, double wall_s) {
    return std::max(0.0, (ReadCpuTicks().busy_s - before.busy_s - own_cpu_s) / wall_s);
  };
  for (int r = 0; r < policy.reps; ++r) {
    if (conveyor_run) {
      if (policy.gate != nullptr) policy.gate->Wait();
      const CpuTicks ticks = ReadCpuTicks();
      const double cpu_before = ProcessCpuSeconds();
      const Clock::time_point start = Clock::now();
      ASSIGN_OR_RETURN(const double s, conveyor_run());
      const double cpu = ProcessCpuSeconds() - cpu_before;
      const double o = others(ticks, cpu, SecondsSince(start));
      t.conveyor_all_s.push_back(s);
      t.conveyor_all_others.push_back(o);
      if (s < t.conveyor_s) {
        t.conveyor_s = s;
        t.conveyor_cpu_s = cpu;
        t.conveyor_others = o;
      }
    }
    for (size_t i = 0; i < n; ++i) {
      if (policy.gate != nullptr) policy.gate->Wait();
      const CpuTicks ticks = ReadCpuTicks();
      ASSIGN_OR_RETURN(ProcessRun run, reference_runs[i]());
      const double o = others(ticks, run.cpu_s, run.wall_s);
      t.reference_all_s[i].push_back(run.wall_s);
      t.reference_all_others[i].push_back(o);
      if (run.wall_s < t.reference_s[i]) {
        t.reference_s[i] = run.wall_s;
        t.reference_others[i] = o;
        t.reference_runs[i] = std::move(run);
      }
    }
  }
  return t;
}

// Every run's time, for judging the noise: Conveyor's (wall, and CPU of the fastest) and each
// reference process's wall clock.
json TimingsJson(const Timings& t) {
  json j = {{"conveyor_runs_s", t.conveyor_all_s},
            {"conveyor_runs_others_cpus", t.conveyor_all_others},
            {"conveyor_best_cpu_s", t.conveyor_cpu_s},
            {"reference_runs_s", t.reference_all_s},
            {"reference_runs_others_cpus", t.reference_all_others}};
  json cpu = json::array();
  for (const ProcessRun& r : t.reference_runs) cpu.push_back(r.cpu_s);
  j["reference_best_cpu_s"] = cpu;
  return j;
}

// The last "frame=   N" in ffmpeg's progress output (0 when there is none).
int64_t FfmpegFrames(const std::string& output) {
  int64_t frames = 0;
  size_t pos = 0;
  while ((pos = output.find("frame=", pos)) != std::string::npos) {
    pos += 6;
    while (pos < output.size() && output[pos] == ' ') ++pos;
    size_t end = pos;
    while (end < output.size() && std::isdigit(static_cast<unsigned char>(output[end]))) ++end;
    int64_t v = 0;
    if (absl::SimpleAtoi(absl::string_view(output).substr(pos, end - pos), &v)) frames = v;
  }
  return frames;
}

// The last "time=HH:MM:SS.ss" in ffmpeg's progress output, seconds (0 when there is none).
double FfmpegTime(const std::string& output) {
  double seconds = 0;
  size_t pos = 0;
  while ((pos = output.find("time=", pos)) != std::string::npos) {
    pos += 5;
    int h = 0, m = 0;
    double s = 0;
    if (std::sscanf(output.c_str() + pos, "%d:%d:%lf", &h, &m, &s) == 3) {
      seconds = h * 3600.0 + m * 60.0 + s;
    }
  }
  return seconds;
}

// ---------------------------------------------------------------------------------------------
// Environment: work dir, datasets, the CLI

class Bench {
 public:
  Bench(Flags flags, std::string work) : flags_(std::move(flags)), work_(std::move(work)) {}

  absl::Status Run();

 private:
  std::string Path(std::string_view name) const { return StrCat(work_, "/", name); }
  std::string Log() const { return Path("command.log"); }

  // Runs an untimed setup command (synth, import, extract, ffmpeg making inputs).
  absl::Status Setup(const std::vector<std::string>& argv) {
    if (!flags_.quick) std::cerr << "decode_bench: $ " << CommandLine(argv) << "\n";
    return Exec(argv, Log()).status();
  }
  // Makes `out` with `argv` unless the work dir already has it from the same command.
  absl::Status Cached(const std::string& out, const std::vector<std::string>& argv,
                      const std::function<absl::Status()>& make);
  absl::StatusOr<std::string> Synth(const std::string& name, std::vector<std::string> args);
  absl::StatusOr<std::string> Extract(const std::string& dataset, const std::string& stream,
                                      const std::string& out_name);

  absl::Status VideoGroup();
  absl::Status VideoSize(const std::string& label, const std::string& dataset, int64_t min_frames,
                         int random_accesses);
  absl::Status AssemblyGroup();
  absl::Status JpegGroup();
  absl::Status AudioGroup();
  absl::Status AudioStream(const std::string& label, const std::string& dataset,
                           const std::string& stream, double min_audio_s);
  absl::Status LowdimGroup();

  void AddReference(Reference r) { report_.references.push_back(std::move(r)); }
  void AddRow(Row r) { report_.rows.push_back(std::move(r)); }
  void Print(const json& doc) const;
  json ToJson(const std::string& load_before) const;

  // Runs the ffmpeg command `ffmpeg -nostdin -threads 1 [-stream_loop N] -i FILE EXTRA...`.
  std::vector<std::string> FfmpegCommand(const std::string& file, int loops,
                                         const std::vector<std::string>& extra) const {
    std::vector<std::string> argv = {"ffmpeg", "-nostdin", "-hide_banner", "-threads", "1"};
    if (loops > 1) {
      argv.push_back("-stream_loop");
      argv.push_back(StrCat(loops - 1));
    }
    argv.insert(argv.end(), {"-i", file});
    argv.insert(argv.end(), extra.begin(), extra.end());
    return argv;
  }
  // Shortens the work dir in commands shown in the table.
  std::string Short(const std::string& command) const {
    std::string s = command;
    for (size_t pos; (pos = s.find(work_ + "/")) != std::string::npos;) {
      s.replace(pos, work_.size() + 1, "");
    }
    return s;
  }

  // The synth datasets. v224: one 224x224 camera (also the audio and lowdim source); v720: one
  // 1280x720 camera; asm: three 224x224 cameras, for aloha_like.yaml.
  std::vector<std::string> Video224Args() const {
    return {"--episodes", "1", "--cameras", "1", "--episode-seconds", flags_.quick ? "4" : "120"};
  }
  std::vector<std::string> Video720Args() const {
    return {"--episodes", "1", "--cameras", "1", "--size", "1280x720", "--episode-seconds", "10"};
  }
  std::vector<std::string> AssemblyArgs() const {
    if (flags_.quick) return {"--episodes", "1", "--cameras", "3", "--episode-seconds", "3"};
    return {"--episodes", "2", "--cameras", "3", "--episode-seconds", "30"};
  }

  Flags flags_;
  std::string work_;
  QuietGate gate_{flags_.quiet_below, flags_.max_wait_s};
  RunPolicy policy_{flags_.reps, &gate_};
  Report report_;
  double ffmpeg_startup_s_ = 0;
};

absl::Status Bench::Cached(const std::string& out, const std::vector<std::string>& argv,
                           const std::function<absl::Status()>& make) {
  const std::string stamp = out + ".cmd";
  const std::string command = CommandLine(argv);
  std::error_code ec;
  if (std::filesystem::exists(out, ec) && std::filesystem::exists(stamp, ec) &&
      ReadWholeFile(stamp) == command) {
    return absl::OkStatus();
  }
  std::filesystem::remove_all(out, ec);
  std::filesystem::remove(stamp, ec);
  RETURN_IF_ERROR(make());
  std::ofstream(stamp, std::ios::trunc) << command;
  return absl::OkStatus();
}

absl::StatusOr<std::string> Bench::Synth(const std::string& name, std::vector<std::string> args) {
  const std::string out = Path(name);
  std::vector<std::string> argv = {flags_.conveyor, "synth", "--out", out, "--quiet"};
  argv.insert(argv.end(), args.begin(), args.end());
  RETURN_IF_ERROR(Cached(out, argv, [&] { return Setup(argv); }));
  return out;
}

absl::StatusOr<std::string> Bench::Extract(const std::string& dataset, const std::string& stream,
                                           const std::string& out_name) {
  const std::string out = Path(out_name);
  const std::vector<std::string> argv = {flags_.conveyor, "extract", dataset, "--episode", "0",
                                         "--stream",      stream,    "--out", out};
  RETURN_IF_ERROR(Cached(out, argv, [&] { return Setup(argv); }));
  return out;
}

struct OpenedEpisode {
  std::unique_ptr<Dataset> dataset;
  std::shared_ptr<const pb::EpisodeIndex> index;
  int stream = -1;
};

absl::StatusOr<OpenedEpisode> OpenEpisode(const std::string& dir, const std::string& stream,
                                          size_t episode = 0) {
  OpenedEpisode e;
  ASSIGN_OR_RETURN(e.dataset, Dataset::Open(dir));
  ASSIGN_OR_RETURN(e.index, e.dataset->LoadEpisode(episode));
  e.stream = e.dataset->manifest().StreamIndex(stream);
  if (e.stream < 0) return absl::NotFoundError(StrCat(dir, " has no stream '", stream, "'"));
  return e;
}

// ---------------------------------------------------------------------------------------------
// Video

// Decodes every frame of `table` in order, `passes` times, one frame per Decode call (as the
// sample assembler calls it), at the frames' own size. Returns seconds.
absl::StatusOr<double> ConveyorSequential(const OpenedEpisode& e, const FrameTable& table,
                                          int passes, FrameDecoderStats* stats) {
  const pb::StreamIndex& stream = e.index->streams(e.stream);
  auto read = [&](size_t packet, std::string* bytes) {
    return e.dataset->ReadPacket(*e.index, e.stream, packet, bytes);
  };
  const DecodeLimits limits;
  const VideoOutput output;  // own size, RGB24
  std::vector<RgbImage> images;
  const Clock::time_point start = Clock::now();
  VideoDecoder decoder;
  for (int p = 0; p < passes; ++p) {
    for (int64_t k = 0; k < static_cast<int64_t>(table.size()); ++k) {
      RETURN_IF_ERROR(decoder.Decode(1, stream, table, read, std::span<const int64_t>(&k, 1),
                                     output, limits, &images));
    }
  }
  const double seconds = SecondsSince(start);
  *stats = decoder.stats();
  if (images.size() != 1 || images[0].width != stream.codec().width() ||
      images[0].height != stream.codec().height()) {
    return absl::InternalError("the decoder returned frames of an unexpected size");
  }
  return seconds;
}

// `count` single frames uniform over the episode (seed fixed), one Decode call each.
absl::StatusOr<double> ConveyorRandom(const OpenedEpisode& e, const FrameTable& table, int count,
                                      FrameDecoderStats* stats) {
  const pb::StreamIndex& stream = e.index->streams(e.stream);
  auto read = [&](size_t packet, std::string* bytes) {
    return e.dataset->ReadPacket(*e.index, e.stream, packet, bytes);
  };
  std::mt19937_64 rng(20261121);
  std::vector<int64_t> frames(static_cast<size_t>(count));
  for (int64_t& f : frames) f = static_cast<int64_t>(rng() % table.size());
  const DecodeLimits limits;
  const VideoOutput output;
  std::vector<RgbImage> images;
  const Clock::time_point start = Clock::now();
  VideoDecoder decoder;
  for (const int64_t& k : frames) {
    RETURN_IF_ERROR(decoder.Decode(1, stream, table, read, std::span<const int64_t>(&k, 1), output,
                                   limits, &images));
  }
  const double seconds = SecondsSince(start);
  *stats = decoder.stats();
  return seconds;
}

// The raw-libavcodec baseline's own FFmpeg plumbing: the library's (media/internal/) is private
// to it, and the baseline should not lean on Conveyor's code anyway.
struct AvCodecContextFree {
  void operator()(AVCodecContext* c) const { avcodec_free_context(&c); }
};
struct AvCodecParametersFree {
  void operator()(AVCodecParameters* p) const { avcodec_parameters_free(&p); }
};
struct AvFrameFree {
  void operator()(AVFrame* f) const { av_frame_free(&f); }
};
struct AvPacketFree {
  void operator()(AVPacket* p) const { av_packet_free(&p); }
};

absl::Status AvError(int errnum, std::string_view call) {
  char buf[AV_ERROR_MAX_STRING_SIZE] = {0};
  av_strerror(errnum, buf, sizeof(buf));
  return absl::InternalError(StrCat(call, ": ", buf));
}

// The stored video codec parameters as libavcodec takes them: the video fields of the library's
// conversion (media/av_codec_params.cc), which is what VideoDecoder opens its decoder with.
absl::Status VideoCodecParametersFromStored(const pb::CodecParams& params, AVCodecParameters* out) {
  const AVCodecDescriptor* desc = avcodec_descriptor_get_by_name(params.codec().c_str());
  if (desc == nullptr || desc->type != AVMEDIA_TYPE_VIDEO) {
    return absl::InvalidArgumentError(StrCat("'", params.codec(), "' is not a video codec"));
  }
  out->codec_type = desc->type;
  out->codec_id = desc->id;
  if (!params.extradata().empty()) {
    const size_t n = params.extradata().size();
    out->extradata = static_cast<uint8_t*>(av_mallocz(n + AV_INPUT_BUFFER_PADDING_SIZE));
    if (out->extradata == nullptr) return AvError(AVERROR(ENOMEM), "av_mallocz");
    std::memcpy(out->extradata, params.extradata().data(), n);
    out->extradata_size = static_cast<int>(n);
  }
  out->width = params.width();
  out->height = params.height();
  out->format = params.pix_fmt().empty() ? -1 : av_get_pix_fmt(params.pix_fmt().c_str());
  out->bits_per_coded_sample = params.bits_per_coded_sample();
  out->bits_per_raw_sample = params.bits_per_raw_sample();
  out->profile = params.profile();
  out->level = params.level();
  out->color_range = static_cast<AVColorRange>(params.color_range());
  out->color_primaries = static_cast<AVColorPrimaries>(params.color_primaries());
  out->color_trc = static_cast<AVColorTransferCharacteristic>(params.color_trc());
  out->color_space = static_cast<AVColorSpace>(params.color_space());
  out->chroma_location = static_cast<AVChromaLocation>(params.chroma_location());
  out->field_order = static_cast<AVFieldOrder>(params.field_order());
  out->sample_aspect_ratio = AVRational{params.sar_num(), params.sar_den()};
  out->video_delay = params.video_delay();
  return absl::OkStatus();
}

// libavcodec alone on the same packets (read with Dataset::ReadPacket, as VideoDecoder reads
// them), every packet in decode order, `passes` times, frames received and dropped: what decoding
// costs in this process before any conversion. Returns seconds; `frames` counts frames out.
absl::StatusOr<double> LibavcodecDecodeOnly(const OpenedEpisode& e, int passes, int64_t* frames) {
  const pb::StreamIndex& stream = e.index->streams(e.stream);
  std::unique_ptr<AVCodecParameters, AvCodecParametersFree> par(avcodec_parameters_alloc());
  RETURN_IF_ERROR(VideoCodecParametersFromStored(stream.codec(), par.get()));
  const AVCodec* codec = avcodec_find_decoder(par->codec_id);
  if (codec == nullptr) return absl::UnimplementedError("no decoder");
  std::unique_ptr<AVFrame, AvFrameFree> frame(av_frame_alloc());
  std::unique_ptr<AVPacket, AvPacketFree> pkt(av_packet_alloc());
  std::string bytes;
  const pb::PacketTable& pk = stream.packets();
  *frames = 0;
  const Clock::time_point start = Clock::now();
  std::unique_ptr<AVCodecContext, AvCodecContextFree> ctx(avcodec_alloc_context3(codec));
  int ret = avcodec_parameters_to_context(ctx.get(), par.get());
  if (ret < 0) return AvError(ret, "avcodec_parameters_to_context");
  ctx->pkt_timebase = AVRational{stream.time_base_num(), stream.time_base_den()};
  ctx->thread_count = 1;
  ret = avcodec_open2(ctx.get(), codec, nullptr);
  if (ret < 0) return AvError(ret, "avcodec_open2");
  for (int p = 0; p < passes; ++p) {
    if (p > 0) avcodec_flush_buffers(ctx.get());
    for (int i = 0; i <= pk.pts_size(); ++i) {
      if (i < pk.pts_size()) {
        RETURN_IF_ERROR(e.dataset->ReadPacket(*e.index, e.stream, static_cast<size_t>(i), &bytes));
        av_packet_unref(pkt.get());
        ret = av_new_packet(pkt.get(), static_cast<int>(bytes.size()));
        if (ret < 0) return AvError(ret, "av_new_packet");
        std::memcpy(pkt->data, bytes.data(), bytes.size());
        pkt->pts = pk.pts(i);
        pkt->dts = pk.dts(i);
        pkt->duration = pk.duration(i);
        if (pk.flags(i) & 1) pkt->flags |= AV_PKT_FLAG_KEY;
        ret = avcodec_send_packet(ctx.get(), pkt.get());
      } else {
        ret = avcodec_send_packet(ctx.get(), nullptr);
      }
      if (ret < 0) return AvError(ret, "avcodec_send_packet");
      while ((ret = avcodec_receive_frame(ctx.get(), frame.get())) == 0) {
        ++*frames;
        av_frame_unref(frame.get());
      }
      if (ret != AVERROR(EAGAIN) && ret != AVERROR_EOF) {
        return AvError(ret, "avcodec_receive_frame");
      }
    }
  }
  return SecondsSince(start);
}

absl::Status Bench::VideoSize(const std::string& label, const std::string& dataset,
                              int64_t min_frames, int random_accesses) {
  ASSIGN_OR_RETURN(OpenedEpisode e, OpenEpisode(dataset, "cam0"));
  const pb::StreamIndex& stream = e.index->streams(e.stream);
  ASSIGN_OR_RETURN(const FrameTable table, FrameTable::Build(stream));
  ASSIGN_OR_RETURN(const std::string mp4, Extract(dataset, "cam0", StrCat("cam0_", label, ".mp4")));
  const int64_t n = static_cast<int64_t>(table.size());
  const int passes = static_cast<int>(std::max<int64_t>(1, (min_frames + n - 1) / n));
  const int64_t frames = n * passes;
  const std::string what = StrCat(label, " ", stream.codec().codec(), " GOP 30");

  // Sequential: Conveyor decode + RGB24, ffmpeg decode + RGB24, ffmpeg decode only.
  const std::vector<std::string> rgb_cmd =
      FfmpegCommand(mp4, passes, {"-pix_fmt", "rgb24", "-f", "null", "-"});
  const std::vector<std::string> dec_cmd = FfmpegCommand(mp4, passes, {"-f", "null", "-"});
  FrameDecoderStats seq_stats;
  ASSIGN_OR_RETURN(Timings t, Alternate(policy_,
                                        [&]() -> absl::StatusOr<double> {
                                          return ConveyorSequential(e, table, passes, &seq_stats);
                                        },
                                        {[&] { return Exec(rgb_cmd, Log()); },
                                         [&] { return Exec(dec_cmd, Log()); }}));
  for (size_t i = 0; i < 2; ++i) {
    const int64_t got = FfmpegFrames(t.reference_runs[i].output);
    if (got != frames) {
      return absl::InternalError(StrCat(CommandLine(i == 0 ? rgb_cmd : dec_cmd), " output ", got,
                                        " frames, expected ", frames));
    }
  }
  const double conveyor_fps = frames / t.conveyor_s;
  const double rgb_fps = frames / t.reference_s[0];
  const double dec_fps = frames / t.reference_s[1];
  const std::string rgb_ref = StrCat("ffmpeg ", label, " decode+rgb24");
  const std::string dec_ref = StrCat("ffmpeg ", label, " decode only");
  AddReference(
      {rgb_ref,
       CommandLine(rgb_cmd),
       "wall clock of the process",
       rgb_fps,
       "frames/s",
       {{"frames", frames}, {"wall_s", t.reference_s[0]}, {"cpu_s", t.reference_runs[0].cpu_s}}});
  AddReference(
      {dec_ref,
       CommandLine(dec_cmd),
       "wall clock of the process",
       dec_fps,
       "frames/s",
       {{"frames", frames}, {"wall_s", t.reference_s[1]}, {"cpu_s", t.reference_runs[1].cpu_s}}});
  const json seq_extra = {{"frames", frames},
                          {"passes", passes},
                          {"episode_frames", n},
                          {"seconds", t.conveyor_s},
                          {"frames_decoded", seq_stats.frames_decoded},
                          {"frames_delivered", seq_stats.frames_delivered},
                          {"seeks", seq_stats.seeks},
                          {"timings", TimingsJson(t)}};
  AddRow({"video", StrCat("video sequential ", what, ": decode+rgb24"), conveyor_fps, "frames/s",
          rgb_ref, rgb_fps, 0.97, "headline: like with like", seq_extra, t.Others(0)});
  AddRow({"video", StrCat("video sequential ", what, ": decode+rgb24"), conveyor_fps, "frames/s",
          dec_ref, dec_fps, std::nullopt, "Conveyor converts, the reference does not", seq_extra,
          t.Others(1)});

  // libavcodec alone in this process: the decode-only floor.
  {
    int64_t got = 0;
    ASSIGN_OR_RETURN(Timings lt, Alternate(policy_,
                                           [&]() -> absl::StatusOr<double> {
                                             return LibavcodecDecodeOnly(e, passes, &got);
                                           },
                                           {}));
    AddRow({"video",
            StrCat("video sequential ", what, ": libavcodec decode only, in process"),
            got / lt.conveyor_s,
            "frames/s",
            dec_ref,
            dec_fps,
            std::nullopt,
            "packets via Dataset::ReadPacket, no conversion",
            {{"frames", got}, {"seconds", lt.conveyor_s}, {"timings", TimingsJson(lt)}},
            std::max(lt.Others(), t.reference_others[1])});
  }

  // Random access.
  FrameDecoderStats rnd_stats;
  ASSIGN_OR_RETURN(Timings rt, Alternate(policy_,
                                         [&]() -> absl::StatusOr<double> {
                                           return ConveyorRandom(e, table, random_accesses,
                                                                 &rnd_stats);
                                         },
                                         {}));
  const double delivered_fps = rnd_stats.frames_delivered / rt.conveyor_s;
  const double amplification = static_cast<double>(rnd_stats.frames_decoded) /
                               std::max<uint64_t>(rnd_stats.frames_delivered, 1);
  AddRow({"video",
          StrCat("video random frame ", what),
          delivered_fps,
          "frames/s",
          StrCat("ideal: Conveyor sequential / amplification ",
                 absl::StrFormat("%.1f", amplification)),
          conveyor_fps / amplification,
          std::nullopt,
          absl::StrFormat("one access costs %.1f sequential frames; %.1f packets decoded per "
                          "access (frames still in the decoder at a seek are decoded, not counted)",
                          conveyor_fps / delivered_fps,
                          static_cast<double>(rnd_stats.packets_sent) / random_accesses),
          {{"accesses", random_accesses},
           {"seconds", rt.conveyor_s},
           {"frames_decoded", rnd_stats.frames_decoded},
           {"frames_delivered", rnd_stats.frames_delivered},
           {"packets_sent", rnd_stats.packets_sent},
           {"seeks", rnd_stats.seeks},
           {"amplification", amplification},
           {"cost_in_sequential_frames", conveyor_fps / delivered_fps},
           {"timings", TimingsJson(rt)}},
          rt.Others()});
  return absl::OkStatus();
}

absl::Status Bench::VideoGroup() {
  // ffmpeg's own start-up: the same command on a one-frame clip of the 224x224 stream.
  ASSIGN_OR_RETURN(const std::string d224, Synth("v224", Video224Args()));
  ASSIGN_OR_RETURN(const std::string mp4, Extract(d224, "cam0", "cam0_224x224.mp4"));
  const std::string one = Path("one_frame.mp4");
  RETURN_IF_ERROR(Cached(one, {"ffmpeg", mp4, "1"}, [&] {
    return Setup({"ffmpeg", "-nostdin", "-v", "error", "-y", "-i", mp4, "-frames:v", "1", "-c",
                  "copy", one});
  }));
  double startup = std::numeric_limits<double>::infinity();
  for (int r = 0; r < std::max(flags_.reps, 3); ++r) {
    ASSIGN_OR_RETURN(ProcessRun run,
                     Exec(FfmpegCommand(one, 1, {"-pix_fmt", "rgb24", "-f", "null", "-"}), Log()));
    startup = std::min(startup, run.wall_s);
  }
  ffmpeg_startup_s_ = startup;
  report_.notes.push_back(absl::StrFormat(
      "ffmpeg start-up (same command on a 1-frame clip): %.1f ms, included in every ffmpeg "
      "figure (not subtracted)",
      startup * 1e3));

  RETURN_IF_ERROR(VideoSize("224x224", d224, flags_.quick ? 300 : 21600, flags_.quick ? 20 : 400));
  if (!flags_.quick) {
    ASSIGN_OR_RETURN(const std::string d720, Synth("v720", Video720Args()));
    RETURN_IF_ERROR(VideoSize("1280x720", d720, 1200, 40));
  }
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------------------------
// Sample assembly

// A permutation of [0, n) (Fisher-Yates with a fixed seed; the same on every standard library).
std::vector<uint64_t> Shuffled(uint64_t n, uint64_t seed) {
  std::vector<uint64_t> order(n);
  for (uint64_t i = 0; i < n; ++i) order[i] = i;
  std::mt19937_64 rng(seed);
  for (uint64_t i = n; i > 1; --i) std::swap(order[i - 1], order[rng() % i]);
  return order;
}

// Assembles `samples` with a fresh assembler and returns seconds; `stats` gets its counters.
absl::StatusOr<double> AssembleAll(const Dataset& dataset, const SampleSpec& spec,
                                   const SampleIndex& index, std::span<const uint64_t> samples,
                                   AssemblerStats* stats) {
  const Clock::time_point start = Clock::now();
  SampleAssembler assembler(dataset, spec, index);
  for (uint64_t i : samples) {
    ASSIGN_OR_RETURN(Sample s, assembler.Assemble(i, /*seed=*/0, /*epoch=*/0));
    if (s.tensors.empty()) return absl::InternalError("empty sample");
  }
  const double seconds = SecondsSince(start);
  *stats = assembler.stats();
  return seconds;
}

absl::Status Bench::AssemblyGroup() {
  ASSIGN_OR_RETURN(const std::string dir, Synth("asm", AssemblyArgs()));
  ASSIGN_OR_RETURN(std::unique_ptr<Dataset> dataset, Dataset::Open(dir));
  const std::string yaml_path = StrCat(CONVEYOR_BENCH_SOURCE_DIR, "/examples/aloha_like.yaml");
  ASSIGN_OR_RETURN(SampleSpec spec, SampleSpec::FromFile(yaml_path, dataset->manifest()));
  spec.audio_method = flags_.audio_method;  // the audio window's decoding, as in the audio group
  ASSIGN_OR_RETURN(const SampleIndex index, SampleIndex::Build(*dataset, spec.anchor_stream));
  int frames_per_sample = 0;
  for (const StreamSpec& s : spec.streams) {
    if (s.kind == pb::VIDEO) frames_per_sample += static_cast<int>(s.deltas.size());
  }

  // The reference: ffmpeg decoding + converting one of the same cameras (episode 0, cam0).
  ASSIGN_OR_RETURN(const std::string mp4, Extract(dir, "cam0", "cam0_asm.mp4"));
  ASSIGN_OR_RETURN(OpenedEpisode e, OpenEpisode(dir, "cam0"));
  const int64_t n = static_cast<int64_t>(e.index->streams(e.stream).num_frames());
  const int64_t min_frames = flags_.quick ? 300 : 7200;
  const int loops = static_cast<int>(std::max<int64_t>(1, (min_frames + n - 1) / n));
  const std::vector<std::string> rgb_cmd =
      FfmpegCommand(mp4, loops, {"-pix_fmt", "rgb24", "-f", "null", "-"});

  const uint64_t num_seq = flags_.quick ? 30 : 300;
  const uint64_t num_shuf = flags_.quick ? 15 : 150;
  std::vector<uint64_t> in_order(std::min<uint64_t>(num_seq, index.size()));
  for (uint64_t i = 0; i < in_order.size(); ++i) in_order[i] = i;
  std::vector<uint64_t> shuffled = Shuffled(index.size(), 7);
  shuffled.resize(std::min<uint64_t>(num_shuf, shuffled.size()));

  AssemblerStats seq_stats, shuf_stats;
  double seq_s = std::numeric_limits<double>::infinity();
  double shuf_s = std::numeric_limits<double>::infinity();
  ASSIGN_OR_RETURN(Timings t,
                   Alternate(policy_,
                             [&]() -> absl::StatusOr<double> {
                               ASSIGN_OR_RETURN(const double a, AssembleAll(*dataset, spec, index,
                                                                            in_order, &seq_stats));
                               ASSIGN_OR_RETURN(const double b, AssembleAll(*dataset, spec, index,
                                                                            shuffled, &shuf_stats));
                               seq_s = std::min(seq_s, a);
                               shuf_s = std::min(shuf_s, b);
                               return a + b;
                             },
                             {[&] { return Exec(rgb_cmd, Log()); }}));
  const double ref_fps = static_cast<double>(n * loops) / t.reference_s[0];
  const std::string ref = "ffmpeg 224x224 decode+rgb24 (asm cam0)";
  AddReference({ref,
                CommandLine(rgb_cmd),
                "wall clock of the process",
                ref_fps,
                "frames/s",
                {{"frames", n * loops}, {"wall_s", t.reference_s[0]}}});

  auto add = [&](const std::string& order, const AssemblerStats& st, double seconds, size_t count) {
    const double amplification =
        static_cast<double>(st.frames_decoded) / std::max<uint64_t>(st.frames_delivered, 1);
    const json extra = {{"samples", count},
                        {"seconds", seconds},
                        {"frames_per_sample", frames_per_sample},
                        {"frames_delivered", st.frames_delivered},
                        {"frames_decoded", st.frames_decoded},
                        {"amplification", amplification},
                        {"video_seeks", st.video_seeks},
                        {"audio_windows", st.audio_windows},
                        {"lowdim_windows", st.lowdim_windows},
                        {"episode_loads", st.episode_loads},
                        {"bytes", st.bytes},
                        {"timings", TimingsJson(t)}};
    AddRow({"assembly", StrCat("assembly aloha_like.yaml, ", order, ": samples"), count / seconds,
            "samples/s", "", 0, std::nullopt,
            StrCat(frames_per_sample, " frames (3 cameras x 2), 50 actions, 1 s audio per sample",
                   flags_.audio_method == AudioMethod::kChunks ? "" : " (audio per_window)"),
            extra, t.Others()});
    AddRow({"assembly", StrCat("assembly aloha_like.yaml, ", order, ": frames delivered"),
            st.frames_delivered / seconds, "frames/s", ref, ref_fps, std::nullopt,
            absl::StrFormat(
                "amplification %.1f, %.2f seeks per frame", amplification,
                static_cast<double>(st.video_seeks) / std::max<uint64_t>(st.frames_delivered, 1)),
            extra, t.Others(0)});
  };
  add("indices in order", seq_stats, seq_s, in_order.size());
  add("shuffled indices", shuf_stats, shuf_s, shuffled.size());
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------------------------
// JPEG

// Decodes `bytes` in a loop for at least `seconds` (after a short warm-up); returns images/s.
absl::StatusOr<double> ConveyorJpegRate(const std::string& bytes, int min_w, int min_h,
                                        double seconds, int* out_w, int* out_h) {
  ImageDecoder decoder;
  RgbImage image;
  const DecodeLimits limits;
  for (const double budget : {seconds / 5, seconds}) {  // warm-up, then the timed run
    int64_t count = 0;
    const Clock::time_point start = Clock::now();
    double elapsed = 0;
    do {
      RETURN_IF_ERROR(decoder.Decode("mjpeg", bytes, min_w, min_h, limits, &image));
      ++count;
      elapsed = SecondsSince(start);
    } while (elapsed < budget);
    if (budget == seconds) {
      *out_w = image.width;
      *out_h = image.height;
      return count / elapsed;
    }
  }
  return absl::InternalError("unreachable");
}

// tjbench's "Frame rate: N fps" (decompression), images/s.
absl::StatusOr<double> TjbenchFps(const std::string& output) {
  const size_t pos = output.find("Frame rate:");
  double fps = 0;
  if (pos == std::string::npos || std::sscanf(output.c_str() + pos, "Frame rate: %lf", &fps) != 1 ||
      fps <= 0) {
    return absl::InternalError(StrCat("no decompression frame rate in tjbench output:\n", output));
  }
  return fps;
}

absl::Status Bench::JpegGroup() {
  struct File {
    std::string name;
    int width, height;
    std::vector<std::string> quality;  // ffmpeg filter and mjpeg encoder options
    std::string quality_name;
  };
  const std::vector<File> files = {
      {"testsrc2_224x224.jpg", 224, 224, {}, "ffmpeg default quality"},
      {"testsrc2_640x480.jpg", 640, 480, {}, "ffmpeg default quality"},
      // Noise makes the file photo-like (several bits per pixel): more entropy decoding.
      {"testsrc2_noise_640x480_q2.jpg",
       640,
       480,
       {"-vf", "noise=alls=12", "-q:v", "2"},
       "+noise -q:v 2"},
      {"testsrc2_noise_1280x720_q2.jpg",
       1280,
       720,
       {"-vf", "noise=alls=12", "-q:v", "2"},
       "+noise -q:v 2"},
  };
  const double seconds = flags_.quick ? 0.1 : 1.0;
  for (const File& f : files) {
    const std::string path = Path(f.name);
    std::vector<std::string> make = {
        "ffmpeg", "-nostdin", "-v",
        "error",  "-y",       "-f",
        "lavfi",  "-i",       StrCat("testsrc2=size=", f.width, "x", f.height, ":rate=30"),
        "-ss",    "1",        "-frames:v",
        "1"};
    make.insert(make.end(), f.quality.begin(), f.quality.end());
    make.push_back(path);
    RETURN_IF_ERROR(Cached(path, make, [&] { return Setup(make); }));
    const std::string bytes = ReadWholeFile(path);
    const double bpp = 8.0 * bytes.size() / (static_cast<double>(f.width) * f.height);
    for (const bool half : {false, true}) {
      std::vector<std::string> tj = {"tjbench",
                                     path,
                                     "-rgb",
                                     "-benchtime",
                                     absl::StrFormat("%g", seconds),
                                     "-warmup",
                                     absl::StrFormat("%g", seconds / 5),
                                     "-nowrite"};
      if (half) tj.insert(tj.end(), {"-scale", "1/2"});
      int w = 0, h = 0;
      ASSIGN_OR_RETURN(Timings t,
                       Alternate(policy_,
                                 [&]() -> absl::StatusOr<double> {
                                   ASSIGN_OR_RETURN(
                                       const double fps,
                                       ConveyorJpegRate(bytes, half ? f.width / 2 : 0,
                                                        half ? f.height / 2 : 0, seconds, &w, &h));
                                   return 1.0 / fps;  // seconds per image: smaller is better
                                 },
                                 {[&] { return Exec(tj, Log()); }}));
      // Alternate kept the fastest tjbench process; its own figure is what counts.
      ASSIGN_OR_RETURN(const double tj_fps, TjbenchFps(t.reference_runs[0].output));
      if (w != (half ? f.width / 2 : f.width) || h != (half ? f.height / 2 : f.height)) {
        return absl::InternalError(StrCat(f.name, ": decoded to ", w, "x", h));
      }
      const std::string what = StrCat(f.width, "x", f.height, " ", f.quality_name,
                                      absl::StrFormat(" (%.2f bits/pixel)", bpp));
      const std::string ref =
          StrCat("tjbench ", f.width, "x", f.height, f.quality.empty() ? "" : " noise q2",
                 half ? " -scale 1/2" : "");
      AddReference({ref,
                    CommandLine(tj),
                    "tjbench's decompression frame rate",
                    tj_fps,
                    "images/s",
                    {{"bytes", bytes.size()}}});
      const double fps = 1.0 / t.conveyor_s;
      AddRow({"jpeg",
              StrCat("jpeg ", half ? "min size half (decoded at 1/2)" : "full size", ", ", what),
              fps,
              "images/s",
              ref,
              tj_fps,
              0.95,
              absl::StrFormat("%.0f input Mpixels/s", fps * f.width * f.height / 1e6),
              {{"file", f.name},
               {"bytes", bytes.size()},
               {"out_width", w},
               {"out_height", h},
               {"timings", TimingsJson(t)},
               {"timings_unit", "conveyor: seconds per image; reference: tjbench process"}},
              t.Others(0)});
    }
  }
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------------------------
// Audio

absl::Status Bench::AudioStream(const std::string& label, const std::string& dataset,
                                const std::string& stream_name, double min_audio_s) {
  ASSIGN_OR_RETURN(OpenedEpisode e, OpenEpisode(dataset, stream_name));
  const pb::StreamIndex& stream = e.index->streams(e.stream);
  const pb::PacketTable& pk = stream.packets();
  const int rate = stream.codec().sample_rate();
  const int last = pk.pts_size() - 1;
  const double duration =
      static_cast<double>(pk.pts(last) + pk.duration(last) - stream.pts_origin()) *
      stream.time_base_num() / stream.time_base_den();
  const int windows = std::max(1, static_cast<int>(std::floor(duration)));
  const int passes = std::max(1, static_cast<int>(std::ceil(min_audio_s / windows)));
  ASSIGN_OR_RETURN(const std::string m4a, Extract(dataset, stream_name, StrCat(label, ".m4a")));
  const std::vector<std::string> null_cmd = FfmpegCommand(m4a, passes, {"-f", "null", "-"});
  const std::vector<std::string> f32_cmd =
      FfmpegCommand(m4a, passes, {"-c:a", "pcm_f32le", "-f", "null", "-"});

  uint64_t packets = 0, pads = 0, chunks = 0;
  auto conveyor_run = [&]() -> absl::StatusOr<double> {
    auto read = [&](size_t packet, std::string* bytes) {
      return e.dataset->ReadPacket(*e.index, e.stream, packet, bytes);
    };
    const DecodeLimits limits;
    std::vector<float> pcm;
    std::vector<uint8_t> is_pad;
    pads = 0;
    const Clock::time_point start = Clock::now();
    AudioDecoder decoder(flags_.audio_method);
    for (int p = 0; p < passes; ++p) {
      // Each pass decodes the episode again, as ffmpeg's loop does: no chunk of a pass before.
      decoder.ClearChunkCache();
      for (int w = 0; w < windows; ++w) {
        if (flags_.audio_cold) decoder.ClearChunkCache();
        RETURN_IF_ERROR(
            decoder.DecodeWindow(stream, read, w, rate, rate, 0, limits, &pcm, &is_pad));
        if (p == 0) {  // a sanity check, kept mostly out of the timing
          for (uint8_t v : is_pad) pads += v;
        }
      }
    }
    const double seconds = SecondsSince(start);
    packets = decoder.packets_decoded();
    chunks = decoder.chunks_decoded();
    return seconds;
  };
  ASSIGN_OR_RETURN(Timings t, Alternate(policy_, conveyor_run,
                                        {[&] { return Exec(null_cmd, Log()); },
                                         [&] { return Exec(f32_cmd, Log()); }}));
  const double ours = static_cast<double>(windows) * passes / t.conveyor_s;
  const double ref_audio_s = duration * passes;
  std::vector<std::string> refs;
  for (size_t i = 0; i < 2; ++i) {
    const double reported = FfmpegTime(t.reference_runs[i].output);
    if (std::fabs(reported - ref_audio_s) > 0.02 * ref_audio_s + 0.1) {
      return absl::InternalError(StrCat(CommandLine(i == 0 ? null_cmd : f32_cmd), " decoded ",
                                        reported, " s of audio, expected ", ref_audio_s));
    }
    refs.push_back(StrCat("ffmpeg ", label, i == 0 ? " -f null" : " pcm_f32le"));
    AddReference({refs.back(),
                  CommandLine(i == 0 ? null_cmd : f32_cmd),
                  "wall clock of the process",
                  ref_audio_s / t.reference_s[i],
                  "audio s/s",
                  {{"audio_s", ref_audio_s},
                   {"ffmpeg_time", reported},
                   {"wall_s", t.reference_s[i]},
                   {"cpu_s", t.reference_runs[i].cpu_s}}});
  }
  const double packet_amplification =
      static_cast<double>(packets) / (static_cast<double>(pk.pts_size()) * passes);
  const json extra = {{"windows", windows * passes},
                      {"window_s", 1.0},
                      {"passes", passes},
                      {"seconds", t.conveyor_s},
                      {"packets_decoded", packets},
                      {"chunks_decoded", chunks},
                      {"stream_packets", pk.pts_size()},
                      {"packet_amplification", packet_amplification},
                      {"pad_samples", pads},
                      {"timings", TimingsJson(t)}};
  const std::string what =
      StrCat("audio ", label, " ", stream.codec().codec(), " ", rate / 1000.0, " kHz ",
             stream.codec().channels() == 1 ? "mono" : "stereo", ", 1 s windows",
             flags_.audio_method == AudioMethod::kChunks ? "" : " (per_window)",
             flags_.audio_cold ? " (cold)" : "");
  const std::string note =
      absl::StrFormat("%.2f packets decoded per stream packet", packet_amplification);
  AddRow({"audio", what, ours, "audio s/s", refs[0], ref_audio_s / t.reference_s[0], 0.95, note,
          extra, t.Others(0)});
  AddRow({"audio", what, ours, "audio s/s", refs[1], ref_audio_s / t.reference_s[1], std::nullopt,
          "float output like Conveyor's", extra, t.Others(1)});
  return absl::OkStatus();
}

absl::Status Bench::AudioGroup() {
  ASSIGN_OR_RETURN(const std::string d224, Synth("v224", Video224Args()));
  RETURN_IF_ERROR(AudioStream("synth_16k", d224, "audio", flags_.quick ? 20 : 20000));

  // 44.1 kHz stereo AAC, imported: a tone on the left, pink noise on the right.
  const std::string seconds = flags_.quick ? "5" : "60";
  const std::string src = Path("in44");
  const std::string m4a = src + "/ep_0000/mic.m4a";
  const std::vector<std::string> make = {
      "ffmpeg",
      "-nostdin",
      "-v",
      "error",
      "-y",
      "-f",
      "lavfi",
      "-i",
      StrCat("sine=frequency=440:sample_rate=44100:duration=", seconds),
      "-f",
      "lavfi",
      "-i",
      StrCat("anoisesrc=color=pink:sample_rate=44100:amplitude=0.2:duration=", seconds),
      "-filter_complex",
      "[0:a][1:a]amerge=inputs=2[a]",
      "-map",
      "[a]",
      "-c:a",
      "aac",
      "-b:a",
      "128k",
      m4a};
  RETURN_IF_ERROR(Cached(src, make, [&] {
    std::filesystem::create_directories(src + "/ep_0000");
    return Setup(make);
  }));
  const std::string d44 = Path("a44");
  const std::vector<std::string> import = {flags_.conveyor, "import", "--from", src,
                                           "--out",         d44,      "--quiet"};
  RETURN_IF_ERROR(Cached(d44, import, [&] { return Setup(import); }));
  return AudioStream("import_44k", d44, "mic", flags_.quick ? 20 : 6000);
}

// ---------------------------------------------------------------------------------------------
// Low-dimensional arrays

absl::Status Bench::LowdimGroup() {
  ASSIGN_OR_RETURN(const std::string d224, Synth("v224", Video224Args()));
  ASSIGN_OR_RETURN(OpenedEpisode e, OpenEpisode(d224, "action"));
  const pb::StreamIndex& stream = e.index->streams(e.stream);
  const pb::LowdimBlocks& blocks = stream.blocks();
  const size_t dim = static_cast<size_t>(blocks.dim());
  const size_t steps = stream.num_frames();
  constexpr size_t kWindow = 50;
  if (steps < kWindow) return absl::InternalError("lowdim stream shorter than a window");
  const int count = flags_.quick ? 500 : 20000;
  std::mt19937_64 rng(99);
  std::vector<size_t> firsts(static_cast<size_t>(count));
  uint64_t block_bytes = 0;  // decompressed bytes of the blocks each window touches
  for (size_t& f : firsts) {
    f = rng() % (steps - kWindow + 1);
    for (int b = 0; b < blocks.first_step_size(); ++b) {
      const size_t lo = blocks.first_step(b), n = blocks.num_steps(b);
      if (lo + n > f && lo < f + kWindow) block_bytes += n * dim * sizeof(float);
    }
  }

  // The reference: zstd's own benchmark on the same array, byte-shuffled per 256-step block as
  // the blocks are, cut into chunks of one block's size.
  ASSIGN_OR_RETURN(const std::string npy, Extract(d224, "action", "action.npy"));
  ASSIGN_OR_RETURN(const NpyArray array, ReadNpy(npy));
  std::string shuffled;
  const size_t block_steps = blocks.first_step_size() > 0 ? blocks.num_steps(0) : 256;
  for (size_t lo = 0; lo < steps; lo += block_steps) {
    const size_t cnt = std::min(block_steps, steps - lo) * dim;
    const auto* in = reinterpret_cast<const unsigned char*>(array.values.data() + lo * dim);
    std::string part(cnt * sizeof(float), '\0');
    for (size_t b = 0; b < sizeof(float); ++b) {
      for (size_t i = 0; i < cnt; ++i) part[b * cnt + i] = static_cast<char>(in[i * 4 + b]);
    }
    shuffled += part;
  }
  const std::string shuffled_path = Path("action_shuffled.bin");
  std::ofstream(shuffled_path, std::ios::binary | std::ios::trunc) << shuffled;
  const std::vector<std::string> zstd_cmd = {
      "zstd", "-b3", StrCat("-B", block_steps * dim * sizeof(float)), "-i1", shuffled_path};

  uint64_t delivered = 0;
  auto conveyor_run = [&]() -> absl::StatusOr<double> {
    std::vector<float> rows;
    delivered = 0;
    const Clock::time_point start = Clock::now();
    for (size_t f : firsts) {
      RETURN_IF_ERROR(e.dataset->ReadLowdim(*e.index, e.stream, f, kWindow, &rows));
      delivered += rows.size() * sizeof(float);
    }
    return SecondsSince(start);
  };
  ASSIGN_OR_RETURN(Timings t,
                   Alternate(policy_, conveyor_run, {[&] { return Exec(zstd_cmd, Log()); }}));
  // zstd -b's progress lines (split by \r): "3#FILE : N -> M (xR), C MB/s, D MB/s" (MB = 1e6
  // bytes), or without ", D MB/s" while it compresses; the last line with both has the result.
  double zstd_mbs = 0;
  for (absl::string_view line :
       absl::StrSplit(t.reference_runs[0].output, absl::ByAnyChar("\r\n"))) {
    const size_t at = line.rfind(" MB/s");
    const size_t first = line.find(" MB/s");
    if (at == absl::string_view::npos || first == at) continue;
    const size_t comma = line.rfind(',', at);
    double v = 0;
    if (comma != absl::string_view::npos &&
        absl::SimpleAtod(absl::StripAsciiWhitespace(line.substr(comma + 1, at - comma - 1)), &v)) {
      zstd_mbs = v;
    }
  }
  if (zstd_mbs <= 0) {
    return absl::InternalError(
        StrCat("cannot read zstd -b's output:\n", t.reference_runs[0].output));
  }
  const std::string ref = "zstd -b3 decompress, 1-block chunks";
  AddReference({ref,
                CommandLine(zstd_cmd),
                "zstd's own benchmark (decompression)",
                zstd_mbs,
                "MB/s",
                {{"bytes", shuffled.size()}}});
  const json extra = {{"windows", count},
                      {"window", {kWindow, dim}},
                      {"seconds", t.conveyor_s},
                      {"delivered_bytes", delivered},
                      {"block_bytes_decompressed", block_bytes},
                      {"block_steps", block_steps},
                      {"timings", TimingsJson(t)}};
  AddRow({"lowdim", StrCat("lowdim ReadLowdim 50x", dim, " windows, random positions"),
          count / t.conveyor_s, "windows/s", "", 0, std::nullopt,
          absl::StrFormat("%.0f MB/s of float32 delivered", delivered / t.conveyor_s / 1e6), extra,
          t.Others()});
  AddRow({"lowdim", "lowdim ReadLowdim: blocks decompressed", block_bytes / t.conveyor_s / 1e6,
          "MB/s", ref, zstd_mbs, std::nullopt,
          absl::StrFormat("%.2f blocks of %zu steps per window",
                          static_cast<double>(block_bytes) / (block_steps * dim * 4) / count,
                          block_steps),
          extra, t.Others(0)});

  // Through the assembler: state (1 step, mean_std) and 50 actions (min_max) per sample.
  const std::string yaml =
      "anchor: action\n"
      "streams:\n"
      "  observation.state:\n"
      "    delta_timestamps: [0.0]\n"
      "    normalize: mean_std\n"
      "  action:\n"
      "    delta_timestamps: {start: 0.0, step: 0.02, count: 50}\n"
      "    normalize: min_max\n";
  ASSIGN_OR_RETURN(const SampleSpec spec,
                   SampleSpec::FromYaml(yaml, e.dataset->manifest(), "decode_bench lowdim spec"));
  ASSIGN_OR_RETURN(const SampleIndex index, SampleIndex::Build(*e.dataset, spec.anchor_stream));
  std::vector<uint64_t> order = Shuffled(index.size(), 11);
  const size_t num = flags_.quick ? 200 : 5000;
  std::vector<uint64_t> samples;
  while (samples.size() < num) {
    samples.insert(
        samples.end(), order.begin(),
        order.begin() + static_cast<ptrdiff_t>(std::min(order.size(), num - samples.size())));
  }
  AssemblerStats stats;
  ASSIGN_OR_RETURN(Timings at, Alternate(policy_,
                                         [&]() -> absl::StatusOr<double> {
                                           return AssembleAll(*e.dataset, spec, index, samples,
                                                              &stats);
                                         },
                                         {}));
  AddRow({"lowdim",
          "lowdim SampleAssembler: state + 50 actions, normalized, shuffled",
          samples.size() / at.conveyor_s,
          "samples/s",
          "",
          0,
          std::nullopt,
          "2 ReadLowdim windows per sample",
          {{"samples", samples.size()},
           {"seconds", at.conveyor_s},
           {"lowdim_windows", stats.lowdim_windows},
           {"timings", TimingsJson(at)}},
          at.Others()});
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------------------------
// Output

using bench::CpuModel;
using bench::LoadAverage;

std::string Figure(double v) {
  if (v <= 0) return "-";
  if (v >= 100) return absl::StrFormat("%.0f", v);
  if (v >= 10) return absl::StrFormat("%.1f", v);
  return absl::StrFormat("%.2f", v);
}

void Bench::Print(const json& doc) const {
  std::cout << "decode_bench: " << doc["machine"]["cpus"].get<unsigned>() << " CPUs, "
            << doc["machine"]["cpu_model"].get<std::string>() << "; "
            << (flags_.cpu >= 0 ? StrCat("everything pinned to CPU ", flags_.cpu)
                                : std::string("not pinned"))
            << "; best of " << flags_.reps << (flags_.quick ? " (--quick)" : "")
            << "; load average before " << doc["machine"]["load_average_before"].get<std::string>()
            << ", after " << doc["machine"]["load_average_after"].get<std::string>() << "\n\n";
  std::cout << "references (same files, same run):\n";
  for (const Reference& r : report_.references) {
    std::cout << absl::StrFormat("  %-40s %10s %-9s  %s   [%s]\n", r.name, Figure(r.value), r.unit,
                                 Short(r.command), r.timing);
  }
  for (const std::string& n : report_.notes) std::cout << "  note: " << n << "\n";
  std::cout << "\n"
            << absl::StrFormat("%-84s %10s %-9s | %-40s %10s | %5s %6s | %5s  %s\n", "benchmark",
                               "value", "unit", "reference", "value", "ratio", "others", "goal",
                               "notes");
  for (const Row& r : report_.rows) {
    const std::string goal = r.goal ? absl::StrFormat("%.2f", *r.goal) : "";
    const std::string ratio = r.reference_value > 0 ? absl::StrFormat("%.2f", r.ratio()) : "-";
    std::string mark;
    if (r.goal) mark = r.ratio() >= *r.goal ? " met" : " MISSED";
    const std::string others = r.others_cpus >= 0 ? absl::StrFormat("%.2f", r.others_cpus) : "-";
    std::cout << absl::StrFormat("%-84s %10s %-9s | %-40s %10s | %5s %6s | %5s%s  %s\n", r.name,
                                 Figure(r.value), r.unit, r.reference.empty() ? "-" : r.reference,
                                 Figure(r.reference_value), ratio, others, goal, mark, r.note);
  }
  std::cout << "\n";
}

json Bench::ToJson(const std::string& load_before) const {
  json doc = {{"benchmark", "decode_bench"},
              {"machine",
               {{"cpus", std::thread::hardware_concurrency()},
                {"cpu_model", CpuModel()},
                {"pinned_cpu", flags_.cpu},
                {"load_average_before", load_before},
                {"load_average_after", LoadAverage()}}},
              {"quick", flags_.quick},
              {"reps", flags_.reps},
              {"statistic", "best of reps (Conveyor and reference runs alternate)"},
              {"ffmpeg_startup_s", ffmpeg_startup_s_},
              {"quiet_below_cpus", flags_.quiet_below},
              {"waited_for_quiet_s", gate_.waited_s()},
              {"runs_without_quiet", gate_.gave_up()},
              {"references", json::array()},
              {"results", json::array()},
              {"notes", report_.notes}};
  for (const Reference& r : report_.references) {
    doc["references"].push_back({{"name", r.name},
                                 {"command", r.command},
                                 {"timing", r.timing},
                                 {"value", r.value},
                                 {"unit", r.unit},
                                 {"details", r.extra}});
  }
  for (const Row& r : report_.rows) {
    json row = {{"group", r.group}, {"name", r.name},           {"value", r.value},
                {"unit", r.unit},   {"reference", r.reference}, {"details", r.extra},
                {"note", r.note}};
    if (r.reference_value > 0) {
      row["reference_value"] = r.reference_value;
      row["ratio"] = r.ratio();
    }
    if (r.others_cpus >= 0) row["others_cpus"] = r.others_cpus;
    if (r.goal) {
      row["goal"] = *r.goal;
      row["goal_met"] = r.ratio() >= *r.goal;
    }
    doc["results"].push_back(row);
  }
  return doc;
}

absl::Status Bench::Run() {
  const std::string load_before = LoadAverage();
  for (const char* tool : {"ffmpeg", "tjbench", "zstd"}) {
    if (!HaveTool(tool)) {
      return absl::FailedPreconditionError(
          StrCat(tool, " is not on PATH (bash tools/setup.sh installs it)"));
    }
  }
  // Inputs first, on all CPUs (synth encodes episodes in parallel).
  if (flags_.only.count("video") || flags_.only.count("audio") || flags_.only.count("lowdim")) {
    RETURN_IF_ERROR(Synth("v224", Video224Args()).status());
  }
  if (flags_.only.count("video") && !flags_.quick) {
    RETURN_IF_ERROR(Synth("v720", Video720Args()).status());
  }
  if (flags_.only.count("assembly")) RETURN_IF_ERROR(Synth("asm", AssemblyArgs()).status());

  if (flags_.cpu >= 0) {
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(flags_.cpu, &set);
    if (sched_setaffinity(0, sizeof(set), &set) != 0) {
      return absl::InvalidArgumentError(
          StrCat("cannot pin to CPU ", flags_.cpu, ": ", std::strerror(errno)));
    }
  }
  if (flags_.quick) {
    report_.notes.push_back(
        "--quick: a smoke run on tiny inputs; ffmpeg's start-up dominates its figures, so the "
        "ratios mean nothing");
  }
  const Clock::time_point start = Clock::now();
  if (flags_.only.count("video")) RETURN_IF_ERROR(VideoGroup());
  if (flags_.only.count("assembly")) RETURN_IF_ERROR(AssemblyGroup());
  if (flags_.only.count("jpeg")) RETURN_IF_ERROR(JpegGroup());
  if (flags_.only.count("audio")) RETURN_IF_ERROR(AudioGroup());
  if (flags_.only.count("lowdim")) RETURN_IF_ERROR(LowdimGroup());
  report_.notes.push_back(absl::StrFormat("measuring took %.0f s", SecondsSince(start)));
  if (flags_.quiet_below >= 0) {
    report_.notes.push_back(absl::StrFormat(
        "before each run it waited for the rest of the machine to use < %.2f CPUs for 1 s: "
        "%.0f s of waiting in all, %d runs went ahead without (the --max_wait_s budget was spent)",
        flags_.quiet_below, gate_.waited_s(), gate_.gave_up()));
  }
  report_.notes.push_back(
      "others: CPUs the rest of the machine used during the runs a row compares (the larger of "
      "the two), from /proc/stat minus the runs' own CPU time; near 0 means undisturbed (on the "
      "other CPU it still shares caches and memory, and on a VM maybe a physical core)");

  const json doc = ToJson(load_before);
  Print(doc);
  std::cout << "JSON " << doc.dump() << "\n";
  if (!flags_.json_path.empty()) {
    std::ofstream out(flags_.json_path, std::ios::trunc);
    out << doc.dump(2) << "\n";
    if (!out) return absl::UnavailableError("cannot write " + flags_.json_path);
  }
  return absl::OkStatus();
}

absl::Status Main(const Flags& flags) {
  std::string work = flags.work_dir;
  bool temporary = false;
  if (work.empty()) {
    const char* base = std::getenv("TMPDIR");
    std::string tmpl = StrCat(base != nullptr && *base ? base : "/tmp", "/decode_bench-XXXXXX");
    if (mkdtemp(tmpl.data()) == nullptr) {
      return absl::UnavailableError(StrCat("mkdtemp ", tmpl, ": ", std::strerror(errno)));
    }
    work = tmpl;
    temporary = true;
  } else {
    std::error_code ec;
    std::filesystem::create_directories(work, ec);
    if (ec) return absl::UnavailableError(StrCat("cannot create ", work, ": ", ec.message()));
    work = std::filesystem::absolute(work).lexically_normal().string();
    while (work.size() > 1 && work.back() == '/') work.pop_back();
  }
  Bench bench(flags, work);
  absl::Status status = bench.Run();
  if (temporary) {
    std::error_code ec;
    std::filesystem::remove_all(work, ec);
  }
  return status;
}

}  // namespace
}  // namespace conveyor

int main(int argc, char** argv) {
  absl::Status status = conveyor::Main(conveyor::ParseFlags(argc, argv));
  if (!status.ok()) {
    std::cerr << "decode_bench: " << status << "\n";
    return 1;
  }
  return 0;
}
