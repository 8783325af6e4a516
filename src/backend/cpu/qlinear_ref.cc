#include "backend/cpu/qlinear_ref.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstring>

#include "backend/cpu/trellis.h"
#include "backend/cpu/trellis_layout.h"
#include "core/error.h"
#include "core/half.h"

// The reference dequantization must round exactly as GGUF's does (multiply, then add): no FMA.
#if defined(__clang__)
#pragma clang fp contract(off)
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

namespace gyre {

namespace {

// Byte offset and bit shift of packed column c of row r (see the layout in the header).
void locate(const QWeightDesc& d, int64_t r, int64_t c, int64_t& byte, int& shift) {
  const int64_t row_bytes = int64_t{d.cols} * d.bits / 8;
  if (d.bits == 8) {
    byte = r * row_bytes + c;
    shift = 0;
    return;
  }
  const int64_t chunk = c / 32, in_chunk = c % 32;
  const int64_t word = in_chunk / 8, e = in_chunk % 8;
  const int bit = static_cast<int>((e % 2) * 16 + 4 * (e / 2));
  byte = r * row_bytes + chunk * 16 + word * 4 + bit / 8;
  shift = bit % 8;
}

// Narrow widths (2/3/5/6 bits, the split-plane layout in the header): where plane `plane` (0 =
// low, 1 = high) of packed column c of row r lives, and that plane's bits per value. A field
// never straddles a byte (its bit offset is a multiple of its 1, 2 or 4 bits).
struct Field {
  int64_t byte;
  int shift, bits;
};

int low_plane_bits(int bits) {
  return bits >= 5 ? 4 : 2;
}

Field narrow_field(const QWeightDesc& d, int64_t r, int64_t c, int plane) {
  const int lo = low_plane_bits(d.bits);
  const int pbits = plane == 0 ? lo : d.bits - lo;
  const int64_t units = d.cols / 32, unit = c / 32, in_unit = c % 32;
  const int per_word = 32 / pbits;
  const int64_t j = (plane == 0 ? 0 : lo) + in_unit / per_word;  // word within the unit
  const int e = static_cast<int>(in_unit % per_word);
  const int64_t tile = unit / 32, u = unit % 32, m = std::min<int64_t>(32, units - 32 * tile);
  const int64_t word = r * units * d.bits + 32 * d.bits * tile + j * m + u;
  const int bit = (e % 2) * 16 + pbits * (e / 2);
  return {word * 4 + bit / 8, bit % 8, pbits};
}

void put_field(std::vector<uint8_t>& q, const Field& f, int v) {
  const int mask = ((1 << f.bits) - 1) << f.shift;
  q[f.byte] = static_cast<uint8_t>((q[f.byte] & ~mask) | ((v << f.shift) & mask));
}

int get_field(const std::vector<uint8_t>& q, const Field& f) {
  return (q[f.byte] >> f.shift) & ((1 << f.bits) - 1);
}

void put_q(QWeightHost& w, int64_t r, int64_t c, int q) {
  const QWeightDesc& d = w.desc;
  if (d.narrow()) {
    const int lo = low_plane_bits(d.bits);
    put_field(w.qweight, narrow_field(d, r, c, 0), q & ((1 << lo) - 1));
    if (d.bits > lo) put_field(w.qweight, narrow_field(d, r, c, 1), q >> lo);
    return;
  }
  int64_t byte;
  int shift;
  locate(d, r, c, byte, shift);
  put_field(w.qweight, {byte, shift, d.bits}, q);
}

void put_scalar(std::vector<uint8_t>& v, bool f32, int64_t i, float x) {
  if (f32) {
    std::memcpy(&v[i * 4], &x, 4);
  } else {
    const uint16_t h = f32_to_f16(x);
    std::memcpy(&v[i * 2], &h, 2);
  }
}

float get_scalar(const std::vector<uint8_t>& v, bool f32, int64_t i) {
  if (f32) {
    float x;
    std::memcpy(&x, &v[i * 4], 4);
    return x;
  }
  uint16_t h;
  std::memcpy(&h, &v[i * 2], 2);
  return f16_to_f32(h);
}

float round_f16(float x) {
  return f16_to_f32(f32_to_f16(x));
}

QWeightHost allocate(const QWeightDesc& d) {
  qweight_validate(d);
  QWeightHost w;
  w.desc = d;
  w.qweight.assign(static_cast<size_t>(d.qweight_bytes()), 0);
  w.scales.assign(static_cast<size_t>(d.scale_count() * d.scale_bytes()), 0);
  if (d.asymmetric) w.mins.assign(w.scales.size(), 0);
  return w;
}

float load_f16(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return f16_to_f32(h);
}

// Sub-block j's 6-bit scale and min of a Q4_K/Q5_K super-block (the GGUF packing of 12 bytes).
void k_scale_min(const uint8_t* s, int j, int& sc, int& mn) {
  if (j < 4) {
    sc = s[j] & 63;
    mn = s[j + 4] & 63;
  } else {
    sc = (s[j + 4] & 0x0f) | ((s[j - 4] >> 6) << 4);
    mn = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
  }
}

void repack_block(DType t, const uint8_t* b, QWeightHost& w, int64_t r, int64_t col0,
                  int64_t group0) {
  auto copy_f16 = [&](std::vector<uint8_t>& v, int64_t i, const uint8_t* src) {
    std::memcpy(&v[i * 2], src, 2);  // the same half bits: exact by construction
  };
  switch (t) {
    case DType::Q4_0:
    case DType::Q4_1: {
      const uint8_t* qs = b + (t == DType::Q4_0 ? 2 : 4);
      copy_f16(w.scales, group0, b);
      if (t == DType::Q4_1) copy_f16(w.mins, group0, b + 2);
      for (int i = 0; i < 16; ++i) {
        put_q(w, r, col0 + i, qs[i] & 0x0f);
        put_q(w, r, col0 + i + 16, qs[i] >> 4);
      }
      return;
    }
    case DType::Q8_0:
      copy_f16(w.scales, group0, b);
      for (int i = 0; i < 32; ++i) put_q(w, r, col0 + i, (static_cast<int8_t>(b[2 + i]) + 128));
      return;
    case DType::Q4_K:
    case DType::Q5_K: {
      const float d = load_f16(b), dmin = load_f16(b + 2);
      const uint8_t* qh = t == DType::Q5_K ? b + 16 : nullptr;
      const uint8_t* qs = b + (t == DType::Q5_K ? 48 : 16);
      for (int sub = 0; sub < 8; ++sub) {
        int sc, mn;
        k_scale_min(b + 4, sub, sc, mn);
        // d*sc and dmin*mn are exact in f32 (11 + 6 significant bits).
        put_scalar(w.scales, true, group0 + sub, d * static_cast<float>(sc));
        put_scalar(w.mins, true, group0 + sub, -(dmin * static_cast<float>(mn)));
        const uint8_t* q = qs + 32 * (sub / 2);
        for (int l = 0; l < 32; ++l) {
          int v = (q[l] >> (4 * (sub % 2))) & 0x0f;
          if (qh != nullptr) v |= ((qh[l] >> sub) & 1) << 4;
          put_q(w, r, col0 + 32 * sub + l, v);
        }
      }
      return;
    }
    case DType::Q6_K: {
      const uint8_t* ql = b;
      const uint8_t* qh = b + 128;
      const auto* sc = b + 192;
      const float d = load_f16(b + 208);
      for (int half = 0; half < 2; ++half) {
        for (int g = 0; g < 8; ++g) {
          const float s = d * static_cast<float>(static_cast<int8_t>(sc[8 * half + g]));
          put_scalar(w.scales, true, group0 + 8 * half + g, s);
        }
        for (int k = 0; k < 4; ++k) {
          for (int l = 0; l < 32; ++l) {
            const int lo = (ql[64 * half + l + 32 * (k % 2)] >> (4 * (k / 2))) & 0x0f;
            const int hi = (qh[32 * half + l] >> (2 * k)) & 3;
            // q6 - 32 + 128: the 8-bit symmetric offset reproduces (q6 - 32) exactly.
            put_q(w, r, col0 + 128 * half + 32 * k + l, (lo | (hi << 4)) + 96);
          }
        }
      }
      return;
    }
    default:
      fail("qweight_pack_from_gguf: unsupported type ", dtype_name(t));
  }
}

}  // namespace

void qweight_validate(const QWeightDesc& d) {
  if (d.trellis) {
    trellis_validate(d);
    return;
  }
  GYRE_CHECK(d.bits == 2 || d.bits == 3 || d.bits == 4 || d.bits == 5 || d.bits == 6 || d.bits == 8,
             "quantized weight: bits must be 2, 3, 4, 5, 6 or 8, got ", d.bits);
  const int g = d.group_size;
  GYRE_CHECK(g == 16 || g == 32 || g == 64 || g == 128 || g == 256,
             "quantized weight: group size must be 16, 32, 64, 128 or 256, got ", g);
  GYRE_CHECK(g >= d.chunk_cols(), "quantized weight: ", d.bits, "-bit groups must be at least ",
             d.chunk_cols(), " wide, got ", g);
  GYRE_CHECK(d.rows > 0 && d.cols > 0, "quantized weight: empty shape [", d.rows, ", ", d.cols,
             "]");
  GYRE_CHECK(d.cols % g == 0, "quantized weight: ", d.cols,
             " columns are not a multiple of the group size ", g);
}

int QWeightHost::q(int64_t r, int64_t packed_col) const {
  GYRE_CHECK(!desc.trellis, "quantized weight: a trellis-coded weight has no stored integers");
  if (desc.narrow()) {
    const int lo = low_plane_bits(desc.bits);
    int v = get_field(qweight, narrow_field(desc, r, packed_col, 0));
    if (desc.bits > lo) v |= get_field(qweight, narrow_field(desc, r, packed_col, 1)) << lo;
    return v;
  }
  int64_t byte;
  int shift;
  locate(desc, r, packed_col, byte, shift);
  return get_field(qweight, {byte, shift, desc.bits});
}

float QWeightHost::scale(int64_t r, int64_t group) const {
  return get_scalar(scales, desc.scale_f32, r * desc.groups_per_row() + group);
}

float QWeightHost::min(int64_t r, int64_t group) const {
  return get_scalar(mins, desc.scale_f32, r * desc.groups_per_row() + group);
}

QWeightHost qweight_pack_from_f32(const float* w, int rows, int cols, int bits, int group_size,
                                  bool asymmetric, const int32_t* perm) {
  QWeightDesc d;
  d.bits = bits;
  d.group_size = group_size;
  d.asymmetric = asymmetric;
  d.has_perm = perm != nullptr;
  d.rows = rows;
  d.cols = cols;
  QWeightHost out = allocate(d);
  if (perm != nullptr) {
    std::vector<bool> seen(static_cast<size_t>(cols), false);
    for (int j = 0; j < cols; ++j) {
      GYRE_CHECK(perm[j] >= 0 && perm[j] < cols && !seen[perm[j]],
                 "quantized weight: the column permutation is not a permutation of 0..", cols - 1);
      seen[perm[j]] = true;
    }
    out.perm.assign(perm, perm + cols);
  }
  const int qmax = (1 << bits) - 1, offset = 1 << (bits - 1);
  std::vector<float> g(static_cast<size_t>(group_size));
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t grp = 0; grp < d.groups_per_row(); ++grp) {
      float lo = INFINITY, hi = -INFINITY, amax = 0.0f;
      for (int i = 0; i < group_size; ++i) {
        const int64_t c = grp * group_size + i;
        g[i] = w[r * cols + (perm ? perm[c] : c)];
        GYRE_CHECK(std::isfinite(g[i]), "quantized weight: non-finite value at [", r, ", ", c, "]");
        lo = std::min(lo, g[i]);
        hi = std::max(hi, g[i]);
        amax = std::max(amax, std::fabs(g[i]));
      }
      const int64_t si = r * d.groups_per_row() + grp;
      const float s = round_f16(asymmetric ? (hi - lo) / static_cast<float>(qmax)
                                           : amax / static_cast<float>(offset - 1));
      const float m = asymmetric ? round_f16(lo) : 0.0f;
      GYRE_CHECK(std::isfinite(s), "quantized weight: group scale overflows f16 in row ", r);
      put_scalar(out.scales, false, si, s);
      if (asymmetric) put_scalar(out.mins, false, si, m);
      for (int i = 0; i < group_size; ++i) {
        long q;
        if (s == 0.0f) {
          q = asymmetric ? 0 : offset;
        } else {
          q = asymmetric ? std::lround((g[i] - m) / s) : std::lround(g[i] / s) + offset;
        }
        put_q(out, r, grp * group_size + i, static_cast<int>(std::clamp(q, 0L, long{qmax})));
      }
    }
  }
  return out;
}

