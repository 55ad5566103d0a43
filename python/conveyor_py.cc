// conveyor._conveyor: the C++ client (client/client.h) for Python, without copying batch data.
//
// Client.next() waits for a batch with the GIL released and returns a dict: one numpy array per
// tensor, in batch order, each a view of the batch's block (the client parses the received payload
// straight into one aligned block per batch, client/client.h) whose `base` is a capsule
// holding the batch's storage (one capsule per batch, shared by its arrays), so the bytes live
// as long as any array of the batch does, after the Client is gone too; then the metadata keys
// (see kMetaKeys). The arrays are writable: the buffer belongs to this batch alone (nothing else
// reads it once Next() has returned it), and torch.from_numpy / from_dlpack refuse or warn on
// read-only arrays.
//
// With device delivery (device >= 0: the C++ client copies each batch to that CUDA device as it
// arrives, device/upload.h), or dlpack=True on the host, the tensors are `Tensor` objects instead:
// DLPack exporters (__dlpack__, __dlpack_device__) for torch.from_dlpack and any other consumer,
// owning the batch as the capsule does. __dlpack__(stream=S) orders S after the batch's copy on
// the GPU (cudaStreamWaitEvent; the host never waits) and remembers S: when the last tensor of the
// batch is gone, the batch records its use on every such stream, so its device buffer is not
// reused before the work queued there is done (as torch's record_stream).
//
// Errors are ConveyorError (a RuntimeError) with the status code name in `.code` and the
// client's or server's message; the end of the stream (a std::nullopt from Next) is StopIteration,
// and OUT_OF_RANGE (a cursor past the end of the data) is an error like any other.
#include <google/protobuf/util/json_util.h>
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "client/client.h"
#include "client/launch_env.h"
#include "conveyor/v1/service.pb.h"

namespace py = pybind11;
namespace cc = conveyor::client;

