// Ragged paged attention for XLA:CPU, as an XLA FFI custom call (`ffi_cpu.py` builds and
// registers it; `base.py` documents the arguments).
//
// XLA:CPU materialises every gather: the XLA implementation copies each page it reads into a
// temporary that its matmuls then read again. This kernel reads the keys and values where they
// lie in the cache: work items are (tile of up to kTileRows query rows of one sequence, kv head),
// each an online softmax over the pages its rows can see, handed out to XLA's intra-op thread
// pool. Decodes are tiles of one row; a prefill chunk's tiles read each page once per tile.

#include <algorithm>
#include <atomic>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <mutex>
#include <vector>

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

inline float ToFloat(float x) { return x; }
inline float ToFloat(uint16_t bf16) {
  uint32_t bits = static_cast<uint32_t>(bf16) << 16;
  float out;
  std::memcpy(&out, &bits, sizeof(out));
  return out;
}
inline void FromFloat(float x, float* out) { *out = x; }
inline void FromFloat(float x, uint16_t* out) {  // round to nearest even, as XLA converts
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof(bits));
  if (std::isnan(x)) {
    *out = 0x7fc0;
    return;
  }
  bits += 0x7fff + ((bits >> 16) & 1);
  *out = static_cast<uint16_t>(bits >> 16);
}

// exp(x) for x <= 0, as Cephes' expf computes it (x = n ln2 + r, |r| <= ln2 / 2, a degree-5
// polynomial for e^r, 2^n from the exponent bits; within 2 ulp): inline and branch-free, so
// that the loops over a page's positions vectorise (libm's expf is a call per element).
inline float ExpNonPositive(float x) {
  x = std::max(x, -87.0f);  // e^-87 ~ 1.6e-38, the smallest normal float's order; -inf -> that
  const float n = std::floor(x * 1.44269504088896341f + 0.5f);
  const float r = x - n * 0.693359375f + n * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  return p * scale;
}

struct Shape {
  int64_t tokens, heads, kv_heads, head_dim, num_pages, page_size, seqs, table_width;
  bool head_major;
};

struct Options {
  float scale, cap;  // cap <= 0: no soft cap
  int64_t window;    // <= 0: no sliding window
};

constexpr int64_t kLanes = 16;  // floats of V a PV pass keeps in registers (one AVX-512 vector)
constexpr int64_t kTileRows = 8;  // query rows of one sequence that share each page read

