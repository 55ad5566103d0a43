// The C ABI over the client (capi/include/conveyor/conveyor_c.h): handles around client::Client
// and client::Batch, JSON for options and structured results, a thread-local last error.
#include "conveyor/conveyor_c.h"

#include <google/protobuf/util/json_util.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "base/json_text.h"
#include "capi/internal/c_status.h"
#include "client/client.h"
#include "client/launch_env.h"
#include "conveyor/v1/service.pb.h"
#include "nlohmann/json.hpp"

#ifndef CONVEYOR_VERSION
#define CONVEYOR_VERSION "0.0.0"
#endif

namespace cc = ::conveyor::client;
using json = nlohmann::json;
using ::conveyor::JsonText;

struct conveyor_client {
  std::unique_ptr<cc::Client> client;
};

namespace {

using ::conveyor::capi::Dup;
using ::conveyor::capi::Fail;

// A received batch, shared by its handle and its DLPack exports. When the last owner is gone the
// batch records its use on every stream a consumer ordered after it, then returns its memory.
struct SharedBatch {
  cc::Batch batch;
  std::vector<std::vector<int64_t>> shapes;  // stable copies for conveyor_tensor::shape
  // The streams its exports were ordered on: the exports outlive the handle and may be consumed
  // on other threads than the one holding it.
  absl::Mutex mu;
  std::vector<void*> streams ABSL_GUARDED_BY(mu);
  ~SharedBatch() {
    absl::MutexLock lock(&mu);  // uncontended: the last owner is going
    for (void* s : streams) (void)batch.RecordUse(s).ok();  // nobody left to tell of a failure
  }
};

absl::Status ParseJson(const char* text, const char* what, json* out) {
  if (text == nullptr) return absl::InvalidArgumentError(std::string(what) + ": NULL");
  *out = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (out->is_discarded()) return absl::InvalidArgumentError(std::string(what) + ": not JSON");
  if (!out->is_object()) return absl::InvalidArgumentError(std::string(what) + ": not an object");
  return absl::OkStatus();
}

// Typed reads of one option, naming it when its type is wrong.
template <typename T>
absl::Status Get(const json& v, const std::string& key, T* out) {
  try {
    if constexpr (std::is_same_v<T, bool>) {
      if (!v.is_boolean()) throw std::invalid_argument("");
    } else if constexpr (std::is_same_v<T, std::string>) {
      if (!v.is_string()) throw std::invalid_argument("");
    } else if constexpr (std::is_floating_point_v<T>) {
      if (!v.is_number()) throw std::invalid_argument("");
    } else if constexpr (std::is_unsigned_v<T>) {
      if (!v.is_number_integer() || v.get<int64_t>() < 0) throw std::invalid_argument("");
    } else {
      if (!v.is_number_integer()) throw std::invalid_argument("");
    }
    *out = v.get<T>();
    return absl::OkStatus();
  } catch (const std::exception&) {
    return absl::InvalidArgumentError("option '" + key + "': " + JsonText(v) + " is not " +
                                      (std::is_same_v<T, bool>          ? "a boolean"
                                       : std::is_same_v<T, std::string> ? "a string"
                                       : std::is_floating_point_v<T>    ? "a number"
                                       : std::is_unsigned_v<T> ? "a non-negative integer"
                                                               : "an integer"));
  }
}

absl::Status ParseServers(const json& v, std::vector<std::string>* out) {
  if (v.is_string()) {
    *out = cc::ParseServers(v.get<std::string>());
    return absl::OkStatus();
  }
  if (!v.is_array()) return absl::InvalidArgumentError("option 'servers': expected a list");
  out->clear();
  for (const json& s : v) {
    if (!s.is_string()) return absl::InvalidArgumentError("option 'servers': " + JsonText(s) +
                                                          " is not a string");
    out->push_back(s.get<std::string>());
  }
  return absl::OkStatus();
}

absl::Status ParseClientOptions(const json& j, cc::ClientOptions* o) {
  bool tls = false;
  for (const auto& [key, v] : j.items()) {
    absl::Status s;
    if (key == "servers") s = ParseServers(v, &o->servers);
    else if (key == "job") s = Get(v, key, &o->job);
    else if (key == "dataset") s = Get(v, key, &o->dataset);
    else if (key == "consumer") s = Get(v, key, &o->consumer);
    else if (key == "consumers") s = Get(v, key, &o->consumers);
    else if (key == "start") {
      if (v.is_string()) {
        absl::StatusOr<cc::Cursor> c = cc::Cursor::Parse(v.get<std::string>());
        if (c.ok()) o->start = *c;
        else s = absl::InvalidArgumentError("option 'start': " + std::string(c.status().message()));
      } else if (!v.is_array() || v.size() != 2 || !v[0].is_number_unsigned() ||
                 !v[1].is_number_unsigned()) {
        s = absl::InvalidArgumentError(
            "option 'start': expected [epoch, step], \"EPOCH:STEP\" or \"EPOCH@POSITION\", got " + JsonText(v));
      } else {
        o->start = {v[0].get<uint64_t>(), v[1].get<uint64_t>()};
      }
    } else if (key == "config_yaml") s = Get(v, key, &o->config_yaml);
    else if (key == "config_name") s = Get(v, key, &o->config_name);
    else if (key == "max_batches") s = Get(v, key, &o->max_batches);
    else if (key == "prefetch_batches") s = Get(v, key, &o->prefetch_batches);
    else if (key == "prefetch_bytes") s = Get(v, key, &o->prefetch_bytes);
    else if (key == "max_message_bytes") s = Get(v, key, &o->max_message_bytes);
    else if (key == "schedule_version") s = Get(v, key, &o->schedule_version);
    else if (key == "expect_dataset_fingerprint") s = Get(v, key, &o->expect_dataset_fingerprint);
    else if (key == "expect_order_digest") s = Get(v, key, &o->expect_order_digest);
    else if (key == "pin_from_environment") s = Get(v, key, &o->pin_from_environment);
    else if (key == "max_batch_bytes") s = Get(v, key, &o->max_batch_bytes);
    else if (key == "auth_token") s = Get(v, key, &o->auth_token);
    else if (key == "job_secret") s = Get(v, key, &o->job_secret);
    else if (key == "tls") s = Get(v, key, &tls);
    else if (key == "tls_ca_pem") s = Get(v, key, &o->tls_ca_pem);
    else if (key == "tls_cert_pem") s = Get(v, key, &o->tls_cert_pem);
    else if (key == "tls_key_pem") s = Get(v, key, &o->tls_key_pem);
    else if (key == "tls_server_name") s = Get(v, key, &o->tls_server_name);
    else if (key == "reconnect_timeout_s") s = Get(v, key, &o->reconnect_timeout_s);
    else if (key == "report_interval_s") s = Get(v, key, &o->report_interval_s);
    else if (key == "shared_memory") s = Get(v, key, &o->shared_memory);
    else if (key == "shared_memory_bytes") s = Get(v, key, &o->shared_memory_bytes);
    else if (key == "payload_streams") s = Get(v, key, &o->payload_streams);
    else if (key == "device_buffers") s = Get(v, key, &o->device_buffers);
    else if (key == "device") {
      int device = -1;
      s = Get(v, key, &device);
      o->device = device >= 0;
      o->device_index = std::max(device, 0);
    } else {
      s = absl::InvalidArgumentError("unknown option '" + key + "'");
    }
    if (!s.ok()) return s;
  }
  o->tls = tls || !o->tls_ca_pem.empty() || !o->tls_cert_pem.empty();
  return absl::OkStatus();
}

// ParseClientOptions' inverse, for conveyor_client_defaults: the same names, so that a binding
// passing this object back is accepted as is. Keep the two lists together.
json ClientOptionsJson(const cc::ClientOptions& o) {
  return {{"servers", o.servers},
          {"job", o.job},
          {"dataset", o.dataset},
          {"consumer", o.consumer},
          {"consumers", o.consumers},
          {"start", o.start.ToString()},
          {"config_yaml", o.config_yaml},
          {"config_name", o.config_name},
          {"max_batches", o.max_batches},
          {"prefetch_batches", o.prefetch_batches},
          {"prefetch_bytes", o.prefetch_bytes},
          {"max_message_bytes", o.max_message_bytes},
          {"schedule_version", o.schedule_version},
          {"expect_dataset_fingerprint", o.expect_dataset_fingerprint},
          {"expect_order_digest", o.expect_order_digest},
          {"pin_from_environment", o.pin_from_environment},
          {"max_batch_bytes", o.max_batch_bytes},
          {"auth_token", o.auth_token},
          {"job_secret", o.job_secret},
          {"tls", o.tls},
          {"tls_ca_pem", o.tls_ca_pem},
          {"tls_cert_pem", o.tls_cert_pem},
          {"tls_key_pem", o.tls_key_pem},
          {"tls_server_name", o.tls_server_name},
          {"reconnect_timeout_s", o.reconnect_timeout_s},
          {"report_interval_s", o.report_interval_s},
          {"shared_memory", o.shared_memory},
          {"shared_memory_bytes", o.shared_memory_bytes},
          {"payload_streams", o.payload_streams},
          {"device_buffers", o.device_buffers},
          {"device", o.device ? o.device_index : -1}};
}

// The proto3 JSON mapping writes 64-bit integers as strings (for JavaScript's doubles); a binding
// would then have to know which fields are 64-bit. They are turned back into numbers here, field
// by field from the message's descriptor, so every 64-bit field of every nested message is
// covered, including ones added later.
void Int64sAsNumbers(const google::protobuf::Descriptor& message, json* j) {
  using FD = google::protobuf::FieldDescriptor;
  auto convert = [](const FD& f, json* v) {
    if (f.cpp_type() == FD::CPPTYPE_MESSAGE) {
      Int64sAsNumbers(*f.message_type(), v);
    } else if (v->is_string() && f.cpp_type() == FD::CPPTYPE_INT64) {
      *v = std::stoll(v->get<std::string>());  // the printer wrote it: always a valid integer
    } else if (v->is_string() && f.cpp_type() == FD::CPPTYPE_UINT64) {
      *v = std::stoull(v->get<std::string>());
    }
  };
  if (!j->is_object()) return;
  for (int i = 0; i < message.field_count(); ++i) {
    const FD& f = *message.field(i);
    auto it = j->find(f.name());
    if (it == j->end()) continue;
    if (f.is_map()) {  // an object of values; keys stay strings in JSON
      const FD& value = *f.message_type()->map_value();
      for (auto& [key, v] : it->items()) convert(value, &v);
    } else if (f.is_repeated() && it->is_array()) {
      for (json& v : *it) convert(f, &v);
    } else {
      convert(f, &*it);
    }
  }
}

}  // namespace