namespace {

// The DLPack ABI (dlpack.h v0.8, github.com/dmlc/dlpack), which is a stable C struct layout;
// spelled out here because Debian packages no dlpack.h.
namespace dl {
enum DeviceType : int32_t { kCPU = 1, kCUDA = 2 };
struct Device {
  int32_t device_type;
  int32_t device_id;
};
enum TypeCode : uint8_t { kInt = 0, kUInt = 1, kFloat = 2, kBool = 6 };
struct DataType {
  uint8_t code;
  uint8_t bits;
  uint16_t lanes;
};
struct Tensor {
  void* data;
  Device device;
  int32_t ndim;
  DataType dtype;
  int64_t* shape;
  int64_t* strides;  // null: C-contiguous
  uint64_t byte_offset;
};
struct ManagedTensor {
  Tensor dl_tensor;
  void* manager_ctx;
  void (*deleter)(ManagedTensor* self);
};
}  // namespace dl

// conveyor._conveyor.ConveyorError; created at import, never freed (it outlives every caller).
PyObject* g_error = nullptr;

constexpr const char* kMetaKeys[] = {"_cursor", "_next",   "_consumer",         "_consumers",
                                     "_ids",    "_dataset", "_server", "_packed_sequences",
                                     "_fill_ratio"};

[[noreturn]] void Raise(const absl::Status& s) {
  const std::string code(absl::StatusCodeToString(s.code()));
  py::object error =
      py::reinterpret_borrow<py::object>(g_error)(code + ": " + std::string(s.message()));
  error.attr("code") = code;
  PyErr_SetObject(g_error, error.ptr());
  throw py::error_already_set();
}

py::dtype NumpyType(cc::DType t) {
  switch (t) {
    case cc::DType::kUint8:
      return py::dtype::of<uint8_t>();
    case cc::DType::kBool:
      return py::dtype::of<bool>();
    case cc::DType::kFloat32:
      return py::dtype::of<float>();
    case cc::DType::kInt32:
      return py::dtype::of<int32_t>();
  }
  return py::dtype::of<uint8_t>();
}

py::tuple CursorTuple(const cc::Cursor& c) { return py::make_tuple(c.epoch, c.step); }

void AddMetadata(const cc::Batch& b, py::dict* dict);

// Tensors as views (batch order), then metadata.
py::dict ToDict(cc::Batch&& b) {
  py::dict out;
  // One owner for all arrays of the batch: each array holds a reference to the capsule, the
  // capsule holds the storage (the batch's block, back to the client's pool when released).
  auto* holder = new std::shared_ptr<void>(std::move(b.storage));
  py::capsule base(holder, [](void* p) { delete static_cast<std::shared_ptr<void>*>(p); });
  for (const cc::Tensor& t : b.tensors) {
    std::vector<py::ssize_t> shape(t.shape.begin(), t.shape.end());
    std::vector<py::ssize_t> strides(shape.size());
    py::ssize_t stride = static_cast<py::ssize_t>(cc::DTypeSize(t.dtype));
    for (size_t i = shape.size(); i-- > 0;) {
      strides[i] = stride;
      stride *= shape[i];
    }
    if (out.contains(t.name)) {
      Raise(absl::DataLossError("batch " + b.cursor.ToString() + " has two tensors named '" +
                                t.name + "'"));
    }
    // A null pointer (empty tensor) makes numpy allocate an empty array of its own.
    out[py::str(t.name)] = py::array(NumpyType(t.dtype), std::move(shape), std::move(strides),
                                     t.data, t.data ? py::handle(base) : py::handle());
  }
  AddMetadata(b, &out);
  return out;
}

// The metadata keys (kMetaKeys) after the tensors.
void AddMetadata(const cc::Batch& b, py::dict* dict) {
  py::dict& out = *dict;
  for (const char* key : kMetaKeys) {
    if (out.contains(key)) {
      Raise(absl::InvalidArgumentError(std::string("batch tensor '") + key +
                                       "' collides with the metadata key of that name"));
    }
  }
  py::array_t<int64_t> ids({static_cast<py::ssize_t>(b.ids.size()), static_cast<py::ssize_t>(3)});
  auto w = ids.mutable_unchecked<2>();
  for (size_t i = 0; i < b.ids.size(); ++i) {
    w(i, 0) = static_cast<int64_t>(b.ids[i].index);
    w(i, 1) = static_cast<int64_t>(b.ids[i].episode);
    w(i, 2) = static_cast<int64_t>(b.ids[i].step);
  }
  out["_cursor"] = CursorTuple(b.cursor);
  out["_next"] = CursorTuple(b.next);
  out["_consumer"] = b.consumer;
  out["_consumers"] = b.consumers;
  out["_ids"] = std::move(ids);
  py::array_t<int32_t> dataset(static_cast<py::ssize_t>(b.ids.size()));
  auto d = dataset.mutable_unchecked<1>();
  for (size_t i = 0; i < b.ids.size(); ++i) d(i) = static_cast<int32_t>(b.ids[i].dataset);
  out["_dataset"] = std::move(dataset);
  out["_server"] = b.server;
  out["_packed_sequences"] = b.packed_sequences;
  out["_fill_ratio"] = b.fill_ratio;
}

// A received batch shared by its exported tensors. Destroyed when the last of them (and the last
// DLPack capsule a consumer still holds) is gone, with or without the GIL: it touches no Python.
struct SharedBatch {
  cc::Batch batch;
  // CUDA streams (as void*) a consumer asked for through __dlpack__; they may read the device
  // buffer. Changed only under the GIL, read by the destructor (the last owner).
  std::vector<void*> streams;
  ~SharedBatch() {
    for (void* s : streams) (void)batch.RecordUse(s).ok();  // nobody to tell of a failure
  }
};

// One tensor of a batch as a DLPack exporter.
class PyTensor {
 public:
  PyTensor(std::shared_ptr<SharedBatch> batch, size_t index, bool on_device, bool as_uint8 = false)
      : batch_(std::move(batch)), index_(index), on_device_(on_device), as_uint8_(as_uint8) {}

