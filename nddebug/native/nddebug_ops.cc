// nddebug's native ops: the digest of nddebug/digest.py in one pass over the bytes, and a
// recorder that appends digest rows to a process-global buffer, so a traced graph hands its
// digests to Python once per call (a drain) instead of once per op; and both in one op
// (NddebugDigestRecord), the one the tracer adds for most graph ops. That op also has a GPU
// kernel, which digests on the device with the kernels of nddebug_digest.cu (see "the GPU
// path" below); the other ops are CPU only.
//
// The digest definition ("nddebug-wsum64x2-v2") is in docs/format.md; digest_numpy is the
// reference this must match bit for bit. The sums wrap around mod 2**64 and are associative,
// so any reduction order gives the same value (the GPU's included).
#include <dlfcn.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <map>
#include <string>
#include <cstring>
#include <mutex>
#include <vector>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#endif

#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "tensorflow/core/util/work_sharder.h"
#include "xla/stream_executor/stream.h"

namespace {

using tensorflow::OpKernel;
using tensorflow::OpKernelConstruction;
using tensorflow::OpKernelContext;
using tensorflow::Tensor;
using tensorflow::TensorShape;

constexpr int64_t kBlock = 4096;
constexpr uint64_t kLengthWeight = 0x9E3779B97F4A7C15ULL;
constexpr uint64_t kRowMul[2] = {0x9E3779B97F4A7C15ULL, 0xD6E8FEB86659FD93ULL};
constexpr uint64_t kRowMul2[2] = {0xBF58476D1CE4E5B9ULL, 0x94D049BB133111EBULL};

uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ULL;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

// Arithmetic right shift of the word read as int64 (digest.py shifts signed values).
inline uint64_t sar(uint64_t x, int n) {
  return static_cast<uint64_t>(static_cast<int64_t>(x) >> n);
}

struct Weights {
  uint64_t w[2][kBlock];
  Weights() {
    for (int s = 0; s < 2; ++s) {
      const uint64_t base = static_cast<uint64_t>(s + 1) << 32;
      for (int64_t k = 0; k < kBlock; ++k) w[s][k] = splitmix64(base + k) | 1ULL;
    }
  }
};

const Weights& weights() {
  static const Weights* table = new Weights();
  return *table;
}

inline uint64_t row_weight(uint64_t row, int s) {
  uint64_t h = (row + 1) * kRowMul[s];
  h ^= sar(h, 31);
  h *= kRowMul2[s];
  h ^= sar(h, 29);
  return h | 1ULL;
}

// Adds words from..n-1 of a block to the weighted sums {sum u*w0, sum (u>>32)*w1}, one word
// at a time: the portable loop, and the tail of the SIMD ones.
inline void add_words(const char* p, int64_t from, int64_t n, uint64_t* a, uint64_t* b) {
  const Weights& t = weights();
  for (int64_t k = from; k < n; ++k) {
    uint64_t u;
    std::memcpy(&u, p + 8 * k, 8);
    *a += u * t.w[0][k];
    *b += sar(u, 32) * t.w[1][k];
  }
}

// Weighted sums of one block of n words (n <= kBlock); the portable loop.
void block_sums_scalar(const char* p, int64_t n, uint64_t* lo, uint64_t* hi) {
  uint64_t a = 0, b = 0;
  add_words(p, 0, n, &a, &b);
  *lo = a;
  *hi = b;
}

#if defined(__x86_64__) && defined(__GNUC__)
#define NDDEBUG_HAVE_AVX2 1
// The SIMD loops prefetch the data this many bytes ahead (a prefetch past the buffer's end
// does not fault): without it their loads wait on memory. It took an 18.9 MB tensor from
// ~12 to ~17 GB/s on one core of an AVX-512 EPYC, where a plain read runs at ~40.
constexpr int64_t kPrefetch = 4096;

// The same sums four words at a time with AVX2, which has no 64-bit multiply: with
// u = uh*2^32 + ul and w = wh*2^32 + wl, u*w = ul*wl + 2^32*(uh*wl + ul*wh) mod 2^64, and the
// cross terms are summed first and shifted once (multiplying by 2^32 distributes over the
// wrap-around sum). For v = u>>32 (arithmetic), vl = uh and vh is 0 or 2^32-1; only the low
// 32 bits of the cross sum survive the shift, and there vh*wl is -wl for a negative u.
// The result is the scalar loop's bit for bit (tests/test_native.py compares them).
__attribute__((target("avx2"))) void block_sums_avx2(const char* p, int64_t n, uint64_t* lo,
                                                     uint64_t* hi) {
  const Weights& t = weights();
  const __m256i zero = _mm256_setzero_si256();
  __m256i acc_lo = zero, acc_lo_x = zero, acc_hi = zero, acc_hi_x = zero;
  const int64_t vec = n & ~int64_t{3};
  for (int64_t k = 0; k < vec; k += 4) {
    if ((k & 7) == 0) _mm_prefetch(p + 8 * k + kPrefetch, _MM_HINT_T0);  // one per line
    const __m256i u = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 8 * k));
    const __m256i w0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(&t.w[0][k]));
    const __m256i w1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(&t.w[1][k]));
    const __m256i uh = _mm256_srli_epi64(u, 32);
    acc_lo = _mm256_add_epi64(acc_lo, _mm256_mul_epu32(u, w0));
    acc_lo_x = _mm256_add_epi64(acc_lo_x, _mm256_mul_epu32(uh, w0));
    acc_lo_x = _mm256_add_epi64(acc_lo_x, _mm256_mul_epu32(u, _mm256_srli_epi64(w0, 32)));
    acc_hi = _mm256_add_epi64(acc_hi, _mm256_mul_epu32(uh, w1));
    acc_hi_x = _mm256_add_epi64(acc_hi_x, _mm256_mul_epu32(uh, _mm256_srli_epi64(w1, 32)));
    const __m256i negative = _mm256_cmpgt_epi64(zero, u);
    acc_hi_x = _mm256_sub_epi64(acc_hi_x, _mm256_and_si256(negative, w1));
  }
  alignas(32) uint64_t l[4], lx[4], h[4], hx[4];
  _mm256_store_si256(reinterpret_cast<__m256i*>(l), acc_lo);
  _mm256_store_si256(reinterpret_cast<__m256i*>(lx), acc_lo_x);
  _mm256_store_si256(reinterpret_cast<__m256i*>(h), acc_hi);
  _mm256_store_si256(reinterpret_cast<__m256i*>(hx), acc_hi_x);
  uint64_t a = (l[0] + l[1] + l[2] + l[3]) + ((lx[0] + lx[1] + lx[2] + lx[3]) << 32);
  uint64_t b = (h[0] + h[1] + h[2] + h[3]) + ((hx[0] + hx[1] + hx[2] + hx[3]) << 32);
  add_words(p, vec, n, &a, &b);
  *lo = a;
  *hi = b;
}