bool qweight_gguf_supported(DType t) {
  return t == DType::Q4_0 || t == DType::Q4_1 || t == DType::Q8_0 || t == DType::Q4_K ||
         t == DType::Q5_K || t == DType::Q6_K;
}

QWeightHost qweight_pack_from_gguf(DType t, const void* blocks, int rows, int cols) {
  GYRE_CHECK(qweight_gguf_supported(t), "qweight_pack_from_gguf: cannot repack ", dtype_name(t));
  QWeightDesc d;
  d.rows = rows;
  d.cols = cols;
  d.bits = (t == DType::Q4_0 || t == DType::Q4_1 || t == DType::Q4_K) ? 4 : 8;
  d.group_size = t == DType::Q6_K ? 16 : 32;
  d.asymmetric = t == DType::Q4_1 || t == DType::Q4_K || t == DType::Q5_K;
  d.scale_f32 = t == DType::Q4_K || t == DType::Q5_K || t == DType::Q6_K;
  QWeightHost out = allocate(d);
  const DTypeInfo& info = dtype_info(t);
  const size_t row_bytes = dtype_row_bytes(t, cols);  // throws on a partial block
  const auto* src = static_cast<const uint8_t*>(blocks);
  const int64_t groups_per_block = info.block_elems / d.group_size;
  for (int64_t r = 0; r < rows; ++r) {
    const uint8_t* row = src + r * row_bytes;
    for (int64_t b = 0; b < cols / info.block_elems; ++b) {
      repack_block(t, row + b * info.block_bytes, out, r, b * info.block_elems,
                   r * d.groups_per_row() + b * groups_per_block);
    }
  }
  return out;
}