// A tile of `rows` consecutive query rows of one sequence (positions pos0, pos0 + 1, ...)
// against one kv head, each row with the `group` query heads that share it. The tile's rows
// read each page while it is in the core's cache: a prefill chunk's keys and values are read
// from memory once per tile, not once per row. D is the head dimension when known at compile
// time (0: sh.head_dim), so that the loops over it unroll.
template <typename T, int64_t D>
void AttendTile(const Shape& sh, const Options& opt, const T* q, const T* k, const T* v,
                const int32_t* pages, int64_t pos0, int64_t rows, int64_t head, T* out,
                float* scratch) {
  const int64_t d = D > 0 ? D : sh.head_dim, ps = sh.page_size, group = sh.heads / sh.kv_heads;
  const int64_t heads = rows * group;  // (row, query head) pairs, each with its own softmax
  float* __restrict qf = scratch;          // [heads, d]
  float* __restrict acc = qf + heads * d;  // [heads, d]
  float* __restrict w = acc + heads * d;   // [ps] one page's softmax weights
  float* row_max = w + ps;                 // [heads]
  float* denom = row_max + heads;          // [heads]
  const int64_t q_row = sh.heads * d;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t g = 0; g < group; ++g) {
      const T* src = q + r * q_row + (head * group + g) * d;
      float* dst = qf + (r * group + g) * d;
      for (int64_t i = 0; i < d; ++i) dst[i] = ToFloat(src[i]) * opt.scale;
      row_max[r * group + g] = -std::numeric_limits<float>::infinity();
      denom[r * group + g] = 0.0f;
    }
  }
  std::fill(acc, acc + heads * d, 0.0f);
  const int64_t last = pos0 + rows - 1;
  const int64_t first = opt.window > 0 ? std::max<int64_t>(0, pos0 - opt.window + 1) : 0;
  // Strides of a position and of a page, in elements, for this kv head.
  const int64_t pos_stride = sh.head_major ? d : sh.kv_heads * d;
  const int64_t page_stride = ps * pos_stride;
  const int64_t head_offset = sh.head_major ? head * sh.num_pages * page_stride : head * d;
  for (int64_t p = first / ps; p <= last / ps; ++p) {
    const int64_t page = std::clamp<int64_t>(pages[p], 0, sh.num_pages - 1);
    const T* __restrict kp = k + head_offset + page * page_stride;
    const T* __restrict vp = v + head_offset + page * page_stride;
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t pos = pos0 + r;
      const int64_t row_first = opt.window > 0 ? std::max<int64_t>(0, pos - opt.window + 1) : 0;
      const int64_t lo = std::max(row_first, p * ps) - p * ps;
      const int64_t hi = std::min(pos, p * ps + ps - 1) - p * ps;
      for (int64_t g = 0; g < group && lo <= hi; ++g) {
        const int64_t h = r * group + g;
        const float* __restrict qh = qf + h * d;
        float page_max = -std::numeric_limits<float>::infinity();
        int64_t j = lo;
        for (; j + 3 <= hi; j += 4) {  // four positions at once: four independent sums
          const T* __restrict k0 = kp + j * pos_stride;
          const T* __restrict k1 = k0 + pos_stride;
          const T* __restrict k2 = k1 + pos_stride;
          const T* __restrict k3 = k2 + pos_stride;
          float d0 = 0.0f, d1 = 0.0f, d2 = 0.0f, d3 = 0.0f;
#pragma omp simd reduction(+ : d0, d1, d2, d3)
          for (int64_t i = 0; i < d; ++i) {
            d0 += qh[i] * ToFloat(k0[i]);
            d1 += qh[i] * ToFloat(k1[i]);
            d2 += qh[i] * ToFloat(k2[i]);
            d3 += qh[i] * ToFloat(k3[i]);
          }
          w[j] = d0, w[j + 1] = d1, w[j + 2] = d2, w[j + 3] = d3;
        }
        for (; j <= hi; ++j) {
          const T* __restrict kj = kp + j * pos_stride;
          float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
          for (int64_t i = 0; i < d; ++i) dot += qh[i] * ToFloat(kj[i]);
          w[j] = dot;
        }
        for (j = lo; j <= hi; ++j) {
          if (opt.cap > 0.0f) w[j] = opt.cap * std::tanh(w[j] / opt.cap);
          page_max = std::max(page_max, w[j]);
        }
        const float new_max = std::max(row_max[h], page_max);
        const float rescale = ExpNonPositive(row_max[h] - new_max);
        float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
        for (int64_t j = lo; j <= hi; ++j) {
          w[j] = ExpNonPositive(w[j] - new_max);
          sum += w[j];
        }
        denom[h] = denom[h] * rescale + sum;
        row_max[h] = new_max;
        // acc = acc * rescale + w . V, kLanes columns at a time: their sums stay in registers
        // across the page's positions.
        float* __restrict ah = acc + h * d;
        if constexpr (D > 0 && D % kLanes == 0) {
          for (int64_t i0 = 0; i0 < D; i0 += kLanes) {
            float a[kLanes];
            for (int64_t i = 0; i < kLanes; ++i) a[i] = ah[i0 + i] * rescale;
            for (int64_t j = lo; j <= hi; ++j) {
              const float wj = w[j];
              const T* __restrict vj = vp + j * pos_stride + i0;
#pragma omp simd
              for (int64_t i = 0; i < kLanes; ++i) a[i] += wj * ToFloat(vj[i]);
            }
            for (int64_t i = 0; i < kLanes; ++i) ah[i0 + i] = a[i];
          }
        } else {
          for (int64_t i = 0; i < d; ++i) ah[i] *= rescale;
          for (int64_t j = lo; j <= hi; ++j) {
            const float wj = w[j];
            const T* __restrict vj = vp + j * pos_stride;
#pragma omp simd
            for (int64_t i = 0; i < d; ++i) ah[i] += wj * ToFloat(vj[i]);
          }
        }
      }
    }
  }
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t g = 0; g < group; ++g) {
      const int64_t h = r * group + g;
      const float inv = denom[h] > 0.0f ? 1.0f / denom[h] : 0.0f;
      T* dst = out + r * q_row + (head * group + g) * d;
      for (int64_t i = 0; i < d; ++i) FromFloat(acc[h * d + i] * inv, dst + i);
    }
  }
}