// The same sums eight words at a time with AVX-512: AVX512DQ multiplies 64-bit lanes
// (vpmullq, the low 64 bits of the product, which is all a sum mod 2^64 keeps) and AVX512F
// shifts them arithmetically, so each word costs two multiplies, as in the portable loop.
// Two accumulator pairs hide the multiply's latency; the data is prefetched (kPrefetch).

__attribute__((target("avx512f,avx512dq"))) void block_sums_avx512(const char* p, int64_t n,
                                                                  uint64_t* lo, uint64_t* hi) {
  const Weights& t = weights();
  __m512i lo0 = _mm512_setzero_si512(), lo1 = lo0, hi0 = lo0, hi1 = lo0;
  const int64_t vec = n & ~int64_t{15};
  for (int64_t k = 0; k < vec; k += 16) {
    _mm_prefetch(p + 8 * k + kPrefetch, _MM_HINT_T0);
    _mm_prefetch(p + 8 * k + kPrefetch + 64, _MM_HINT_T0);
    const __m512i u0 = _mm512_loadu_si512(p + 8 * k);
    const __m512i u1 = _mm512_loadu_si512(p + 8 * k + 64);
    lo0 = _mm512_add_epi64(lo0, _mm512_mullo_epi64(u0, _mm512_loadu_si512(&t.w[0][k])));
    lo1 = _mm512_add_epi64(lo1, _mm512_mullo_epi64(u1, _mm512_loadu_si512(&t.w[0][k + 8])));
    hi0 = _mm512_add_epi64(
        hi0, _mm512_mullo_epi64(_mm512_srai_epi64(u0, 32), _mm512_loadu_si512(&t.w[1][k])));
    hi1 = _mm512_add_epi64(
        hi1, _mm512_mullo_epi64(_mm512_srai_epi64(u1, 32), _mm512_loadu_si512(&t.w[1][k + 8])));
  }
  uint64_t a = static_cast<uint64_t>(_mm512_reduce_add_epi64(_mm512_add_epi64(lo0, lo1)));
  uint64_t b = static_cast<uint64_t>(_mm512_reduce_add_epi64(_mm512_add_epi64(hi0, hi1)));
  add_words(p, vec, n, &a, &b);
  *lo = a;
  *hi = b;
}
#endif

using BlockSums = void (*)(const char*, int64_t, uint64_t*, uint64_t*);

// The loops this CPU runs: kLoopPortable always, kLoopAvx2 and kLoopAvx512 where it reports
// them (the library is compiled for any x86-64, so a SIMD loop is only called where the CPU,
// and the OS's saved register state, support it).
constexpr int kLoopPortable = 0, kLoopAvx2 = 1, kLoopAvx512 = 2;

BlockSums loop_if_supported(int loop) {
#ifdef NDDEBUG_HAVE_AVX2
  __builtin_cpu_init();
  if (loop == kLoopAvx512 && __builtin_cpu_supports("avx512f") &&
      __builtin_cpu_supports("avx512dq")) {
    return block_sums_avx512;
  }
  if (loop == kLoopAvx2 && __builtin_cpu_supports("avx2")) return block_sums_avx2;
#endif
  return loop == kLoopPortable ? block_sums_scalar : nullptr;
}

// The widest loop this CPU runs well, chosen once per process. AVX-512 only where the CPU
// also has AVX512-IFMA (Ice Lake, Zen 4 and later): on Skylake-SP and Cascade Lake, vpmullq
// is three uops and 512-bit multiplies lower the core's clock for the ops around them.
BlockSums best_block_sums() {
#ifdef NDDEBUG_HAVE_AVX2
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512ifma")) {
    if (BlockSums f = loop_if_supported(kLoopAvx512)) return f;
  }
#endif
  if (BlockSums f = loop_if_supported(kLoopAvx2)) return f;
  return block_sums_scalar;
}

std::atomic<BlockSums> g_block_sums{best_block_sums()};

inline void block_sums(const char* p, int64_t n, uint64_t* lo, uint64_t* hi) {
  g_block_sums.load(std::memory_order_relaxed)(p, n, lo, hi);
}

void digest_bytes(const char* data, int64_t nbytes, const tensorflow::DeviceBase::CpuWorkerThreads* pool,
                  uint64_t* out_lo, uint64_t* out_hi) {
  const int64_t whole_words = nbytes / 8;
  const int64_t rows = whole_words / kBlock;
  const int64_t rest_words = whole_words % kBlock;
  const int64_t tail = nbytes % 8;
  uint64_t lo = 0, hi = 0;
  if (rows > 0) {
    std::vector<uint64_t> partial(2 * rows);
    auto work = [&](int64_t start, int64_t limit) {
      for (int64_t r = start; r < limit; ++r) {
        uint64_t a, b;
        block_sums(data + r * kBlock * 8, kBlock, &a, &b);
        partial[2 * r] = a * row_weight(r, 0);
        partial[2 * r + 1] = b * row_weight(r, 1);
      }
    };
    if (pool != nullptr && rows > 1) {
      tensorflow::Shard(pool->num_threads, pool->workers, rows, kBlock * 4, work);
    } else {
      work(0, rows);
    }
    for (int64_t r = 0; r < rows; ++r) {  // wrap-around sums: any order gives the same value
      lo += partial[2 * r];
      hi += partial[2 * r + 1];
    }
  }
  const int64_t last_len = rest_words + (tail ? 1 : 0);
  if (last_len > 0) {
    // The last partial block: whole words, then the tail bytes zero-padded to one word.
    std::vector<char> buf(8 * last_len, 0);
    std::memcpy(buf.data(), data + rows * kBlock * 8, nbytes - rows * kBlock * 8);
    uint64_t a, b;
    block_sums(buf.data(), last_len, &a, &b);
    lo += a * row_weight(rows, 0);
    hi += b * row_weight(rows, 1);
  }
  lo += static_cast<uint64_t>(nbytes) * kLengthWeight;
  *out_lo = lo;
  *out_hi = hi;
}

// ------------------------------------------------------------------ the record buffer
std::atomic<bool> g_active{false};
std::mutex g_mutex;
std::vector<int64_t> g_rows;     // flat: op_id, n_out, n_in, then 2*(n_out+n_in) digests
std::vector<int64_t> g_drained;  // what the last drain handed out (valid until the next)
std::vector<int64_t> g_heads, g_words;  // the last nddebug_drain_split's (likewise)

