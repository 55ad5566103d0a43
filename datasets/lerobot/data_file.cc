// A LeRobot data file's rows (datasets/lerobot/internal/data_file.h).
#include "datasets/lerobot/internal/data_file.h"

#include <cstring>
#include <type_traits>
#include <variant>

#include "base/status_macros.h"
#include "base/strings.h"

namespace conveyor::lerobot {

namespace {

absl::StatusOr<std::vector<double>> ReadTimestampColumn(const parquet::ParquetFile& file) {
  ASSIGN_OR_RETURN(parquet::Column c, file.ReadColumn("timestamp"));
  if (!c.lists.empty() || c.null_count != 0) {
    return absl::InvalidArgumentError(
        StrCat(file.name(), ": column 'timestamp' is not a flat non-null number column"));
  }
  if (const auto* f = std::get_if<std::vector<float>>(&c.values)) {
    return std::vector<double>(f->begin(), f->end());
  }
  if (const auto* d = std::get_if<std::vector<double>>(&c.values)) return *d;
  return absl::InvalidArgumentError(StrCat(file.name(), ": column 'timestamp' is ",
                                           parquet::PhysicalTypeName(c.descriptor.physical_type),
                                           ", expected FLOAT or DOUBLE"));
}

// The value slots [begin, end) of row `row` of a (possibly nested) list column.
absl::Status RowSlots(const parquet::Column& c, int64_t row, int64_t* begin, int64_t* end,
                      const std::string& where) {
  int64_t b = row, e = row + 1;
  for (const parquet::ListLevel& level : c.lists) {
    for (int64_t i = b; i < e; ++i) {
      if (!level.valid[static_cast<size_t>(i)]) {
        return absl::InvalidArgumentError(StrCat(where, ": a null list"));
      }
    }
    b = level.offsets[static_cast<size_t>(b)];
    e = level.offsets[static_cast<size_t>(e)];
  }
  *begin = b;
  *end = e;
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<DataFile>> LoadDataFile(Storage& storage, const std::string& path,
                                                       int64_t episode,
                                                       const std::vector<const Feature*>& lowdim,
                                                       const std::vector<const Feature*>& images) {
  auto out = std::make_unique<DataFile>();
  out->path = path;
  out->name = storage.Describe(path);
  absl::StatusOr<parquet::ParquetFile> pf = OpenParquet(storage, path);
  if (absl::IsNotFound(pf.status())) {
    return absl::NotFoundError(StrCat(out->name, " is missing (the data file of episode ", episode,
                                      ", named by the episode metadata and info.json's ",
                                      "data_path)"));
  }
  if (!pf.ok()) return pf.status();
  out->rows = pf->num_rows();
  ASSIGN_OR_RETURN(out->episode_index, ReadIntColumn(*pf, "episode_index"));
  ASSIGN_OR_RETURN(out->frame_index, ReadIntColumn(*pf, "frame_index"));
  ASSIGN_OR_RETURN(out->index, ReadIntColumn(*pf, "index"));
  ASSIGN_OR_RETURN(out->task_index, ReadIntColumn(*pf, "task_index"));
  ASSIGN_OR_RETURN(out->timestamp, ReadTimestampColumn(*pf));
  for (const Feature* f : lowdim) {
    ASSIGN_OR_RETURN(out->columns[f->key], pf->ReadColumn(f->key));
  }
  for (const Feature* f : images) {
    // The Hugging Face Image feature: a struct {bytes: binary, path: string}.
    absl::StatusOr<parquet::Column> c = pf->ReadColumn(f->key + ".bytes");
    if (!c.ok()) {
      return absl::InvalidArgumentError(
          StrCat(out->name, ": image feature '", f->key, "' has no '", f->key,
                 ".bytes' column (images must be embedded as the Hugging Face Image struct ",
                 "{bytes, path}): ", c.status().message()));
    }
    out->columns[f->key] = *std::move(c);
  }
  // Each episode's rows must be one contiguous run.
  for (int64_t r = 0; r < out->rows; ++r) {
    const int64_t e = out->episode_index[static_cast<size_t>(r)];
    auto [it, inserted] = out->episode_rows.emplace(e, std::make_pair(r, int64_t{0}));
    if (!inserted && it->second.first + it->second.second != r) {
      return absl::InvalidArgumentError(
          StrCat(out->name, ": the rows of episode ", e, " are not contiguous (row ", r,
                 " after rows ", it->second.first, "..", it->second.first + it->second.second - 1,
                 " and others between)"));
    }
    ++it->second.second;
  }
  return out;
}

// Rows [first, first + count) of a numeric feature column as float32 [count, D]. float32 values
// are copied bit for bit; other types are converted, and `inexact` counts values that float32
// cannot hold exactly.
absl::Status LowdimRows(const parquet::Column& c, const Feature& f, int64_t first, int64_t count,
                        const std::string& where, float* out, int64_t* inexact) {
  const int64_t dim = f.elements();
  if (c.null_count != 0) {
    return absl::InvalidArgumentError(StrCat(where, ": column '", f.key, "' has null values"));
  }
  for (int64_t r = 0; r < count; ++r) {
    int64_t b = 0, e = 0;
    RETURN_IF_ERROR(RowSlots(c, first + r, &b, &e, StrCat(where, " row ", first + r)));
    if (e - b != dim) {
      return absl::InvalidArgumentError(StrCat(where, " row ", first + r, ": '", f.key, "' holds ",
                                               e - b, " values, info.json's shape says ", dim));
    }
    float* dst = out + r * dim;
    const absl::Status s = std::visit(
        [&](const auto& v) -> absl::Status {
          using V = std::decay_t<decltype(v)>;
          if constexpr (std::is_same_v<V, parquet::BinaryValues>) {
            return absl::InvalidArgumentError(
                StrCat(where, ": column '", f.key, "' holds bytes, not numbers"));
          } else if constexpr (std::is_same_v<V, std::vector<float>>) {
            std::memcpy(dst, v.data() + b, static_cast<size_t>(dim) * sizeof(float));
            return absl::OkStatus();
          } else {
            for (int64_t i = 0; i < dim; ++i) {
              const auto x = v[static_cast<size_t>(b + i)];
              dst[i] = static_cast<float>(x);
              if (static_cast<double>(dst[i]) != static_cast<double>(x)) ++*inexact;
            }
            return absl::OkStatus();
          }
        },
        c.values);
    RETURN_IF_ERROR(s);
  }
  return absl::OkStatus();
}

}  // namespace conveyor::lerobot