QWeightHost qweight_concat_rows(const std::vector<const QWeightHost*>& parts) {
  GYRE_CHECK(!parts.empty(), "qweight_concat_rows: no weights");
  QWeightHost out;
  out.desc = parts[0]->desc;
  out.desc.rows = 0;
  out.perm = parts[0]->perm;
  out.had = parts[0]->had;
  for (const QWeightHost* w : parts) {
    const QWeightDesc& d = w->desc;
    const QWeightDesc& o = out.desc;
    GYRE_CHECK(qweight_same_layout(*w, *parts[0]),
               "qweight_concat_rows: weights differ in layout or column count");
    GYRE_CHECK(int64_t{o.rows} + d.rows <= INT32_MAX, "qweight_concat_rows: too many rows");
    // Every array is row-major, so row concatenation is byte concatenation; trellis words are
    // tile-row major and every part has whole 16-row tile rows, so the same holds for them.
    out.qweight.insert(out.qweight.end(), w->qweight.begin(), w->qweight.end());
    out.scales.insert(out.scales.end(), w->scales.begin(), w->scales.end());
    out.mins.insert(out.mins.end(), w->mins.begin(), w->mins.end());
    out.desc.rows += d.rows;
  }
  return out;
}

QWeightHost qweight_permute_rows(const QWeightHost& w, const std::vector<int32_t>& order) {
  const QWeightDesc& d = w.desc;
  GYRE_CHECK(!d.trellis, "qweight_permute_rows: trellis rows are coded in tiles of 16");
  GYRE_CHECK(static_cast<int64_t>(order.size()) == d.rows, "qweight_permute_rows: the order has ",
             order.size(), " entries for ", d.rows, " rows");
  std::vector<bool> seen(order.size(), false);
  for (int32_t r : order) {
    GYRE_CHECK(r >= 0 && r < d.rows && !seen[static_cast<size_t>(r)],
               "qweight_permute_rows: the order is not a permutation of the rows");
    seen[static_cast<size_t>(r)] = true;
  }
  QWeightHost out = w;
  // Every array is row-major with a fixed number of bytes per row.
  auto permute = [&](const std::vector<uint8_t>& src, std::vector<uint8_t>& dst) {
    const size_t row = src.size() / static_cast<size_t>(d.rows);
    for (size_t j = 0; j < order.size(); ++j)
      std::copy_n(src.begin() + static_cast<ptrdiff_t>(static_cast<size_t>(order[j]) * row), row,
                  dst.begin() + static_cast<ptrdiff_t>(j * row));
  };
  permute(w.qweight, out.qweight);
  permute(w.scales, out.scales);
  if (!w.mins.empty()) permute(w.mins, out.mins);
  return out;
}