  const cc::Tensor& tensor() const { return batch_->batch.tensors[index_]; }
  std::string name() const { return tensor().name; }
  py::tuple shape() const { return py::cast(tensor().shape); }
  std::string dtype() const {
    return as_uint8_ ? "uint8" : std::string(py::str(NumpyType(tensor().dtype)));
  }
  py::tuple Device() const {
    return py::make_tuple(static_cast<int>(on_device_ ? dl::kCUDA : dl::kCPU), DeviceId());
  }

  // The same bytes exported as uint8: DLPack consumers older than its kDLBool (torch 1.x,
  // numpy 1.x) refuse bool tensors; the Loader views the result as torch.bool.
  PyTensor AsUint8() const { return PyTensor(batch_, index_, on_device_, true); }

  // A numpy view of the host bytes the batch arrived in (the device copy's source).
  py::array Host() const {
    const cc::Tensor& t = tensor();
    auto* holder = new std::shared_ptr<SharedBatch>(batch_);
    py::capsule base(holder, [](void* p) { delete static_cast<std::shared_ptr<SharedBatch>*>(p); });
    return py::array(as_uint8_ ? py::dtype::of<uint8_t>() : NumpyType(t.dtype),
                     std::vector<py::ssize_t>(t.shape.begin(), t.shape.end()), t.data,
                     t.data ? py::handle(base) : py::handle());
  }

  // The array API's __dlpack__: a "dltensor" capsule (unversioned DLPack, which every consumer
  // reads). stream: None is CUDA's legacy default stream, -1 asks for no ordering, 1 and 2 are
  // cudaStreamLegacy and cudaStreamPerThread, anything else a cudaStream_t. Views only: copy=True
  // is refused (BufferError), as is a dl_device other than this tensor's.
  py::capsule DLPack(py::object stream, py::object max_version, py::object dl_device,
                     py::object copy) {
    if (!copy.is_none() && copy.cast<bool>()) {
      throw py::buffer_error("conveyor tensors are exported as views: copy=True is not supported");
    }
    if (!dl_device.is_none()) {
      const auto want = dl_device.cast<std::pair<int, int>>();
      if (want.first != (on_device_ ? dl::kCUDA : dl::kCPU) || want.second != DeviceId()) {
        throw py::buffer_error("conveyor tensor '" + name() + "' lives on another device");
      }
    }
    if (on_device_) {
      const int64_t s = stream.is_none() ? 1 : stream.cast<int64_t>();
      if (s == 0) {
        throw py::value_error("__dlpack__(stream=0) is ambiguous for CUDA: pass 1 for the legacy "
                              "default stream, 2 for the per-thread one, or a stream");
      }
      if (s != -1) {
        void* cuda_stream = reinterpret_cast<void*>(static_cast<intptr_t>(s));
        std::vector<void*>& seen = batch_->streams;
        if (std::find(seen.begin(), seen.end(), cuda_stream) == seen.end()) {
          absl::Status st = batch_->batch.WaitOnStream(cuda_stream);
          if (!st.ok()) Raise(st);
          seen.push_back(cuda_stream);
        }
      }
    }
    struct Export {
      dl::ManagedTensor managed;
      std::shared_ptr<SharedBatch> batch;
      std::vector<int64_t> shape;
    };
    const cc::Tensor& t = tensor();
    auto* e = new Export{};
    e->batch = batch_;
    e->shape = t.shape;
    dl::Tensor& d = e->managed.dl_tensor;
    d.data = on_device_ ? t.device_data : const_cast<uint8_t*>(t.data);
    d.device = {on_device_ ? dl::kCUDA : dl::kCPU, DeviceId()};
    d.ndim = static_cast<int32_t>(e->shape.size());
    d.dtype = DataTypeOf(t.dtype);
    d.shape = e->shape.data();
    d.strides = nullptr;
    d.byte_offset = 0;
    e->managed.manager_ctx = e;
    e->managed.deleter = [](dl::ManagedTensor* self) { delete static_cast<Export*>(self->manager_ctx); };
    // A capsule nobody consumed still owns its tensor; a consumer renames it "used_dltensor" and
    // calls the deleter itself when it is done.
    return py::capsule(&e->managed, "dltensor", [](PyObject* capsule) {
      if (PyCapsule_IsValid(capsule, "dltensor")) {
        auto* m = static_cast<dl::ManagedTensor*>(PyCapsule_GetPointer(capsule, "dltensor"));
        m->deleter(m);
      } else {
        PyErr_Clear();
      }
    });
  }

