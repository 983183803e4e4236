// nddebug's GPU digest kernels: the "nddebug-wsum64x2-v1" digest of docs/format.md, computed
// where the tensor lives. Compiled to PTX by NVRTC (`python -m nddebug.native ptx`; the PTX
// ships beside this file) and loaded by the driver, which compiles it for the GPU at hand:
// a GPU machine needs no CUDA toolkit, only its driver.
//
// The sums wrap around mod 2**64, so any split of the words gives the same digest: large
// tensors are summed by many blocks (nddebug_digest_parts, one partial pair per block) and
// the partials added by nddebug_finish in block order; small ones by nddebug_finish alone.
// nddebug_finish then writes each digest to the op's output tensor (where it has one) and, with
// the op's input digests, to the op's row in pinned host memory (where it has one) that the host
// reads after the call.
// No atomics, no floating point: the result is the CPU's bit for bit.

typedef unsigned long long u64;
typedef long long i64;

#define NDDEBUG_BLOCK 4096
#define NDDEBUG_MAX_X 8
#define NDDEBUG_MAX_IN 32

__device__ u64 g_weights[2][NDDEBUG_BLOCK];

__device__ __forceinline__ u64 splitmix64(u64 x) {
  x += 0x9E3779B97F4A7C15ULL;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

__device__ __forceinline__ u64 sar(u64 x, int n) { return (u64)((i64)x >> n); }

__device__ __forceinline__ u64 row_weight(u64 row, int s) {
  const u64 a = s ? 0xD6E8FEB86659FD93ULL : 0x9E3779B97F4A7C15ULL;
  const u64 b = s ? 0x94D049BB133111EBULL : 0xBF58476D1CE4E5B9ULL;
  u64 h = (row + 1) * a;
  h ^= sar(h, 31);
  h *= b;
  h ^= sar(h, 29);
  return h | 1ULL;
}

// The block weights, once per context (module globals need no allocation).
extern "C" __global__ void nddebug_init_weights() {
  const int k = blockIdx.x * blockDim.x + threadIdx.x;
  if (k < NDDEBUG_BLOCK) {
    g_weights[0][k] = splitmix64((1ULL << 32) + k) | 1ULL;
    g_weights[1][k] = splitmix64((2ULL << 32) + k) | 1ULL;
  }
}

// Word j of the bytes, zero-padded past nbytes (byte loads where the word is partial or the
// data is not 8-byte aligned).
__device__ __forceinline__ u64 word_at(const unsigned char* p, u64 j, u64 nbytes, bool aligned) {
  const u64 off = j * 8;
  if (aligned && off + 8 <= nbytes) return *(const u64*)(p + off);
  u64 u = 0;
  for (int b = 0; b < 8; ++b) {
    if (off + b < nbytes) u |= (u64)p[off + b] << (8 * b);
  }
  return u;
}

// This thread's share of the weighted sums over rows r0, r0 + rstep, ...
__device__ void thread_sums(const unsigned char* p, u64 nbytes, u64 r0, u64 rstep, u64* lo,
                            u64* hi) {
  const u64 nwords = (nbytes + 7) / 8;
  const u64 nrows = (nwords + NDDEBUG_BLOCK - 1) / NDDEBUG_BLOCK;
  const bool aligned = (((u64)p) & 7) == 0;
  u64 a = 0, b = 0;
  for (u64 r = r0; r < nrows; r += rstep) {
    const u64 base = r * NDDEBUG_BLOCK;
    u64 ra = 0, rb = 0;
#pragma unroll 4
    for (int k = threadIdx.x; k < NDDEBUG_BLOCK; k += blockDim.x) {
      const u64 j = base + k;
      if (j < nwords) {
        const u64 u = word_at(p, j, nbytes, aligned);
        ra += u * g_weights[0][k];
        rb += sar(u, 32) * g_weights[1][k];
      }
    }
    a += ra * row_weight(r, 0);
    b += rb * row_weight(r, 1);
  }
  *lo = a;
  *hi = b;
}

// The block's sums, in thread 0 (every thread must call it).
__device__ void block_sum(u64* a, u64* b) {
  __shared__ u64 sa[32], sb[32];
  for (int o = 16; o > 0; o >>= 1) {
    *a += __shfl_down_sync(0xffffffffu, *a, o);
    *b += __shfl_down_sync(0xffffffffu, *b, o);
  }
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  if (lane == 0) {
    sa[warp] = *a;
    sb[warp] = *b;
  }
  __syncthreads();
  if (warp == 0) {
    const int warps = (blockDim.x + 31) >> 5;
    *a = lane < warps ? sa[lane] : 0;
    *b = lane < warps ? sb[lane] : 0;
    for (int o = 16; o > 0; o >>= 1) {
      *a += __shfl_down_sync(0xffffffffu, *a, o);
      *b += __shfl_down_sync(0xffffffffu, *b, o);
    }
  }
  __syncthreads();
}

// Partial sums of a large tensor: block i sums rows i, i + gridDim.x, ... into parts[2i..].
extern "C" __global__ void nddebug_digest_parts(const unsigned char* p, u64 nbytes, u64* parts) {
  u64 a, b;
  thread_sums(p, nbytes, blockIdx.x, gridDim.x, &a, &b);
  block_sum(&a, &b);
  if (threadIdx.x == 0) {
    parts[2 * blockIdx.x] = a;
    parts[2 * blockIdx.x + 1] = b;
  }
}

// One output to finish: its data (nparts == 0: summed here), or its partial sums (nparts > 0),
// or a digest the host already computed (nparts == ~0: lo, hi in data, nbytes).
struct XDesc {
  u64 data;
  u64 nbytes;
  u64 parts;
  u64 nparts;
  u64 out;   // the op's [1, 2] int64 output on the device
  u64 slot;  // its pair's index in the row
};

// Input digests to copy into the row: npairs pairs from ptr (device) to pairs at..at+npairs.
struct InDesc {
  u64 ptr;
  u64 npairs;
  u64 at;
};

struct FinishArgs {
  u64 row;  // the row's digest pairs, in mapped pinned host memory
  unsigned int n_x, n_in;
  XDesc x[NDDEBUG_MAX_X];
  InDesc in[NDDEBUG_MAX_IN];
};

extern "C" __global__ void nddebug_finish(FinishArgs args) {
  u64* row = (u64*)args.row;
  for (unsigned int i = 0; i < args.n_x; ++i) {
    const XDesc d = args.x[i];
    u64 a = 0, b = 0;
    if (d.nparts == ~0ULL) {
      a = d.data;
      b = d.nbytes;
    } else {
      if (d.nparts == 0) {
        thread_sums((const unsigned char*)d.data, d.nbytes, 0, 1, &a, &b);
      } else {
        const u64* parts = (const u64*)d.parts;
        for (u64 k = threadIdx.x; k < d.nparts; k += blockDim.x) {
          a += parts[2 * k];
          b += parts[2 * k + 1];
        }
      }
      block_sum(&a, &b);
      a += d.nbytes * 0x9E3779B97F4A7C15ULL;
    }
    if (threadIdx.x == 0) {
      if (d.out) {
        u64* out = (u64*)d.out;
        out[0] = a;
        out[1] = b;
      }
      if (row) {
        row[2 * d.slot] = a;
        row[2 * d.slot + 1] = b;
      }
    }
  }
  if (!row) return;  // a digest op: no row
  for (unsigned int i = 0; i < args.n_in; ++i) {
    const InDesc d = args.in[i];
    const u64* src = (const u64*)d.ptr;
    for (u64 k = threadIdx.x; k < 2 * d.npairs; k += blockDim.x) row[2 * d.at + k] = src[k];
  }
}
