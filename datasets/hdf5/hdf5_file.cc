#include "datasets/hdf5/hdf5_file.h"

#include <hdf5.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <map>

#include "base/status_macros.h"
#include "base/strings.h"
#include "datasets/internal/format_util.h"

namespace conveyor::hdf5 {
namespace {

// ---------------------------------------------------------------------------------------------
// The virtual file driver: libhdf5 reads the file's metadata through a RandomAccessFile. Its
// callbacks run under libhdf5's global lock (the library is built thread-safe), so the per-file
// state below needs no lock of its own.

constexpr uint64_t kBlock = 64 << 10;     // metadata read unit
constexpr size_t kMaxBlocks = 64;         // blocks kept per open file (4 MiB)

struct DriverInfo {
  const RandomAccessFile* file;
};

struct StorageFd {
  H5FD_t pub;  // first: libhdf5 sees only this
  const RandomAccessFile* file = nullptr;
  haddr_t eoa = 0;
  std::map<uint64_t, std::string> blocks;  // block index -> bytes
};

// The last read error of this thread's libhdf5 call, for the message (libhdf5 itself only says
// "read failed").
thread_local std::string g_io_error;

H5FD_t* FdOpen(const char*, unsigned flags, hid_t fapl, haddr_t) {
  if ((flags & H5F_ACC_RDWR) != 0) return nullptr;
  const auto* info = static_cast<const DriverInfo*>(H5Pget_driver_info(fapl));
  if (info == nullptr || info->file == nullptr) return nullptr;
  auto* fd = new StorageFd();
  std::memset(&fd->pub, 0, sizeof(fd->pub));
  fd->file = info->file;
  return &fd->pub;
}

herr_t FdClose(H5FD_t* f) {
  delete reinterpret_cast<StorageFd*>(f);
  return 0;
}

int FdCmp(const H5FD_t* a, const H5FD_t* b) {
  const auto* x = reinterpret_cast<const StorageFd*>(a)->file;
  const auto* y = reinterpret_cast<const StorageFd*>(b)->file;
  return x < y ? -1 : x > y ? 1 : 0;
}

herr_t FdQuery(const H5FD_t*, unsigned long* flags) {
  *flags = H5FD_FEAT_AGGREGATE_METADATA | H5FD_FEAT_ACCUMULATE_METADATA | H5FD_FEAT_DATA_SIEVE |
           H5FD_FEAT_AGGREGATE_SMALLDATA;
  return 0;
}

haddr_t FdGetEoa(const H5FD_t* f, H5FD_mem_t) { return reinterpret_cast<const StorageFd*>(f)->eoa; }
herr_t FdSetEoa(H5FD_t* f, H5FD_mem_t, haddr_t addr) {
  reinterpret_cast<StorageFd*>(f)->eoa = addr;
  return 0;
}
haddr_t FdGetEof(const H5FD_t* f, H5FD_mem_t) {
  return reinterpret_cast<const StorageFd*>(f)->file->size();
}

herr_t FdGetHandle(H5FD_t* f, hid_t, void** handle) {
  *handle = const_cast<RandomAccessFile*>(reinterpret_cast<StorageFd*>(f)->file);
  return 0;
}

herr_t FdRead(H5FD_t* f, H5FD_mem_t, hid_t, haddr_t addr, size_t size, void* buf) {
  auto* fd = reinterpret_cast<StorageFd*>(f);
  const uint64_t eof = fd->file->size();
  if (addr > eof || size > eof - addr) {
    // libhdf5 reads past the end only for a damaged (cut) file: the bytes do not exist.
    g_io_error = StrCat("read of ", size, " bytes at offset ", addr, " is past the end of the ",
                        eof, "-byte file (truncated?)");
    return -1;
  }
  char* dst = static_cast<char*>(buf);
  while (size > 0) {
    const uint64_t b = addr / kBlock;
    auto it = fd->blocks.find(b);
    if (it == fd->blocks.end()) {
      if (fd->blocks.size() >= kMaxBlocks) fd->blocks.erase(fd->blocks.begin());
      const uint64_t start = b * kBlock;
      std::string bytes(static_cast<size_t>(std::min(kBlock, eof - start)), '\0');
      if (absl::Status s = fd->file->Read(start, bytes.size(), bytes.data()); !s.ok()) {
        g_io_error = std::string(s.message());
        return -1;
      }
      it = fd->blocks.emplace(b, std::move(bytes)).first;
    }
    const uint64_t in = addr - b * kBlock;
    const size_t n = static_cast<size_t>(std::min<uint64_t>(size, it->second.size() - in));
    std::memcpy(dst, it->second.data() + in, n);
    dst += n;
    addr += n;
    size -= n;
  }
  return 0;
}

herr_t FdWrite(H5FD_t*, H5FD_mem_t, hid_t, haddr_t, size_t, const void*) { return -1; }
herr_t FdTruncate(H5FD_t*, hid_t, hbool_t) { return 0; }

H5FD_class_t MakeClass() {
  H5FD_class_t c;
  std::memset(&c, 0, sizeof(c));
  c.name = "conveyor_storage";
  c.maxaddr = (haddr_t{1} << 62) - 1;
  c.fc_degree = H5F_CLOSE_WEAK;
  c.fapl_size = sizeof(DriverInfo);
  c.open = FdOpen;
  c.close = FdClose;
  c.cmp = FdCmp;
  c.query = FdQuery;
  c.get_eoa = FdGetEoa;
  c.set_eoa = FdSetEoa;
  c.get_eof = FdGetEof;
  c.get_handle = FdGetHandle;
  c.read = FdRead;
  c.write = FdWrite;
  c.truncate = FdTruncate;
  const H5FD_mem_t map[] = H5FD_FLMAP_DICHOTOMY;
  std::memcpy(c.fl_map, map, sizeof(map));
  return c;
}

hid_t Driver() {
  static const H5FD_class_t cls = MakeClass();
  static const hid_t id = H5FDregister(&cls);
  return id;
}

// ---------------------------------------------------------------------------------------------
// Errors: libhdf5's error stack (per thread) as text, and RAII for its ids.

herr_t CollectError(unsigned n, const H5E_error2_t* e, void* data) {
  auto* out = static_cast<std::string*>(data);
  if (n < 3 && e->desc != nullptr && e->desc[0] != 0) {
    StrAppend(out, out->empty() ? "" : "; ", e->desc);
  }
  return 0;
}

// Silences libhdf5's printing of errors on this thread (the setting is per thread).
void Quiet() { H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr); }

std::string H5Message() {
  std::string text;
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_UPWARD, CollectError, &text);
  H5Eclear2(H5E_DEFAULT);
  if (!g_io_error.empty()) {
    StrAppend(&text, text.empty() ? "" : "; ", g_io_error);
    g_io_error.clear();
  }
  return text.empty() ? "libhdf5 gave no reason" : text;
}

