#include "media/nvdec_decoder.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <unordered_map>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "base/status_macros.h"
#include "base/strings.h"
#include "conveyor/format/v1/shard.pb.h"

#if CONVEYOR_HAVE_CUDA && CONVEYOR_HAVE_FFNVCODEC
#include <cstdarg>
#include <cstdio>

#include "media/internal/av_codec_params.h"
#include "media/internal/av_util.h"
#include "media/internal/nvdec_kernels.h"
extern "C" {
#include <libavcodec/bsf.h>
}
namespace conveyor::nvdec {
// The nv-codec-headers loader reports a missing library or symbol through this.
void LoaderLog(void* sink, const char* fmt, ...) {
  char buf[256];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof(buf), fmt, ap);
  va_end(ap);
  if (sink != nullptr) static_cast<std::string*>(sink)->append(buf);
}
}  // namespace conveyor::nvdec
#define FFNV_LOG_FUNC(logctx, msg, ...) ::conveyor::nvdec::LoaderLog((logctx), (msg), __VA_ARGS__)
#define FFNV_DEBUG_LOG_FUNC(logctx, msg, ...)
#include <ffnvcodec/dynlink_loader.h>
#define CONVEYOR_NVDEC 1
#else
#define CONVEYOR_NVDEC 0
#endif