bool qweight_same_layout(const QWeightHost& a, const QWeightHost& b) {
  const QWeightDesc &x = a.desc, &y = b.desc;
  return x.bits == y.bits && x.group_size == y.group_size && x.asymmetric == y.asymmetric &&
         x.scale_f32 == y.scale_f32 && x.has_perm == y.has_perm && x.trellis == y.trellis &&
         x.cols == y.cols && a.perm == b.perm && a.had == b.had;
}

QWeightHost qweight_interleave_rows(const QWeightHost& a, const QWeightHost& b, int block) {
  GYRE_CHECK(block > 0 && qweight_same_layout(a, b) && a.desc.rows == b.desc.rows,
             "qweight_interleave_rows: weights differ in layout or shape");
  // Trellis words come in 16-row tile rows: blocks of whole tile rows copy as bytes below (a
  // tile row's words are the bytes of its 16 rows at cols * bits / 8 bytes per row).
  GYRE_CHECK(!a.desc.trellis || block % kTrellisTileDim == 0,
             "qweight_interleave_rows: trellis weights interleave in blocks of a multiple of 16 "
             "rows, got ",
             block);
  const int64_t h = a.desc.rows;
  const int64_t padded = (h + block - 1) / block * block;
  GYRE_CHECK(2 * padded <= INT32_MAX, "qweight_interleave_rows: too many rows");
  QWeightDesc d = a.desc;
  d.rows = static_cast<int>(2 * padded);
  QWeightHost out = allocate(d);  // zero rows are the padding
  out.perm = a.perm;
  out.had = a.had;
  const size_t q_row = static_cast<size_t>(d.cols) * d.bits / 8;
  const size_t s_row = static_cast<size_t>(d.groups_per_row()) * d.scale_bytes();
  auto copy_rows = [&](const QWeightHost& src, int64_t r, int64_t dst, int64_t n) {
    std::memcpy(&out.qweight[dst * q_row], &src.qweight[r * q_row], n * q_row);
    std::memcpy(&out.scales[dst * s_row], &src.scales[r * s_row], n * s_row);
    if (d.asymmetric) std::memcpy(&out.mins[dst * s_row], &src.mins[r * s_row], n * s_row);
  };
  for (int64_t r0 = 0; r0 < h; r0 += block) {
    const int64_t n = std::min<int64_t>(block, h - r0);
    copy_rows(a, r0, 2 * r0, n);
    copy_rows(b, r0, 2 * r0 + block, n);
  }
  return out;
}