// ------------------------------------------------------------------ the GPU path
// GPU ops digest on the device (nddebug_digest.cu, compiled to PTX, loaded through the CUDA
// driver API, which TensorFlow's GPU build has loaded already): no CUDA toolkit is needed to
// build or run this file. A GPU op's row is appended to g_rows at once with its digests left
// zero; the kernel writes them into a slot of mapped pinned host memory, and the drain, which
// waits for the streams those kernels went to, copies each slot into its row. One wait per
// drain, no copy per op.
using CUresult = int;
using CUcontext = void*;
using CUmodule = void*;
using CUfunction = void*;
using CUstream = void*;
using CUdevice = int;
using CUdeviceptr = unsigned long long;

struct Driver {
  CUresult (*StreamGetCtx)(CUstream, CUcontext*) = nullptr;
  CUresult (*CtxPushCurrent)(CUcontext) = nullptr;
  CUresult (*CtxPopCurrent)(CUcontext*) = nullptr;
  CUresult (*CtxGetDevice)(CUdevice*) = nullptr;
  CUresult (*DeviceGetAttribute)(int*, int, CUdevice) = nullptr;
  CUresult (*ModuleLoadData)(CUmodule*, const void*) = nullptr;
  CUresult (*ModuleGetFunction)(CUfunction*, CUmodule, const char*) = nullptr;
  CUresult (*LaunchKernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned,
                           unsigned, unsigned, CUstream, void**, void**) = nullptr;
  CUresult (*MemHostAlloc)(void**, size_t, unsigned) = nullptr;
  CUresult (*MemHostGetDevicePointer)(CUdeviceptr*, void*, unsigned) = nullptr;
  CUresult (*StreamSynchronize)(CUstream) = nullptr;
  CUresult (*GetErrorString)(CUresult, const char**) = nullptr;
};

struct GpuModule {
  CUfunction parts = nullptr, finish = nullptr;
  int sms = 1;
};

constexpr unsigned kThreads = 256;
constexpr uint64_t kSmallWords = uint64_t{1} << 15;  // up to 256 KiB: one block digests it
constexpr int kMaxX = 8, kMaxIn = 32;                  // as in nddebug_digest.cu

struct XDesc {
  uint64_t data, nbytes, parts, nparts, out, slot;
};
struct InDesc {
  uint64_t ptr, npairs, at;
};
struct FinishArgs {
  uint64_t row;
  uint32_t n_x, n_in;
  XDesc x[kMaxX];
  InDesc in[kMaxIn];
};

struct PinnedChunk {
  int64_t* host = nullptr;
  CUdeviceptr dev = 0;
  size_t cap = 0, used = 0;  // in int64s
};

struct Pending {
  size_t row_at;  // the index in g_rows of the row's first digest value
  int64_t* slot;  // its values in pinned memory
  size_t n;       // int64s
  CUstream stream;
};

std::mutex g_gpu_mutex;  // guards the driver, the modules and g_ptx
Driver g_cu;
std::string g_gpu_problem;  // why the GPU path cannot run ("" while it can)
bool g_gpu_loaded = false;
std::string g_ptx;
std::map<CUcontext, GpuModule> g_modules;
// Guarded by g_mutex, like g_rows:
std::vector<PinnedChunk> g_chunks;
std::vector<Pending> g_pending;

std::string cu_error(CUresult r) {
  const char* s = nullptr;
  if (g_cu.GetErrorString != nullptr) g_cu.GetErrorString(r, &s);
  return std::string("CUDA error ") + std::to_string(r) + (s ? std::string(" (") + s + ")" : "");
}

// Resolve the driver API once (dlopen of the libcuda TensorFlow loaded).
bool load_driver_locked() {
  if (g_gpu_loaded) return g_gpu_problem.empty();
  g_gpu_loaded = true;
  void* h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  if (h == nullptr) h = dlopen("libcuda.so.1", RTLD_NOW);
  if (h == nullptr) {
    g_gpu_problem = "libcuda.so.1 could not be opened";
    return false;
  }
  bool ok = true;
  auto get = [&](auto& fn, const char* name) {
    fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(h, name));
    if (fn == nullptr) {
      ok = false;
      g_gpu_problem = std::string("libcuda.so.1 lacks ") + name;
    }
  };
  get(g_cu.StreamGetCtx, "cuStreamGetCtx");
  get(g_cu.CtxPushCurrent, "cuCtxPushCurrent_v2");
  get(g_cu.CtxPopCurrent, "cuCtxPopCurrent_v2");
  get(g_cu.CtxGetDevice, "cuCtxGetDevice");
  get(g_cu.DeviceGetAttribute, "cuDeviceGetAttribute");
  get(g_cu.ModuleLoadData, "cuModuleLoadData");
  get(g_cu.ModuleGetFunction, "cuModuleGetFunction");
  get(g_cu.LaunchKernel, "cuLaunchKernel");
  get(g_cu.MemHostAlloc, "cuMemHostAlloc");
  get(g_cu.MemHostGetDevicePointer, "cuMemHostGetDevicePointer_v2");
  get(g_cu.StreamSynchronize, "cuStreamSynchronize");
  get(g_cu.GetErrorString, "cuGetErrorString");
  return ok;
}

// Runs fn with the stream's context current on this thread.
template <typename F>
tensorflow::Status in_context(CUstream stream, CUcontext* ctx_out, F fn) {
  CUcontext ctx = nullptr;
  CUresult r = g_cu.StreamGetCtx(stream, &ctx);
  if (r != 0) return tensorflow::errors::Internal("nddebug: cuStreamGetCtx: ", cu_error(r));
  if (ctx_out != nullptr) *ctx_out = ctx;
  r = g_cu.CtxPushCurrent(ctx);
  if (r != 0) return tensorflow::errors::Internal("nddebug: cuCtxPushCurrent: ", cu_error(r));
  tensorflow::Status s = fn(ctx);
  CUcontext popped;
  g_cu.CtxPopCurrent(&popped);
  return s;
}