 private:
  int DeviceId() const { return on_device_ ? batch_->batch.device : 0; }

  dl::DataType DataTypeOf(cc::DType t) const {
    if (as_uint8_) return {dl::kUInt, 8, 1};
    switch (t) {
      case cc::DType::kUint8:
        return {dl::kUInt, 8, 1};
      case cc::DType::kBool:
        return {dl::kBool, 8, 1};
      case cc::DType::kFloat32:
        return {dl::kFloat, 32, 1};
      case cc::DType::kInt32:
        return {dl::kInt, 32, 1};
    }
    return {dl::kUInt, 8, 1};
  }

  std::shared_ptr<SharedBatch> batch_;
  size_t index_;
  bool on_device_;
  bool as_uint8_;
};

// Tensors as DLPack exporters (batch order), then metadata.
py::dict ToTensorDict(cc::Batch&& b, bool on_device) {
  auto shared = std::make_shared<SharedBatch>();
  shared->batch = std::move(b);
  const cc::Batch& batch = shared->batch;
  py::dict out;
  for (size_t i = 0; i < batch.tensors.size(); ++i) {
    const std::string& name = batch.tensors[i].name;
    if (out.contains(name)) {
      Raise(absl::DataLossError("batch " + batch.cursor.ToString() + " has two tensors named '" +
                                name + "'"));
    }
    out[py::str(name)] = PyTensor(shared, i, on_device);
  }
  AddMetadata(batch, &out);
  return out;
}

class PyClient {
 public:
  PyClient(cc::ClientOptions o, bool dlpack) : dlpack_(dlpack || o.device), on_device_(o.device) {
    absl::StatusOr<std::unique_ptr<cc::Client>> c = cc::Client::Create(std::move(o));
    if (!c.ok()) Raise(c.status());
    client_ = std::shared_ptr<cc::Client>(std::move(*c));
  }

  ~PyClient() { Close(); }

  py::dict Next() {
    std::shared_ptr<cc::Client> c = Get();  // a close() from another thread waits for us
    absl::StatusOr<std::optional<cc::Batch>> b;
    for (;;) {
      {
        py::gil_scoped_release release;
        b = c->Next(0.1);
      }
      if (!absl::IsDeadlineExceeded(b.status())) break;
      // Waiting: let Python run its signal handlers (Ctrl-C raises KeyboardInterrupt here).
      if (PyErr_CheckSignals() != 0) throw py::error_already_set();
    }
    if (!b.ok()) Raise(b.status());  // every error, OUT_OF_RANGE (a cursor past the end) included
    if (!b->has_value()) throw py::stop_iteration("end of the stream");
    if (dlpack_) return ToTensorDict(std::move(**b), on_device_);
    return ToDict(std::move(**b));
  }

  py::tuple Cursor() const { return CursorTuple(Get()->cursor()); }
  uint32_t ScheduleVersion() const { return Get()->schedule_version(); }

  py::dict Stats() const {
    const cc::ClientStats s = Get()->stats();
    py::dict d;
    d["batches"] = s.batches;
    d["bytes"] = s.bytes;
    d["messages"] = s.messages;
    d["reconnects"] = s.reconnects;
    d["wait_seconds"] = s.wait_seconds;
    d["server"] = s.server;
    d["transport"] = s.transport;
    d["shared_memory_batches"] = s.shared_memory_batches;
    d["shared_memory_refused"] = s.shared_memory_refused;
    return d;
  }