TensorView qweight_view(const std::string& name, const QWeightHost& w) {
  TensorView v;
  v.name = name;
  v.dtype = DType::QPACKED;
  v.shape = {w.desc.rows, w.desc.cols};
  v.data = &w;
  v.nbytes = sizeof(QWeightHost);
  return v;
}

const QWeightHost& qweight_of_view(const TensorView& v) {
  GYRE_CHECK(v.dtype == DType::QPACKED && v.data != nullptr && v.nbytes == sizeof(QWeightHost),
             "tensor ", v.name, " is not a packed quantized weight");
  const auto& w = *static_cast<const QWeightHost*>(v.data);
  GYRE_CHECK(v.shape.size() == 2 && v.shape[0] == w.desc.rows && v.shape[1] == w.desc.cols,
             "tensor ", v.name, " has shape ", shape_str(v.shape), " but its packed weight is [",
             w.desc.rows, ", ", w.desc.cols, "]");
  return w;
}

QWeightHost qweight_allocate(const QWeightDesc& d) {
  return allocate(d);
}

void qweight_set_q(QWeightHost& w, int64_t r, int64_t packed_col, int q) {
  put_q(w, r, packed_col, q);
}

void qweight_set_scale(QWeightHost& w, int64_t r, int64_t group, float scale, float min) {
  const int64_t i = r * w.desc.groups_per_row() + group;
  put_scalar(w.scales, w.desc.scale_f32, i, scale);
  if (w.desc.asymmetric) put_scalar(w.mins, w.desc.scale_f32, i, min);
}