// The kernels in the stream's context, loaded (and the weights made) on first use.
tensorflow::Status gpu_module(CUstream stream, GpuModule** out) {
  std::lock_guard<std::mutex> lock(g_gpu_mutex);
  if (!load_driver_locked()) return tensorflow::errors::Unavailable("nddebug: ", g_gpu_problem);
  if (g_ptx.empty()) {
    return tensorflow::errors::FailedPrecondition(
        "nddebug: the GPU digest kernels were not given to the library (nddebug_set_ptx)");
  }
  CUcontext ctx = nullptr;
  CUresult r = g_cu.StreamGetCtx(stream, &ctx);
  if (r != 0) return tensorflow::errors::Internal("nddebug: cuStreamGetCtx: ", cu_error(r));
  auto it = g_modules.find(ctx);
  if (it != g_modules.end()) {
    *out = &it->second;
    return tensorflow::OkStatus();
  }
  GpuModule m;
  tensorflow::Status s = in_context(stream, nullptr, [&](CUcontext) -> tensorflow::Status {
    CUmodule mod = nullptr;
    CUresult e = g_cu.ModuleLoadData(&mod, g_ptx.c_str());
    if (e != 0) return tensorflow::errors::Internal("nddebug: loading the PTX: ", cu_error(e));
    CUfunction init = nullptr;
    if ((e = g_cu.ModuleGetFunction(&init, mod, "nddebug_init_weights")) != 0 ||
        (e = g_cu.ModuleGetFunction(&m.parts, mod, "nddebug_digest_parts")) != 0 ||
        (e = g_cu.ModuleGetFunction(&m.finish, mod, "nddebug_finish")) != 0) {
      return tensorflow::errors::Internal("nddebug: a GPU kernel is missing: ", cu_error(e));
    }
    CUdevice dev = 0;
    g_cu.CtxGetDevice(&dev);
    g_cu.DeviceGetAttribute(&m.sms, 16 /* MULTIPROCESSOR_COUNT */, dev);
    if (m.sms < 1) m.sms = 1;
    e = g_cu.LaunchKernel(init, kBlock / kThreads, 1, 1, kThreads, 1, 1, 0, stream, nullptr,
                          nullptr);
    if (e == 0) e = g_cu.StreamSynchronize(stream);
    if (e != 0) return tensorflow::errors::Internal("nddebug: weights kernel: ", cu_error(e));
    return tensorflow::OkStatus();
  });
  if (!s.ok()) return s;
  *out = &(g_modules[ctx] = m);
  return tensorflow::OkStatus();
}

// n int64s of mapped pinned memory for one row (g_mutex held, the stream's context current).
tensorflow::Status pinned_slot(size_t n, int64_t** host, CUdeviceptr* dev) {
  for (auto& c : g_chunks) {
    if (c.cap - c.used >= n) {
      *host = c.host + c.used;
      *dev = c.dev + 8 * c.used;
      c.used += n;
      return tensorflow::OkStatus();
    }
  }
  PinnedChunk c;
  c.cap = std::max<size_t>(n, size_t{1} << 18);
  void* p = nullptr;
  CUresult r = g_cu.MemHostAlloc(&p, 8 * c.cap, 0x01 | 0x02 /* PORTABLE | DEVICEMAP */);
  if (r != 0) return tensorflow::errors::ResourceExhausted("nddebug: pinned row buffer: ", cu_error(r));
  c.host = static_cast<int64_t*>(p);
  r = g_cu.MemHostGetDevicePointer(&c.dev, p, 0);
  if (r != 0) return tensorflow::errors::Internal("nddebug: mapped row buffer: ", cu_error(r));
  c.used = n;
  g_chunks.push_back(c);
  *host = c.host;
  *dev = c.dev;
  return tensorflow::OkStatus();
}

// Before the rows are handed out (g_mutex held): wait for the kernels that write them and
// copy their digests in.
void settle_pending_locked() {
  if (g_pending.empty()) return;
  std::vector<CUstream> streams;
  for (const auto& p : g_pending) {
    if (std::find(streams.begin(), streams.end(), p.stream) == streams.end()) {
      streams.push_back(p.stream);
    }
  }
  for (CUstream s : streams) g_cu.StreamSynchronize(s);
  for (const auto& p : g_pending) {
    std::memcpy(g_rows.data() + p.row_at, p.slot, 8 * p.n);
  }
  g_pending.clear();
  for (auto& c : g_chunks) c.used = 0;
}

}  // namespace

extern "C" {
__attribute__((visibility("default"))) void nddebug_set_active(int on) {
  g_active.store(on != 0);
}

__attribute__((visibility("default"))) int nddebug_is_active() { return g_active.load() ? 1 : 0; }

// Hands out every row appended since the last drain, in arrival order: *data points at
// the flat rows (valid until the next drain), the return value is their number of int64s.
__attribute__((visibility("default"))) int64_t nddebug_drain(const int64_t** data) {
  std::lock_guard<std::mutex> lock(g_mutex);
  settle_pending_locked();
  g_drained.clear();
  g_drained.swap(g_rows);
  *data = g_drained.data();
  return static_cast<int64_t>(g_drained.size());
}

// The same rows split in two: *heads, three int64s a row (op_id, n_out, n_in; the return
// value is their number), and *words, the rows' digest values one after the other (*n_words
// of them). Python then makes each digest pair once, from one list, with no row's header
// in between (the recorder's work per row is most of what a record costs a GPU's host).
__attribute__((visibility("default"))) int64_t nddebug_drain_split(const int64_t** heads,
                                                                  const int64_t** words,
                                                                  int64_t* n_words) {
  std::lock_guard<std::mutex> lock(g_mutex);
  settle_pending_locked();
  g_drained.clear();
  g_drained.swap(g_rows);
  g_heads.clear();
  g_words.clear();
  const size_t n = g_drained.size();
  size_t i = 0;
  while (i + 3 <= n) {
    const int64_t n_out = g_drained[i + 1], n_in = g_drained[i + 2];
    const size_t end = i + 3 + 2 * static_cast<size_t>(n_out + n_in);
    if (n_out < 0 || n_in < 0 || end > n) break;  // never: rows are appended whole
    g_heads.insert(g_heads.end(), g_drained.begin() + i, g_drained.begin() + i + 3);
    g_words.insert(g_words.end(), g_drained.begin() + i + 3, g_drained.begin() + end);
    i = end;
  }
  *heads = g_heads.data();
  *words = g_words.data();
  *n_words = static_cast<int64_t>(g_words.size());
  return static_cast<int64_t>(g_heads.size());
}

// Which loop digests: 1 the widest this CPU runs (the default), 0 the portable one (for
// tests and benchmarks that compare the two). Returns 1 when a SIMD loop is now in use.
__attribute__((visibility("default"))) int nddebug_set_simd(int on) {
  g_block_sums.store(on ? best_block_sums() : block_sums_scalar);
  return g_block_sums.load() != block_sums_scalar ? 1 : 0;
}

// The loop in use: 0 portable, 1 AVX2, 2 AVX-512.
__attribute__((visibility("default"))) int nddebug_loop() {
  const BlockSums f = g_block_sums.load();
#ifdef NDDEBUG_HAVE_AVX2
  if (f == block_sums_avx512) return kLoopAvx512;
  if (f == block_sums_avx2) return kLoopAvx2;
#endif
  return f == block_sums_scalar ? kLoopPortable : -1;
}

// Digest with one named loop: 0 portable, 1 AVX2, 2 AVX-512. Returns 1 when that loop is
// now in use, 0 (and the loop unchanged) where this CPU does not run it.
__attribute__((visibility("default"))) int nddebug_set_loop(int loop) {
  BlockSums f = loop_if_supported(loop);
  if (f == nullptr) return 0;
  g_block_sums.store(f);
  return 1;
}

// The PTX of nddebug_digest.cu, given by the Python side before a GPU op runs.
__attribute__((visibility("default"))) void nddebug_set_ptx(const char* ptx) {
  std::lock_guard<std::mutex> lock(g_gpu_mutex);
  g_ptx = ptx;
}

__attribute__((visibility("default"))) int64_t nddebug_digest_bytes(const char* data,
                                                                   int64_t nbytes,
                                                                   int64_t* out) {
  uint64_t lo, hi;
  digest_bytes(data, nbytes, nullptr, &lo, &hi);
  out[0] = static_cast<int64_t>(lo);
  out[1] = static_cast<int64_t>(hi);
  return 0;
}
}