struct Id {
  hid_t id = H5I_INVALID_HID;
  herr_t (*close)(hid_t) = nullptr;
  Id(hid_t i, herr_t (*c)(hid_t)) : id(i), close(c) {}
  ~Id() {
    if (id >= 0 && close != nullptr) close(id);
  }
  Id(const Id&) = delete;
  Id& operator=(const Id&) = delete;
  bool ok() const { return id >= 0; }
};

DType TypeOf(hid_t type) {
  DType d;
  d.size = H5Tget_size(type);
  H5T_class_t cls = H5Tget_class(type);
  Id super(H5I_INVALID_HID, H5Tclose);
  if (cls == H5T_ENUM) {  // h5py's bool: an enum over int8
    super.id = H5Tget_super(type);
    if (super.ok()) {
      type = super.id;
      cls = H5Tget_class(type);
    }
  }
  d.big_endian = (cls == H5T_INTEGER || cls == H5T_FLOAT) && H5Tget_order(type) == H5T_ORDER_BE;
  const std::string bits = std::to_string(d.size * 8);
  if (cls == H5T_INTEGER) {
    const bool is_signed = H5Tget_sign(type) == H5T_SGN_2;
    d.cls = is_signed ? TypeClass::kInt : TypeClass::kUInt;
    d.text = (is_signed ? "int" : "uint") + bits;
  } else if (cls == H5T_FLOAT) {
    d.cls = TypeClass::kFloat;
    d.text = "float" + bits;
  } else if (cls == H5T_STRING) {
    d.cls = TypeClass::kString;
    d.text = H5Tis_variable_str(type) > 0 ? "variable-length string" : "fixed-length string";
  } else {
    d.text = cls == H5T_COMPOUND ? "compound" : cls == H5T_VLEN ? "variable-length" :
             cls == H5T_ARRAY ? "array" : cls == H5T_REFERENCE ? "reference" : "opaque or other";
  }
  if (d.big_endian) d.text += " (big-endian)";
  return d;
}