namespace conveyor {
namespace pb = ::conveyor::format::v1;

namespace {

// The sizes `o` gives a width x height frame: resized to rw x rh, cropped to ow x oh.
struct OutputDims {
  int rw, rh, ow, oh;
};
OutputDims DimsOf(const GpuFrameOutput& o, int width, int height) {
  const int rw = o.resize_width > 0 ? o.resize_width : width;
  const int rh = o.resize_height > 0 ? o.resize_height : height;
  return {rw, rh, o.width > 0 ? o.width : rw, o.height > 0 ? o.height : rh};
}

// FAILED_PRECONDITION for a stream the CPU path would turn upright (VideoDecoder applies a
// rotation that is a multiple of 90 degrees and ignores any other) when `autorotate` asks for it:
// the kernel does not rotate.
absl::Status RefuseRotation(const pb::StreamIndex& stream, bool autorotate) {
  const double rotation = stream.codec().rotation_deg();
  const double turn = std::fmod(std::fabs(rotation), 360.0);
  if (!autorotate || turn == 0.0 || std::fmod(turn, 90.0) != 0.0) return absl::OkStatus();
  return absl::FailedPreconditionError(
      StrCat("the stream is shown rotated by ", rotation, " degrees; NVDEC output is not rotated "
             "(decode it on the CPU, or set autorotate: false)"));
}

}  // namespace

absl::StatusOr<GpuFrameOutput> NvdecOutputFor(const pb::StreamIndex& stream,
                                              const VideoOutput& output) {
  RETURN_IF_ERROR(RefuseRotation(stream, output.autorotate));
  if (output.crop.has_value()) {
    return absl::FailedPreconditionError(
        "NVDEC crops after resizing; a crop before it (VideoOutput::crop) is the CPU decoder's");
  }
  if (output.width > 0 && output.filter != ResizeFilter::kBilinear) {
    return absl::FailedPreconditionError("the NVDEC kernel resizes bilinearly; resize: bilinear");
  }
  GpuFrameOutput out;
  out.resize_width = output.width;
  out.resize_height = output.height;
  out.layout = GpuFrameOutput::Layout::kHwcU8;
  out.autorotate = output.autorotate;
  return out;
}

size_t NvdecDecoder::FrameBytes(const GpuFrameOutput& o, int width, int height) {
  const OutputDims d = DimsOf(o, width, height);
  return static_cast<size_t>(d.ow) * static_cast<size_t>(d.oh) * 3 *
         (o.layout == GpuFrameOutput::Layout::kChwF32 ? sizeof(float) : 1);
}

#if !CONVEYOR_NVDEC

const std::string& NvdecUnavailable(int) {
#if !CONVEYOR_HAVE_CUDA
  static const std::string reason = "built without CUDA (no toolkit at build time)";
#else
  static const std::string reason =
      "built without nv-codec-headers (Debian's libffmpeg-nvenc-dev), which NVDEC needs";
#endif
  return reason;
}
absl::StatusOr<NvdecCaps> QueryNvdecCaps(const std::string&, int device) {
  return absl::FailedPreconditionError(StrCat("NVDEC: ", NvdecUnavailable(device)));
}
struct NvdecDecoder::Impl {
  FrameDecoderStats stats;
};
absl::StatusOr<std::unique_ptr<NvdecDecoder>> NvdecDecoder::Create(int device) {
  return absl::FailedPreconditionError(StrCat("NVDEC: ", NvdecUnavailable(device)));
}
NvdecDecoder::NvdecDecoder(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
NvdecDecoder::~NvdecDecoder() = default;
absl::Status NvdecDecoder::DecodeToDevice(uint64_t, const pb::StreamIndex&, const FrameTable&,
                                          PacketReader, std::span<const int64_t>,
                                          const GpuFrameOutput&, const DecodeLimits&, void*,
                                          size_t) {
  return absl::FailedPreconditionError(StrCat("NVDEC: ", NvdecUnavailable(0)));
}
absl::Status NvdecDecoder::Decode(uint64_t, const pb::StreamIndex&, const FrameTable&, PacketReader,
                                  std::span<const int64_t>, const VideoOutput&,
                                  const DecodeLimits&, std::vector<RgbImage>*) {
  return absl::FailedPreconditionError(StrCat("NVDEC: ", NvdecUnavailable(0)));
}
void* NvdecDecoder::stream() const { return nullptr; }
int NvdecDecoder::device() const { return -1; }
const FrameDecoderStats& NvdecDecoder::stats() const { return impl_->stats; }

#else  // CONVEYOR_NVDEC

namespace {

// The driver's libraries, loaded once per process.
struct Driver {
  CudaFunctions* cu = nullptr;
  CuvidFunctions* cv = nullptr;
  int devices = 0;
  std::string error;  // why they are unusable; empty when usable
};

const Driver& LoadDriver() {
  static const Driver* driver = [] {
    auto* d = new Driver;
    std::string log;
    if (cuda_load_functions(&d->cu, &log) != 0) {
      d->error = StrCat("the CUDA driver (libcuda.so.1) could not be loaded: ", log);
      return d;
    }
    if (CUresult r = d->cu->cuInit(0); r != CUDA_SUCCESS) {
      const char* name = nullptr;
      d->cu->cuGetErrorName(r, &name);
      d->error = StrCat("cuInit: ", name != nullptr ? name : "error ", name ? "" : StrCat(r));
      return d;
    }
    d->cu->cuDeviceGetCount(&d->devices);
    if (d->devices == 0) {
      d->error = "no CUDA device";
      return d;
    }
    if (cuvid_load_functions(&d->cv, &log) != 0) {
      d->error = StrCat("the NVDEC library (libnvcuvid.so.1, part of the driver) could not be "
                        "loaded: ", log);
    }
    return d;
  }();
  return *driver;
}

std::string CuError(const Driver& d, CUresult r, std::string_view call) {
  const char* name = nullptr;
  d.cu->cuGetErrorName(r, &name);
  return StrCat(call, ": ", name != nullptr ? std::string(name) : StrCat("CUresult ", r));
}

// Makes `ctx` current for the scope.
class ScopedContext {
 public:
  ScopedContext(const Driver& d, CUcontext ctx) : d_(d) { d_.cu->cuCtxPushCurrent(ctx); }
  ~ScopedContext() {
    CUcontext dummy;
    d_.cu->cuCtxPopCurrent(&dummy);
  }

 private:
  const Driver& d_;
};

absl::StatusOr<cudaVideoCodec> CodecFor(const std::string& codec) {
  if (codec == "h264") return cudaVideoCodec_H264;
  if (codec == "hevc") return cudaVideoCodec_HEVC;
  if (codec == "av1") return cudaVideoCodec_AV1;
  if (codec == "vp9") return cudaVideoCodec_VP9;
  return absl::FailedPreconditionError(StrCat("NVDEC has no decoder for codec '", codec, "'"));
}

absl::StatusOr<NvdecCaps> Caps(const Driver& d, cudaVideoCodec codec) {
  CUVIDDECODECAPS c;
  std::memset(&c, 0, sizeof(c));
  c.eCodecType = codec;
  c.eChromaFormat = cudaVideoChromaFormat_420;
  c.nBitDepthMinus8 = 0;
  if (d.cv->cuvidGetDecoderCaps == nullptr) {
    return absl::FailedPreconditionError("this driver's libnvcuvid has no cuvidGetDecoderCaps");
  }
  if (CUresult r = d.cv->cuvidGetDecoderCaps(&c); r != CUDA_SUCCESS) {
    return absl::InternalError(CuError(d, r, "cuvidGetDecoderCaps"));
  }
  NvdecCaps caps;
  caps.supported = c.bIsSupported != 0;
  caps.engines = c.nNumNVDECs;
  caps.min_width = c.nMinWidth;
  caps.min_height = c.nMinHeight;
  caps.max_width = static_cast<int>(c.nMaxWidth);
  caps.max_height = static_cast<int>(c.nMaxHeight);
  return caps;
}

// Kr and Kb of the stream's Y'CbCr matrix (FFmpeg's AVColorSpace numbers, as libswscale reads
// them on the CPU path): BT.709 (1), BT.2020 (9, 10), SMPTE 240M (7), FCC (4); anything else,
// unspecified included, is BT.601.
void MatrixFor(int color_space, float* kr, float* kb) {
  switch (color_space) {
    case 1: *kr = 0.2126f; *kb = 0.0722f; return;
    case 9: case 10: *kr = 0.2627f; *kb = 0.0593f; return;
    case 7: *kr = 0.212f; *kb = 0.087f; return;
    case 4: *kr = 0.30f; *kb = 0.11f; return;
    default: *kr = 0.299f; *kb = 0.114f; return;
  }
}

constexpr unsigned kDisplayDelay = 4;  // pictures decoded ahead of the one shown (pipelining)

}  // namespace

const std::string& NvdecUnavailable(int device) {
  static absl::Mutex mu(absl::kConstInit);
  static auto* reasons = new std::unordered_map<int, std::string>;
  absl::MutexLock lock(&mu);
  auto it = reasons->find(device);
  if (it != reasons->end()) return it->second;
  const Driver& d = LoadDriver();
  std::string reason = d.error;
  if (reason.empty() && (device < 0 || device >= d.devices)) {
    reason = StrCat("no CUDA device ", device, " (", d.devices, " here)");
  }
  return reasons->emplace(device, std::move(reason)).first->second;
}

absl::StatusOr<NvdecCaps> QueryNvdecCaps(const std::string& codec, int device) {
  if (const std::string& why = NvdecUnavailable(device); !why.empty()) {
    return absl::FailedPreconditionError(StrCat("NVDEC: ", why));
  }
  auto c = CodecFor(codec);
  if (!c.ok()) return NvdecCaps{};
  const Driver& d = LoadDriver();
  CUdevice dev;
  CUcontext ctx;
  d.cu->cuDeviceGet(&dev, device);
  if (CUresult r = d.cu->cuDevicePrimaryCtxRetain(&ctx, dev); r != CUDA_SUCCESS) {
    return absl::FailedPreconditionError(CuError(d, r, "cuDevicePrimaryCtxRetain"));
  }
  absl::StatusOr<NvdecCaps> caps;
  {
    ScopedContext scoped(d, ctx);
    caps = Caps(d, *c);
  }
  d.cu->cuDevicePrimaryCtxRelease(dev);
  return caps;
}

struct NvdecDecoder::Impl {
  const Driver* d = nullptr;
  int device = 0;
  CUdevice dev = 0;
  CUcontext ctx = nullptr;
  CUstream stream = nullptr;
  CUvideoparser parser = nullptr;
  CUvideodecoder decoder = nullptr;
  FrameDecoderStats stats;

  // The decoder's shape (from the last sequence header).
  cudaVideoCodec codec = cudaVideoCodec_NumCodecs;
  unsigned coded_width = 0, coded_height = 0, surfaces = 0;
  int display_width = 0, display_height = 0;

  // Where the bitstream stands: stream_key's packets up to next_packet went through the parser.
  std::string params_key;
  uint64_t stream_key = 0;
  bool live = false;
  size_t next_packet = 0;
  int64_t last_shown_pts = std::numeric_limits<int64_t>::min();
  AVBSFContext* bsf = nullptr;
  std::string bsf_key;
  av::UniquePacket pkt = av::MakePacket();
  std::string bytes;

  // This call's request.
  std::unordered_map<int64_t, std::vector<size_t>> wanted;  // pts -> output entries
  size_t remaining = 0;
  const GpuFrameOutput* output = nullptr;
  nvdec::ConvertParams convert;
  uint8_t* dst = nullptr;
  size_t dst_stride = 0;
  int64_t max_pixels = 0;
  absl::Status error;  // the first failure inside a parser callback

  // Decode's (host frames) device buffer, grown to the largest request.
  CUdeviceptr staging = 0;
  size_t staging_bytes = 0;

  ~Impl() {
    if (d == nullptr) return;
    {
      ScopedContext scoped(*d, ctx);
      if (staging != 0) d->cu->cuMemFree(staging);
      if (parser != nullptr) d->cv->cuvidDestroyVideoParser(parser);
      if (decoder != nullptr) d->cv->cuvidDestroyDecoder(decoder);
      if (stream != nullptr) d->cu->cuStreamDestroy(stream);
    }
    if (bsf != nullptr) av_bsf_free(&bsf);
    if (ctx != nullptr) d->cu->cuDevicePrimaryCtxRelease(dev);
  }

  static int CUDAAPI OnSequence(void* self, CUVIDEOFORMAT* f) {
    return static_cast<Impl*>(self)->Sequence(*f);
  }
  static int CUDAAPI OnDecode(void* self, CUVIDPICPARAMS* p) {
    return static_cast<Impl*>(self)->DecodePicture(p);
  }
  static int CUDAAPI OnDisplay(void* self, CUVIDPARSERDISPINFO* i) {
    return static_cast<Impl*>(self)->Display(i);
  }

  int Fail(absl::Status s) {
    if (error.ok()) error = std::move(s);
    return 0;
  }

  int Sequence(const CUVIDEOFORMAT& f) {
    if (f.chroma_format != cudaVideoChromaFormat_420 || f.bit_depth_luma_minus8 != 0 ||
        f.bit_depth_chroma_minus8 != 0) {
      return Fail(absl::FailedPreconditionError(StrCat(
          "NVDEC path takes 8-bit 4:2:0 only; the stream is chroma format ", f.chroma_format,
          " at ", 8 + f.bit_depth_luma_minus8, " bits (decode it on the CPU)")));
    }
    if (static_cast<int64_t>(f.coded_width) * f.coded_height > max_pixels) {
      return Fail(absl::ResourceExhaustedError(StrCat("frame size ", f.coded_width, "x",
                                                      f.coded_height, " is over limits.max_pixels")));
    }
    const unsigned want = f.min_num_decode_surfaces + kDisplayDelay + 2;
    const int dw = f.display_area.right - f.display_area.left;
    const int dh = f.display_area.bottom - f.display_area.top;
    if (decoder != nullptr && codec == f.codec && coded_width == f.coded_width &&
        coded_height == f.coded_height && surfaces >= want && dw == display_width &&
        dh == display_height) {
      return static_cast<int>(surfaces);
    }
    auto caps = Caps(*d, f.codec);
    if (!caps.ok()) return Fail(caps.status());
    if (!caps->supported || static_cast<int>(f.coded_width) < caps->min_width ||
        static_cast<int>(f.coded_height) < caps->min_height ||
        static_cast<int>(f.coded_width) > caps->max_width ||
        static_cast<int>(f.coded_height) > caps->max_height) {
      return Fail(absl::FailedPreconditionError(StrCat(
          "this GPU's NVDEC cannot decode ", f.coded_width, "x", f.coded_height, " (codec ",
          f.codec, ": supported ", caps->supported, ", ", caps->min_width, "x", caps->min_height,
          " to ", caps->max_width, "x", caps->max_height, ")")));
    }
    if (decoder != nullptr) {
      d->cv->cuvidDestroyDecoder(decoder);
      decoder = nullptr;
    }
    CUVIDDECODECREATEINFO ci;
    std::memset(&ci, 0, sizeof(ci));
    ci.CodecType = f.codec;
    ci.ChromaFormat = f.chroma_format;
    ci.OutputFormat = cudaVideoSurfaceFormat_NV12;
    ci.bitDepthMinus8 = 0;
    ci.DeinterlaceMode =
        f.progressive_sequence ? cudaVideoDeinterlaceMode_Weave : cudaVideoDeinterlaceMode_Adaptive;
    ci.ulNumOutputSurfaces = 2;
    ci.ulCreationFlags = cudaVideoCreate_PreferCUVID;
    ci.ulNumDecodeSurfaces = want;
    ci.ulWidth = f.coded_width;
    ci.ulHeight = f.coded_height;
    ci.ulMaxWidth = f.coded_width;
    ci.ulMaxHeight = f.coded_height;
    ci.display_area.left = static_cast<short>(f.display_area.left);
    ci.display_area.top = static_cast<short>(f.display_area.top);
    ci.display_area.right = static_cast<short>(f.display_area.right);
    ci.display_area.bottom = static_cast<short>(f.display_area.bottom);
    ci.ulTargetWidth = static_cast<unsigned>(dw);
    ci.ulTargetHeight = static_cast<unsigned>(dh);
    if (CUresult r = d->cv->cuvidCreateDecoder(&decoder, &ci); r != CUDA_SUCCESS) {
      decoder = nullptr;
      return Fail(absl::ResourceExhaustedError(CuError(*d, r, "cuvidCreateDecoder")));
    }
    ++stats.decoders_opened;
    codec = f.codec;
    coded_width = f.coded_width;
    coded_height = f.coded_height;
    surfaces = want;
    display_width = dw;
    display_height = dh;
    return static_cast<int>(surfaces);
  }

  int DecodePicture(CUVIDPICPARAMS* p) {
    if (decoder == nullptr) return Fail(absl::DataLossError("a picture came before any sequence header"));
    if (CUresult r = d->cv->cuvidDecodePicture(decoder, p); r != CUDA_SUCCESS) {
      return Fail(absl::DataLossError(CuError(*d, r, "cuvidDecodePicture")));
    }
    ++stats.frames_decoded;
    return 1;
  }

  int Display(const CUVIDPARSERDISPINFO* info) {
    if (info == nullptr) return 1;
    const int64_t pts = info->timestamp;
    last_shown_pts = pts;
    auto it = wanted.find(pts);
    if (it == wanted.end()) return 1;
    CUVIDGETDECODESTATUS st;
    std::memset(&st, 0, sizeof(st));
    if (d->cv->cuvidGetDecodeStatus(decoder, info->picture_index, &st) == CUDA_SUCCESS &&
        (st.decodeStatus == cuvidDecodeStatus_Error ||
         st.decodeStatus == cuvidDecodeStatus_Error_Concealed)) {
      return Fail(absl::DataLossError(
          StrCat("NVDEC flagged the picture at pts ", pts, " as corrupt (status ", st.decodeStatus, ")")));
    }
    CUVIDPROCPARAMS proc;
    std::memset(&proc, 0, sizeof(proc));
    proc.progressive_frame = info->progressive_frame;
    proc.top_field_first = info->top_field_first;
    proc.second_field = 0;
    proc.output_stream = stream;
    CUdeviceptr frame = 0;
    unsigned pitch = 0;
    if (CUresult r = d->cv->cuvidMapVideoFrame(decoder, info->picture_index, &frame, &pitch, &proc);
        r != CUDA_SUCCESS) {
      return Fail(absl::InternalError(CuError(*d, r, "cuvidMapVideoFrame")));
    }
    nvdec::ConvertParams p = convert;
    p.luma = frame;
    p.chroma = frame + static_cast<uint64_t>(pitch) * ((display_height + 1) & ~1);
    p.pitch = static_cast<int>(pitch);
    p.src_width = display_width;
    p.src_height = display_height;
    const GpuFrameOutput& o = *output;
    p.resize_width = o.resize_width > 0 ? o.resize_width : display_width;
    p.resize_height = o.resize_height > 0 ? o.resize_height : display_height;
    p.out_width = o.width > 0 ? o.width : p.resize_width;
    p.out_height = o.height > 0 ? o.height : p.resize_height;
    p.crop_x = o.crop_x;
    p.crop_y = o.crop_y;
    const char* launch_error = nullptr;
    for (size_t entry : it->second) {
      p.dst = dst + entry * dst_stride;
      launch_error = nvdec::LaunchConvert(p, stream);
      if (launch_error != nullptr) break;
    }
    const CUresult sync = d->cu->cuStreamSynchronize(stream);
    d->cv->cuvidUnmapVideoFrame(decoder, frame);
    if (launch_error != nullptr) {
      return Fail(absl::InternalError(StrCat("the NV12 conversion kernel: ", launch_error)));
    }
    if (sync != CUDA_SUCCESS) return Fail(absl::InternalError(CuError(*d, sync, "cuStreamSynchronize")));
    stats.frames_delivered += it->second.size();
    remaining -= it->second.size();
    wanted.erase(it);
    return 1;
  }

  absl::Status RestartParser(cudaVideoCodec c) {
    if (parser != nullptr) {
      d->cv->cuvidDestroyVideoParser(parser);
      parser = nullptr;
    }
    CUVIDPARSERPARAMS pp;
    std::memset(&pp, 0, sizeof(pp));
    pp.CodecType = c;
    pp.ulMaxNumDecodeSurfaces = 1;  // the sequence callback returns the real number
    pp.ulMaxDisplayDelay = kDisplayDelay;
    pp.pUserData = this;
    pp.pfnSequenceCallback = &Impl::OnSequence;
    pp.pfnDecodePicture = &Impl::OnDecode;
    pp.pfnDisplayPicture = &Impl::OnDisplay;
    if (CUresult r = d->cv->cuvidCreateVideoParser(&parser, &pp); r != CUDA_SUCCESS) {
      parser = nullptr;
      return absl::InternalError(CuError(*d, r, "cuvidCreateVideoParser"));
    }
    return absl::OkStatus();
  }

  // The stream's packets as Annex B (what NVCUVID's parser reads): MP4's length-prefixed NAL units
  // go through FFmpeg's h264_mp4toannexb / hevc_mp4toannexb, which pass Annex B through.
  absl::Status UseBitstreamFilter(const pb::StreamIndex& stream) {
    std::string key = stream.codec().SerializeAsString();
    if (bsf != nullptr && key == bsf_key) {
      av_bsf_flush(bsf);
      return absl::OkStatus();
    }
    if (bsf != nullptr) av_bsf_free(&bsf);
    const std::string& codec = stream.codec().codec();
    const char* name = codec == "h264" ? "h264_mp4toannexb" : "hevc_mp4toannexb";
    const AVBitStreamFilter* filter = av_bsf_get_by_name(name);
    if (filter == nullptr) return absl::InternalError(StrCat("FFmpeg has no ", name));
    if (av_bsf_alloc(filter, &bsf) < 0) return absl::ResourceExhaustedError("av_bsf_alloc");
    RETURN_IF_ERROR(av::CodecParamsToAv(stream.codec(), bsf->par_in));
    bsf->time_base_in = AVRational{stream.time_base_num(), stream.time_base_den()};
    if (int r = av_bsf_init(bsf); r < 0) {
      av_bsf_free(&bsf);
      return absl::DataLossError(StrCat(name, " rejected the stream's codec parameters (",
                                        av::ErrorString(r), ")"));
    }
    bsf_key = std::move(key);
    return absl::OkStatus();
  }

  absl::Status Parse(const uint8_t* data, size_t size, int64_t pts, unsigned flags) {
    CUVIDSOURCEDATAPACKET sp;
    std::memset(&sp, 0, sizeof(sp));
    sp.flags = flags;
    sp.payload = data;
    sp.payload_size = static_cast<unsigned long>(size);
    sp.timestamp = pts;
    const CUresult r = d->cv->cuvidParseVideoData(parser, &sp);
    if (!error.ok()) return error;
    if (r != CUDA_SUCCESS) return absl::DataLossError(CuError(*d, r, "cuvidParseVideoData"));
    return absl::OkStatus();
  }

  // Sends packet `i` (decode order) through the bitstream filter and the parser.
  absl::Status SendPacket(const pb::StreamIndex& stream, PacketReader read, size_t i) {
    const pb::PacketTable& pk = stream.packets();
    RETURN_IF_ERROR(read(i, &bytes));
    av_packet_unref(pkt.get());
    if (av_new_packet(pkt.get(), static_cast<int>(bytes.size())) < 0) {
      return absl::ResourceExhaustedError("av_new_packet");
    }
    std::memcpy(pkt->data, bytes.data(), bytes.size());
    const int64_t pts = pk.pts(static_cast<int>(i));
    pkt->pts = pts;
    pkt->dts = pk.dts(static_cast<int>(i));
    if (pk.flags(static_cast<int>(i)) & 1) pkt->flags |= AV_PKT_FLAG_KEY;
    if (int r = av_bsf_send_packet(bsf, pkt.get()); r < 0) {
      return absl::DataLossError(StrCat("packet ", i, ": the Annex B filter refused it (",
                                        av::ErrorString(r), ")"));
    }
    ++stats.packets_sent;
    while (true) {
      const int r = av_bsf_receive_packet(bsf, pkt.get());
      if (r == AVERROR(EAGAIN) || r == AVERROR_EOF) break;
      if (r < 0) {
        return absl::DataLossError(
            StrCat("packet ", i, ": the Annex B filter failed (", av::ErrorString(r), ")"));
      }
      absl::Status s = Parse(pkt->data, static_cast<size_t>(pkt->size), pts, CUVID_PKT_TIMESTAMP);
      av_packet_unref(pkt.get());
      if (!s.ok()) return Annotate(s, StrCat("packet ", i, " (pts ", pts, ")"));
    }
    return absl::OkStatus();
  }

  static absl::Status Annotate(const absl::Status& s, std::string_view where) {
    return absl::Status(s.code(), StrCat(where, ": ", s.message()));
  }
};

NvdecDecoder::NvdecDecoder(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
NvdecDecoder::~NvdecDecoder() = default;

absl::StatusOr<std::unique_ptr<NvdecDecoder>> NvdecDecoder::Create(int device) {
  if (const std::string& why = NvdecUnavailable(device); !why.empty()) {
    return absl::FailedPreconditionError(StrCat("NVDEC: ", why));
  }
  av::QuietLogging();
  auto impl = std::make_unique<Impl>();
  const Driver& d = LoadDriver();
  impl->device = device;
  d.cu->cuDeviceGet(&impl->dev, device);
  if (CUresult r = d.cu->cuDevicePrimaryCtxRetain(&impl->ctx, impl->dev); r != CUDA_SUCCESS) {
    return absl::FailedPreconditionError(CuError(d, r, "cuDevicePrimaryCtxRetain"));
  }
  impl->d = &d;
  {
    ScopedContext scoped(d, impl->ctx);
    if (CUresult r = d.cu->cuStreamCreate(&impl->stream, CU_STREAM_NON_BLOCKING); r != CUDA_SUCCESS) {
      impl->stream = nullptr;
      return absl::ResourceExhaustedError(CuError(d, r, "cuStreamCreate"));
    }
  }
  return std::unique_ptr<NvdecDecoder>(new NvdecDecoder(std::move(impl)));
}

namespace {

// DecodeToDevice's request against the stream: a codec the path decodes, an output inside the
// resized frame and the limits, a stride of at least one frame, frames the table has.
absl::Status CheckDeviceRequest(const pb::StreamIndex& stream, const FrameTable& table,
                                std::span<const int64_t> frames, const GpuFrameOutput& output,
                                const DecodeLimits& limits, size_t dst_stride) {
  const std::string& name = stream.codec().codec();
  if (name != "h264" && name != "hevc") {
    return absl::FailedPreconditionError(
        StrCat("the NVDEC path decodes h264 and hevc; this stream is '", name, "'"));
  }
  const int width = stream.codec().width(), height = stream.codec().height();
  const auto [rw, rh, ow, oh] = DimsOf(output, width, height);
  if (rw <= 0 || rh <= 0 || ow <= 0 || oh <= 0 || output.crop_x < 0 || output.crop_y < 0 ||
      output.crop_x + ow > rw || output.crop_y + oh > rh ||
      static_cast<int64_t>(rw) * rh > limits.max_pixels) {
    return absl::InvalidArgumentError(StrCat("output: crop ", ow, "x", oh, "+", output.crop_x, "+",
                                             output.crop_y, " of a ", rw, "x", rh,
                                             " resize of ", width, "x", height, " is invalid"));
  }
  const size_t frame_bytes = NvdecDecoder::FrameBytes(output, width, height);
  if (dst_stride < frame_bytes) {
    return absl::InvalidArgumentError(
        StrCat("dst_stride ", dst_stride, " is under one frame (", frame_bytes, " bytes)"));
  }
  for (int64_t f : frames) {
    if (f < 0 || f >= static_cast<int64_t>(table.size())) {
      return absl::OutOfRangeError(StrCat("frame ", f, " requested; the stream has ", table.size(),
                                          " frames"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status NvdecDecoder::DecodeToDevice(uint64_t stream_key, const pb::StreamIndex& stream,
                                          const FrameTable& table, PacketReader read,
                                          std::span<const int64_t> frames,
                                          const GpuFrameOutput& output, const DecodeLimits& limits,
                                          void* dst, size_t dst_stride) {
  Impl& m = *impl_;
  RETURN_IF_ERROR(RefuseRotation(stream, output.autorotate));
  if (static_cast<int64_t>(frames.size()) > limits.max_frames_per_sample) {
    return absl::ResourceExhaustedError(StrCat(frames.size(), " frames requested, over the limit of ",
                                               limits.max_frames_per_sample));
  }
  if (frames.empty()) return absl::OkStatus();
  RETURN_IF_ERROR(CheckDeviceRequest(stream, table, frames, output, limits, dst_stride));
  ASSIGN_OR_RETURN(const cudaVideoCodec codec, CodecFor(stream.codec().codec()));
  ScopedContext scoped(*m.d, m.ctx);

  m.wanted.clear();
  int64_t first = table.size();
  for (size_t i = 0; i < frames.size(); ++i) {
    m.wanted[table.pts[static_cast<size_t>(frames[i])]].push_back(i);
    first = std::min(first, frames[i]);
  }
  m.remaining = frames.size();
  m.output = &output;
  m.dst = static_cast<uint8_t*>(dst);
  m.dst_stride = dst_stride;
  m.max_pixels = limits.max_pixels;
  m.error = absl::OkStatus();
  nvdec::ConvertParams& c = m.convert;
  c = nvdec::ConvertParams{};
  c.layout = output.layout == GpuFrameOutput::Layout::kChwF32 ? 1 : 0;
  for (int i = 0; i < 3; ++i) {
    c.mean[i] = output.mean[static_cast<size_t>(i)];
    c.inv_std[i] = output.std[static_cast<size_t>(i)] != 0.f ? 1.f / output.std[static_cast<size_t>(i)] : 1.f;
  }
  MatrixFor(stream.codec().color_space(), &c.kr, &c.kb);
  c.full_range = stream.codec().color_range() == 2;  // AVCOL_RANGE_JPEG

  const size_t start = table.start_packet[static_cast<size_t>(first)];
  std::string params = stream.codec().SerializeAsString();
  const bool can_continue = m.live && m.stream_key == stream_key && m.params_key == params &&
                            m.last_shown_pts < table.pts[static_cast<size_t>(first)] &&
                            start <= m.next_packet;
  if (!can_continue) {
    RETURN_IF_ERROR(m.UseBitstreamFilter(stream));
    RETURN_IF_ERROR(m.RestartParser(codec));
    m.stream_key = stream_key;
    m.params_key = std::move(params);
    m.next_packet = start;
    m.last_shown_pts = std::numeric_limits<int64_t>::min();
    m.live = true;
    ++m.stats.seeks;
    // Parameter sets first, so a stream whose keyframes carry none (or an open-GOP start that is
    // not an IDR) still starts decoding.
    if (m.bsf->par_out->extradata_size > 0) {
      absl::Status s = m.Parse(m.bsf->par_out->extradata,
                               static_cast<size_t>(m.bsf->par_out->extradata_size), 0, 0);
      if (!s.ok()) {
        m.live = false;
        return Impl::Annotate(s, "the stream's parameter sets");
      }
    }
  }
  const size_t packets = static_cast<size_t>(stream.packets().pts_size());
  while (m.remaining > 0 && m.next_packet < packets) {
    absl::Status s = m.SendPacket(stream, read, m.next_packet);
    ++m.next_packet;
    if (!s.ok()) {
      m.live = false;
      return s;
    }
  }
  if (m.remaining > 0) {  // the end of the stream: flush the parser's display queue
    absl::Status s = m.Parse(nullptr, 0, 0, CUVID_PKT_ENDOFSTREAM);
    m.live = false;
    if (!s.ok()) return Impl::Annotate(s, "end of stream");
  }
  if (m.remaining > 0) {
    return absl::DataLossError(StrCat("NVDEC never showed ", m.remaining, " of the ",
                                      frames.size(), " frames asked for (the first at pts ",
                                      m.wanted.begin()->first, "), packets ", start, " to ",
                                      packets));
  }
  return absl::OkStatus();
}

absl::Status NvdecDecoder::Decode(uint64_t stream_key, const pb::StreamIndex& stream,
                                  const FrameTable& table, PacketReader read,
                                  std::span<const int64_t> frames, const VideoOutput& video_output,
                                  const DecodeLimits& limits, std::vector<RgbImage>* out) {
  Impl& m = *impl_;
  ASSIGN_OR_RETURN(const GpuFrameOutput output, NvdecOutputFor(stream, video_output));
  const int width = stream.codec().width(), height = stream.codec().height();
  const OutputDims dims = DimsOf(output, width, height);
  const size_t frame_bytes = FrameBytes(output, width, height);
  out->resize(frames.size());
  if (frames.empty()) return absl::OkStatus();
  if (frame_bytes == 0 || frames.size() > std::numeric_limits<size_t>::max() / frame_bytes) {
    return absl::InvalidArgumentError(StrCat("a ", width, "x", height, " stream's frames: bad size"));
  }
  const size_t need = frame_bytes * frames.size();
  {
    ScopedContext scoped(*m.d, m.ctx);
    if (m.staging_bytes < need) {
      if (m.staging != 0) m.d->cu->cuMemFree(m.staging);
      m.staging = 0;
      m.staging_bytes = 0;
      if (CUresult r = m.d->cu->cuMemAlloc(&m.staging, need); r != CUDA_SUCCESS) {
        m.staging = 0;
        return absl::ResourceExhaustedError(CuError(*m.d, r, StrCat("cuMemAlloc of ", need, " bytes")));
      }
      m.staging_bytes = need;
    }
  }
  RETURN_IF_ERROR(DecodeToDevice(stream_key, stream, table, read, frames, output, limits,
                                 reinterpret_cast<void*>(static_cast<uintptr_t>(m.staging)),
                                 frame_bytes));
  // DecodeToDevice returned with every frame written (its stream synchronised): copy them out.
  ScopedContext scoped(*m.d, m.ctx);
  for (size_t i = 0; i < frames.size(); ++i) {
    RgbImage& img = (*out)[i];
    img.width = dims.ow;
    img.height = dims.oh;
    img.pixels.resize(frame_bytes);
    if (CUresult r = m.d->cu->cuMemcpyDtoH(img.pixels.data(), m.staging + i * frame_bytes, frame_bytes);
        r != CUDA_SUCCESS) {
      return absl::InternalError(CuError(*m.d, r, "cuMemcpyDtoH"));
    }
  }
  return absl::OkStatus();
}

void* NvdecDecoder::stream() const { return impl_->stream; }
int NvdecDecoder::device() const { return impl_->device; }
const FrameDecoderStats& NvdecDecoder::stats() const { return impl_->stats; }

#endif  // CONVEYOR_NVDEC

}  // namespace conveyor