template <typename T>
void Attend(const Shape& sh, const Options& opt, const T* q, const T* k, const T* v,
            const int32_t* pages, int64_t pos0, int64_t rows, int64_t head, T* out,
            float* scratch) {
  switch (sh.head_dim) {
    case 64: return AttendTile<T, 64>(sh, opt, q, k, v, pages, pos0, rows, head, out, scratch);
    case 128: return AttendTile<T, 128>(sh, opt, q, k, v, pages, pos0, rows, head, out, scratch);
    default: return AttendTile<T, 0>(sh, opt, q, k, v, pages, pos0, rows, head, out, scratch);
  }
}

// Work shared by the calling thread and the tasks it schedules: items are (tile, kv head)
// pairs handed out by an atomic counter, so a task that starts late finds nothing left and a
// thread that is busy elsewhere never holds the call up.
struct Work {
  std::atomic<int64_t> next{0};
  std::atomic<int64_t> done{0};
  int64_t total = 0;
  std::mutex mu;
  std::condition_variable cv;
};

template <ffi::DataType DT>
ffi::Error Run(ffi::ThreadPool pool, ffi::Buffer<DT> q, ffi::Buffer<DT> k_pages,
               ffi::Buffer<DT> v_pages, ffi::Buffer<ffi::S32> kv_lens,
               ffi::Buffer<ffi::S32> block_tables, ffi::Buffer<ffi::S32> query_start_loc,
               ffi::Buffer<ffi::S32> num_seqs, ffi::ResultBuffer<DT> out, float scale, float cap,
               int64_t window, bool head_major) {
  using T = ffi::NativeType<DT>;
  using Elem = std::conditional_t<std::is_same_v<T, float>, float, uint16_t>;
  auto qd = q.dimensions(), kd = k_pages.dimensions(), bd = block_tables.dimensions();
  Shape sh;
  sh.tokens = qd[0];
  sh.heads = qd[1];
  sh.head_dim = qd[2];
  sh.head_major = head_major;
  sh.kv_heads = head_major ? kd[0] : kd[2];
  sh.num_pages = head_major ? kd[1] : kd[0];
  sh.page_size = head_major ? kd[2] : kd[1];
  sh.seqs = bd[0];
  sh.table_width = bd[1];
  if (sh.heads % sh.kv_heads != 0) {
    return ffi::Error::InvalidArgument("query heads must be a multiple of kv heads");
  }
  const Options opt{scale, cap, window};
  const int32_t* lens = kv_lens.typed_data();
  const int32_t* tables = block_tables.typed_data();
  const int32_t* cu = query_start_loc.typed_data();
  const int64_t live = std::clamp<int64_t>(num_seqs.typed_data()[0], 0, sh.seqs);
  const auto* qp = reinterpret_cast<const Elem*>(q.typed_data());
  const auto* kp = reinterpret_cast<const Elem*>(k_pages.typed_data());
  const auto* vp = reinterpret_cast<const Elem*>(v_pages.typed_data());
  auto* op = reinterpret_cast<Elem*>(out->typed_data());
  const int64_t row = sh.heads * sh.head_dim;
  std::memset(op, 0, sizeof(Elem) * sh.tokens * row);  // padding rows stay 0

  // The live rows, in tiles of up to kTileRows rows of one sequence.
  struct Tile {
    int64_t seq, row, pos, rows;
  };
  std::vector<Tile> tiles;
  for (int64_t s = 0; s < live; ++s) {
    const int64_t begin = std::max<int64_t>(cu[s], 0), end = std::min<int64_t>(cu[s + 1], sh.tokens);
    const int64_t pos0 = lens[s] - (cu[s + 1] - cu[s]);
    for (int64_t t = begin; t < end; t += kTileRows) {
      const int64_t pos = pos0 + (t - cu[s]);
      const int64_t rows = std::min(kTileRows, end - t);
      // rows before position 0 (kv_lens shorter than the chunk) or past the block table
      // have no pages: they stay 0
      if (pos < 0 || (pos + rows - 1) / sh.page_size >= sh.table_width) continue;
      tiles.push_back({s, t, pos, rows});
    }
  }
  const int64_t group = sh.heads / sh.kv_heads;
  const int64_t tile_heads = kTileRows * group;
  const int64_t scratch_size = 2 * tile_heads * sh.head_dim + sh.page_size + 2 * tile_heads;
  auto work = std::make_shared<Work>();
  work->total = static_cast<int64_t>(tiles.size()) * sh.kv_heads;
  const Tile* tile_list = tiles.data();
  auto drain = [=](Work& w) {
    std::vector<float> scratch(scratch_size);
    int64_t finished = 0;
    for (int64_t item; (item = w.next.fetch_add(1)) < w.total; ++finished) {
      const Tile& tile = tile_list[item / sh.kv_heads];
      const int64_t head = item % sh.kv_heads;
      Attend<Elem>(sh, opt, qp + tile.row * row, kp, vp, tables + tile.seq * sh.table_width,
                   tile.pos, tile.rows, head, op + tile.row * row, scratch.data());
    }
    if (finished > 0 && w.done.fetch_add(finished) + finished == w.total) {
      std::lock_guard<std::mutex> lock(w.mu);
      w.cv.notify_all();
    }
  };
  const int64_t helpers = std::min<int64_t>(pool.num_threads(), work->total) - 1;
  for (int64_t i = 0; i < helpers; ++i) {
    pool.Schedule([work, drain] { drain(*work); });
  }
  drain(*work);
  std::unique_lock<std::mutex> lock(work->mu);
  work->cv.wait(lock, [&] { return work->done.load() == work->total; });
  return ffi::Error::Success();
}

}  // namespace

#define JAXSTACK_RPA_HANDLER(name, DT)                                                   \
  XLA_FFI_DEFINE_HANDLER_SYMBOL(name, Run<DT>,                                          \
                                ffi::Ffi::Bind()                                        \
                                    .Ctx<ffi::ThreadPool>()                             \
                                    .Arg<ffi::Buffer<DT>>()                             \
                                    .Arg<ffi::Buffer<DT>>()                             \
                                    .Arg<ffi::Buffer<DT>>()                             \
                                    .Arg<ffi::Buffer<ffi::S32>>()                       \
                                    .Arg<ffi::Buffer<ffi::S32>>()                       \
                                    .Arg<ffi::Buffer<ffi::S32>>()                       \
                                    .Arg<ffi::Buffer<ffi::S32>>()                       \
                                    .Ret<ffi::Buffer<DT>>()                             \
                                    .Attr<float>("scale")                               \
                                    .Attr<float>("cap")                                 \
                                    .Attr<int64_t>("window")                            \
                                    .Attr<bool>("head_major"));

JAXSTACK_RPA_HANDLER(RaggedPagedAttentionF32, ffi::F32)
JAXSTACK_RPA_HANDLER(RaggedPagedAttentionBF16, ffi::BF16)
