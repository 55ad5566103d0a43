// The one file that includes SentencePiece, built as its own loadable module
// (libconveyor_sentencepiece.so) with a C interface; sentencepiece_model.cc loads it.
//
// Why a module: Debian 12's libsentencepiece.so.0 carries its own copy of protobuf-lite and
// exports its symbols (about 1,600 google::protobuf ones). Linked into a program that also links
// libprotobuf.so.32, as every Conveyor program does, the two copies interpose each other and the
// program crashes before main (libprotobuf's static initialisers call sentencepiece's
// MergeFromImpl). Loaded with dlopen(RTLD_LOCAL | RTLD_DEEPBIND), this module and its
// libsentencepiece bind to their own protobuf and stay out of the program's global scope.
// (Its header also declares absl::string_view as std::string_view, which Debian's abseil
// defines as a class: no file can include both, another reason for a file of its own.)
#include <sentencepiece_processor.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

namespace {

void SetError(const std::string& what, char* error, size_t error_len) {
  if (error_len == 0) return;
  const size_t n = std::min(what.size(), error_len - 1);
  std::memcpy(error, what.data(), n);
  error[n] = '\0';
}

}  // namespace

extern "C" {

// A model parsed from a .model file's bytes; null with `error` set on failure.
__attribute__((visibility("default"))) void* conveyor_spm_load(const char* bytes, size_t size,
                                                              char* error, size_t error_len) {
  auto* sp = new sentencepiece::SentencePieceProcessor();
  const sentencepiece::util::Status st = sp->LoadFromSerializedProto(std::string_view(bytes, size));
  if (!st.ok()) {
    SetError(st.ToString(), error, error_len);
    delete sp;
    return nullptr;
  }
  return sp;
}

__attribute__((visibility("default"))) void conveyor_spm_free(void* model) {
  delete static_cast<sentencepiece::SentencePieceProcessor*>(model);
}

// The ids of `text` in *ids (malloc'd, *count of them; the caller frees it with free()). 0 on
// success, -1 with `error` set. Thread-safe: SentencePieceProcessor::Encode is const.
__attribute__((visibility("default"))) int conveyor_spm_encode(const void* model, const char* text,
                                                              size_t size, int** ids, size_t* count,
                                                              char* error, size_t error_len) {
  std::vector<int> out;
  const sentencepiece::util::Status st =
      static_cast<const sentencepiece::SentencePieceProcessor*>(model)->Encode(
          std::string_view(text, size), &out);
  if (!st.ok()) {
    SetError(st.ToString(), error, error_len);
    return -1;
  }
  *count = out.size();
  *ids = static_cast<int*>(std::malloc(std::max<size_t>(out.size(), 1) * sizeof(int)));
  if (*ids == nullptr) {
    SetError("out of memory", error, error_len);
    return -1;
  }
  if (!out.empty()) std::memcpy(*ids, out.data(), out.size() * sizeof(int));
  return 0;
}

// bos_id, eos_id (-1: the model has none), vocabulary size.
__attribute__((visibility("default"))) void conveyor_spm_info(const void* model, int* bos, int* eos,
                                                             int* vocab) {
  const auto* sp = static_cast<const sentencepiece::SentencePieceProcessor*>(model);
  *bos = sp->bos_id();
  *eos = sp->eos_id();
  *vocab = sp->GetPieceSize();
}

}  // extern "C"