bool ValidUtf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    const size_t n = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 0;
    if (n == 0 || i + n > s.size()) return false;
    for (size_t k = 1; k < n; ++k) {
      if ((static_cast<unsigned char>(s[i + k]) >> 6) != 0x2) return false;
    }
    i += n;
  }
  return true;
}

// `s` with bytes outside printable ASCII as \xNN, for a message about a damaged name.
std::string Escaped(std::string_view s) {
  static const char kHex[] = "0123456789abcdef";
  std::string out;
  for (char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    if (c >= 0x20 && c < 0x7f) {
      out += ch;
    } else {
      out += "\\x";
      out += kHex[c >> 4];
      out += kHex[c & 15];
    }
  }
  return out;
}

}  // namespace

uint64_t Array::elements_per_row() const {
  uint64_t n = 1;
  for (size_t i = 1; i < dims.size(); ++i) n *= dims[i];
  return n;
}

std::string Array::ShapeText() const {
  std::string s = "[";
  for (size_t i = 0; i < dims.size(); ++i) StrAppend(&s, i ? ", " : "", dims[i]);
  return s + "]";
}

absl::StatusOr<std::unique_ptr<File>> File::Open(const RandomAccessFile& file) {
  Quiet();
  const hid_t driver = Driver();
  if (driver < 0) {
    return absl::InternalError(StrCat("cannot register the HDF5 file driver: ", H5Message()));
  }
  Id fapl(H5Pcreate(H5P_FILE_ACCESS), H5Pclose);
  DriverInfo info{&file};
  if (!fapl.ok() || H5Pset_driver(fapl.id, driver, &info) < 0) {
    return absl::InternalError(StrCat(file.name(), ": ", H5Message()));
  }
  g_io_error.clear();
  const hid_t id = H5Fopen(file.name().c_str(), H5F_ACC_RDONLY, fapl.id);
  if (id < 0) {
    return absl::DataLossError(
        StrCat(file.name(), ": not a readable HDF5 file (", file.size(), " bytes): ", H5Message()));
  }
  return std::unique_ptr<File>(new File(file.name(), id));
}

File::~File() { H5Fclose(id_); }

bool File::Exists(const std::string& path) const {
  Quiet();
  if (path == "/" || path.empty()) return true;
  // Each parent must exist before its child is asked about.
  size_t pos = 0;
  while (true) {
    pos = path.find('/', pos + 1);
    const std::string prefix = path.substr(0, pos);
    if (H5Lexists(id_, prefix.c_str(), H5P_DEFAULT) <= 0) {
      H5Eclear2(H5E_DEFAULT);
      return false;
    }
    if (pos == std::string::npos) return true;
  }
}

