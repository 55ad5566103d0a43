// Rows of an HDF5 dataset read by byte offset, without libhdf5 (docs/hdf5.md "How reads work"):
// the Array (hdf5_file.h) says where the bytes are; a contiguous dataset is one range read, a
// chunked one a range read per chunk it touches, each chunk's filters undone here (deflate with
// zlib, shuffle). Any other filter is refused with an error naming the file, the dataset and the
// filter. Thread-safe (pure functions of their arguments and RandomAccessFile::Read).
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "datasets/hdf5/hdf5_file.h"
#include "storage/storage.h"

namespace conveyor::hdf5 {

// OK when every chunk's filter pipeline of `a` is one this reader undoes; else UNIMPLEMENTED
// naming `file_name`, the dataset and the filter.
absl::Status CheckFilters(const Array& a, const std::string& file_name);

// Reads rows [first, first + count) along the first dimension of `a` (each row all of the other
// dimensions, row-major, in the file's byte order) into `dst`, which holds count * a.row_bytes()
// bytes. Errors name the file, the dataset, the rows and the chunk.
absl::Status ReadRows(const RandomAccessFile& file, const Array& a, uint64_t first, uint64_t count,
                      char* dst);

}  // namespace conveyor::hdf5