namespace {

// The bytes a host tensor's digest reads: its own bytes, or for a string tensor each
// element's length in bytes (little-endian int64, row-major order) followed by the elements'
// bytes (string_bytes in digest.py), built in buf. An error for a dtype whose bytes are not
// its value (resources, variants).
tensorflow::Status host_bytes(const Tensor& t, std::string* buf, const char** data,
                              int64_t* nbytes) {
  if (t.dtype() == tensorflow::DT_STRING) {
    const auto flat = t.flat<tensorflow::tstring>();
    size_t total = 8 * static_cast<size_t>(flat.size());
    for (int64_t i = 0; i < flat.size(); ++i) total += flat(i).size();
    buf->clear();
    buf->reserve(total);
    for (int64_t i = 0; i < flat.size(); ++i) {
      const uint64_t n = flat(i).size();
      char le[8];
      for (int b = 0; b < 8; ++b) le[b] = static_cast<char>((n >> (8 * b)) & 0xff);
      buf->append(le, 8);
    }
    for (int64_t i = 0; i < flat.size(); ++i) buf->append(flat(i).data(), flat(i).size());
    *data = buf->data();
    *nbytes = static_cast<int64_t>(buf->size());
    return tensorflow::OkStatus();
  }
  if (!tensorflow::DataTypeCanUseMemcpy(t.dtype())) {
    return tensorflow::errors::InvalidArgument("nddebug: cannot read the bytes of ",
                                               tensorflow::DataTypeString(t.dtype()));
  }
  const auto bytes = t.tensor_data();
  *data = bytes.data();
  *nbytes = static_cast<int64_t>(bytes.size());
  return tensorflow::OkStatus();
}

// The digest of one host tensor into pair (see host_bytes).
tensorflow::Status digest_tensor(const Tensor& t,
                                 const tensorflow::DeviceBase::CpuWorkerThreads* pool,
                                 int64_t* pair) {
  std::string buf;
  const char* data = nullptr;
  int64_t nbytes = 0;
  TF_RETURN_IF_ERROR(host_bytes(t, &buf, &data, &nbytes));
  uint64_t lo, hi;
  digest_bytes(data, nbytes, pool, &lo, &hi);
  pair[0] = static_cast<int64_t>(lo);
  pair[1] = static_cast<int64_t>(hi);
  return tensorflow::OkStatus();
}

// NddebugDigest's gate, its tensors and its [n, 2] output (the CPU and GPU kernels alike).
tensorflow::Status digest_op_begin(OpKernelContext* ctx, bool* on, tensorflow::OpInputList* xs,
                                   Tensor** out) {
  *on = ctx->input(0).scalar<int32_t>()() != 0;
  TF_RETURN_IF_ERROR(ctx->input_list("x", xs));
  return ctx->allocate_output(0, TensorShape({xs->size(), 2}), out);
}

class DigestOp : public OpKernel {
 public:
  explicit DigestOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    bool on = false;
    tensorflow::OpInputList xs;
    Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, digest_op_begin(ctx, &on, &xs, &out));
    auto o = out->matrix<int64_t>();
    const auto* pool = ctx->device()->tensorflow_cpu_worker_threads();
    for (int i = 0; i < xs.size(); ++i) {
      o(i, 0) = 0;
      o(i, 1) = 0;
      if (!on) continue;  // outside trace(): read no data
      int64_t pair[2];
      OP_REQUIRES_OK(ctx, digest_tensor(xs[i], pool, pair));
      o(i, 0) = pair[0];
      o(i, 1) = pair[1];
    }
  }
};

class RecordOp : public OpKernel {
 public:
  explicit RecordOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("op_id", &op_id_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("n_out", &n_out_));
  }

  void Compute(OpKernelContext* ctx) override {
    if (!g_active.load(std::memory_order_relaxed)) return;
    tensorflow::OpInputList ds;
    OP_REQUIRES_OK(ctx, ctx->input_list("digests", &ds));
    int64_t pairs[2] = {0, 0};
    for (int i = 0; i < ds.size(); ++i) pairs[i < n_out_ ? 0 : 1] += ds[i].NumElements() / 2;
    std::lock_guard<std::mutex> lock(g_mutex);
    g_rows.push_back(op_id_);
    g_rows.push_back(pairs[0]);
    g_rows.push_back(pairs[1]);
    for (int i = 0; i < ds.size(); ++i) {
      auto flat = ds[i].flat<int64_t>();
      const int64_t n = ds[i].NumElements() / 2 * 2;
      g_rows.insert(g_rows.end(), flat.data(), flat.data() + n);
    }
  }

 protected:  // the GPU kernel (RecordGpuOp) shares the attrs
  int64_t op_id_ = 0;
  int n_out_ = 0;
};

// Digest and record in one op: the digests of the op's outputs (its x inputs) are this op's
// outputs, which the digests of the consumers' inputs reuse, and the row (op_id, those
// digests, the input digests) is appended when a trace is active. One op per instrumented op
// execution instead of one digest op per output plus a record op. Input digests that were
// known when the graph was built (constants) come as attrs: in_static holds their pairs and
// in_static_at their positions among the input digest pairs.
class DigestRecordOp : public OpKernel {
 public:
  explicit DigestRecordOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("op_id", &op_id_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("in_static", &in_static_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("in_static_at", &in_static_at_));
    OP_REQUIRES(ctx, in_static_.size() == 2 * in_static_at_.size(),
                tensorflow::errors::InvalidArgument("NddebugDigestRecord: in_static holds ",
                                                    in_static_.size(), " values for ",
                                                    in_static_at_.size(), " positions"));
  }