  // Cancels the stream and joins the client's thread (GIL released). Arrays already returned
  // stay valid. A next() waiting in another thread returns at once with an error.
  void Close() {
    std::shared_ptr<cc::Client> c = std::move(client_);
    client_.reset();
    if (c && getpid() != owner_pid_) {
      // A forked child (a DataLoader worker) closing a copy of its parent's client: the client's
      // threads exist only in the parent, and joining them here aborts the child ("No such
      // process"). The copy is left alone; the parent's client is unaffected.
      new std::shared_ptr<cc::Client>(std::move(c));
      return;
    }
    if (c) {
      c->Cancel();  // wakes a next() waiting in another thread (it gets CANCELLED)
      py::gil_scoped_release release;
      c.reset();
    }
  }

  bool closed() const { return client_ == nullptr; }

 private:
  std::shared_ptr<cc::Client> Get() const {
    if (!client_) Raise(absl::FailedPreconditionError("the client is closed"));
    return client_;
  }

  const bool dlpack_;     // tensors as PyTensor (DLPack) rather than numpy views
  const bool on_device_;  // device delivery: the PyTensors export the device copies
  std::shared_ptr<cc::Client> client_;
  const pid_t owner_pid_ = getpid();
};

cc::ClientOptions MakeOptions(std::vector<std::string> servers, std::string job, uint32_t consumer,
                              uint32_t consumers, std::pair<uint64_t, uint64_t> start,
                              std::string config_yaml, std::string config_name,
                              uint64_t max_batches, size_t prefetch_batches,
                              uint64_t prefetch_bytes, uint64_t max_message_bytes,
                              std::string auth_token, double reconnect_timeout_s,
                              std::string dataset, bool tls, std::string tls_ca_pem,
                              std::string tls_cert_pem, std::string tls_key_pem,
                              std::string tls_server_name, uint32_t schedule_version,
                              bool shared_memory, uint64_t shared_memory_bytes, int device,
                              size_t device_buffers) {
  cc::ClientOptions o;
  o.device = device >= 0;
  o.device_index = std::max(device, 0);
  o.device_buffers = device_buffers;
  o.shared_memory = shared_memory;
  o.shared_memory_bytes = shared_memory_bytes;
  o.schedule_version = schedule_version;
  o.servers = std::move(servers);
  o.job = std::move(job);
  o.consumer = consumer;
  o.consumers = consumers;
  o.start = {start.first, start.second};
  o.config_yaml = std::move(config_yaml);
  o.config_name = std::move(config_name);
  o.max_batches = max_batches;
  o.prefetch_batches = prefetch_batches;
  o.prefetch_bytes = prefetch_bytes;
  o.max_message_bytes = max_message_bytes;
  o.auth_token = std::move(auth_token);
  o.reconnect_timeout_s = reconnect_timeout_s;
  o.dataset = std::move(dataset);
  o.tls = tls || !tls_ca_pem.empty() || !tls_cert_pem.empty();
  o.tls_ca_pem = std::move(tls_ca_pem);
  o.tls_cert_pem = std::move(tls_cert_pem);
  o.tls_key_pem = std::move(tls_key_pem);
  o.tls_server_name = std::move(tls_server_name);
  return o;
}

}  // namespace