// A handle: one reference to the shared batch.
struct conveyor_batch {
  std::shared_ptr<SharedBatch> shared;
};

namespace {

SharedBatch* Shared(const conveyor_batch* b) { return b->shared.get(); }

// Where the batch's payload block starts: its lowest tensor address (the tensors are views into
// one block, client/client.h); null when every tensor is empty.
const uint8_t* PayloadStart(const cc::Batch& batch) {
  const uint8_t* lo = nullptr;
  for (const cc::TensorView& t : batch.tensors) {
    if (t.data != nullptr && (lo == nullptr || t.data < lo)) lo = t.data;
  }
  return lo;
}

int TensorOutOfRange(uint32_t index, size_t tensors) {
  return Fail(absl::StatusCode::kOutOfRange,
              "tensor " + std::to_string(index) + " of a batch of " + std::to_string(tensors));
}

}  // namespace

extern "C" {

uint32_t conveyor_abi_version(void) { return CONVEYOR_C_ABI_VERSION; }
const char* conveyor_version(void) { return CONVEYOR_VERSION; }
uint32_t conveyor_protocol_version(void) { return cc::ProtocolVersion(); }
const char* conveyor_last_error(void) { return ::conveyor::capi::LastError().c_str(); }
void conveyor_string_free(char* s) { std::free(s); }
int conveyor_device_supported(void) { return cc::Client::device_supported() ? 1 : 0; }

int conveyor_check_device(int index) {
  absl::Status s = cc::Client::CheckDevice(index);
  return s.ok() ? CONVEYOR_OK : Fail(s);
}

int conveyor_resolve_launch(const char* request_json, char** result_json) {
  json req;
  if (absl::Status s = ParseJson(request_json, "launch request", &req); !s.ok()) return Fail(s);
  cc::LaunchOverrides o;
  try {
    if (req.contains("rank") && !req["rank"].is_null()) o.rank = req["rank"].get<int64_t>();
    if (req.contains("world_size") && !req["world_size"].is_null()) {
      o.world_size = req["world_size"].get<int64_t>();
    }
    o.servers = req.value("servers", std::string());
    o.servers_required = req.value("servers_required", true);
    o.from_jax = req.value("from_jax", false);
  } catch (const std::exception& e) {
    return Fail(absl::StatusCode::kInvalidArgument, std::string("launch request: ") + e.what());
  }
  o.rank_name = o.from_jax ? "jax.process_index()" : "rank=";
  o.world_size_name = o.from_jax ? "jax.process_count()" : "world_size=";
  absl::StatusOr<cc::LaunchEnv> e = cc::ResolveLaunch(o);
  if (!e.ok()) return Fail(e.status());
  json out = {{"rank", e->rank},
              {"world_size", e->world_size},
              {"local_rank", e->local_rank},
              {"local_world_size", e->local_world_size},
              {"source", e->source},
              {"servers", e->servers},
              {"servers_source", e->servers_source}};
  *result_json = Dup(JsonText(out));
  return CONVEYOR_OK;
}

int conveyor_get_info(const char* options_json, char** result_json) {
  json j;
  if (absl::Status s = ParseJson(options_json, "info options", &j); !s.ok()) return Fail(s);
  cc::ClientOptions o;
  if (absl::Status s = ParseClientOptions(j, &o); !s.ok()) return Fail(s);
  absl::StatusOr<conveyor::v1::InfoResponse> info = cc::GetInfo(o);
  if (!info.ok()) return Fail(info.status());
  std::string text;
  google::protobuf::util::JsonPrintOptions jo;
  jo.preserve_proto_field_names = true;
  jo.always_print_primitive_fields = true;
  if (!google::protobuf::util::MessageToJsonString(*info, &text, jo).ok()) {
    return Fail(absl::StatusCode::kInternal, "InfoResponse could not be written as JSON");
  }
  json out = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (out.is_discarded()) {
    return Fail(absl::StatusCode::kInternal, "InfoResponse's JSON could not be read back");
  }
  Int64sAsNumbers(*conveyor::v1::InfoResponse::descriptor(), &out);
  *result_json = Dup(JsonText(out));
  return CONVEYOR_OK;
}

int conveyor_client_create(const char* options_json, conveyor_client** out) {
  *out = nullptr;
  json j;
  if (absl::Status s = ParseJson(options_json, "client options", &j); !s.ok()) return Fail(s);
  cc::ClientOptions o;
  if (absl::Status s = ParseClientOptions(j, &o); !s.ok()) return Fail(s);
  absl::StatusOr<std::unique_ptr<cc::Client>> c = cc::Client::Create(std::move(o));
  if (!c.ok()) return Fail(c.status());
  *out = new conveyor_client{std::move(*c)};
  return CONVEYOR_OK;
}

int conveyor_client_next(conveyor_client* c, double timeout_s, conveyor_batch** out) {
  *out = nullptr;
  absl::StatusOr<std::optional<cc::Batch>> b =
      timeout_s < 0 ? c->client->Next() : c->client->Next(timeout_s);
  if (!b.ok()) return Fail(b.status());
  if (!b->has_value()) return CONVEYOR_OK;  // the end of the stream
  auto shared = std::make_shared<SharedBatch>();
  shared->batch = std::move(**b);
  shared->shapes.reserve(shared->batch.tensors.size());
  for (const cc::TensorView& t : shared->batch.tensors) shared->shapes.push_back(t.shape);
  *out = new conveyor_batch{std::move(shared)};
  return CONVEYOR_OK;
}

void conveyor_client_cancel(conveyor_client* c) { c->client->Cancel(); }

void conveyor_client_cursor(const conveyor_client* c, uint64_t* epoch, uint64_t* step) {
  const cc::Cursor cur = c->client->cursor();
  *epoch = cur.epoch;
  *step = cur.step;
}

uint32_t conveyor_client_schedule_version(const conveyor_client* c) {
  return c->client->schedule_version();
}

uint64_t conveyor_client_global_batch_size(const conveyor_client* c) {
  return c->client->global_batch_size();
}

int conveyor_client_coverage(const conveyor_client* c, char** result_json) {
  json slices = json::array();
  for (const cc::CoverageSlice& s : c->client->coverage()) {
    char digest[17];
    std::snprintf(digest, sizeof digest, "%016llx", static_cast<unsigned long long>(s.digest));
    slices.push_back({{"epoch", s.epoch}, {"consumer", s.consumer}, {"consumers", s.consumers},
                      {"global_batch_size", s.global_batch_size}, {"samples", s.samples},
                      {"digest", digest}, {"first_position", s.first_position},
                      {"end_position", s.end_position}, {"batches", s.batches}});
  }
  *result_json = Dup(JsonText(json{{"coverage", slices}}));
  return CONVEYOR_OK;
}

int conveyor_client_stats(const conveyor_client* c, char** result_json) {
  const cc::ClientStats s = c->client->stats();
  json out = {{"batches", s.batches},
              {"bytes", s.bytes},
              {"messages", s.messages},
              {"reconnects", s.reconnects},
              {"wait_seconds", s.wait_seconds},
              {"reports", s.reports},
              {"server", s.server},
              {"transport", s.transport},
              {"shared_memory_refused", s.shared_memory_refused},
              {"shared_memory_batches", s.shared_memory_batches},
              {"dataset_name", s.dataset_name},
              {"dataset_fingerprint", s.dataset_fingerprint},
              {"config_digest", s.config_digest},
              {"order_digest", s.order_digest}};
  *result_json = Dup(JsonText(out));
  return CONVEYOR_OK;
}

void conveyor_client_destroy(conveyor_client* c) { delete c; }

void conveyor_client_abandon(conveyor_client* c) {
  if (c != nullptr) (void)c->client.release();  // its threads live in the parent process only
  delete c;
}

int conveyor_batch_info_get(const conveyor_batch* b, conveyor_batch_info* out) {
  const cc::Batch& batch = Shared(b)->batch;
  conveyor_batch_info info{};
  info.size = out->size;
  info.epoch = batch.cursor.epoch;
  info.step = batch.cursor.step;
  info.next_epoch = batch.next.epoch;
  info.next_step = batch.next.step;
  info.position = batch.cursor.position.value_or(CONVEYOR_NO_POSITION);
  info.next_position = batch.next.position.value_or(CONVEYOR_NO_POSITION);
  info.consumer = batch.consumer;
  info.consumers = batch.consumers;
  info.samples = batch.ids.size();
  info.tensors = static_cast<uint32_t>(batch.tensors.size());
  info.packed_sequences = batch.packed_sequences;
  info.fill_ratio = batch.fill_ratio;
  info.server = batch.server.c_str();
  info.device = batch.device;
  // The tensors are views into one payload block (client/client.h): its span.
  const uint8_t* lo = PayloadStart(batch);
  const uint8_t* hi = lo;
  for (const cc::TensorView& t : batch.tensors) {
    if (t.data != nullptr && t.data + t.bytes > hi) hi = t.data + t.bytes;
  }
  info.payload = lo;
  info.payload_bytes = lo == nullptr ? 0 : static_cast<uint64_t>(hi - lo);
  std::memcpy(out, &info, std::min<size_t>(out->size, sizeof(info)));
  return CONVEYOR_OK;
}

int conveyor_batch_tensor(const conveyor_batch* b, uint32_t index, conveyor_tensor* out) {
  const SharedBatch* s = Shared(b);
  if (index >= s->batch.tensors.size()) return TensorOutOfRange(index, s->batch.tensors.size());
  const cc::TensorView& t = s->batch.tensors[index];
  conveyor_tensor info{};
  info.size = out->size;
  info.name = t.name.c_str();
  info.dtype = static_cast<int32_t>(t.dtype);
  info.role = static_cast<int32_t>(t.role);
  info.ndim = static_cast<int32_t>(t.shape.size());
  info.shape = s->shapes[index].data();
  info.data = t.data;
  info.bytes = t.bytes;
  info.device_data = t.device_data;
  std::memcpy(out, &info, std::min<size_t>(out->size, sizeof(info)));
  return CONVEYOR_OK;
}

uint64_t conveyor_batch_layout(const conveyor_batch* b) {
  const cc::Batch& batch = Shared(b)->batch;
  const uint8_t* payload = PayloadStart(batch);
  // FNV-1a over everything that places a tensor; the offset is from the payload's start.
  uint64_t h = 1469598103934665603ull;
  auto mix = [&h](const void* p, size_t n) {
    for (size_t i = 0; i < n; ++i) h = (h ^ static_cast<const uint8_t*>(p)[i]) * 1099511628211ull;
  };
  for (const cc::TensorView& t : batch.tensors) {
    mix(t.name.data(), t.name.size() + 1);  // with the NUL: names cannot run together
    const int64_t fields[4] = {static_cast<int64_t>(t.dtype), static_cast<int64_t>(t.role),
                               t.data == nullptr ? -1 : t.data - payload,
                               static_cast<int64_t>(t.shape.size())};
    mix(fields, sizeof(fields));
    mix(t.shape.data(), t.shape.size() * sizeof(int64_t));
  }
  return h;
}

int conveyor_batch_ids(const conveyor_batch* b, int64_t* ids, int32_t* datasets) {
  const cc::Batch& batch = Shared(b)->batch;
  for (size_t i = 0; i < batch.ids.size(); ++i) {
    if (ids != nullptr) {
      ids[3 * i] = static_cast<int64_t>(batch.ids[i].index);
      ids[3 * i + 1] = static_cast<int64_t>(batch.ids[i].episode);
      ids[3 * i + 2] = static_cast<int64_t>(batch.ids[i].step);
    }
    if (datasets != nullptr) datasets[i] = static_cast<int32_t>(batch.ids[i].dataset);
  }
  return CONVEYOR_OK;
}

int conveyor_batch_wait_on_stream(conveyor_batch* b, void* cuda_stream) {
  SharedBatch* s = Shared(b);
  absl::MutexLock lock(&s->mu);
  if (std::find(s->streams.begin(), s->streams.end(), cuda_stream) != s->streams.end()) {
    return CONVEYOR_OK;  // already ordered after the copy
  }
  if (absl::Status st = s->batch.WaitOnStream(cuda_stream); !st.ok()) return Fail(st);
  s->streams.push_back(cuda_stream);
  return CONVEYOR_OK;
}

int conveyor_batch_wait_device(conveyor_batch* b) {
  absl::Status st = Shared(b)->batch.WaitDevice();
  return st.ok() ? CONVEYOR_OK : Fail(st);
}

int conveyor_batch_dlpack(conveyor_batch* b, uint32_t index, int on_device, int as_uint8,
                          conveyor_dl_managed_tensor** out) {
  *out = nullptr;
  const std::shared_ptr<SharedBatch>& s = b->shared;
  if (index >= s->batch.tensors.size()) return TensorOutOfRange(index, s->batch.tensors.size());
  const cc::TensorView& t = s->batch.tensors[index];
  if (on_device && t.device_data == nullptr && t.bytes > 0) {
    return Fail(absl::StatusCode::kFailedPrecondition,
                "tensor '" + t.name + "' has no device copy (the client was made without a device)");
  }
  struct Export {
    conveyor_dl_managed_tensor managed;
    std::shared_ptr<SharedBatch> batch;
    std::vector<int64_t> shape;
  };
  auto* e = new (std::nothrow) Export{};
  if (e == nullptr) return Fail(absl::StatusCode::kResourceExhausted, "out of memory");
  e->batch = s;
  e->shape = t.shape;
  conveyor_dl_tensor& d = e->managed.dl_tensor;
  d.data = on_device ? t.device_data : const_cast<uint8_t*>(t.data);
  d.device = {on_device ? 2 : 1, on_device ? s->batch.device : 0};
  d.ndim = static_cast<int32_t>(e->shape.size());
  d.dtype = {1, 8, 1};  // uint8
  if (!as_uint8) {
    switch (t.dtype) {
      case cc::DType::kUint8: d.dtype = {1, 8, 1}; break;
      case cc::DType::kBool: d.dtype = {6, 8, 1}; break;
      case cc::DType::kFloat32: d.dtype = {2, 32, 1}; break;
      case cc::DType::kInt32: d.dtype = {0, 32, 1}; break;
      case cc::DType::kFloat16: d.dtype = {2, 16, 1}; break;
      case cc::DType::kBFloat16: d.dtype = {4, 16, 1}; break;  // DLPack's kDLBfloat
    }
  }
  d.shape = e->shape.data();
  d.strides = nullptr;
  d.byte_offset = 0;
  e->managed.manager_ctx = e;
  e->managed.deleter = [](conveyor_dl_managed_tensor* self) {
    delete static_cast<Export*>(self->manager_ctx);
  };
  *out = &e->managed;
  return CONVEYOR_OK;
}

void conveyor_batch_free(conveyor_batch* b) { delete b; }

}  // extern "C"

extern "C" {

int conveyor_parse_cursor(const char* text, uint64_t* epoch, uint64_t* step, uint64_t* position) {
  if (text == nullptr || epoch == nullptr || step == nullptr || position == nullptr) {
    return Fail(absl::StatusCode::kInvalidArgument, "conveyor_parse_cursor: a NULL argument");
  }
  absl::StatusOr<cc::Cursor> c = cc::Cursor::Parse(text);
  if (!c.ok()) return Fail(c.status());
  *epoch = c->epoch;
  *step = c->step;
  *position = c->position.value_or(CONVEYOR_NO_POSITION);
  return CONVEYOR_OK;
}

int conveyor_client_defaults(char** result_json) {
  if (result_json == nullptr) {
    return Fail(absl::StatusCode::kInvalidArgument, "conveyor_client_defaults: result_json is NULL");
  }
  *result_json = Dup(JsonText(ClientOptionsJson(cc::ClientOptions{})));
  return CONVEYOR_OK;
}

}  // extern "C"