  void Compute(OpKernelContext* ctx) override {
    // No gate input: the buffer is on exactly while a trace() block is (the gate variable
    // switches with it), and a gate read feeding every op made the graph much larger.
    const bool on = g_active.load(std::memory_order_relaxed);
    tensorflow::OpInputList xs, ds;
    OP_REQUIRES_OK(ctx, ctx->input_list("x", &xs));
    OP_REQUIRES_OK(ctx, ctx->input_list("in_digests", &ds));
    const auto* pool = ctx->device()->tensorflow_cpu_worker_threads();
    std::vector<int64_t> outs(2 * xs.size(), 0);
    for (int i = 0; i < xs.size(); ++i) {
      Tensor* out = nullptr;
      OP_REQUIRES_OK(ctx, ctx->allocate_output(i, TensorShape({1, 2}), &out));
      if (on) OP_REQUIRES_OK(ctx, digest_tensor(xs[i], pool, &outs[2 * i]));
      auto o = out->matrix<int64_t>();
      o(0, 0) = outs[2 * i];
      o(0, 1) = outs[2 * i + 1];
    }
    if (!on) return;
    // The input digest pairs in input order: the dynamic ones (each input [k, 2]) with the
    // static ones slotted in at their positions. Built before taking the buffer's lock, so
    // a malformed op leaves no partial row behind.
    std::vector<int64_t> ins;
    size_t next_static = 0;
    for (int d = 0; d < ds.size(); ++d) {
      const auto flat = ds[d].flat<int64_t>();
      for (int64_t k = 0; k < ds[d].NumElements() / 2; ++k) {
        while (next_static < in_static_at_.size() &&
               in_static_at_[next_static] == static_cast<int64_t>(ins.size() / 2)) {
          ins.push_back(in_static_[2 * next_static]);
          ins.push_back(in_static_[2 * next_static + 1]);
          ++next_static;
        }
        ins.push_back(flat(2 * k));
        ins.push_back(flat(2 * k + 1));
      }
    }
    for (; next_static < in_static_at_.size(); ++next_static) {
      OP_REQUIRES(ctx, in_static_at_[next_static] == static_cast<int64_t>(ins.size() / 2),
                  tensorflow::errors::InvalidArgument(
                      "NddebugDigestRecord: static input digest position ",
                      in_static_at_[next_static], " is out of order or past the inputs"));
      ins.push_back(in_static_[2 * next_static]);
      ins.push_back(in_static_[2 * next_static + 1]);
    }
    std::lock_guard<std::mutex> lock(g_mutex);
    g_rows.push_back(op_id_);
    g_rows.push_back(xs.size());
    g_rows.push_back(static_cast<int64_t>(ins.size() / 2));
    g_rows.insert(g_rows.end(), outs.begin(), outs.end());
    g_rows.insert(g_rows.end(), ins.begin(), ins.end());
  }

 protected:  // the GPU kernel (DigestRecordGpuOp) shares the attrs
  int64_t op_id_ = 0;
  std::vector<int64_t> in_static_;
  std::vector<int64_t> in_static_at_;
};

// Queues on stream the kernels that digest xs[i] into the device pair outs[i] (when not 0)
// and, where row_dev is not 0, into the row's pair slot i; and that copy each of ins (device
// digest pairs) into the row. Tensors TensorFlow keeps in host memory (int32, strings) are
// digested here on the host. Large tensors get partial sums first, in temps, which must live
// until Compute returns: the allocator hands their memory on only to work queued after ours.
// Called with g_mutex held and the stream's context current.
tensorflow::Status launch_digests(OpKernelContext* ctx, CUstream stream, const GpuModule& mod,
                                  const std::vector<const Tensor*>& xs,
                                  const std::vector<bool>& on_host,
                                  const std::vector<uint64_t>& outs, CUdeviceptr row_dev,
                                  const std::vector<InDesc>& ins, std::vector<Tensor>* temps) {
  std::vector<XDesc> xd;
  for (size_t i = 0; i < xs.size(); ++i) {
    const Tensor& x = *xs[i];
    XDesc d{};
    d.out = outs[i];
    d.slot = i;
    if (!tensorflow::DataTypeCanUseMemcpy(x.dtype()) &&
        !(on_host[i] && x.dtype() == tensorflow::DT_STRING)) {
      return tensorflow::errors::InvalidArgument("nddebug: cannot read the bytes of ",
                                                 tensorflow::DataTypeString(x.dtype()));
    }
    if (on_host[i]) {  // (strings always are)
      std::string buf;
      const char* data = nullptr;
      int64_t nbytes = 0;
      TF_RETURN_IF_ERROR(host_bytes(x, &buf, &data, &nbytes));
      uint64_t lo, hi;
      digest_bytes(data, nbytes, nullptr, &lo, &hi);
      d.data = lo;
      d.nbytes = hi;
      d.nparts = ~uint64_t{0};
    } else {
      const auto bytes = x.tensor_data();
      d.data = reinterpret_cast<uint64_t>(bytes.data());
      d.nbytes = bytes.size();
      const uint64_t words = (d.nbytes + 7) / 8;
      if (words > kSmallWords) {
        const uint64_t rows = (words + kBlock - 1) / kBlock;
        const uint64_t grid = std::min<uint64_t>(rows, 8 * static_cast<uint64_t>(mod.sms));
        temps->emplace_back();
        TF_RETURN_IF_ERROR(ctx->allocate_temp(tensorflow::DT_INT64,
                                              TensorShape({static_cast<int64_t>(2 * grid)}),
                                              &temps->back()));
        d.parts = reinterpret_cast<uint64_t>(temps->back().tensor_data().data());
        d.nparts = grid;
        void* args[] = {&d.data, &d.nbytes, &d.parts};
        CUresult e = g_cu.LaunchKernel(mod.parts, grid, 1, 1, kThreads, 1, 1, 0, stream, args,
                                       nullptr);
        if (e != 0) return tensorflow::errors::Internal("nddebug: digest kernel: ", cu_error(e));
      }
    }
    xd.push_back(d);
  }
  // One finish launch per kMaxX tensors and kMaxIn input digests (usually one).
  size_t xi = 0, ii = 0;
  while (xi < xd.size() || ii < ins.size()) {
    FinishArgs a{};
    a.row = row_dev;
    for (; xi < xd.size() && a.n_x < kMaxX; ++xi) a.x[a.n_x++] = xd[xi];
    for (; ii < ins.size() && a.n_in < kMaxIn; ++ii) a.in[a.n_in++] = ins[ii];
    void* args[] = {&a};
    CUresult e =
        g_cu.LaunchKernel(mod.finish, 1, 1, 1, kThreads, 1, 1, 0, stream, args, nullptr);
    if (e != 0) return tensorflow::errors::Internal("nddebug: finish kernel: ", cu_error(e));
  }
  return tensorflow::OkStatus();
}