absl::StatusOr<std::vector<Child>> File::List(const std::string& path) const {
  Quiet();
  Id g(H5Gopen2(id_, path.c_str(), H5P_DEFAULT), H5Gclose);
  if (!g.ok()) return absl::NotFoundError(StrCat(name_, ": no group ", path, ": ", H5Message()));
  std::vector<std::string> names;
  auto collect = [](hid_t, const char* name, const H5L_info_t*, void* data) -> herr_t {
    static_cast<std::vector<std::string>*>(data)->push_back(name);
    return 0;
  };
  if (H5Literate(g.id, H5_INDEX_NAME, H5_ITER_INC, nullptr, collect, &names) < 0) {
    return absl::DataLossError(StrCat(name_, ": cannot list group ", path, ": ", H5Message()));
  }
  std::vector<Child> out;
  for (const std::string& n : names) {
    if (!ValidUtf8(n) || n.empty()) {
      // Names become stream names (UTF-8 in every message and manifest): a damaged one is refused.
      return absl::DataLossError(StrCat(name_, ": group ", path, " holds a link named \"",
                                        Escaped(n), "\", not UTF-8 text (a damaged file?)"));
    }
    Child c;
    c.name = n;
    Id o(H5Oopen(g.id, n.c_str(), H5P_DEFAULT), H5Oclose);
    if (o.ok()) {
      const H5I_type_t t = H5Iget_type(o.id);
      c.is_group = t == H5I_GROUP;
      c.is_dataset = t == H5I_DATASET;
    } else {
      H5Eclear2(H5E_DEFAULT);  // a dangling link: neither
    }
    out.push_back(std::move(c));
  }
  return out;
}