namespace {

// Every stored integer of row r of a narrow-width weight, decoded a unit (32 columns, `bits`
// words) at a time: the fast path of the dequantizer (one word read per plane word, not per value).
void narrow_row_q(const QWeightHost& w, int64_t r, std::vector<int>& q) {
  const QWeightDesc& d = w.desc;
  const int lo = low_plane_bits(d.bits), hi = d.bits - lo;
  const int64_t units = d.cols / 32;
  const uint8_t* row = w.qweight.data() + r * units * d.bits * 4;
  q.resize(static_cast<size_t>(d.cols));
  uint32_t words[8];
  for (int64_t unit = 0; unit < units; ++unit) {
    const int64_t tile = unit / 32, m = std::min<int64_t>(32, units - 32 * tile);
    for (int j = 0; j < d.bits; ++j)
      std::memcpy(&words[j], row + (32 * d.bits * tile + j * m + unit % 32) * 4, 4);
    auto field = [&](int first, int p, int e) {
      const int per_word = 32 / p, k = e % per_word;
      return static_cast<int>((words[first + e / per_word] >> ((k % 2) * 16 + p * (k / 2))) &
                              ((1u << p) - 1));
    };
    for (int e = 0; e < 32; ++e) {
      int v = field(0, lo, e);
      if (hi > 0) v |= field(lo, hi, e) << lo;
      q[static_cast<size_t>(unit * 32 + e)] = v;
    }
  }
}

}  // namespace

void qweight_dequantize_row(const QWeightHost& w, int64_t r, float* out) {
  const QWeightDesc& d = w.desc;
  if (d.trellis) {
    trellis_dequantize_row(w, r, out);
    if (w.had.active()) hadamard_unrotate_rows(out, 1, d.cols, w.had);
    return;
  }
  const int offset = 1 << (d.bits - 1);
  thread_local std::vector<int> narrow_q;
  if (d.narrow()) narrow_row_q(w, r, narrow_q);
  for (int64_t grp = 0; grp < d.groups_per_row(); ++grp) {
    const float s = w.scale(r, grp);
    const float m = d.asymmetric ? w.min(r, grp) : 0.0f;
    for (int64_t i = 0; i < d.group_size; ++i) {
      const int64_t c = grp * d.group_size + i;
      const int q = d.narrow() ? narrow_q[static_cast<size_t>(c)] : w.q(r, c);
      // Symmetric: one product, no "+ 0" (it would turn -0 into +0 and break bit-exactness).
      const float v =
          d.asymmetric ? s * static_cast<float>(q) + m : s * static_cast<float>(q - offset);
      out[d.has_perm ? w.perm[c] : c] = v;
    }
  }
  if (w.had.active()) hadamard_unrotate_rows(out, 1, d.cols, w.had);
}

}  // namespace gyre