// The CUDA stream and the kernels of the op's GPU.
tensorflow::Status op_stream(OpKernelContext* ctx, CUstream* stream, GpuModule** mod) {
  auto* dc = ctx->op_device_context();
  if (dc == nullptr || dc->stream() == nullptr) {
    return tensorflow::errors::Internal("nddebug: no GPU stream for ", ctx->op_kernel().name());
  }
  *stream = static_cast<CUstream>(dc->stream()->platform_specific_handle().stream);
  return gpu_module(*stream, mod);
}

// Appends the row (op_id, n_out, n_in, then 2 * (n_out + n_in) values that the queued kernels
// write into slot) and marks it pending until the stream has run them (g_mutex held).
void push_pending_row(int64_t op_id, int64_t n_out, int64_t n_in, int64_t* slot,
                      CUstream stream) {
  const size_t n_vals = 2 * static_cast<size_t>(n_out + n_in);
  g_rows.push_back(op_id);
  g_rows.push_back(n_out);
  g_rows.push_back(n_in);
  const size_t row_at = g_rows.size();
  g_rows.resize(row_at + n_vals, 0);
  if (n_vals > 0) g_pending.push_back({row_at, slot, n_vals, stream});
}

// The fused op on a GPU: the same row and outputs as DigestRecordOp, digested on the device
// (outputs that TensorFlow keeps in host memory, int32 ones, are digested on the host). The
// launches are made under g_mutex so that a drain, which waits for the streams, covers them.
class DigestRecordGpuOp : public DigestRecordOp {
 public:
  explicit DigestRecordGpuOp(OpKernelConstruction* ctx) : DigestRecordOp(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    const bool on = g_active.load(std::memory_order_relaxed);
    tensorflow::OpInputList xs, ds;
    OP_REQUIRES_OK(ctx, ctx->input_list("x", &xs));
    OP_REQUIRES_OK(ctx, ctx->input_list("in_digests", &ds));
    std::vector<Tensor*> outs(xs.size(), nullptr);
    for (int i = 0; i < xs.size(); ++i) {
      OP_REQUIRES_OK(ctx, ctx->allocate_output(i, TensorShape({1, 2}), &outs[i]));
    }
    if (!on) return;  // outside trace(): no kernel, the outputs are never read
    CUstream stream = nullptr;
    GpuModule* mod = nullptr;
    OP_REQUIRES_OK(ctx, op_stream(ctx, &stream, &mod));

    // The row's input pairs: each dynamic input's position, the static ones' values.
    std::vector<std::pair<int, int64_t>> dyn_at;  // (input list index, first pair)
    std::vector<std::pair<int64_t, size_t>> static_at;  // (pair index, in_static index)
    int64_t pairs = 0;
    size_t next_static = 0;
    auto take_static = [&]() {
      while (next_static < in_static_at_.size() && in_static_at_[next_static] == pairs) {
        static_at.emplace_back(pairs++, next_static++);
      }
    };
    for (int d = 0; d < ds.size(); ++d) {
      const int64_t n = ds[d].NumElements() / 2;
      if (n == 0) continue;
      take_static();
      dyn_at.emplace_back(d, pairs);
      // The tracer places static pairs between inputs, never inside one input's pairs.
      OP_REQUIRES(ctx,
                  next_static >= in_static_at_.size() || in_static_at_[next_static] >= pairs + n,
                  tensorflow::errors::InvalidArgument(
                      "NddebugDigestRecord (GPU): a static input digest position falls inside "
                      "an input of several digests"));
      pairs += n;
    }
    take_static();
    OP_REQUIRES(ctx, next_static == in_static_at_.size(),
                tensorflow::errors::InvalidArgument(
                    "NddebugDigestRecord: static input digest position ",
                    next_static < in_static_at_.size() ? in_static_at_[next_static] : -1,
                    " is out of order or past the inputs"));

    const int n_x = xs.size();
    std::vector<const Tensor*> x_ptrs;
    std::vector<bool> on_host;
    std::vector<uint64_t> out_ptrs;
    for (int i = 0; i < n_x; ++i) {
      x_ptrs.push_back(&xs[i]);
      on_host.push_back(ctx->input_memory_type(i) == tensorflow::HOST_MEMORY);
      out_ptrs.push_back(reinterpret_cast<uint64_t>(outs[i]->tensor_data().data()));
    }
    std::vector<InDesc> ins;
    for (const auto& [d, at] : dyn_at) {
      ins.push_back({reinterpret_cast<uint64_t>(ds[d].tensor_data().data()),
                     static_cast<uint64_t>(ds[d].NumElements() / 2),
                     static_cast<uint64_t>(n_x + at)});
    }
    const size_t n_vals = 2 * (n_x + pairs);
    std::vector<Tensor> temps;
    std::lock_guard<std::mutex> lock(g_mutex);
    tensorflow::Status status = in_context(stream, nullptr, [&](CUcontext) -> tensorflow::Status {
      int64_t* slot = nullptr;
      CUdeviceptr slot_dev = 0;
      TF_RETURN_IF_ERROR(pinned_slot(n_vals, &slot, &slot_dev));
      std::memset(slot, 0, 8 * n_vals);
      for (const auto& [at, k] : static_at) {
        slot[2 * (n_x + at)] = in_static_[2 * k];
        slot[2 * (n_x + at) + 1] = in_static_[2 * k + 1];
      }
      TF_RETURN_IF_ERROR(
          launch_digests(ctx, stream, *mod, x_ptrs, on_host, out_ptrs, slot_dev, ins, &temps));
      push_pending_row(op_id_, n_x, pairs, slot, stream);
      return tensorflow::OkStatus();
    });
    OP_REQUIRES_OK(ctx, status);
  }
};

// Queues the kernel that writes zero pairs to the device pairs outs (a digest op whose gate is
// 0: outside trace(), no data is read).
tensorflow::Status zero_pairs(CUstream stream, const GpuModule& mod,
                              const std::vector<uint64_t>& outs) {
  for (size_t i = 0; i < outs.size(); i += kMaxX) {
    FinishArgs a{};
    for (size_t k = i; k < outs.size() && a.n_x < kMaxX; ++k) {
      XDesc& d = a.x[a.n_x++];
      d.out = outs[k];
      d.nparts = ~uint64_t{0};  // a "digest known on the host": (0, 0)
    }
    void* args[] = {&a};
    CUresult e =
        g_cu.LaunchKernel(mod.finish, 1, 1, 1, kThreads, 1, 1, 0, stream, args, nullptr);
    if (e != 0) return tensorflow::errors::Internal("nddebug: finish kernel: ", cu_error(e));
  }
  return tensorflow::OkStatus();
}