namespace {

absl::Status DescribeFilters(hid_t dcpl, const std::string& where, Array* a) {
  const int n = H5Pget_nfilters(dcpl);
  for (int i = 0; i < n; ++i) {
    unsigned flags = 0, config = 0;
    size_t nelmts = 16;
    unsigned cd[16] = {};
    char name[256] = {};
    const H5Z_filter_t id = H5Pget_filter2(dcpl, static_cast<unsigned>(i), &flags, &nelmts, cd,
                                           sizeof(name), name, &config);
    if (id < 0) return absl::DataLossError(StrCat(where, ": cannot read filter ", i, ": ", H5Message()));
    Filter f;
    f.id = id;
    f.name = name;
    f.cd.assign(cd, cd + std::min<size_t>(nelmts, 16));
    a->filters.push_back(std::move(f));
  }
  return absl::OkStatus();
}

absl::Status DescribeChunks(hid_t d, const std::string& where, Array* a) {
  const size_t rank = a->dims.size();
  std::vector<uint64_t> grid(rank);
  uint64_t total = 1;
  for (size_t i = 0; i < rank; ++i) {
    if (a->chunk_dims[i] == 0) return absl::DataLossError(StrCat(where, ": a chunk dimension is 0"));
    grid[i] = (a->dims[i] + a->chunk_dims[i] - 1) / a->chunk_dims[i];
    total *= grid[i];
    if (total > (16u << 20)) {
      return absl::InvalidArgumentError(StrCat(where, ": over 16M chunks (chunk shape too small)"));
    }
  }
  a->chunks.resize(static_cast<size_t>(total));
  std::vector<hsize_t> coord(rank, 0);  // chunk-grid coordinates, row-major
  for (uint64_t c = 0; c < total; ++c) {
    std::vector<hsize_t> offset(rank);
    for (size_t i = 0; i < rank; ++i) offset[i] = coord[i] * a->chunk_dims[i];
    unsigned mask = 0;
    haddr_t addr = HADDR_UNDEF;
    hsize_t size = 0;
    if (H5Dget_chunk_info_by_coord(d, offset.data(), &mask, &addr, &size) < 0) {
      return absl::DataLossError(StrCat(where, ": cannot locate chunk ", c, ": ", H5Message()));
    }
    Chunk& ch = a->chunks[static_cast<size_t>(c)];
    ch.offset = addr == HADDR_UNDEF ? kUndefined : addr;
    ch.size = size;
    ch.filter_mask = mask;
    for (size_t i = rank; i-- > 0;) {
      if (++coord[i] < grid[i]) break;
      coord[i] = 0;
    }
  }
  return absl::OkStatus();
}

absl::Status DescribeStorage(hid_t d, const std::string& where, Array* a) {
  Id dcpl(H5Dget_create_plist(d), H5Pclose);
  if (!dcpl.ok()) return absl::DataLossError(StrCat(where, ": ", H5Message()));
  if (H5Pget_external_count(dcpl.id) > 0) {
    return absl::UnimplementedError(StrCat(where, ": data in external files is not read"));
  }
  RETURN_IF_ERROR(DescribeFilters(dcpl.id, where, a));
  const H5D_layout_t layout = H5Pget_layout(dcpl.id);
  if (layout == H5D_CONTIGUOUS) {
    a->layout = Array::Layout::kContiguous;
    const haddr_t off = H5Dget_offset(d);
    H5Eclear2(H5E_DEFAULT);
    a->offset = off == HADDR_UNDEF ? kUndefined : off;
  } else if (layout == H5D_COMPACT) {
    a->layout = Array::Layout::kCompact;
    Id type(H5Dget_type(d), H5Tclose);
    uint64_t n = a->dims.empty() ? 1 : a->dims[0] * a->elements_per_row();
    a->compact.resize(static_cast<size_t>(n * a->dtype.size));
    if (!type.ok() || H5Dread(d, type.id, H5S_ALL, H5S_ALL, H5P_DEFAULT, a->compact.data()) < 0) {
      return absl::DataLossError(StrCat(where, ": cannot read compact data: ", H5Message()));
    }
  } else if (layout == H5D_CHUNKED) {
    a->layout = Array::Layout::kChunked;
    std::vector<hsize_t> cd(a->dims.size());
    if (H5Pget_chunk(dcpl.id, static_cast<int>(cd.size()), cd.data()) != static_cast<int>(cd.size())) {
      return absl::DataLossError(StrCat(where, ": cannot read the chunk shape: ", H5Message()));
    }
    a->chunk_dims.assign(cd.begin(), cd.end());
    RETURN_IF_ERROR(DescribeChunks(d, where, a));
  } else {
    return absl::UnimplementedError(StrCat(where, ": virtual datasets are not read"));
  }
  a->has_storage = true;
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<Array> File::Describe(const std::string& path, bool storage) const {
  Quiet();
  const std::string where = StrCat(name_, ": dataset ", path);
  if (!Exists(path)) return absl::NotFoundError(StrCat(name_, ": no dataset ", path));
  Id d(H5Dopen2(id_, path.c_str(), H5P_DEFAULT), H5Dclose);
  if (!d.ok()) return absl::InvalidArgumentError(StrCat(where, ": not a dataset: ", H5Message()));
  Array a;
  a.path = path;
  {
    Id type(H5Dget_type(d.id), H5Tclose);
    if (!type.ok()) return absl::DataLossError(StrCat(where, ": ", H5Message()));
    a.dtype = TypeOf(type.id);
  }
  Id space(H5Dget_space(d.id), H5Sclose);
  const int rank = space.ok() ? H5Sget_simple_extent_ndims(space.id) : -1;
  if (rank < 0) return absl::DataLossError(StrCat(where, ": cannot read its shape: ", H5Message()));
  std::vector<hsize_t> dims(static_cast<size_t>(rank));
  H5Sget_simple_extent_dims(space.id, dims.data(), nullptr);
  a.dims.assign(dims.begin(), dims.end());
  if (storage) RETURN_IF_ERROR(DescribeStorage(d.id, where, &a));
  return a;
}

absl::StatusOr<std::optional<std::string>> File::StringAttribute(const std::string& path,
                                                                 const std::string& attr) const {
  Quiet();
  const std::string where = StrCat(name_, ": attribute '", attr, "' of ", path);
  if (H5Aexists_by_name(id_, path.c_str(), attr.c_str(), H5P_DEFAULT) <= 0) {
    H5Eclear2(H5E_DEFAULT);
    return std::nullopt;
  }
  Id a(H5Aopen_by_name(id_, path.c_str(), attr.c_str(), H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
  Id type(a.ok() ? H5Aget_type(a.id) : H5I_INVALID_HID, H5Tclose);
  if (!type.ok()) return absl::DataLossError(StrCat(where, ": ", H5Message()));
  if (H5Tget_class(type.id) != H5T_STRING) return std::nullopt;
  if (H5Tis_variable_str(type.id) > 0) {
    Id mem(H5Tcopy(type.id), H5Tclose);
    char* value = nullptr;
    if (H5Aread(a.id, mem.id, &value) < 0) {
      return absl::DataLossError(StrCat(where, ": ", H5Message()));
    }
    std::string s = value != nullptr ? value : "";
    H5free_memory(value);
    if (!ValidUtf8(s)) return absl::DataLossError(StrCat(where, " is not UTF-8 text"));
    return s;
  }
  std::string s(H5Tget_size(type.id), '\0');
  if (H5Aread(a.id, type.id, s.data()) < 0) {
    return absl::DataLossError(StrCat(where, ": ", H5Message()));
  }
  s.resize(std::strlen(s.c_str()));
  if (!ValidUtf8(s)) return absl::DataLossError(StrCat(where, " is not UTF-8 text"));
  return s;
}

absl::StatusOr<std::optional<double>> File::NumberAttribute(const std::string& path,
                                                            const std::string& attr) const {
  Quiet();
  if (H5Aexists_by_name(id_, path.c_str(), attr.c_str(), H5P_DEFAULT) <= 0) {
    H5Eclear2(H5E_DEFAULT);
    return std::nullopt;
  }
  Id a(H5Aopen_by_name(id_, path.c_str(), attr.c_str(), H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
  double v = 0;
  if (!a.ok() || H5Aread(a.id, H5T_NATIVE_DOUBLE, &v) < 0) {
    H5Eclear2(H5E_DEFAULT);
    return std::nullopt;  // not a scalar number
  }
  return v;
}

absl::StatusOr<std::vector<double>> File::ReadNumbers(const std::string& path) const {
  ASSIGN_OR_RETURN(Array a, Describe(path, false));
  Quiet();
  uint64_t n = 1;
  for (uint64_t d : a.dims) n *= d;
  if (n > (64u << 20)) return absl::InvalidArgumentError(StrCat(name_, ": ", path, " is too large"));
  std::vector<double> out(static_cast<size_t>(n));
  Id d(H5Dopen2(id_, path.c_str(), H5P_DEFAULT), H5Dclose);
  if (!d.ok() || (n > 0 && H5Dread(d.id, H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT,
                                   out.data()) < 0)) {
    return absl::DataLossError(StrCat(name_, ": cannot read ", path, ": ", H5Message()));
  }
  return out;
}

absl::StatusOr<std::vector<std::string>> File::ReadStrings(const std::string& path) const {
  ASSIGN_OR_RETURN(Array a, Describe(path, false));
  Quiet();
  const std::string where = StrCat(name_, ": ", path);
  if (a.dtype.cls != TypeClass::kString || a.dims.size() != 1) {
    return absl::InvalidArgumentError(StrCat(where, " is not a 1-D list of strings (it is ",
                                             a.dtype.text, " ", a.ShapeText(), ")"));
  }
  Id d(H5Dopen2(id_, path.c_str(), H5P_DEFAULT), H5Dclose);
  Id type(d.ok() ? H5Dget_type(d.id) : H5I_INVALID_HID, H5Tclose);
  if (!type.ok()) return absl::DataLossError(StrCat(where, ": ", H5Message()));
  const size_t n = static_cast<size_t>(a.dims[0]);
  std::vector<std::string> out;
  if (H5Tis_variable_str(type.id) > 0) {
    std::vector<char*> v(n, nullptr);
    if (n > 0 && H5Dread(d.id, type.id, H5S_ALL, H5S_ALL, H5P_DEFAULT, v.data()) < 0) {
      return absl::DataLossError(StrCat(where, ": ", H5Message()));
    }
    for (char* s : v) {
      out.emplace_back(s != nullptr ? s : "");
      H5free_memory(s);
    }
    return out;
  }
  const size_t size = H5Tget_size(type.id);
  std::string buf(n * size, '\0');
  if (n > 0 && H5Dread(d.id, type.id, H5S_ALL, H5S_ALL, H5P_DEFAULT, buf.data()) < 0) {
    return absl::DataLossError(StrCat(where, ": ", H5Message()));
  }
  for (size_t i = 0; i < n; ++i) {
    std::string s = buf.substr(i * size, size);
    s.resize(std::strlen(s.c_str()));
    out.push_back(std::move(s));
  }
  return out;
}

bool NaturalLess(const std::string& a, const std::string& b) {
  return datasets_internal::NaturalLess(a, b);
}

}  // namespace conveyor::hdf5