PYBIND11_MODULE(_conveyor, m) {
  m.doc() = "Conveyor's C++ client (client/client.h) for Python; use the `conveyor` package.";
  g_error = PyErr_NewExceptionWithDoc(
      "conveyor._conveyor.ConveyorError",
      "An error from the Conveyor client or a data server; `.code` is the status code name "
      "(INVALID_ARGUMENT, UNAVAILABLE, ...).",
      PyExc_RuntimeError, nullptr);
  if (g_error == nullptr) throw py::error_already_set();
  m.attr("ConveyorError") = py::handle(g_error);  // the module takes its own reference
  m.attr("__version__") = CONVEYOR_VERSION;
  m.attr("METADATA_KEYS") =
      py::tuple(py::cast(std::vector<std::string>(std::begin(kMetaKeys), std::end(kMetaKeys))));
  m.def("protocol_version", &cc::ProtocolVersion, "The conveyor.v1 protocol version spoken.");
  m.def("device_supported", &cc::Client::device_supported,
        "Whether device delivery can work here: built with CUDA and a usable GPU.");
  m.def(
      "check_device",
      [](int index) {
        absl::Status s = cc::Client::CheckDevice(index);
        if (!s.ok()) Raise(s);
      },
      py::arg("index"),
      "Raises ConveyorError (FAILED_PRECONDITION: no usable GPU, and why; INVALID_ARGUMENT: no "
      "such device) unless device delivery to CUDA device `index` can work here.");

  py::class_<PyTensor>(m, "Tensor",
                       "One tensor of a batch as a DLPack exporter (torch.from_dlpack, "
                       "numpy.from_dlpack, ...): on the GPU with device delivery, else the host "
                       "bytes. Keeps its batch alive.")
      .def_property_readonly("name", &PyTensor::name)
      .def_property_readonly("shape", &PyTensor::shape)
      .def_property_readonly("dtype", &PyTensor::dtype, "The numpy dtype name.")
      .def_property_readonly("host", &PyTensor::Host,
                             "A numpy view of the host bytes the batch arrived in.")
      .def("as_uint8", &PyTensor::AsUint8,
           "The same bytes exported as uint8 (for consumers that lack DLPack's bool).")
      .def("__dlpack_device__", &PyTensor::Device)
      .def("__dlpack__", &PyTensor::DLPack, py::kw_only(), py::arg("stream") = py::none(),
           py::arg("max_version") = py::none(), py::arg("dl_device") = py::none(),
           py::arg("copy") = py::none(),
           "A DLPack capsule of this tensor; a CUDA `stream` is ordered after the batch's copy "
           "without a host wait.")
      .def("__repr__", [](const PyTensor& t) {
        return "conveyor.Tensor(name=" + t.name() + ", shape=" + std::string(py::str(t.shape())) +
               ", dtype=" + t.dtype() + ", device=" + std::string(py::str(t.Device())) + ")";
      });

  py::class_<PyClient>(m, "Client",
                       "One stream of batches (client/client.h). next() returns a dict of numpy "
                       "views plus metadata; StopIteration at the end of the stream.")
      .def(py::init([](std::vector<std::string> servers, std::string job, uint32_t consumer,
                       uint32_t consumers, std::pair<uint64_t, uint64_t> start,
                       std::string config_yaml, std::string config_name, uint64_t max_batches,
                       size_t prefetch_batches, uint64_t prefetch_bytes, uint64_t max_message_bytes,
                       std::string auth_token, double reconnect_timeout_s, std::string dataset,
                       bool tls, std::string tls_ca_pem, std::string tls_cert_pem,
                       std::string tls_key_pem, std::string tls_server_name, uint32_t schedule_version,
                       bool shared_memory, uint64_t shared_memory_bytes, int device,
                       size_t device_buffers, bool dlpack) {
             return std::make_unique<PyClient>(MakeOptions(
                 std::move(servers), std::move(job), consumer, consumers, start,
                 std::move(config_yaml), std::move(config_name), max_batches, prefetch_batches,
                 prefetch_bytes, max_message_bytes, std::move(auth_token), reconnect_timeout_s,
                 std::move(dataset), tls, std::move(tls_ca_pem), std::move(tls_cert_pem),
                 std::move(tls_key_pem), std::move(tls_server_name), schedule_version,
                 shared_memory, shared_memory_bytes, device, device_buffers), dlpack);
           }),
           py::kw_only(), py::arg("servers"), py::arg("job") = "default", py::arg("consumer") = 0,
           py::arg("consumers") = 1, py::arg("start") = std::pair<uint64_t, uint64_t>{0, 0},
           py::arg("config_yaml") = "", py::arg("config_name") = "", py::arg("max_batches") = 0,
           py::arg("prefetch_batches") = 4, py::arg("prefetch_bytes") = uint64_t{1} << 30,
           py::arg("max_message_bytes") = 0, py::arg("auth_token") = "",
           py::arg("reconnect_timeout_s") = 60.0, py::arg("dataset") = "", py::arg("tls") = false,
           py::arg("tls_ca_pem") = "", py::arg("tls_cert_pem") = "", py::arg("tls_key_pem") = "",
           py::arg("tls_server_name") = "", py::arg("schedule_version") = 0,
           py::arg("shared_memory") = true, py::arg("shared_memory_bytes") = uint64_t{256} << 20,
           py::arg("device") = -1, py::arg("device_buffers") = 0, py::arg("dlpack") = false)
      .def("next", &PyClient::Next,
           "The next batch: {tensor name: numpy view, ..., '_cursor': (epoch, step), '_next': "
           "(epoch, step), '_consumer', '_consumers', '_ids': int64 [n, 3] (index, episode, "
           "step), '_server', '_packed_sequences', '_fill_ratio'}. Waits with the GIL released.")
      .def("__next__", &PyClient::Next)
      .def("__iter__", [](py::object self) { return self; })
      .def("cursor", &PyClient::Cursor,
           "(epoch, step) right after the last batch next() returned: resume from it.")
      .def("schedule_version", [](PyClient& c) { return c.ScheduleVersion(); },
           "The order's schedule version from the server (0 before the first batch): save it "
           "with the cursor.")
      .def("stats", &PyClient::Stats)
      .def("close", &PyClient::Close, "Cancels the stream; arrays already returned stay valid.")
      .def_property_readonly("closed", &PyClient::closed)
      .def("__enter__", [](py::object self) { return self; })
      .def("__exit__", [](PyClient& c, py::args) { c.Close(); });

  m.def(
      "resolve_launch",
      [](std::optional<int64_t> rank, std::optional<int64_t> world_size, std::string servers,
         bool servers_required, bool from_jax) {
        cc::LaunchOverrides o;
        o.rank = rank;
        o.world_size = world_size;
        o.rank_name = from_jax ? "jax.process_index()" : "rank=";
        o.world_size_name = from_jax ? "jax.process_count()" : "world_size=";
        o.from_jax = from_jax;
        o.servers = std::move(servers);
        o.servers_required = servers_required;
        absl::StatusOr<cc::LaunchEnv> e = cc::ResolveLaunch(o);
        // Bad arguments or launcher variables are the caller's ValueError, as in Python itself.
        if (!e.ok() && e.status().code() == absl::StatusCode::kInvalidArgument) {
          throw py::value_error(std::string(e.status().message()));
        }
        if (!e.ok()) Raise(e.status());
        py::dict d;
        d["rank"] = e->rank;
        d["world_size"] = e->world_size;
        d["local_rank"] = e->local_rank;
        d["local_world_size"] = e->local_world_size;
        d["source"] = e->source;
        d["servers"] = e->servers;
        d["servers_source"] = e->servers_source;
        return d;
      },
      py::kw_only(), py::arg("rank") = py::none(), py::arg("world_size") = py::none(),
      py::arg("servers") = "", py::arg("servers_required") = true, py::arg("from_jax") = false,
      "Rank, world size, local rank and servers: the arguments given, else what torchrun, Open "
      "MPI or SLURM set, else 0 of 1 (client/launch_env.h, docs/launch.md). ValueError when they "
      "are inconsistent.");

  m.def(
      "get_info",
      [](std::vector<std::string> servers, std::string auth_token) {
        cc::ClientOptions o;
        o.servers = std::move(servers);
        o.auth_token = std::move(auth_token);
        absl::StatusOr<conveyor::v1::InfoResponse> info;
        {
          py::gil_scoped_release release;
          info = cc::GetInfo(o);
        }
        if (!info.ok()) Raise(info.status());
        std::string json;
        google::protobuf::util::JsonPrintOptions jo;
        jo.preserve_proto_field_names = true;
        jo.always_print_primitive_fields = true;
        (void)google::protobuf::util::MessageToJsonString(*info, &json, jo);
        return json;
      },
      py::kw_only(), py::arg("servers"), py::arg("auth_token") = "",
      "Info from the first server that answers, as JSON text (conveyor.v1.InfoResponse).");
}