// NddebugDigest on a GPU: the digests of device tensors (function arguments, tensors that
// feed a recorded op from outside it) computed where they live, into a device [n, 2] output,
// so that no tensor crosses to the host inside the step. Zeros while the gate is 0.
class DigestGpuOp : public OpKernel {
 public:
  explicit DigestGpuOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    bool on = false;
    tensorflow::OpInputList xs;
    Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, digest_op_begin(ctx, &on, &xs, &out));
    if (xs.size() == 0) return;
    CUstream stream = nullptr;
    GpuModule* mod = nullptr;
    OP_REQUIRES_OK(ctx, op_stream(ctx, &stream, &mod));
    const uint64_t base = reinterpret_cast<uint64_t>(out->tensor_data().data());
    std::vector<const Tensor*> x_ptrs;
    std::vector<bool> on_host;
    std::vector<uint64_t> out_ptrs;
    for (int i = 0; i < xs.size(); ++i) {
      out_ptrs.push_back(base + 16 * static_cast<uint64_t>(i));
      on_host.push_back(ctx->input_memory_type(i + 1) == tensorflow::HOST_MEMORY);
      x_ptrs.push_back(&xs[i]);
    }
    std::vector<Tensor> temps;
    std::lock_guard<std::mutex> lock(g_mutex);  // a drain waits for these launches too
    OP_REQUIRES_OK(ctx, in_context(stream, nullptr, [&](CUcontext) -> tensorflow::Status {
      if (!on) return zero_pairs(stream, *mod, out_ptrs);
      return launch_digests(ctx, stream, *mod, x_ptrs, on_host, out_ptrs, 0, {}, &temps);
    }));
  }
};

// NddebugRecord on a GPU: the row of digests that are already on the device, copied into
// pinned memory by one kernel on the op's stream, not each fetched to the host.
class RecordGpuOp : public RecordOp {
 public:
  explicit RecordGpuOp(OpKernelConstruction* ctx) : RecordOp(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    if (!g_active.load(std::memory_order_relaxed)) return;
    tensorflow::OpInputList ds;
    OP_REQUIRES_OK(ctx, ctx->input_list("digests", &ds));
    CUstream stream = nullptr;
    GpuModule* mod = nullptr;
    OP_REQUIRES_OK(ctx, op_stream(ctx, &stream, &mod));
    int64_t pairs[2] = {0, 0};
    std::vector<InDesc> ins;
    uint64_t at = 0;
    for (int i = 0; i < ds.size(); ++i) {
      const int64_t n = ds[i].NumElements() / 2;
      pairs[i < n_out_ ? 0 : 1] += n;
      if (n > 0) {
        ins.push_back({reinterpret_cast<uint64_t>(ds[i].tensor_data().data()),
                       static_cast<uint64_t>(n), at});
      }
      at += n;
    }
    const size_t n_vals = 2 * at;
    std::lock_guard<std::mutex> lock(g_mutex);
    OP_REQUIRES_OK(ctx, in_context(stream, nullptr, [&](CUcontext) -> tensorflow::Status {
      int64_t* slot = nullptr;
      CUdeviceptr slot_dev = 0;
      if (n_vals > 0) {
        TF_RETURN_IF_ERROR(pinned_slot(n_vals, &slot, &slot_dev));
        TF_RETURN_IF_ERROR(launch_digests(ctx, stream, *mod, {}, {}, {}, slot_dev, ins, nullptr));
      }
      push_pending_row(op_id_, pairs[0], pairs[1], slot, stream);
      return tensorflow::OkStatus();
    }));
  }
};

}  // namespace

REGISTER_OP("NddebugDigest")
    .Input("gate: int32")
    .Input("x: T")
    .Attr("T: list(type)")
    .Output("digests: int64")
    .SetShapeFn([](tensorflow::shape_inference::InferenceContext* c) {
      c->set_output(0, c->Matrix(c->num_inputs() - 1, 2));
      return tensorflow::OkStatus();
    })
    .Doc("nddebug-wsum64x2-v2 digest of each input, as int64 [n, 2]; zeros when gate is 0.");

REGISTER_OP("NddebugRecord")
    .Input("digests: N * int64")
    .Attr("N: int >= 1")
    .Attr("op_id: int")
    .Attr("n_out: int >= 0")
    .SetIsStateful()
    .SetShapeFn(tensorflow::shape_inference::NoOutputs)
    .Doc("Appends (op_id, output digests, input digests) to the process buffer in a trace.");

REGISTER_OP("NddebugDigestRecord")
    .Input("x: T")
    .Input("in_digests: N * int64")
    .Output("digests: M * int64")
    .Attr("T: list(type)")
    .Attr("N: int >= 0")
    .Attr("M: int >= 1")
    .Attr("op_id: int")
    .Attr("in_static: list(int) = []")
    .Attr("in_static_at: list(int) = []")
    .SetIsStateful()
    .SetShapeFn([](tensorflow::shape_inference::InferenceContext* c) {
      for (int i = 0; i < c->num_outputs(); ++i) c->set_output(i, c->Matrix(1, 2));
      return tensorflow::OkStatus();
    })
    .Doc("In a trace: the digests of x (one [1, 2] output each; zeros outside) and the row "
         "(op_id, those digests, the input digests with in_static at in_static_at) appended.");

REGISTER_KERNEL_BUILDER(Name("NddebugDigest").Device(tensorflow::DEVICE_CPU).HostMemory("gate"),
                        DigestOp);
REGISTER_KERNEL_BUILDER(Name("NddebugDigest").Device(tensorflow::DEVICE_GPU).HostMemory("gate"),
                        DigestGpuOp);
REGISTER_KERNEL_BUILDER(Name("NddebugRecord").Device(tensorflow::DEVICE_CPU), RecordOp);
REGISTER_KERNEL_BUILDER(Name("NddebugRecord").Device(tensorflow::DEVICE_GPU), RecordGpuOp);
REGISTER_KERNEL_BUILDER(
    Name("NddebugDigestRecord").Device(tensorflow::DEVICE_CPU), DigestRecordOp);
REGISTER_KERNEL_BUILDER(
    Name("NddebugDigestRecord").Device(tensorflow::DEVICE_GPU), DigestRecordGpuOp);
