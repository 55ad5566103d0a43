#include "datasets/webdataset/internal/wds_member.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <cstring>
#include <set>

#include "base/json_text.h"
#include "base/status_macros.h"
#include "base/strings.h"
#include "base/types.h"
#include "format/format.h"
#include "format/npy.h"
#include "media/media_demux.h"
#include "media/video_decoder.h"

namespace conveyor::webdataset {
namespace {

namespace pb = format::v1;
using json = nlohmann::json;

std::string EncodeVideoFacts(const VideoFacts& v) {
  std::string out(kVideoFactsHead, '\0');
  std::memcpy(out.data(), &v.rate, 8);
  std::memcpy(out.data() + 8, &v.frames, 8);
  std::memcpy(out.data() + 16, &v.duration_s, 8);
  std::memcpy(out.data() + 24, &v.width, 4);
  std::memcpy(out.data() + 28, &v.height, 4);
  std::memcpy(out.data() + 32, v.codec.data(), std::min<size_t>(v.codec.size(), 15));
  std::memcpy(out.data() + 48, v.pix_fmt.data(), std::min<size_t>(v.pix_fmt.size(), 15));
  out += v.index.SerializeAsString();
  return out;
}

std::string Hex(std::string_view b) {
  static const char* d = "0123456789ABCDEF";
  std::string out;
  for (unsigned char c : b) {
    if (!out.empty()) out += ' ';
    out += d[c >> 4];
    out += d[c & 15];
  }
  return out;
}

// What bytes look like, for an error about a member whose content is not its extension's.
std::string ContentGuess(std::string_view b) {
  auto starts = [&](std::string_view m) { return b.substr(0, m.size()) == m; };
  if (starts("\xff\xd8\xff")) return "a JPEG image";
  if (starts("\x89PNG")) return "a PNG image";
  if (starts("GIF8")) return "a GIF image";
  if (starts("\x1a\x45\xdf\xa3")) return "a Matroska/WebM file";
  if (b.size() >= 8 && b.substr(4, 4) == "ftyp") return "an MP4/MOV file";
  if (starts("\x93NUMPY")) return "a .npy array";
  const size_t first = b.find_first_not_of(" \t\r\n");
  if (first != std::string_view::npos && (b[first] == '{' || b[first] == '['))
    return "JSON text, perhaps";
  return "";
}

// Whether a video member's first bytes are its container's: an .mp4 must start with an ISO-BMFF
// box, a .webm/.mkv with the EBML magic. libavformat probes by content and would demux a JPEG
// named .mp4 as a one-frame mjpeg "video"; this says what it is instead.
absl::Status SniffContainer(std::string_view ext, std::string_view head, const std::string& where) {
  std::string e(ext.substr(ext.rfind('.') == std::string_view::npos ? 0 : ext.rfind('.') + 1));
  std::transform(e.begin(), e.end(), e.begin(), [](unsigned char c) { return std::tolower(c); });
  bool ok = false;
  if (e == "webm" || e == "mkv") {
    ok = head.substr(0, 4) == "\x1a\x45\xdf\xa3";
  } else {
    static const std::set<std::string_view> kBoxes = {"ftyp", "moov", "mdat", "free",
                                                      "skip", "wide", "pnot", "uuid"};
    ok = head.size() >= 8 && kBoxes.count(head.substr(4, 4)) > 0;
  }
  if (ok) return absl::OkStatus();
  const std::string guess = ContentGuess(head);
  return absl::DataLossError(StrCat(where, ": not a .", e, " file: it starts with ",
                                    Hex(head.substr(0, 8)),
                                    guess.empty() ? std::string() : StrCat(" (", guess, ")"),
                                    "; the member's extension says what it holds"));
}

json DescribeJson(const json& j) {
  json kinds = json::object(), nums = json::object();
  for (const auto& [k, v] : j.items()) {
    if (v.is_number() || v.is_boolean()) {
      kinds[k] = "n";
      nums[k] = v.is_boolean() ? (v.get<bool>() ? 1.0 : 0.0) : v.get<double>();
    } else if (v.is_string()) {
      kinds[k] = "s";
    } else if (v.is_array() && !v.empty() && std::all_of(v.begin(), v.end(), [](const json& x) {
                 return x.is_number() || x.is_boolean();
               })) {
      kinds[k] = v.size();
    } else {
      kinds[k] = "x";
    }
  }
  return json{{"kinds", kinds}, {"nums", nums}};
}

}  // namespace

// The kind by the extension's last part, case-insensitive ("t5_xxl.npy" is a .npy).
MemberKind KindOf(std::string_view ext) {
  const size_t dot = ext.rfind('.');
  std::string e(dot == std::string_view::npos ? ext : ext.substr(dot + 1));
  std::transform(e.begin(), e.end(), e.begin(), [](unsigned char c) { return std::tolower(c); });
  if (e == "mp4" || e == "m4v" || e == "mov" || e == "webm" || e == "mkv")
    return MemberKind::kVideo;
  if (e == "jpg" || e == "jpeg" || e == "png" || e == "ppm") return MemberKind::kImage;
  if (e == "txt" || e == "text" || e == "caption") return MemberKind::kText;
  if (e == "json") return MemberKind::kJson;
  if (e == "npy") return MemberKind::kNpy;
  if (e == "cls") return MemberKind::kClass;
  return MemberKind::kUnknown;
}

absl::StatusOr<VideoFacts> DecodeVideoFacts(std::string_view bytes, bool with_index,
                                            const std::string& where) {
  VideoFacts v;
  if (bytes.size() < kVideoFactsHead)
    return absl::DataLossError(StrCat(where, ": malformed video index"));
  std::memcpy(&v.rate, bytes.data(), 8);
  std::memcpy(&v.frames, bytes.data() + 8, 8);
  std::memcpy(&v.duration_s, bytes.data() + 16, 8);
  std::memcpy(&v.width, bytes.data() + 24, 4);
  std::memcpy(&v.height, bytes.data() + 28, 4);
  v.codec = std::string(bytes.substr(32, 16).substr(0, bytes.substr(32, 16).find('\0')));
  v.pix_fmt = std::string(bytes.substr(48, 16).substr(0, bytes.substr(48, 16).find('\0')));
  if (with_index && !v.index.ParseFromArray(bytes.data() + kVideoFactsHead,
                                            static_cast<int>(bytes.size() - kVideoFactsHead))) {
    return absl::DataLossError(StrCat(where, ": malformed video index"));
  }
  return v;
}

absl::StatusOr<std::string> ReadMember(const RandomAccessFile& tar, uint64_t offset, uint64_t size,
                                       const std::string& where) {
  if (size > kMaxSmallMember) {
    return absl::ResourceExhaustedError(StrCat(where, ": ", size, " bytes, over the ",
                                               kMaxSmallMember,
                                               "-byte bound for a member read whole"));
  }
  std::string bytes(static_cast<size_t>(size), '\0');
  if (size > 0) RETURN_IF_ERROR(tar.Read(offset, bytes.size(), bytes.data()));
  return bytes;
}

// A JSON member's description: per top-level field its kind ("n" a number or bool, "s" a
// string, an integer N an array of N numbers, "x" anything else) and the numbers' values.
absl::StatusOr<json> ParseJsonMember(const std::string& bytes, const std::string& where) {
  json j = json::parse(bytes.begin(), bytes.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) {
    const std::string guess = ContentGuess(bytes);
    return absl::DataLossError(StrCat(where, ": not valid JSON",
                                      guess.empty() ? "" : StrCat(" (it looks like ", guess, ")")));
  }
  if (!j.is_object())
    return absl::DataLossError(StrCat(where, ": a JSON ", j.type_name(), ", not an object"));
  return j;
}

absl::StatusOr<std::string> ProbeMember(const RandomAccessFile& tar, const TarMember& m,
                                        std::string_view ext, const std::string& where) {
  switch (KindOf(ext)) {
    case MemberKind::kVideo: {
      std::string head(static_cast<size_t>(std::min<uint64_t>(m.size, 16)), '\0');
      if (!head.empty()) RETURN_IF_ERROR(tar.Read(m.offset, head.size(), head.data()));
      RETURN_IF_ERROR(SniffContainer(ext, head, where));
      std::unique_ptr<RandomAccessFile> sub =
          SubRangeFile(tar, m.offset, m.size, StrCat(tar.name(), ":", m.path));
      absl::StatusOr<DemuxedStream> d =
          DemuxBestStream(*sub, MediaKind::kVideo, std::string(ext), false);
      if (!d.ok()) return Annotate(d.status(), where);
      VideoFacts v;
      v.rate = d->stream.info.rate;
      pb::StreamIndex& s = v.index;
      s.set_name(std::string(ext));
      s.set_kind(pb::VIDEO);
      *s.mutable_codec() = *d->stream.codec;
      s.mutable_codec()->set_codec(d->stream.info.codec);
      s.set_time_base_num(d->stream.time_base_num);
      s.set_time_base_den(d->stream.time_base_den);
      s.set_pts_origin(d->stream.pts_origin);
      s.set_num_frames(d->stream.packets.size());
      int64_t end_pts = d->stream.pts_origin;
      pb::PacketTable* t = s.mutable_packets();
      for (size_t i = 0; i < d->stream.packets.size(); ++i) {
        const EpisodeData::Packet& p = d->stream.packets[i];
        t->add_pts(p.pts);
        t->add_dts(p.dts);
        t->add_duration(p.duration);
        t->add_offset(m.offset + d->offsets[i]);
        t->add_size(d->sizes[i]);
        t->add_flags(p.key ? format::kPacketKey : 0);
        t->add_xxh3(d->xxh3[i]);
        end_pts = std::max(end_pts, p.pts + p.duration);
      }
      absl::StatusOr<FrameTable> frames = FrameTable::Build(s);
      if (!frames.ok()) return Annotate(frames.status(), where);
      v.frames = frames->size();
      v.duration_s =
          static_cast<double>(end_pts - s.pts_origin()) * s.time_base_num() / s.time_base_den();
      if (v.frames == 0) return absl::DataLossError(StrCat(where, ": the video has no frames"));
      v.width = s.codec().width();
      v.height = s.codec().height();
      v.codec = s.codec().codec();
      v.pix_fmt = s.codec().pix_fmt();
      return EncodeVideoFacts(v);
    }
    case MemberKind::kImage: {
      ASSIGN_OR_RETURN(std::string bytes, ReadMember(tar, m.offset, m.size, where));
      absl::StatusOr<pb::CodecParams> p = ProbeImageBytes(bytes, where);
      if (!p.ok()) {
        const std::string guess = ContentGuess(bytes);
        if (guess.empty()) return p.status();
        return absl::Status(p.status().code(),
                            StrCat(p.status().message(), " (it looks like ", guess, ")"));
      }
      std::string out(8, '\0');
      const uint64_t sum = format::Checksum(bytes);
      std::memcpy(out.data(), &sum, 8);
      return out + p->SerializeAsString();
    }
    case MemberKind::kJson: {
      ASSIGN_OR_RETURN(std::string bytes, ReadMember(tar, m.offset, m.size, where));
      ASSIGN_OR_RETURN(json j, ParseJsonMember(bytes, where));
      return JsonText(DescribeJson(j));
    }
    case MemberKind::kNpy: {
      ASSIGN_OR_RETURN(std::string bytes, ReadMember(tar, m.offset, m.size, where));
      ASSIGN_OR_RETURN(NpyArray a, ParseNpy(bytes, where));
      return JsonText(json{{"shape", a.shape}, {"dtype", a.source_dtype}});
    }
    case MemberKind::kText:
    case MemberKind::kClass:
      if (m.size > kMaxSmallMember) return ReadMember(tar, m.offset, m.size, where).status();
      return std::string();
    case MemberKind::kUnknown:
      return std::string();
  }
  return std::string();
}

int64_t NpyFactsShape(const json& facts, std::vector<int64_t>* shape) {
  shape->clear();
  uint64_t elements = 1;
  bool fits = facts.contains("shape") && facts["shape"].is_array();
  for (const json& d : fits ? facts["shape"] : json::array()) {
    const int64_t n = d.is_number_integer() ? d.get<int64_t>() : -1;
    shape->push_back(n);
    fits = fits && n > 0 && CheckedMul(elements, static_cast<uint64_t>(n), &elements) &&
           elements <= static_cast<uint64_t>(kMaxNpyElements);
  }
  return fits ? static_cast<int64_t>(elements) : -1;
}

std::string CheckNpySample(const std::string& stream_facts, const std::string& facts,
                           const std::string& where, std::vector<int64_t>* shape) {
  const json a = json::parse(stream_facts), b = json::parse(facts, nullptr, false);
  if (b.is_discarded() || a["dtype"] != b["dtype"] || a["shape"].size() != b["shape"].size()) {
    return StrCat(where, ": a ", b.is_discarded() ? std::string("?") : JsonText(b["dtype"]),
                  " array of shape ", b.is_discarded() ? std::string("?") : JsonText(b["shape"]),
                  ", the dataset's stream is ", JsonText(a["dtype"]), " of shape ", JsonText(a["shape"]),
                  " (its first sample's); every sample must have its dtype and rank");
  }
  if (NpyFactsShape(b, shape) < 0) {
    return StrCat(where, ": shape ", JsonText(b["shape"]), " cannot be a stream (1 to ",
                  kMaxNpyElements, " values)");
  }
  return "";
}

StreamSource NpySampleSource(const std::string& stream_facts, const std::vector<int64_t>& shape,
                             StreamSource src, pb::StreamIndex* out) {
  const json f = json::parse(stream_facts);
  out->mutable_codec()->set_codec(NpyCodec(f["dtype"].get<std::string>(), shape));
  src.elements = 1;
  for (int64_t d : shape) src.elements *= d;  // CheckNpySample bounded the product
  return src;
}

absl::Status AppendMemberStreams(const MemberRef& r, MemberKind kind, size_t member,
                                 double clip_rate, const std::string& where, const std::string& uri,
                                 std::vector<std::pair<StreamInfo, StreamSource>>* streams) {
  StreamInfo info;
  info.name = r.ext;
  info.rate = clip_rate;
  StreamSource src{member, "", 1};
  switch (kind) {
    case MemberKind::kVideo: {
      ASSIGN_OR_RETURN(VideoFacts v, DecodeVideoFacts(r.facts, false, where));
      info.kind = pb::VIDEO;
      info.codec = v.codec;
      info.pix_fmt = v.pix_fmt;
      info.shape = {v.height, v.width, 3};
      info.rate = v.rate;
      streams->push_back({info, src});
      break;
    }
    case MemberKind::kImage: {
      pb::CodecParams p;
      p.ParseFromArray(r.facts.data() + 8, static_cast<int>(r.facts.size() - 8));
      info.kind = pb::IMAGE;
      info.codec = p.codec();
      info.pix_fmt = p.pix_fmt();
      info.shape = {p.height(), p.width(), 3};
      streams->push_back({info, src});
      break;
    }
    case MemberKind::kText:
      info.kind = pb::TEXT;
      info.codec = "utf-8";
      info.rate = 0;
      streams->push_back({info, src});
      break;
    case MemberKind::kClass:
      info.kind = pb::LOWDIM;
      info.codec = "wds-cls";
      info.shape = {1};
      streams->push_back({info, src});
      break;
    case MemberKind::kNpy: {
      const json f = json::parse(r.facts);
      std::vector<int64_t> shape;
      const int64_t elements = NpyFactsShape(f, &shape);
      info.codec = NpyCodec(f["dtype"].get<std::string>(), shape);
      if (elements < 0) {
        return absl::InvalidArgumentError(StrCat(where, ", member '.", r.ext, "': ", info.codec,
                                                 " cannot be a stream (1 to ", kMaxNpyElements,
                                                 " values)"));
      }
      info.kind = pb::LOWDIM;
      // The codec says how the values were stored: the dtype and shape the trainer reshapes by
      // (the first sample's; each sample's index carries its own).
      info.shape = {elements};
      src.elements = elements;
      streams->push_back({info, src});
      break;
    }
    case MemberKind::kJson: {
      const json f = json::parse(r.facts);
      std::vector<std::string> skipped;
      for (const auto& [field, k] : f["kinds"].items()) {
        StreamInfo fi = info;
        fi.name = StrCat(r.ext, ".", field);
        StreamSource fs_src{member, field, 1};
        if (k == "n" || k.is_number()) {
          fi.kind = pb::LOWDIM;
          fi.codec = "json";
          fs_src.elements = k.is_number() ? k.get<int64_t>() : 1;
          fi.shape = {fs_src.elements};
        } else if (k == "s") {
          fi.kind = pb::TEXT;
          fi.codec = "utf-8";
          fi.rate = 0;
        } else {
          skipped.push_back(field);
          continue;
        }
        streams->push_back({fi, fs_src});
      }
      if (!skipped.empty()) {
        std::string list;
        for (const std::string& s : skipped) StrAppend(&list, list.empty() ? "" : ", ", s);
        spdlog::info(
            "webdataset: {}: JSON fields of .{} that are neither numbers, arrays of numbers nor "
            "strings are not streams: {}",
            uri, r.ext, list);
      }
      break;
    }
    case MemberKind::kUnknown:
      break;
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<float>> ReadMemberRow(const RandomAccessFile& tar, MemberKind kind,
                                                 uint64_t offset, uint64_t size,
                                                 const StreamSource& src, json* parsed,
                                                 const std::string& where) {
  std::vector<float> row;
  if (kind == MemberKind::kNpy) {
    ASSIGN_OR_RETURN(std::string bytes, ReadMember(tar, offset, size, where));
    ASSIGN_OR_RETURN(NpyArray a, ParseNpy(bytes, where));
    if (static_cast<int64_t>(a.values.size()) != src.elements) {
      return absl::DataLossError(StrCat(where, ": ", a.values.size(), " values, the stream has ",
                                        src.elements,
                                        " (the shard changed after it was indexed?)"));
    }
    row = std::move(a.values);
  } else if (kind == MemberKind::kClass) {
    ASSIGN_OR_RETURN(std::string text, ReadMember(tar, offset, size, where));
    while (!text.empty() && std::isspace(static_cast<unsigned char>(text.back()))) text.pop_back();
    char* end = nullptr;
    const long long v = text.empty() ? 0 : std::strtoll(text.c_str(), &end, 10);
    if (text.empty() || end != text.c_str() + text.size()) {
      return absl::DataLossError(
          StrCat(where, ": '", text.substr(0, 40), "' is not an integer class label"));
    }
    row = {static_cast<float>(v)};
  } else {
    const json& v = (*parsed)[src.field];
    auto number = [](const json& x) {
      return x.is_boolean() ? (x.get<bool>() ? 1.0f : 0.0f) : x.get<float>();
    };
    if (v.is_number() || v.is_boolean()) {
      row = {number(v)};
    } else if (v.is_array() && static_cast<int64_t>(v.size()) == src.elements) {
      for (const json& x : v) {
        if (!x.is_number() && !x.is_boolean())
          return absl::DataLossError(StrCat(where, ": field '", src.field, "' holds a non-number"));
        row.push_back(number(x));
      }
    } else {
      return absl::DataLossError(
          StrCat(where, ": field '", src.field, "' changed since the shard was indexed"));
    }
  }
  return row;
}

}  // namespace conveyor::webdataset
