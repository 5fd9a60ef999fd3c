// Page-table and token-CSR index builders (semantics: each op's reference, kvdispatch/ops/<key>.py).
//
// Every scalar parameter is 64-bit, so a launcher can pass plain integers (CuPy passes a Python int
// as int64) and pointers as integers too.
// One source for NVRTC, hipRTC, nvcc, hipcc and the host build (tests/cuda_host_shim.h): no #include, builtin
// types only, no intrinsics (but the PDL instructions below), no warp operations or atomics, nothing that assumes
// a warp width; threads share data only in kv_block_sum, through shared memory between barriers.
// Grid (from kvdispatch.grid): blockIdx.x = request, blockIdx.y = program of the row (plus blockIdx.z *
// gridDim.y on a grid folded into its third dimension, KV_FOLDED_GRID). A row is cut into blocks of `items`
// consecutive pages/tokens; program k of a row's T programs (T = gridDim.y, times gridDim.z when folded)
// handles its blocks k, k + T, k + 2T, ... up to the row's real length, read on the device, so any grid is
// correct and a grid smaller than the buffers' width costs time only where rows are long. Within a block
// the program's blockDim.x threads stride over the items.

typedef long long kv_i64;
typedef unsigned long long kv_u64;

// 16-byte vector of four ints: one load/store instruction when the address is 16-byte aligned.
struct alignas(16) kv_vec4 {
    int v[4];
};

// Programmatic dependent launch (-DKV_PDL, a specialisation of its own: kernels_cupy/launch.py with_pdl; NVIDIA
// compute capability 9.0 and later only, never HIP or the host build, where both are empty): each kernel waits
// for the previous kernel on the stream (its writes visible) before its first load, and lets the next PDL
// kernel start launching after its last store. The only inline assembly in this file.
#if defined(KV_PDL) && defined(__CUDA_ARCH__) && !defined(__HIP_PLATFORM_AMD__)
#if __CUDA_ARCH__ >= 900
#define KV_GRID_WAIT() asm volatile("griddepcontrol.wait;" ::: "memory")
#define KV_GRID_RELEASE() asm volatile("griddepcontrol.launch_dependents;" ::: "memory")
#endif
#endif
#ifndef KV_GRID_WAIT
#define KV_GRID_WAIT() ((void)0)
#define KV_GRID_RELEASE() ((void)0)
#endif

// Bits of the kernels' `flags` argument.
#define KV_WIDE_POOL 1    // req_pool_indices is int64 (else int32)
#define KV_WIDE_LENS 2    // seq_lens is int64
#define KV_WIDE_START 4   // kv_start_idx is int64
#define KV_WIDE_INDPTR 8  // kv_indptr is int64
#define KV_FILL 16        // page table: write fill_value into columns [pages, width)
#define KV_START 32       // kv_start_idx is given (else every start is 0)
#define KV_LENS_OUT 64    // page table: seq_lens_out is given
#define KV_FOLDED_GRID 128  // a row's programs span gridDim.y * gridDim.z blocks (kvdispatch.grid)
#define KV_WIDE_OUT 256     // token CSR: out is int64 (else int32)
#define KV_MAPPING 512      // token CSR: token_mapping is given
#define KV_WIDE_MAPPING 1024  // token CSR: token_mapping is int64
#define KV_ROUND_TOWARD_ZERO 2048  // page table: divide negative slots rounding toward zero (else floor)
#define KV_POSITIONS 4096        // draft decode: positions is given (it drives kv_indptr)
#define KV_WIDE_POSITIONS 8192   // draft decode: positions is int64
#define KV_V2P 16384             // draft decode, token CSR: v2p is given (every value is translated)
#define KV_WIDE_V2P 32768        // draft decode, token CSR: v2p is int64
#define KV_INDPTR_START 65536    // draft decode: write kv_indptr[s, 0] = 0

// A launcher may compile one specialisation: -DKV_FLAGS=<flags> (and -DKV_PAGE_SIZE=<page size>,
// -DKV_ENTRY_PAGE_SIZE=<entry page size>) turn the runtime `flags` (and `page_size`, `entry_page_size`) into
// constants, so the dtype branches and the divisions fold away. The runtime arguments must then carry the
// same values.
#ifdef KV_FLAGS
#define KV_HAS(bit) (((KV_FLAGS) & (bit)) != 0)
#else
#define KV_HAS(bit) ((flags & (bit)) != 0)
#endif

__device__ inline kv_i64 kv_min(kv_i64 a, kv_i64 b) { return a < b ? a : b; }
__device__ inline kv_i64 kv_max(kv_i64 a, kv_i64 b) { return a > b ? a : b; }

// a + b without signed overflow: the exact sum, or the int64 bound it passes. A length that saturates is
// still decided as the exact one (no table comes near either bound).
__device__ inline kv_i64 kv_add_saturated(kv_i64 a, kv_i64 b) {
    const kv_i64 most = 0x7FFFFFFFFFFFFFFFLL, least = -most - 1;
    if (b > 0 && a > most - b) return most;
    if (b < 0 && a < least - b) return least;
    return a + b;
}

// The block's program index within its row. Without KV_FOLDED_GRID (a constant in a specialised build) it
// is blockIdx.y alone, so the usual launch runs no extra instruction.
__device__ inline kv_i64 kv_row_program(bool folded) {
    return folded ? (kv_i64)blockIdx.y + (kv_i64)blockIdx.z * gridDim.y : (kv_i64)blockIdx.y;
}

// The programs of a row (T), the step between the blocks one program handles.
__device__ inline kv_i64 kv_row_programs(bool folded) {
    return folded ? (kv_i64)gridDim.y * (kv_i64)gridDim.z : (kv_i64)gridDim.y;
}

__device__ inline kv_i64 kv_load_index(const void* base, kv_i64 i, int wide) {
    return wide ? ((const kv_i64*)base)[i] : (kv_i64)((const int*)base)[i];
}

// The most threads a program has (kvdispatch.grid.threads_per_program), and the partial sums the second level
// of kv_block_sum takes (every program has at least as many threads).
constexpr int kv_max_threads = 256;
constexpr int kv_block_sum_lanes = 16;

__device__ inline kv_u64 kv_add_below(kv_u64 a, kv_u64 b, kv_u64 limit) {
    const kv_u64 sum = a + b;
    return sum < limit ? sum : limit;
}

// The sum of every thread's `partial` over the block, returned to every thread: min(a + b, limit) for each
// pair taken, so the exact sum saturated at `limit` when every partial lies in [0, limit] and 2 * limit < 2**64,
// and with limit = 2**64 - 1 the sum modulo 2**64. Every thread of the block must call it (it meets the
// others at barriers). One sum a block where each thread would otherwise take all of it: the cost of a sum
// over a batch's earlier rows stops growing with the threads and programs that need it.
__device__ inline kv_u64 kv_block_sum(kv_u64 partial, kv_u64 limit) {
    __shared__ kv_u64 partials[kv_max_threads];
    __shared__ kv_u64 lanes[kv_block_sum_lanes];
    const unsigned int thread = threadIdx.x, threads = blockDim.x;
    partials[thread] = partial;
    __syncthreads();
    if (thread < kv_block_sum_lanes) {
        kv_u64 lane = 0;
        for (unsigned int i = thread; i < threads; i += kv_block_sum_lanes)
            lane = kv_add_below(lane, partials[i], limit);
        lanes[thread] = lane;
    }
    __syncthreads();
    kv_u64 total = 0;
#pragma unroll
    for (int i = 0; i < kv_block_sum_lanes; ++i) total = kv_add_below(total, lanes[i], limit);
    __syncthreads();  // before the next call writes the scratch again
    return total;
}

// Division by a positive divisor: C++ `/` truncates toward zero; unless `toward_zero`, rounded down.
__device__ inline int kv_page_div(int value, int divisor, bool toward_zero) {
    int q = value / divisor;
    return (!toward_zero && value % divisor != 0 && value < 0) ? q - 1 : q;
}

// Chunk i (ints 4i..4i+3) of src: one wide load when src is 16-byte aligned, else four scalar loads.
__device__ inline kv_vec4 kv_load4(const int* __restrict__ src, int i, bool aligned) {
    if (aligned) return ((const kv_vec4*)src)[i];
    kv_vec4 v;
    v.v[0] = src[4 * i];
    v.v[1] = src[4 * i + 1];
    v.v[2] = src[4 * i + 2];
    v.v[3] = src[4 * i + 3];
    return v;
}

// dst[i] = src[i] for i < n (n <= a program's items), by this block's threads. A head of up to 3 ints
// is peeled so that every store after it is 16 bytes wide; loads are wide when src has the same
// alignment as dst (checked here, per row). Consecutive threads take consecutive 16-byte chunks, two
// per thread per pass, both loaded before either is stored.
__device__ inline void kv_copy(const int* __restrict__ src, int* __restrict__ dst, int n) {
    const int tid = threadIdx.x, threads = blockDim.x;
    const int head = (int)kv_min(((16 - ((kv_u64)dst & 15)) & 15) / 4, n);
    const int chunks = (n - head) / 4;
    const bool aligned = (((kv_u64)src ^ (kv_u64)dst) & 15) == 0;
    if (tid < head) dst[tid] = src[tid];
    const int* s = src + head;
    kv_vec4* d = (kv_vec4*)(dst + head);
    for (int i = tid; i < chunks; i += 2 * threads) {
        const int j = i + threads;
        const kv_vec4 first = kv_load4(s, i, aligned);
        kv_vec4 second;
        if (j < chunks) second = kv_load4(s, j, aligned);
        d[i] = first;
        if (j < chunks) d[j] = second;
    }
    const int tail = head + 4 * chunks + tid;
    if (tail < n) dst[tail] = src[tail];
}

// dst[i] = value for i < n, with 16-byte stores once dst is aligned.
__device__ inline void kv_fill(int* __restrict__ dst, int n, int value) {
    const int tid = threadIdx.x, threads = blockDim.x;
    const int head = (int)kv_min(((16 - ((kv_u64)dst & 15)) & 15) / 4, n);
    const int chunks = (n - head) / 4;
    if (tid < head) dst[tid] = value;
    kv_vec4 v;
    v.v[0] = v.v[1] = v.v[2] = v.v[3] = value;
    kv_vec4* d = (kv_vec4*)(dst + head);
    for (int i = tid; i < chunks; i += threads) d[i] = v;
    const int tail = head + 4 * chunks + tid;
    if (tail < n) dst[tail] = value;
}

// out[b, p] = table[pool_b, start_b + p * page_size] // page_size (floor division, truncation with
// KV_ROUND_TOWARD_ZERO) for p < pages_b, where pages_b is
// min(ceil(L_b / page_size), pages the table row can give, width); fill_value on [pages_b, width)
// when KV_FILL is set. Rows >= B (= gridDim.x) and unwritten columns are left untouched. A row's blocks run
// to pages_b (to the width with KV_FILL).
// seq_lens_out (KV_LENS_OUT): seq_lens + seqlen_offset (the low 32 bits of the exact sum), written by
// program 0 of each row.
// Launched with width 0 it writes only seq_lens_out.
// The parameters every specialised call reads come first (bytes 0-103: two 64-byte lines of the constant
// bank), what only some read after them: on the H200, each further line a kernel reads before its gather
// costs about 2% on the page-64 cases (benchmarks/ablation.py, for the Triton kernel).
extern "C" __global__ void kv_page_table(
    const int* __restrict__ table, const void* __restrict__ req_pool_indices, const void* __restrict__ seq_lens,
    int* __restrict__ out, kv_i64 rows, kv_i64 cols, kv_i64 table_stride, kv_i64 out_stride, kv_i64 width,
    kv_i64 items, kv_i64 seqlen_offset, kv_i64 pool_stride, kv_i64 lens_stride,
    kv_i64 page_size_arg, const void* __restrict__ kv_start_idx, kv_i64 start_stride,
    int* __restrict__ seq_lens_out, kv_i64 fill_value, kv_i64 flags) {
    KV_GRID_WAIT();
#ifdef KV_PAGE_SIZE
    const int page_size = KV_PAGE_SIZE;  // a compile-time page size: divisions become shifts
#else
    const int page_size = (int)page_size_arg;
#endif
    const kv_i64 b = blockIdx.x;
    const kv_i64 program = kv_row_program(KV_HAS(KV_FOLDED_GRID));
    const kv_i64 step = kv_row_programs(KV_HAS(KV_FOLDED_GRID)) * items;
    // Independent loads, issued before any of them is used.
    const kv_i64 pool = kv_load_index(req_pool_indices, b * pool_stride, KV_HAS(KV_WIDE_POOL));
    const kv_i64 seq_len = kv_load_index(seq_lens, b * lens_stride, KV_HAS(KV_WIDE_LENS));
    const kv_i64 start =
        KV_HAS(KV_START) ? kv_load_index(kv_start_idx, b * start_stride, KV_HAS(KV_WIDE_START)) : 0;
    if (KV_HAS(KV_LENS_OUT) && program == 0 && threadIdx.x == 0)
        seq_lens_out[b] = (int)((kv_u64)seq_len + (kv_u64)seqlen_offset);  // unsigned: wraps, never overflows
    const kv_i64 length = kv_add_saturated(seq_len, seqlen_offset);

    const bool readable = pool >= 0 && pool < rows && start >= 0 && start < cols;
    // Page p is written iff its first position p * page_size is below `limit` (the length, cut at
    // the table's last column): that is p < min(ceil(L / page_size), ceil((C - start) / page_size)),
    // with no 64-bit division on the path between the row's loads and the table's.
    const kv_i64 limit = readable && length > 0 ? kv_min(length, cols - start) : 0;
    const int* src = table + (readable ? pool * table_stride + start : 0);
    int* const row_out = out + b * out_stride;
    const bool fill = KV_HAS(KV_FILL);
    const int threads = blockDim.x;
    // The block of pages [first, last); page p is written iff p * page_size < limit (or filled).
    for (kv_i64 first = program * items; first < width && (fill || first * page_size < limit); first += step) {
        // Offsets inside a block fit in 32 bits: kvdispatch.grid keeps items * page_size <= 65536.
        const int count = (int)(kv_min(first + items, width) - first);
        if (page_size == 1) {  // a copy: wide accesses
            const int written = (int)kv_max(0, kv_min(limit - first, count));
            if (written > 0) kv_copy(src + first, row_out + first, written);
            if (fill) kv_fill(row_out + first + written, count - written, (int)fill_value);
            continue;
        }
        // Pages are independent gathers: up to 4 per thread per pass, every load issued before any store.
        const int* row = src + first * page_size;
        // Page first + i is written iff i * page_size < row_limit; clamped to the block's span, which
        // implies i < count and fits in 32 bits, so each page's test is one 32-bit compare.
        const int row_limit = (int)kv_max(0, kv_min(limit - first * page_size, (kv_i64)count * page_size));
        int* dst = row_out + first;
        for (int base = threadIdx.x; base < count; base += 4 * threads) {
            int v[4];
#pragma unroll
            for (int u = 0; u < 4; ++u) {
                const int i = base + u * threads;
                v[u] = i * page_size < row_limit ? row[i * page_size] : 0;
            }
#pragma unroll
            for (int u = 0; u < 4; ++u) {
                const int i = base + u * threads;
                if (i >= count) break;
                if (i * page_size < row_limit) dst[i] = kv_page_div(v[u], page_size, KV_HAS(KV_ROUND_TOWARD_ZERO));
                else if (fill) dst[i] = (int)fill_value;
            }
        }
    }
    KV_GRID_RELEASE();
}

// The token-CSR value at position q of a row (E = entry_page_size): row[q] when E is 1, else
// row[q / E] * E + q % E in 64 bits (q >= 0); then, with a mapping, mapping[v] for v in [0, mapping_len),
// else -1.
__device__ inline kv_i64 kv_token_value(const int* __restrict__ row, kv_i64 q, kv_i64 entry_page_size,
                                        const void* __restrict__ mapping, kv_i64 mapping_len, bool mapped,
                                        bool wide_mapping) {
    kv_i64 v;
    if (entry_page_size == 1) {
        v = row[q];
    } else {
        const kv_i64 entry = q / entry_page_size;
        v = (kv_i64)row[entry] * entry_page_size + (q - entry * entry_page_size);
    }
    if (mapped) v = v >= 0 && v < mapping_len ? kv_load_index(mapping, v, wide_mapping) : -1;
    return v;
}

// The unified pool's token id at position q >= 0 of a row: the slot t opening q's page (P = page_size), its
// virtual page v = t < 0 ? 0 : t / P and max(v2p[v], 0) * P + q % P (entry 0 for v >= v2p_len), the low 64 bits.
__device__ inline kv_i64 kv_page_translated(const int* __restrict__ row, kv_i64 q, const void* __restrict__ v2p,
                                            kv_i64 v2p_len, kv_i64 page_size, bool wide_v2p) {
    const kv_i64 within = q % page_size;
    const int slot = row[q - within];
    const kv_i64 page = slot < 0 ? 0 : slot / page_size;
    const kv_i64 entry = page < v2p_len ? kv_max(kv_load_index(v2p, page, wide_v2p), 0) : 0;
    return (kv_i64)((kv_u64)entry * (kv_u64)page_size + (kv_u64)within);
}

// What a CSR kernel loads of its row b: pool index, length, start (0 without KV_START) and first target position
// (index vectors may be strided views; strides in elements). The loads are independent: issued together.
struct kv_csr_row {
    kv_i64 pool, length, start, offset;
};

__device__ inline kv_csr_row kv_load_csr_row(kv_i64 b, const void* __restrict__ req_pool_indices, kv_i64 pool_stride,
                                             const void* __restrict__ seq_lens, kv_i64 lens_stride,
                                             const void* __restrict__ kv_start_idx, kv_i64 start_stride,
                                             const void* __restrict__ kv_indptr, kv_i64 indptr_stride, kv_i64 flags) {
    kv_csr_row r;
    r.pool = kv_load_index(req_pool_indices, b * pool_stride, KV_HAS(KV_WIDE_POOL));
    r.length = kv_load_index(seq_lens, b * lens_stride, KV_HAS(KV_WIDE_LENS));
    r.start = KV_HAS(KV_START) ? kv_load_index(kv_start_idx, b * start_stride, KV_HAS(KV_WIDE_START)) : 0;
    r.offset = kv_load_index(kv_indptr, b * indptr_stride, KV_HAS(KV_WIDE_INDPTR));
    return r;
}

// The tokens [lo, hi) of a CSR row that land in out, where the row's `count` tokens go to out[offset + j] and
// only those landing in [0, out_len) count; false when there are none. The row's blocks count from lo, its
// first token inside out: a row writes at most min(C, out_len) tokens (its kernel's readable positions), which
// is what kvdispatch.grid sizes the row's programs for.
__device__ inline bool kv_row_tokens(kv_i64 offset, kv_i64 count, kv_i64 out_len, kv_i64* lo, kv_i64* hi) {
    // Checked in this order so that no expression below can overflow, whatever kv_indptr holds.
    if (offset >= out_len || offset + count <= 0) return false;
    *lo = offset < 0 ? -offset : 0;
    *hi = kv_min(count, out_len - offset);
    return *lo < *hi;
}

// out[kv_indptr[b] + j] = table[pool_b, start_b + j] for j < min(seq_lens[b], C - start_b), skipping
// every j whose target falls outside [0, out_len). Nothing else in out is touched.
// Index vectors may be strided views (strides in elements).
// Options (the parameters after `flags`): with E = entry_page_size above 1 a row has C * E positions and
// position q writes kv_token_value; KV_MAPPING maps each value through token_mapping ([mapping_len],
// contiguous); KV_WIDE_OUT writes an int64 out (else the value's low 32 bits into an int32 one); KV_V2P (E 1,
// no mapping) writes the unified pool's translated id, kv_page_translated (P = page_size, KV_PAGE_SIZE when
// specialised).
extern "C" __global__ void kv_token_csr(
    const int* __restrict__ table, kv_i64 rows, kv_i64 cols, kv_i64 table_stride,
    const void* __restrict__ req_pool_indices, kv_i64 pool_stride, const void* __restrict__ seq_lens,
    kv_i64 lens_stride, const void* __restrict__ kv_start_idx, kv_i64 start_stride,
    const void* __restrict__ kv_indptr, kv_i64 indptr_stride, void* __restrict__ out, kv_i64 out_len,
    kv_i64 items, kv_i64 flags, kv_i64 entry_page_size_arg, const void* __restrict__ token_mapping,
    kv_i64 mapping_len, const void* __restrict__ v2p, kv_i64 v2p_len, kv_i64 page_size_arg) {
    KV_GRID_WAIT();
#ifdef KV_PAGE_SIZE
    const kv_i64 page_size = KV_PAGE_SIZE;
#else
    const kv_i64 page_size = page_size_arg;
#endif
#ifdef KV_ENTRY_PAGE_SIZE
    const kv_i64 entry_page_size = KV_ENTRY_PAGE_SIZE;  // a compile-time entry page size: divisions fold
#else
    const kv_i64 entry_page_size = entry_page_size_arg;
#endif
    const kv_i64 b = blockIdx.x;
    const kv_i64 first = kv_row_program(KV_HAS(KV_FOLDED_GRID)) * items;
    const kv_i64 step = kv_row_programs(KV_HAS(KV_FOLDED_GRID)) * items;
    const kv_csr_row r = kv_load_csr_row(b, req_pool_indices, pool_stride, seq_lens, lens_stride, kv_start_idx,
                                         start_stride, kv_indptr, indptr_stride, flags);
    const kv_i64 pool = r.pool, length = r.length, start = r.start, offset = r.offset;

    const kv_i64 positions = cols * entry_page_size;  // exact: no table has 2**51 columns
    const bool readable = pool >= 0 && pool < rows && start >= 0 && start < positions;
    const kv_i64 count = readable ? kv_min(kv_max(length, 0), positions - start) : 0;
    kv_i64 row_lo, row_hi;
    if (!kv_row_tokens(offset, count, out_len, &row_lo, &row_hi)) return;
    const bool mapped = KV_HAS(KV_MAPPING), wide_out = KV_HAS(KV_WIDE_OUT), translated = KV_HAS(KV_V2P);
    const bool copy = entry_page_size == 1 && !mapped && !wide_out && !translated;
    const int* row = table + pool * table_stride;
    for (kv_i64 lo = row_lo + first; lo < row_hi; lo += step) {  // the block of tokens [lo, hi)
        const kv_i64 hi = kv_min(lo + items, row_hi);
        if (copy) {
            kv_copy(row + start + lo, (int*)out + offset + lo, (int)(hi - lo));
            continue;
        }
        for (kv_i64 j = lo + threadIdx.x; j < hi; j += blockDim.x) {
            const kv_i64 v = translated
                ? kv_page_translated(row, start + j, v2p, v2p_len, page_size, KV_HAS(KV_WIDE_V2P))
                : kv_token_value(row, start + j, entry_page_size, token_mapping, mapping_len, mapped,
                                 KV_HAS(KV_WIDE_MAPPING));
            if (wide_out) ((kv_i64*)out)[offset + j] = v;
            else ((int*)out)[offset + j] = (int)(kv_u64)v;  // the low 32 bits, as Tensor.to(torch.int32)
        }
    }
    KV_GRID_RELEASE();
}

// ---- Page tables translated through a lookup table (semantics: kvdispatch/ops/<key>.py,
// build_mha_page_table and build_translated_page_table) ----
//
// Both run on the page table's grid (kvdispatch.grid.mapped_page_table_launch): row b's blocks are its pages
// [j * items, (j + 1) * items), program k handling blocks k, k + T, ..., its threads striding over each; a page
// p is there when its first position p * page_size lies below `limit` = min(L_b, C) on a readable row
// (0 <= pool < rows), and the row's blocks end at the first page that is not.
// Flags: KV_WIDE_POOL, KV_WIDE_LENS, KV_FOLDED_GRID; KV_MAPPING (the MHA table's SWA twin is written),
// KV_WIDE_MAPPING (the lookup table, full_to_swa or v2p, is int64), KV_ROUND_TOWARD_ZERO (MHA divisions).

// Division of a 64-bit value by a positive divisor: truncating when `toward_zero`, else rounded down.
__device__ inline kv_i64 kv_div64(kv_i64 value, kv_i64 divisor, bool toward_zero) {
    const kv_i64 q = value / divisor;
    return (!toward_zero && value % divisor != 0 && value < 0) ? q - 1 : q;
}

// Pages (columns) a thread of a mapped table takes per pass: every load of them issued before any store.
constexpr int kv_page_unroll = 4;

// A pass's slots: slot[u] = row[p * page_size] for the thread's pages p = base + u * blockDim.x (u <
// kv_page_unroll) below `last` whose first position lies below `limit`, else 0; every load issued together.
__device__ inline void kv_load_slots(const int* __restrict__ row, kv_i64 base, kv_i64 last, kv_i64 limit,
                                     kv_i64 page_size, kv_i64* slot) {
    const kv_i64 threads = blockDim.x;
#pragma unroll
    for (int u = 0; u < kv_page_unroll; ++u) {
        const kv_i64 p = base + u * threads;
        slot[u] = p < last && p * page_size < limit ? row[p * page_size] : 0;
    }
}

// One pass of a thread's pages p = base + u * blockDim.x (u < kv_page_unroll), their slots loaded (0 past the
// row): for p below `last` and p * page_size below `limit`, table[p] = slot / page_size (p < width) and
// swa[p] = full_to_swa[clamp(slot, 0, mapping_len - 1)] / page_size (p < swa_width; none with swa_width 0),
// both their low 32 bits. Every map entry is loaded before any store.
__device__ inline void kv_store_slot_pages(const kv_i64* slot, kv_i64 base, kv_i64 last, kv_i64 limit,
                                           kv_i64 page_size, int* __restrict__ table, kv_i64 width,
                                           int* __restrict__ swa, kv_i64 swa_width,
                                           const void* __restrict__ full_to_swa, kv_i64 mapping_len,
                                           bool wide_mapping, bool toward_zero) {
    const kv_i64 threads = blockDim.x;
    kv_i64 mapped[kv_page_unroll];
#pragma unroll
    for (int u = 0; u < kv_page_unroll; ++u) {
        const kv_i64 p = base + u * threads;
        mapped[u] = p < last && p * page_size < limit && p < swa_width
            ? kv_load_index(full_to_swa, kv_min(kv_max(slot[u], 0), mapping_len - 1), wide_mapping) : 0;
    }
#pragma unroll
    for (int u = 0; u < kv_page_unroll; ++u) {
        const kv_i64 p = base + u * threads;
        if (p >= last || p * page_size >= limit) break;
        if (p < width) table[p] = (int)(kv_u64)kv_div64(slot[u], page_size, toward_zero);
        if (p < swa_width) swa[p] = (int)(kv_u64)kv_div64(mapped[u], page_size, toward_zero);
    }
}

// What a program of a mapped table knows before its pages: its first block's first page, its row's pool index
// and the limit of the row's page positions, min(seq_lens[b] + offset, cols) on a readable row, else 0.
struct kv_mapped_row {
    kv_i64 first, pool, limit;
};

__device__ inline kv_mapped_row kv_mapped_row_of(const void* pool_ptr, kv_i64 pool_stride, const void* lens_ptr,
                                                 kv_i64 lens_stride, kv_i64 rows, kv_i64 cols, kv_i64 offset,
                                                 kv_i64 items, kv_i64 flags) {
    const kv_i64 b = blockIdx.x;
    kv_mapped_row r;
    r.first = kv_row_program(KV_HAS(KV_FOLDED_GRID)) * items;
    r.pool = kv_load_index(pool_ptr, b * pool_stride, KV_HAS(KV_WIDE_POOL));
    const kv_i64 length = kv_add_saturated(kv_load_index(lens_ptr, b * lens_stride, KV_HAS(KV_WIDE_LENS)), offset);
    r.limit = r.pool >= 0 && r.pool < rows ? kv_min(length, cols) : 0;
    return r;
}

// The page size: the compile-time one of a specialised build (divisions become shifts), else the argument.
__device__ inline kv_i64 kv_specialised_page_size(kv_i64 page_size_arg) {
#ifdef KV_PAGE_SIZE
    return KV_PAGE_SIZE;
#else
    return page_size_arg;
#endif
}

// Row b's length is seq_lens[b] + seqlen_offset.
// slot = table[pool_b, p * page_size]; page_table[b, p] = slot / page_size (p < width) and, with KV_MAPPING,
// swa[b, p] = mapping[clamp(slot, 0, mapping_len - 1)] / page_size, its low 32 bits (p < swa_width;
// the launcher sets KV_MAPPING only when mapping_len > 0). Everything else is left untouched.
extern "C" __global__ void kv_mha_page_table(
    const int* __restrict__ table, const void* __restrict__ req_pool_indices, const void* __restrict__ seq_lens,
    int* __restrict__ page_table, int* __restrict__ swa_page_table, const void* __restrict__ full_to_swa,
    kv_i64 rows, kv_i64 cols, kv_i64 table_stride, kv_i64 width, kv_i64 page_table_stride, kv_i64 swa_width,
    kv_i64 swa_stride, kv_i64 mapping_len, kv_i64 pool_stride, kv_i64 lens_stride, kv_i64 seqlen_offset,
    kv_i64 items, kv_i64 page_size_arg, kv_i64 flags) {
    KV_GRID_WAIT();
    const kv_i64 page_size = kv_specialised_page_size(page_size_arg), b = blockIdx.x;
    const kv_mapped_row r = kv_mapped_row_of(req_pool_indices, pool_stride, seq_lens, lens_stride, rows, cols,
                                             seqlen_offset, items, flags);
    const kv_i64 limit = r.limit, step = kv_row_programs(KV_HAS(KV_FOLDED_GRID)) * items;
    const bool swa = KV_HAS(KV_MAPPING), toward_zero = KV_HAS(KV_ROUND_TOWARD_ZERO);
    const kv_i64 end = swa ? kv_max(width, swa_width) : width;
    const kv_i64 threads = blockDim.x;
    for (kv_i64 first = r.first; first < end && first * page_size < limit; first += step) {
        const kv_i64 last = kv_min(first + items, end);
        const int* row = table + r.pool * table_stride;
        if (page_size == 1 && !swa) {  // a copy of the row's slots: wide accesses
            kv_copy(row + first, page_table + b * page_table_stride + first, (int)(kv_min(last, limit) - first));
            continue;
        }
        for (kv_i64 base = first + threadIdx.x; base < last && base * page_size < limit;
             base += kv_page_unroll * threads) {
            kv_i64 slot[kv_page_unroll];
            kv_load_slots(row, base, last, limit, page_size, slot);
            kv_store_slot_pages(slot, base, last, limit, page_size, page_table + b * page_table_stride, width,
                                swa_page_table + b * swa_stride, swa ? swa_width : 0, full_to_swa, mapping_len,
                                KV_HAS(KV_WIDE_MAPPING), toward_zero);
        }
    }
    KV_GRID_RELEASE();
}

// Columns [first, min(first + items, columns)) of a translated table's row (see kv_translated_page_table).
__device__ inline void kv_translated_block(const int* __restrict__ row, int* __restrict__ out_row, kv_i64 limit,
                                           kv_i64 first, kv_i64 columns, kv_i64 items, kv_i64 page_size,
                                           const void* __restrict__ v2p, kv_i64 v2p_len, bool wide_v2p,
                                           kv_i64 multiplier, bool fill, int fill_value) {
    const kv_i64 bound = 0x80000000LL;  // 2**31: |physical| and |multiplier| at most this, the product exact
    const kv_i64 last = kv_min(first + items, columns), threads = blockDim.x;
    for (kv_i64 base = first + threadIdx.x; base < last && (fill || base * page_size < limit);
         base += kv_page_unroll * threads) {
        kv_i64 token[kv_page_unroll];
        kv_load_slots(row, base, last, limit, page_size, token);
        kv_i64 physical[kv_page_unroll];
#pragma unroll
        for (int u = 0; u < kv_page_unroll; ++u) {
            const kv_i64 c = base + u * threads, page = token[u] < 0 ? 0 : token[u] / page_size;
            physical[u] = c < last && c * page_size < limit && page < v2p_len ? kv_load_index(v2p, page, wide_v2p) : 0;
        }
#pragma unroll
        for (int u = 0; u < kv_page_unroll; ++u) {
            const kv_i64 c = base + u * threads;
            if (c >= last) break;
            if (c * page_size < limit)
                out_row[c] = (int)kv_min(kv_max(kv_min(kv_max(physical[u], -bound), bound) * multiplier, 0), bound - 1);
            else if (fill)
                out_row[c] = fill_value;
        }
    }
}

// t = table[pool_b, c * page_size]; v = t < 0 ? 0 : t / page_size; out[b, c] = min(max(v2p[v] * multiplier, 0),
// 2**31 - 1), exact (0 for v >= v2p_len), for c < columns with c * page_size below min(seq_lens[b] +
// seq_len_delta, cols); with KV_FILL, fill_value in the row's other columns below `columns`. Everything else
// is left untouched.
extern "C" __global__ void kv_translated_page_table(
    const int* __restrict__ table, const void* __restrict__ req_pool_indices, const void* __restrict__ seq_lens,
    const void* __restrict__ v2p, int* __restrict__ out, kv_i64 rows, kv_i64 cols, kv_i64 table_stride,
    kv_i64 columns, kv_i64 out_stride, kv_i64 v2p_len, kv_i64 multiplier, kv_i64 seq_len_delta, kv_i64 pool_stride,
    kv_i64 lens_stride, kv_i64 items, kv_i64 page_size_arg, kv_i64 fill_value, kv_i64 flags) {
    KV_GRID_WAIT();
    const kv_i64 page_size = kv_specialised_page_size(page_size_arg), b = blockIdx.x;
    const bool folded = KV_HAS(KV_FOLDED_GRID), fill = KV_HAS(KV_FILL), wide_v2p = KV_HAS(KV_WIDE_MAPPING);
    const kv_mapped_row r = kv_mapped_row_of(req_pool_indices, pool_stride, seq_lens, lens_stride, rows, cols,
                                             seq_len_delta, items, flags);
    const kv_i64 step = kv_row_programs(folded) * items;
    for (kv_i64 first = r.first; first < columns && (fill || first * page_size < r.limit); first += step)
        kv_translated_block(table + r.pool * table_stride, out + b * out_stride, r.limit, first, columns, items,
                            page_size, v2p, v2p_len, wide_v2p, multiplier, fill, (int)fill_value);
    KV_GRID_RELEASE();
}

// ---------------------------------------------------------------------------------------------------------
// Multi-step speculative draft decode indices (semantics: kvdispatch/ops/<key>.py, build_draft_decode_indices).
// blockIdx.x = segment z = b * topk + k (request b, branch k); the row's blocks are `items` prefix tokens
// each, up to the last one that can land in out. A prefix token is loaded once and stored into every step's
// row; program 0 of the row also writes the branch's draft slots and its kv_indptr entries, after its blocks.
// A program sums the prefix lengths of the earlier requests once whatever its blocks, with its threads
// (kv_counted_sum), after the row's loads are issued: their latency overlaps the sum.

// Independent loads a draft thread keeps in flight: prefix tokens per pass (kvdispatch.grid gives each thread
// four).
constexpr int kv_draft_unroll = 4;

// min(sum(min(max(values[i * stride], 0), cap) for i < count), limit): exact, never wraps (every term lies in
// [0, cap], cap <= 2**32, and count < 2**31). A block sum: every thread of the block must call it.
__device__ inline kv_i64 kv_counted_sum(const void* __restrict__ values, kv_i64 stride, kv_i64 count, kv_i64 cap,
                                        kv_i64 limit, bool wide) {
    kv_u64 partial = 0;
    for (kv_i64 i = threadIdx.x; i < count; i += blockDim.x)
        partial += (kv_u64)kv_min(kv_max(kv_load_index(values, i * stride, wide), 0), cap);
    return kv_min((kv_i64)kv_block_sum(partial, ~0ULL), limit);
}

// A table value as out stores it: with v2p, v2p[x / P] * P + x % P (the low 64 bits of the exact value) for
// x >= 0 whose page lies inside v2p with a non-negative entry, else 0.
__device__ inline kv_i64 kv_draft_value(kv_i64 x, kv_i64 page_size, const void* __restrict__ v2p, kv_i64 v2p_len,
                                        bool translate, bool wide_v2p) {
    if (!translate) return x;
    if (x < 0) return 0;
    const kv_i64 page = x / page_size;
    if (page >= v2p_len) return 0;
    const kv_i64 mapped = kv_load_index(v2p, page, wide_v2p);
    if (mapped < 0) return 0;
    return (kv_i64)((kv_u64)mapped * (kv_u64)page_size + (kv_u64)(x - page * page_size));
}

__device__ inline void kv_store_index(void* __restrict__ base, kv_i64 i, kv_i64 value, bool wide) {
    if (wide) ((kv_i64*)base)[i] = value;
    else ((int*)base)[i] = (int)(kv_u64)value;  // the low 32 bits, as Tensor.to(torch.int32)
}

// The column of segment `segment`'s first entry in step row `it - 1`, at most `limit`.
__device__ inline kv_i64 kv_segment_offset(kv_i64 base, kv_i64 segments_before, kv_i64 branch, kv_i64 count,
                                           kv_i64 it, kv_i64 limit) {
    return kv_min(base + segments_before * it + branch * (count + it), limit);
}

// The value at position q >= 0 of a table row: row[q], or with E = entry_page_size above 1 (a page-granular
// table) row[q / E] * E + q % E in 64 bits.
__device__ inline kv_i64 kv_draft_entry(const int* __restrict__ row, kv_i64 q, kv_i64 entry_page_size) {
    if (entry_page_size == 1) return row[q];
    const kv_i64 entry = q / entry_page_size;
    return (kv_i64)row[entry] * entry_page_size + (q - entry * entry_page_size);
}

// One pass of a thread's prefix tokens i = i0 + k * threads (k < kv_draft_unroll) below `last`: token i reads
// position q = i below the sink, i + shift past it (the window), if q < cols (the row's positions).
__device__ inline void kv_draft_load_pass(const int* __restrict__ row, kv_i64 i0, kv_i64 threads, kv_i64 last,
                                          kv_i64 sink_tokens, kv_i64 shift, kv_i64 cols, kv_i64 page_size,
                                          kv_i64 entry_page_size, const void* __restrict__ v2p, kv_i64 v2p_len,
                                          bool translate, bool wide_v2p, kv_i64* value, bool* present) {
#pragma unroll
    for (int k = 0; k < kv_draft_unroll; ++k) {
        const kv_i64 i = i0 + k * threads, q = i < sink_tokens ? i : i + shift;
        present[k] = i < last && q < cols;
        value[k] = present[k] ? kv_draft_value(kv_draft_entry(row, q, entry_page_size), page_size, v2p, v2p_len,
                                               translate, wide_v2p) : 0;
    }
}

extern "C" __global__ void kv_draft_decode(
    const int* __restrict__ table, kv_i64 rows, kv_i64 cols, kv_i64 table_stride,
    const void* __restrict__ req_pool_indices, kv_i64 pool_stride, const void* __restrict__ seq_lens,
    kv_i64 lens_stride, void* __restrict__ kv_indptr, kv_i64 indptr_stride, void* __restrict__ out,
    kv_i64 out_width, kv_i64 out_stride, kv_i64 num_steps, kv_i64 topk, kv_i64 cap, kv_i64 sink, kv_i64 limit,
    kv_i64 items, kv_i64 flags, kv_i64 page_size_arg, const void* __restrict__ positions, kv_i64 positions_stride,
    const void* __restrict__ v2p, kv_i64 v2p_len, kv_i64 entry_page_size_arg, kv_i64 step_window) {
    KV_GRID_WAIT();
    const kv_i64 page_size = kv_specialised_page_size(page_size_arg);
#ifdef KV_ENTRY_PAGE_SIZE
    const kv_i64 entry_page_size = KV_ENTRY_PAGE_SIZE;
#else
    const kv_i64 entry_page_size = entry_page_size_arg;
#endif
    cols *= entry_page_size;  // from here on, the row's positions (exact: no table has 2**51 columns)
    const kv_i64 segment = blockIdx.x;
    const kv_i64 request = segment / topk, branch = segment - request * topk;
    const kv_i64 first = kv_row_program(KV_HAS(KV_FOLDED_GRID)) * items;
    const kv_i64 step = kv_row_programs(KV_HAS(KV_FOLDED_GRID)) * items;
    const kv_i64 pool = kv_load_index(req_pool_indices, request * pool_stride, KV_HAS(KV_WIDE_POOL));
    const kv_i64 bound = 0x4000000000000000LL;  // 2**62, as the reference clamps: no readable position moves
    const kv_i64 length = kv_min(kv_max(kv_load_index(seq_lens, request * lens_stride, KV_HAS(KV_WIDE_LENS)),
                                        -bound), bound);
    const kv_i64 count = kv_min(kv_max(length, 0), cap);
    const bool row_readable = pool >= 0 && pool < rows;
    const int* row = table + (row_readable ? pool * table_stride : 0);
    const bool wide_out = KV_HAS(KV_WIDE_OUT), translate = KV_HAS(KV_V2P), wide_v2p = KV_HAS(KV_WIDE_V2P);
    const bool leads = first == 0;
    const kv_i64 floor_remainder = (length % page_size + page_size) % page_size;
    const kv_i64 remainder = KV_HAS(KV_ROUND_TOWARD_ZERO) && length < 0 && floor_remainder != 0
                                 ? floor_remainder - page_size : floor_remainder;
    const kv_i64 slot_start = length + branch * ((remainder + num_steps + page_size - 1) / page_size * page_size);
    if (step_window > 0) {
        // The per-step window over the prefix and the draft slots: step it keeps min(count + it, step_window)
        // entries, the prefix's tail then the latest min(it, step_window) draft slots; the widths of the earlier
        // segments are saturated sums, as min(n + it, V) = min(n, V - it) + min(it, V) for n, it >= 0. The
        // segment's work is one item per (step, block of tail entries), dealt over the row's programs: program k
        // takes the blocks k, k + T, ... of every step, and with fewer blocks than programs the steps run on
        // different programs, side by side. Block 0's item of a step also writes its draft slots and kv_indptr
        // entry. No step copies more than min(count, V, cols, out_width) entries.
        const kv_i64 threads = blockDim.x, programs = kv_row_programs(KV_HAS(KV_FOLDED_GRID));
        const kv_i64 most = kv_min(kv_min(count, kv_max(step_window, 0)), kv_min(cols, out_width));
        const kv_i64 blocks = kv_max((most + items - 1) / items, 1);
        // A program's items of one step are consecutive: each step's sum is taken once.
        kv_i64 summed_step = 0, before = 0;
        for (kv_i64 item = first / items; item < num_steps * blocks; item += programs) {
            const kv_i64 it = item / blocks + 1, lo = item % blocks * items;
            const kv_i64 chain = kv_min(it, step_window), room = kv_max(step_window - it, 0);
            if (it != summed_step) {
                before = kv_min(kv_counted_sum(seq_lens, lens_stride, request, room, limit, KV_HAS(KV_WIDE_LENS))
                                + request * chain, limit);
                summed_step = it;
            }
            const kv_i64 keep = kv_min(count + it, step_window), tail = keep - chain;
            const kv_i64 offset = kv_min(before * topk + branch * keep, limit);
            const kv_i64 tail_end = row_readable ? kv_min(kv_min(tail, kv_max(out_width - offset, 0)),
                                                          kv_max(cols - length + tail, 0)) : 0;
            for (kv_i64 e = lo + threadIdx.x; e < kv_min(lo + items, tail_end); e += threads) {
                const kv_i64 q = length - tail + e;
                if (q < 0) continue;
                kv_store_index(out, (it - 1) * out_stride + offset + e, kv_draft_value(kv_draft_entry(row, q, entry_page_size),
                                                                   page_size, v2p, v2p_len, translate, wide_v2p),
                               wide_out);
            }
            if (lo != 0) continue;
            for (kv_i64 j = threadIdx.x; row_readable && j < chain; j += threads) {
                const kv_i64 q = slot_start + it - chain + j, column = offset + tail + j;
                if (q < 0 || q >= cols || column >= out_width) continue;
                kv_store_index(out, (it - 1) * out_stride + column, kv_draft_value(kv_draft_entry(row, q, entry_page_size), page_size,
                                                               v2p, v2p_len, translate, wide_v2p), wide_out);
            }
            const kv_i64 end = KV_HAS(KV_POSITIONS)
                                   ? kv_min(kv_counted_sum(positions, positions_stride, segment + 1, room, limit,
                                                           KV_HAS(KV_WIDE_POSITIONS)) + (segment + 1) * chain, limit)
                                   : kv_min(offset + keep, limit);
            if (threadIdx.x != 0) continue;
            kv_store_index(kv_indptr, (it - 1) * indptr_stride + segment + 1, end, KV_HAS(KV_WIDE_INDPTR));
            if (segment == 0 && KV_HAS(KV_INDPTR_START))
                kv_store_index(kv_indptr, (it - 1) * indptr_stride, 0, KV_HAS(KV_WIDE_INDPTR));
        }
        KV_GRID_RELEASE();
        return;
    }
    // The row's prefix tokens end at the first that lands nowhere: token i reads position i or past it and
    // lands at column i or past it.
    const kv_i64 end = row_readable ? kv_min(count, kv_min(cols, out_width)) : 0;
    if (!leads && first >= end) return;

    // The row's loads: this thread's first pass of prefix tokens and, in program 0, its first draft slot (the
    // branch owns ceil((L mod P + S) / P) pages past the request's length).
    const kv_i64 threads = blockDim.x, sink_tokens = kv_min(sink, count), shift = length - count;
    kv_i64 block = first, last = kv_min(first + items, end);
    kv_i64 i0 = first + threadIdx.x;
    kv_i64 value[kv_draft_unroll];
    bool present[kv_draft_unroll];
    kv_draft_load_pass(row, i0, threads, last, sink_tokens, shift, cols, page_size, entry_page_size, v2p, v2p_len,
                       translate, wide_v2p, value, present);
    const bool slots_read = leads && row_readable;
    const kv_i64 own_slot = slot_start + threadIdx.x;
    const bool own_slot_read = slots_read && threadIdx.x < num_steps && own_slot >= 0 && own_slot < cols;
    const kv_i64 own_slot_value =
        own_slot_read ? kv_draft_value(kv_draft_entry(row, own_slot, entry_page_size), page_size, v2p, v2p_len,
                                       translate, wide_v2p) : 0;

    const kv_i64 base = kv_min(kv_counted_sum(seq_lens, lens_stride, request, cap, limit, KV_HAS(KV_WIDE_LENS)) * topk,
                               limit);
    const kv_i64 segments_before = segment - branch;
    while (i0 < last) {  // this thread's tokens of the block [block, last), then of the program's next block
        for (kv_i64 it = 1; it <= num_steps; ++it) {
            const kv_i64 offset = kv_segment_offset(base, segments_before, branch, count, it, limit);
#pragma unroll
            for (int k = 0; k < kv_draft_unroll; ++k) {
                const kv_i64 column = offset + i0 + k * threads;
                if (present[k] && column < out_width)
                    kv_store_index(out, (it - 1) * out_stride + column, value[k], wide_out);
            }
        }
        i0 += kv_draft_unroll * threads;
        if (i0 >= last) {  // the next block; past the row's end, last = end <= block, which ends the loop
            block += step;
            i0 = block + threadIdx.x;
            last = kv_min(block + items, end);
        }
        kv_draft_load_pass(row, i0, threads, last, sink_tokens, shift, cols, page_size, entry_page_size, v2p,
                           v2p_len, translate, wide_v2p, value, present);
    }
    if (!leads) return;
    for (kv_i64 j = threadIdx.x; slots_read && j < num_steps; j += threads) {
        const kv_i64 position = slot_start + j;
        if (position < 0 || position >= cols) continue;
        const kv_i64 v = j == threadIdx.x ? own_slot_value
                                          : kv_draft_value(kv_draft_entry(row, position, entry_page_size), page_size,
                                                           v2p, v2p_len, translate, wide_v2p);
        for (kv_i64 it = j + 1; it <= num_steps; ++it) {
            const kv_i64 column = kv_segment_offset(base, segments_before, branch, count, it, limit) + count + j;
            if (column < out_width) kv_store_index(out, (it - 1) * out_stride + column, v, wide_out);
        }
    }
    const kv_i64 through = KV_HAS(KV_POSITIONS) ? kv_counted_sum(positions, positions_stride, segment + 1, cap, limit,
                                                                 KV_HAS(KV_WIDE_POSITIONS)) : 0;
    if (threadIdx.x != 0) return;
    const bool wide_indptr = KV_HAS(KV_WIDE_INDPTR);
    for (kv_i64 it = 1; it <= num_steps; ++it) {
        const kv_i64 end = KV_HAS(KV_POSITIONS)
                               ? kv_min(through + (segment + 1) * it, limit)
                               : kv_min(kv_segment_offset(base, segments_before, branch, count, it, limit) + count + it,
                                        limit);
        kv_store_index(kv_indptr, (it - 1) * indptr_stride + segment + 1, end, wide_indptr);
        if (segment == 0 && KV_HAS(KV_INDPTR_START))
            kv_store_index(kv_indptr, (it - 1) * indptr_stride, 0, wide_indptr);
    }
    KV_GRID_RELEASE();
}

// ---- Decode context parallel, token-interleaved: position p of a request belongs to rank p mod D (dcp_size),
// and a slot id v of the virtual pool is stored on its owner at local slot v / D. Semantics:
// kvdispatch/ops/dcp_token_csr.py and dcp_page_table.py. A launcher may compile one DCP size
// (-DKV_DCP_SIZE=<D>) as it compiles a page size, so the divisions by D fold into shifts or multiplies.

// a mod d rounded down (in [0, d)) for d > 0.
__device__ inline kv_i64 kv_floor_mod(kv_i64 a, kv_i64 d) {
    const kv_i64 r = a % d;
    return r < 0 ? r + d : r;
}

// The DCP size: the compile-time one of a specialised build, else the runtime argument.
__device__ inline kv_i64 kv_dcp_size(kv_i64 dcp_size_arg) {
#ifdef KV_DCP_SIZE
    return KV_DCP_SIZE;
#else
    return dcp_size_arg;
#endif
}

// One rank's token CSR: out[kv_indptr[b] + j] = table[pool_b, first_b + j * D] / D (rounded down, or toward
// zero with KV_ROUND_TOWARD_ZERO) for j < min(local_seq_lens[b], ceil((C - first_b) / D)), where first_b is
// the first position >= start_b congruent to dcp_rank mod D, skipping every j whose target falls outside
// [0, out_len). A first position outside [0, C) or a pool index outside [0, R) gives an empty row.
extern "C" __global__ void kv_dcp_token_csr(
    const int* __restrict__ table, kv_i64 rows, kv_i64 cols, kv_i64 table_stride,
    const void* __restrict__ req_pool_indices, kv_i64 pool_stride, const void* __restrict__ local_seq_lens,
    kv_i64 lens_stride, const void* __restrict__ kv_start_idx, kv_i64 start_stride,
    const void* __restrict__ kv_indptr, kv_i64 indptr_stride, void* __restrict__ out, kv_i64 out_len,
    kv_i64 items, kv_i64 flags, kv_i64 dcp_size_arg, kv_i64 dcp_rank) {
    KV_GRID_WAIT();
    const kv_i64 dcp_size = kv_dcp_size(dcp_size_arg);
    const kv_i64 b = blockIdx.x;
    const kv_i64 program_first = kv_row_program(KV_HAS(KV_FOLDED_GRID)) * items;
    const kv_i64 step = kv_row_programs(KV_HAS(KV_FOLDED_GRID)) * items;
    const kv_csr_row r = kv_load_csr_row(b, req_pool_indices, pool_stride, local_seq_lens, lens_stride, kv_start_idx,
                                         start_stride, kv_indptr, indptr_stride, flags);
    const kv_i64 pool = r.pool, length = r.length, offset = r.offset;

    // A start beyond +-2**62 gives the rows it gives at the bound (no table comes near): then nothing wraps.
    const kv_i64 bound = 1LL << 62;
    const kv_i64 bounded = kv_min(kv_max(r.start, -bound), bound);
    const kv_i64 first = bounded + kv_floor_mod(dcp_rank - bounded, dcp_size);
    const bool readable = pool >= 0 && pool < rows && first >= 0 && first < cols;
    const kv_i64 count = readable ? kv_min(kv_max(length, 0), (cols - first + dcp_size - 1) / dcp_size) : 0;
    kv_i64 row_lo, row_hi;
    if (!kv_row_tokens(offset, count, out_len, &row_lo, &row_hi)) return;
    const int* row = table + pool * table_stride + first;
    const bool toward_zero = KV_HAS(KV_ROUND_TOWARD_ZERO), wide_out = KV_HAS(KV_WIDE_OUT);
    for (kv_i64 lo = row_lo + program_first; lo < row_hi; lo += step) {  // the block of tokens [lo, hi)
        const kv_i64 hi = kv_min(lo + items, row_hi);
        for (kv_i64 j = lo + threadIdx.x; j < hi; j += blockDim.x) {
            const int value = kv_page_div(row[j * dcp_size], (int)dcp_size, toward_zero);
            if (wide_out) ((kv_i64*)out)[offset + j] = value;
            else ((int*)out)[offset + j] = value;
        }
    }
    KV_GRID_RELEASE();
}

// One rank's block table: with V = page_size * D, out[b, p] = table[pool_b, dcp_rank + p * V] / V (rounded
// down, or toward zero with KV_ROUND_TOWARD_ZERO) for p < min(ceil(local_seq_lens[b] / page_size),
// ceil((C - dcp_rank) / V), width); fill_value on the other columns below the width when KV_FILL is set.
// KV_V2P: each page q (0 for a negative slot) is written as max(v2p[q], 0) (its low 32 bits), 0 for q >= v2p_len
// (KV_WIDE_V2P: v2p is int64). Rows >= B (= gridDim.x) and unwritten columns are left untouched.
extern "C" __global__ void kv_dcp_page_table(
    const int* __restrict__ table, const void* __restrict__ req_pool_indices, const void* __restrict__ local_seq_lens,
    int* __restrict__ out, kv_i64 rows, kv_i64 cols, kv_i64 table_stride, kv_i64 out_stride, kv_i64 width,
    kv_i64 items, kv_i64 pool_stride, kv_i64 lens_stride, kv_i64 page_size_arg, kv_i64 dcp_size_arg,
    kv_i64 dcp_rank, kv_i64 fill_value, kv_i64 flags, const void* __restrict__ v2p, kv_i64 v2p_len) {
    KV_GRID_WAIT();
    const kv_i64 page_size = kv_specialised_page_size(page_size_arg);
    const kv_i64 dcp_size = kv_dcp_size(dcp_size_arg);
    const kv_i64 b = blockIdx.x;
    const kv_i64 program = kv_row_program(KV_HAS(KV_FOLDED_GRID));
    const kv_i64 step = kv_row_programs(KV_HAS(KV_FOLDED_GRID)) * items;
    const kv_i64 pool = kv_load_index(req_pool_indices, b * pool_stride, KV_HAS(KV_WIDE_POOL));
    const kv_i64 length = kv_load_index(local_seq_lens, b * lens_stride, KV_HAS(KV_WIDE_LENS));
    const kv_i64 virtual_page = page_size * dcp_size;
    const bool readable = pool >= 0 && pool < rows && length > 0 && cols > dcp_rank;
    const kv_i64 pages = readable ? kv_min(kv_min((length - 1) / page_size + 1, (cols - dcp_rank - 1) / virtual_page + 1),
                                           width) : 0;
    const int* src = table + (readable ? pool * table_stride + dcp_rank : 0);
    int* dst = out + b * out_stride;
    const bool fill = KV_HAS(KV_FILL), toward_zero = KV_HAS(KV_ROUND_TOWARD_ZERO);
    const kv_i64 end = fill ? width : pages;  // the row's blocks: its pages, with a fill the whole width
    for (kv_i64 first = program * items; first < end; first += step) {
        const kv_i64 last = kv_min(first + items, end);
        for (kv_i64 p = first + threadIdx.x; p < last; p += blockDim.x) {
            if (p >= pages) {
                dst[p] = (int)fill_value;
            } else if (KV_HAS(KV_V2P)) {
                const int slot = src[p * virtual_page];
                const kv_i64 q = slot < 0 ? 0 : slot / virtual_page;
                const kv_i64 physical = q < v2p_len ? kv_load_index(v2p, q, KV_HAS(KV_WIDE_V2P)) : 0;
                dst[p] = (int)(unsigned)(kv_u64)kv_max(physical, 0);
            } else {
                dst[p] = kv_page_div(src[p * virtual_page], (int)virtual_page, toward_zero);
            }
        }
    }
    KV_GRID_RELEASE();
}

// ---- Compacted CSR (kvdispatch/ops/compact_csr.py): request b reads row r_b = b * row_step of the source from
// first_b = start_b + offset (start_b = source_indptr[b] with KV_START, else 0) every `step` positions, and writes
// out[kv_indptr[b] + j] = source[r_b, first_b + j * step] for j < min(lens[b], ceil((C - first_b) / step),
// max_count), skipping every j whose target falls outside [0, out_len). A source row >= R or a first position
// outside [0, C) gives an empty row. KV_FILL: a request with lens[b] == 0 writes empty_fill at out[kv_indptr[b]]
// (program 0, thread 0 of its row). KV_WIDE_OUT: out is int64.
extern "C" __global__ void kv_compact_csr(
    const int* __restrict__ source, kv_i64 rows, kv_i64 cols, kv_i64 source_stride,
    const void* __restrict__ lens, kv_i64 lens_stride, const void* __restrict__ source_indptr, kv_i64 start_stride,
    const void* __restrict__ kv_indptr, kv_i64 indptr_stride, void* __restrict__ out, kv_i64 out_len,
    kv_i64 items, kv_i64 flags, kv_i64 row_step, kv_i64 offset, kv_i64 step, kv_i64 max_count, kv_i64 empty_fill) {
    KV_GRID_WAIT();
    const kv_i64 b = blockIdx.x;
    const kv_i64 program = kv_row_program(KV_HAS(KV_FOLDED_GRID));
    const kv_i64 stride = kv_row_programs(KV_HAS(KV_FOLDED_GRID)) * items;
    const kv_i64 length = kv_load_index(lens, b * lens_stride, KV_HAS(KV_WIDE_LENS));
    const kv_i64 target = kv_load_index(kv_indptr, b * indptr_stride, KV_HAS(KV_WIDE_INDPTR));
    const kv_i64 bound = 1LL << 62;
    const kv_i64 start = KV_HAS(KV_START) ? kv_load_index(source_indptr, b * start_stride, KV_HAS(KV_WIDE_START)) : 0;
    const kv_i64 first = kv_min(kv_max(start, -bound), bound) + offset;
    const kv_i64 source_row = b * row_step;
    const bool wide_out = KV_HAS(KV_WIDE_OUT);
    if (KV_HAS(KV_FILL) && program == 0 && threadIdx.x == 0 && length == 0 && target >= 0 && target < out_len) {
        if (wide_out) ((kv_i64*)out)[target] = empty_fill;
        else ((int*)out)[target] = (int)empty_fill;
    }
    const bool readable = source_row < rows && first >= 0 && first < cols;
    const kv_i64 count = readable ? kv_min(kv_min(kv_max(length, 0), (cols - first + step - 1) / step), max_count) : 0;
    kv_i64 row_lo, row_hi;
    if (!kv_row_tokens(target, count, out_len, &row_lo, &row_hi)) return;
    const int* row = source + source_row * source_stride + first;
    for (kv_i64 lo = row_lo + program * items; lo < row_hi; lo += stride) {  // the block of entries [lo, hi)
        const kv_i64 hi = kv_min(lo + items, row_hi);
        for (kv_i64 j = lo + threadIdx.x; j < hi; j += blockDim.x) {
            if (wide_out) ((kv_i64*)out)[target + j] = row[j * step];
            else ((int*)out)[target + j] = row[j * step];
        }
    }
    KV_GRID_RELEASE();
}

// ---- Token CSR over a gathered prefix+extend buffer (kvdispatch/ops/prefix_extend_csr.py): with P_b and E_b the
// lengths clamped into [0, 2**61], request b writes out[kv_indptr[b] + j] for j < P_b + E_b whose target lies in
// [0, out_len): prefix_starts[b] + j below P_b, extend_base + extend_starts[b] + j - P_b after, in the low 64 bits
// (unsigned arithmetic: no signed overflow), then the low 32 bits into an int32 out (KV_WIDE_OUT: int64).
// int64 vectors: prefix_lens KV_WIDE_LENS, prefix_starts KV_WIDE_START, extend_lens KV_WIDE_POOL, extend_starts
// KV_WIDE_POSITIONS, kv_indptr KV_WIDE_INDPTR.
extern "C" __global__ void kv_prefix_extend_csr(
    const void* __restrict__ prefix_lens, kv_i64 prefix_lens_stride, const void* __restrict__ prefix_starts,
    kv_i64 prefix_starts_stride, const void* __restrict__ extend_lens, kv_i64 extend_lens_stride,
    const void* __restrict__ extend_starts, kv_i64 extend_starts_stride, const void* __restrict__ kv_indptr,
    kv_i64 indptr_stride, void* __restrict__ out, kv_i64 out_len, kv_i64 items, kv_i64 flags, kv_i64 extend_base) {
    KV_GRID_WAIT();
    const kv_i64 b = blockIdx.x;
    const kv_i64 program = kv_row_program(KV_HAS(KV_FOLDED_GRID));
    const kv_i64 stride = kv_row_programs(KV_HAS(KV_FOLDED_GRID)) * items;
    const bool wide_out = KV_HAS(KV_WIDE_OUT);
    const kv_i64 bound = 1LL << 61;
    const kv_i64 prefix = kv_min(kv_max(kv_load_index(prefix_lens, b * prefix_lens_stride, KV_HAS(KV_WIDE_LENS)), 0),
                                 bound);
    const kv_i64 extend = kv_min(kv_max(kv_load_index(extend_lens, b * extend_lens_stride, KV_HAS(KV_WIDE_POOL)), 0),
                                 bound);
    const kv_u64 prefix_start = (kv_u64)kv_load_index(prefix_starts, b * prefix_starts_stride, KV_HAS(KV_WIDE_START));
    const kv_u64 extend_first = (kv_u64)extend_base - (kv_u64)prefix
                                + (kv_u64)kv_load_index(extend_starts, b * extend_starts_stride,
                                                        KV_HAS(KV_WIDE_POSITIONS));
    const kv_i64 target = kv_load_index(kv_indptr, b * indptr_stride, KV_HAS(KV_WIDE_INDPTR));
    kv_i64 row_lo, row_hi;
    if (!kv_row_tokens(target, prefix + extend, out_len, &row_lo, &row_hi)) return;
    for (kv_i64 lo = row_lo + program * items; lo < row_hi; lo += stride) {  // the block of entries [lo, hi)
        const kv_i64 hi = kv_min(lo + items, row_hi);
        for (kv_i64 j = lo + threadIdx.x; j < hi; j += blockDim.x) {
            const kv_u64 value = (j < prefix ? prefix_start : extend_first) + (kv_u64)j;
            if (wide_out) ((kv_i64*)out)[target + j] = (kv_i64)value;
            else ((int*)out)[target + j] = (int)(unsigned)value;
        }
    }
    KV_GRID_RELEASE();
}

// ---- One decode step's metadata (semantics: kvdispatch/ops/decode_metadata.py) ----
//
// Grid: kvdispatch.grid.decode_metadata_launch (at least one row and one program per row). Thread 0 of row b's
// last program (the one with the fewest pages to write) writes cache_seqlens[b] and the running sums through
// b, summing rows 0..b itself (no program waits for another); the row's programs write its pages as kv_mha_page_table does; every program takes its
// share of the SWA cache locations, strided over the whole grid. Its own flag bits (the shared ones: KV_WIDE_POOL,
// KV_WIDE_LENS, KV_FOLDED_GRID, KV_WIDE_MAPPING for full_to_swa):
#define KV_DM_K_LEADING (1LL << 40)    // cu_seqlens_k has batch + 1 entries (entry 0 gets 0)
#define KV_DM_Q_CUMSUM (1LL << 41)     // cu_seqlens_q: running sums of qlens
#define KV_DM_Q_STRIDED (1LL << 42)    // cu_seqlens_q: (b + 1) * q_stride
#define KV_DM_Q_LEADING (1LL << 43)    // cu_seqlens_q has batch + 1 entries
#define KV_DM_TABLE (1LL << 44)        // page_table is written
#define KV_DM_FULL_V2P (1LL << 45)     // page_table through full_v2p
#define KV_DM_SWA_SLOTS (1LL << 46)    // swa_page_table through full_to_swa (slots)
#define KV_DM_SWA_PAGES (1LL << 47)    // swa_page_table through swa_v2p (pages)
#define KV_DM_ZERO_TAIL (1LL << 48)    // columns past a row's pages get 0
#define KV_DM_SWA_LOC (1LL << 49)      // swa_out_cache_loc is written
#define KV_DM_WIDE_QLENS (1LL << 50)
#define KV_DM_WIDE_LOC (1LL << 51)
#define KV_DM_WIDE_SWA_LOC (1LL << 52)
#define KV_DM_WIDE_FULL_V2P (1LL << 53)
#define KV_DM_WIDE_SWA_V2P (1LL << 54)

// The low 32 bits of sum(low32(values[i] + offset) for i <= row), in unsigned arithmetic (no overflow). A
// block sum: every thread of the block must call it.
__device__ inline int kv_running_sum(const void* values, kv_i64 stride, kv_i64 row, kv_i64 offset, int wide) {
    kv_u64 partial = 0;
    for (kv_i64 i = threadIdx.x; i <= row; i += blockDim.x)
        partial += (unsigned int)((kv_u64)kv_load_index(values, i * stride, wide) + (kv_u64)offset);
    return (int)(unsigned int)kv_block_sum(partial, ~0ULL);
}

// min(max(v2p[max(slot, 0) / page_size], 0), 2**31 - 1), 0 past the map.
__device__ inline int kv_through_map(int slot, const void* v2p, kv_i64 v2p_len, kv_i64 page_size, int wide) {
    const kv_i64 virtual_page = (slot < 0 ? 0 : slot) / page_size;
    const kv_i64 physical = virtual_page < v2p_len ? kv_load_index(v2p, virtual_page, wide) : 0;
    return (int)kv_min(kv_max(physical, 0), 0x7FFFFFFFLL);
}

// full_to_swa[min(x, M - 1)], -1 for a negative x or an empty map.
__device__ inline kv_i64 kv_swa_entry(kv_i64 x, const void* mapping, kv_i64 mapping_len, int wide) {
    const kv_i64 index = kv_min(x, mapping_len - 1);
    return index < 0 ? -1 : kv_load_index(mapping, index, wide);
}

extern "C" __global__ void kv_decode_metadata(
    const int* __restrict__ table, const void* __restrict__ req_pool_indices, const void* __restrict__ seq_lens,
    int* __restrict__ cache_seqlens, int* __restrict__ cu_seqlens_k, int* __restrict__ page_table,
    int* __restrict__ swa_page_table, const void* __restrict__ full_to_swa, const void* __restrict__ full_v2p,
    const void* __restrict__ swa_v2p, int* __restrict__ cu_seqlens_q, const void* __restrict__ qlens,
    const void* __restrict__ out_cache_loc, void* __restrict__ swa_out_cache_loc, kv_i64 batch, kv_i64 rows,
    kv_i64 cols, kv_i64 table_stride, kv_i64 width, kv_i64 page_table_stride, kv_i64 swa_width, kv_i64 swa_stride,
    kv_i64 mapping_len, kv_i64 full_v2p_len, kv_i64 swa_v2p_len, kv_i64 offset, kv_i64 q_stride, kv_i64 loc_len,
    kv_i64 swa_loc_len, kv_i64 pool_stride, kv_i64 lens_stride, kv_i64 cache_stride, kv_i64 cu_k_stride,
    kv_i64 cu_q_stride, kv_i64 qlens_stride, kv_i64 loc_stride, kv_i64 swa_loc_stride, kv_i64 items,
    kv_i64 page_size_arg, kv_i64 flags) {
    KV_GRID_WAIT();
    const kv_i64 page_size = kv_specialised_page_size(page_size_arg), b = blockIdx.x;
    const kv_i64 program = kv_row_program(KV_HAS(KV_FOLDED_GRID)), programs = kv_row_programs(KV_HAS(KV_FOLDED_GRID));
    if (program == programs - 1) {  // the row's last: the fewest pages to write; its threads take the sums
        if (b < batch) {
            const int wide_lens = KV_HAS(KV_WIDE_LENS);
            const int k_sum = kv_running_sum(seq_lens, lens_stride, b, offset, wide_lens);
            const int q_sum = KV_HAS(KV_DM_Q_CUMSUM) ? kv_running_sum(qlens, qlens_stride, b, 0,
                                                                      KV_HAS(KV_DM_WIDE_QLENS)) : 0;
            if (threadIdx.x == 0) {
                cache_seqlens[b * cache_stride] =
                    (int)(unsigned int)((kv_u64)kv_load_index(seq_lens, b * lens_stride, wide_lens) + (kv_u64)offset);
                cu_seqlens_k[(b + (KV_HAS(KV_DM_K_LEADING) ? 1 : 0)) * cu_k_stride] = k_sum;
                const kv_i64 q_at = (b + (KV_HAS(KV_DM_Q_LEADING) ? 1 : 0)) * cu_q_stride;
                if (KV_HAS(KV_DM_Q_CUMSUM)) cu_seqlens_q[q_at] = q_sum;
                if (KV_HAS(KV_DM_Q_STRIDED))
                    cu_seqlens_q[q_at] = (int)(unsigned int)((kv_u64)(b + 1) * (kv_u64)q_stride);
            }
        }
        if (b == 0 && threadIdx.x == 0) {
            if (KV_HAS(KV_DM_K_LEADING)) cu_seqlens_k[0] = 0;
            if (KV_HAS(KV_DM_Q_LEADING) && (KV_HAS(KV_DM_Q_CUMSUM) || KV_HAS(KV_DM_Q_STRIDED))) cu_seqlens_q[0] = 0;
        }
    }
    if (KV_HAS(KV_DM_TABLE) && b < batch) {
        const kv_mapped_row r = kv_mapped_row_of(req_pool_indices, pool_stride, seq_lens, lens_stride, rows, cols,
                                                 offset, items, flags);
        const bool zero_tail = KV_HAS(KV_DM_ZERO_TAIL), slots_map = KV_HAS(KV_DM_SWA_SLOTS);
        const bool pages_map = KV_HAS(KV_DM_SWA_PAGES);
        const kv_i64 limit = r.limit, end = kv_max(width, swa_width), step = programs * items;
        const int* row = table + r.pool * table_stride;
        const kv_i64 threads = blockDim.x;
        for (kv_i64 first = r.first; first < end && (zero_tail || first * page_size < limit); first += step) {
            const kv_i64 last = kv_min(first + items, end);
            for (kv_i64 base = first + threadIdx.x; base < last && (zero_tail || base * page_size < limit);
                 base += kv_page_unroll * threads) {
                kv_i64 slot[kv_page_unroll];
                kv_load_slots(row, base, last, limit, page_size, slot);
                int value[kv_page_unroll], swa_value[kv_page_unroll];  // 0 past the row
#pragma unroll
                for (int u = 0; u < kv_page_unroll; ++u) {
                    const kv_i64 p = base + u * threads;
                    const bool in_row = p < last && p * page_size < limit;
                    value[u] = !in_row || p >= width ? 0
                        : KV_HAS(KV_DM_FULL_V2P)
                            ? kv_through_map((int)slot[u], full_v2p, full_v2p_len, page_size,
                                             KV_HAS(KV_DM_WIDE_FULL_V2P))
                            : (int)kv_div64(slot[u], page_size, false);
                    swa_value[u] = 0;
                    if (in_row && p < swa_width && pages_map) {
                        swa_value[u] = kv_through_map((int)slot[u], swa_v2p, swa_v2p_len, page_size,
                                                      KV_HAS(KV_DM_WIDE_SWA_V2P));
                    } else if (in_row && p < swa_width && slots_map) {
                        const kv_i64 mapped = kv_swa_entry(slot[u], full_to_swa, mapping_len, KV_HAS(KV_WIDE_MAPPING));
                        swa_value[u] = mapped < 0 ? -1 : (int)(kv_u64)kv_div64(mapped, page_size, false);
                    }
                }
#pragma unroll
                for (int u = 0; u < kv_page_unroll; ++u) {
                    const kv_i64 p = base + u * threads;
                    if (p >= last || (!zero_tail && p * page_size >= limit)) break;
                    if (p < width) page_table[b * page_table_stride + p] = value[u];
                    if ((slots_map || pages_map) && p < swa_width) swa_page_table[b * swa_stride + p] = swa_value[u];
                }
            }
        }
    }
    if (KV_HAS(KV_DM_SWA_LOC)) {
        const kv_i64 all = (kv_i64)gridDim.x * programs * items;
        for (kv_i64 start = (b * programs + program) * items; start < swa_loc_len; start += all) {
            const kv_i64 last = kv_min(start + items, swa_loc_len);
            for (kv_i64 i = start + threadIdx.x; i < last; i += blockDim.x) {
                const kv_i64 value = i < loc_len
                    ? kv_swa_entry(kv_load_index(out_cache_loc, i * loc_stride, KV_HAS(KV_DM_WIDE_LOC)), full_to_swa,
                                   mapping_len, KV_HAS(KV_WIDE_MAPPING))
                    : 0;
                if (KV_HAS(KV_DM_WIDE_SWA_LOC)) ((kv_i64*)swa_out_cache_loc)[i * swa_loc_stride] = value;
                else ((int*)swa_out_cache_loc)[i * swa_loc_stride] = (int)(unsigned int)(kv_u64)value;
            }
        }
    }
    KV_GRID_RELEASE();
}

// Per-request slices gathered into cache locations (kvdispatch.create_cache_locs): what the flags do not say
// of a call (which slices, the other tensors' dtypes) travels in the kernel's own `layout` argument.
enum { KV_CACHE_LOCS_PACKED = 1, KV_CACHE_LOCS_WIDE_TABLE = 2, KV_CACHE_LOCS_WIDE_START = 4,
       KV_CACHE_LOCS_WIDE_END = 8, KV_CACHE_LOCS_WIDE_FULL_OUT = 16, KV_CACHE_LOCS_WIDE_SWA_OUT = 32 };

__device__ inline kv_i64 kv_bounded(kv_i64 v) {  // into [-2**62, 2**62] (kvdispatch.reference.BOUND)
    const kv_i64 bound = 1LL << 62;
    return kv_min(kv_max(v, -bound), bound);
}

// min(max(end - start, 0), limit) of the exact difference (below 2**64 where end > start: unsigned).
__device__ inline kv_i64 kv_slice_length(kv_i64 start, kv_i64 end, kv_i64 limit) {
    if (end <= start) return 0;
    const kv_u64 difference = (kv_u64)end - (kv_u64)start;
    return difference < (kv_u64)limit ? (kv_i64)difference : limit;
}

// sum(kv_slice_length(start[i], end[i]) for i < count), at most `limit` (<= 2**62): exact. A block sum: every
// thread of the block must call it.
__device__ inline kv_i64 kv_packed_offset(const void* __restrict__ start, kv_i64 start_stride, bool wide_start,
                                          const void* __restrict__ end, kv_i64 end_stride, bool wide_end,
                                          kv_i64 count, kv_i64 limit) {
    kv_i64 partial = 0;
    for (kv_i64 i = threadIdx.x; i < count; i += blockDim.x) {
        partial = kv_min(partial + kv_slice_length(kv_load_index(start, i * start_stride, wide_start),
                                                   kv_load_index(end, i * end_stride, wide_end), limit), limit);
    }
    return (kv_i64)kv_block_sum((kv_u64)partial, (kv_u64)limit);
}

// A table value x through a page-level map: v2p[x / P] * P + x % P (the low 64 bits) for x >= 0 whose page
// lies inside the map with a non-negative entry, else 0.
__device__ inline kv_i64 kv_translated_value(kv_i64 x, kv_i64 page_size, const void* __restrict__ v2p, kv_i64 v2p_len,
                                             bool wide_v2p) {
    if (x < 0 || x / page_size >= v2p_len) return 0;
    const kv_i64 page = x / page_size;
    const kv_i64 mapped = kv_load_index(v2p, page, wide_v2p);
    if (mapped < 0) return 0;
    return (kv_i64)((kv_u64)mapped * (kv_u64)page_size + (kv_u64)(x - page * page_size));
}

// Request b = blockIdx.x: entry j < len_b lands at offset_b + j and reads table[pool_b, start_b + j]. Packed
// (KV_CACHE_LOCS_PACKED): len_b = end_b - start_b (0 when negative) and offset_b the sum of the earlier
// lengths, which each program sums with its threads (no second launch, no host sync); else len_b = width, offset_b =
// b * width. Written where the position lies in [0, cols), the destination below out_len and the pool row in
// [0, rows): out, with KV_POSITIONS the position, with KV_V2P / KV_MAPPING the value through full_v2p /
// swa_v2p. Flags: KV_WIDE_POOL, KV_WIDE_OUT, KV_FOLDED_GRID, KV_WIDE_POSITIONS, KV_WIDE_V2P (full_v2p int64),
// KV_WIDE_MAPPING (swa_v2p int64).
extern "C" __global__ void kv_cache_locs(
    const void* __restrict__ table, const void* __restrict__ req_pool_indices, const void* __restrict__ start_offset,
    const void* __restrict__ end_offset, void* __restrict__ out, void* __restrict__ positions_out,
    const void* __restrict__ full_v2p, void* __restrict__ full_out, const void* __restrict__ swa_v2p,
    void* __restrict__ swa_out, kv_i64 rows, kv_i64 cols, kv_i64 table_stride, kv_i64 out_len, kv_i64 width,
    kv_i64 pool_stride, kv_i64 start_stride, kv_i64 end_stride, kv_i64 full_v2p_len, kv_i64 swa_v2p_len,
    kv_i64 items, kv_i64 limit, kv_i64 page_size_arg, kv_i64 layout, kv_i64 flags) {
    KV_GRID_WAIT();
    const kv_i64 page_size = kv_specialised_page_size(page_size_arg), b = blockIdx.x;
    const kv_i64 program = kv_row_program(KV_HAS(KV_FOLDED_GRID));
    const kv_i64 step = kv_row_programs(KV_HAS(KV_FOLDED_GRID)) * items;
    const bool wide_start = (layout & KV_CACHE_LOCS_WIDE_START) != 0, wide_end = (layout & KV_CACHE_LOCS_WIDE_END) != 0;
    const bool wide_table = (layout & KV_CACHE_LOCS_WIDE_TABLE) != 0;
    const kv_i64 pool = kv_load_index(req_pool_indices, b * pool_stride, KV_HAS(KV_WIDE_POOL));
    const kv_i64 given_start = kv_load_index(start_offset, b * start_stride, wide_start);
    const kv_i64 start = kv_bounded(given_start);  // changes no position inside a row
    kv_i64 length = width, offset = b * width;
    if (layout & KV_CACHE_LOCS_PACKED) {
        length = kv_slice_length(given_start, kv_load_index(end_offset, b * end_stride, wide_end), limit);
        offset = kv_packed_offset(start_offset, start_stride, wide_start, end_offset, end_stride, wide_end, b, limit);
    }
    const bool readable = pool >= 0 && pool < rows;
    const kv_i64 begin = kv_max(-start, 0);  // the first entry whose position is in the row
    const kv_i64 stop = readable ? kv_min(kv_min(length, cols - start), out_len - offset) : 0;
    const kv_i64 row = readable ? pool * table_stride : 0;
    for (kv_i64 first = begin + program * items; first < stop; first += step) {
        const kv_i64 last = kv_min(first + items, stop);
        for (kv_i64 j = first + threadIdx.x; j < last; j += blockDim.x) {
            const kv_i64 position = start + j, destination = offset + j;
            const kv_i64 x = kv_load_index(table, row + position, wide_table);
            kv_store_index(out, destination, x, KV_HAS(KV_WIDE_OUT));
            if (KV_HAS(KV_POSITIONS)) kv_store_index(positions_out, destination, position, KV_HAS(KV_WIDE_POSITIONS));
            if (KV_HAS(KV_V2P))
                kv_store_index(full_out, destination,
                               kv_translated_value(x, page_size, full_v2p, full_v2p_len, KV_HAS(KV_WIDE_V2P)),
                               (layout & KV_CACHE_LOCS_WIDE_FULL_OUT) != 0);
            if (KV_HAS(KV_MAPPING))
                kv_store_index(swa_out, destination,
                               kv_translated_value(x, page_size, swa_v2p, swa_v2p_len, KV_HAS(KV_WIDE_MAPPING)),
                               (layout & KV_CACHE_LOCS_WIDE_SWA_OUT) != 0);
        }
    }
    KV_GRID_RELEASE();
}

// ---- The block table of a ragged token CSR (semantics: kvdispatch/ops/ragged_page_table.py,
// build_ragged_page_table) ----
//
// On the mapped tables' grid (kvdispatch.grid.mapped_page_table_launch): row b's tokens are kv_indices[s,
// min(e, total)) for s = kv_indptr[b], e = kv_indptr[b + 1] (none when s lies outside [0, total)); page p is
// there when p * page_size lies below that count, and its first token is written as kv_mha_page_table writes a
// slot: page_table[b, p] = slot / page_size (p < width), with KV_MAPPING swa[b, p] = mapping[clamp(slot, 0,
// mapping_len - 1)] / page_size (p < swa_width), both their low 32 bits. Everything else is left untouched.
// Flags: KV_WIDE_TOKENS, KV_WIDE_INDPTR, KV_MAPPING, KV_WIDE_MAPPING, KV_ROUND_TOWARD_ZERO, KV_FOLDED_GRID.
#define KV_WIDE_TOKENS KV_WIDE_POOL  // kv_indices is int64 (this kernel reads no pool indices)

extern "C" __global__ void kv_ragged_page_table(
    const void* __restrict__ kv_indices, const void* __restrict__ kv_indptr, int* __restrict__ page_table,
    int* __restrict__ swa_page_table, const void* __restrict__ full_to_swa, kv_i64 total, kv_i64 width,
    kv_i64 page_table_stride, kv_i64 swa_width, kv_i64 swa_stride, kv_i64 mapping_len, kv_i64 indptr_stride,
    kv_i64 items, kv_i64 page_size_arg, kv_i64 flags) {
    KV_GRID_WAIT();
    const kv_i64 page_size = kv_specialised_page_size(page_size_arg), b = blockIdx.x;
    const kv_i64 start = kv_load_index(kv_indptr, b * indptr_stride, KV_HAS(KV_WIDE_INDPTR));
    const kv_i64 end = kv_load_index(kv_indptr, (b + 1) * indptr_stride, KV_HAS(KV_WIDE_INDPTR));
    const bool readable = start >= 0 && start < total;
    const kv_i64 begin = readable ? start : 0;
    const kv_i64 limit = readable ? kv_min(kv_max(end, -1), total) - begin : 0;  // both in [-1, total]: exact
    const kv_i64 step = kv_row_programs(KV_HAS(KV_FOLDED_GRID)) * items;
    const bool swa = KV_HAS(KV_MAPPING), toward_zero = KV_HAS(KV_ROUND_TOWARD_ZERO);
    const kv_i64 pages_end = swa ? kv_max(width, swa_width) : width;
    for (kv_i64 first = kv_row_program(KV_HAS(KV_FOLDED_GRID)) * items;
         first < pages_end && first * page_size < limit; first += step) {
        const kv_i64 last = kv_min(first + items, pages_end), threads = blockDim.x;
        if (page_size == 1 && !swa && !KV_HAS(KV_WIDE_TOKENS)) {  // a copy of the row's slots: wide accesses
            kv_copy((const int*)kv_indices + begin + first, page_table + b * page_table_stride + first,
                    (int)(kv_min(last, limit) - first));
            continue;
        }
        for (kv_i64 base = first + threadIdx.x; base < last && base * page_size < limit;
             base += kv_page_unroll * threads) {
            kv_i64 slot[kv_page_unroll];
#pragma unroll
            for (int u = 0; u < kv_page_unroll; ++u) {
                const kv_i64 p = base + u * threads;
                slot[u] = p < last && p * page_size < limit
                    ? kv_load_index(kv_indices, begin + p * page_size, KV_HAS(KV_WIDE_TOKENS)) : 0;
            }
            kv_store_slot_pages(slot, base, last, limit, page_size, page_table + b * page_table_stride, width,
                                swa_page_table + b * swa_stride, swa ? swa_width : 0, full_to_swa, mapping_len,
                                KV_HAS(KV_WIDE_MAPPING), toward_zero);
        }
    }
    KV_GRID_RELEASE();
}

// ---- The prefill-aware sliding-window token table (semantics: kvdispatch/ops/pa_swa_table.py,
// build_pa_swa_table) ----
//
// On the mapped tables' grid at page size 1: row b's columns in blocks of `items`, program k handling blocks
// k, k + T, ...; program (b, 0) writes kv_lens[b]. With s = seq_lens[b], f = prefill_lens[pool] (0 outside
// [0, prefill_count)), both clamped into [-2**62, 2**62] so that no sum wraps: n = min(s, f + window) and
// gap = max(s - window - f, 0); out[b, j] = table[pool, j < f ? j : j + gap] for j < min(n, width) while that
// position lies below cols, on a readable row (0 <= pool < rows). Everything else is left untouched.
// Flags: KV_WIDE_POOL, KV_WIDE_LENS, KV_WIDE_PREFILL, KV_FOLDED_GRID.
#define KV_WIDE_PREFILL KV_WIDE_START  // prefill_lens is int64 (this kernel reads no start positions)

extern "C" __global__ void kv_pa_swa_table(
    const int* __restrict__ table, const void* __restrict__ req_pool_indices, const void* __restrict__ seq_lens,
    const void* __restrict__ prefill_lens, int* __restrict__ out, int* __restrict__ kv_lens, kv_i64 rows,
    kv_i64 cols, kv_i64 table_stride, kv_i64 prefill_count, kv_i64 width, kv_i64 out_stride, kv_i64 kv_lens_stride,
    kv_i64 window, kv_i64 pool_stride, kv_i64 lens_stride, kv_i64 items, kv_i64 flags) {
    KV_GRID_WAIT();
    const kv_i64 b = blockIdx.x, program = kv_row_program(KV_HAS(KV_FOLDED_GRID));
    const kv_i64 bound = 0x4000000000000000LL;  // 2**62
    const kv_i64 pool = kv_load_index(req_pool_indices, b * pool_stride, KV_HAS(KV_WIDE_POOL));
    const kv_i64 length = kv_min(kv_max(kv_load_index(seq_lens, b * lens_stride, KV_HAS(KV_WIDE_LENS)), -bound),
                                 bound);
    const kv_i64 prefill = pool >= 0 && pool < prefill_count
        ? kv_min(kv_max(kv_load_index(prefill_lens, pool, KV_HAS(KV_WIDE_PREFILL)), -bound), bound) : 0;
    const kv_i64 kept = kv_min(length, prefill + window);
    if (program == 0 && threadIdx.x == 0) kv_lens[b * kv_lens_stride] = (int)(kv_u64)kept;
    const kv_i64 gap = kv_max(length - window - kv_max(prefill, -bound / 2), 0);  // below -2**61: no token
    const kv_i64 limit = pool >= 0 && pool < rows ? kv_min(kept, width) : 0;
    const int* row = table + (limit > 0 ? pool * table_stride : 0);
    const kv_i64 step = kv_row_programs(KV_HAS(KV_FOLDED_GRID)) * items;
    for (kv_i64 first = program * items; first < limit; first += step) {
        const kv_i64 last = kv_min(first + items, limit);
        for (kv_i64 j = first + threadIdx.x; j < last; j += blockDim.x) {
            const kv_i64 position = j < prefill ? j : j + gap;
            if (position < cols) out[b * out_stride + j] = row[position];
        }
    }
    KV_GRID_RELEASE();
}

// ---- Two token CSRs merged row by row (semantics: kvdispatch/ops/merged_token_csr.py,
// build_merged_kv_indices) ----
//
// On the token CSR's grid: row b's entries in blocks of `items`, program k handling blocks k, k + T, ...
// Request i's prefix part: p_i = min(max(prefix_indptr[i + 1], -1), prefix_count) - s_i from s_i =
// prefix_indptr[i] (0 when s_i lies outside [0, prefix_count)), its extend part e_i = min(max(lens[i], -1),
// extend_count - t_i) from t_i = start[i] (0 when t_i lies outside [0, extend_count)), both at least 0, so every
// sum below is exact. Each program sums the earlier rows' lengths with its threads (the row's first entry);
// program (b, 0) writes indptr_out[b + 1] (and (0, 0) indptr_out[0] = 0).
// Flags: KV_WIDE_INDPTR (prefix_indptr), KV_WIDE_START (start), KV_WIDE_LENS (lens), KV_WIDE_TOKENS (prefix),
// KV_WIDE_EXTEND (extend), KV_WIDE_OUT (out), KV_WIDE_MAPPING (indptr_out), KV_FOLDED_GRID.
#define KV_WIDE_EXTEND KV_WIDE_POSITIONS  // extend is int64 (this kernel reads no positions)
struct kv_merged_parts {
    kv_i64 start, prefix, first, extend;
};

__device__ inline kv_merged_parts kv_merged_parts_of(const void* prefix_indptr, kv_i64 prefix_indptr_stride,
                                                     const void* start, kv_i64 start_stride, const void* lens,
                                                     kv_i64 lens_stride, kv_i64 i, kv_i64 prefix_count,
                                                     kv_i64 extend_count, kv_i64 flags) {
    kv_merged_parts r;
    r.start = kv_load_index(prefix_indptr, i * prefix_indptr_stride, KV_HAS(KV_WIDE_INDPTR));
    const kv_i64 end = kv_load_index(prefix_indptr, (i + 1) * prefix_indptr_stride, KV_HAS(KV_WIDE_INDPTR));
    r.prefix = r.start >= 0 && r.start < prefix_count ? kv_max(kv_min(kv_max(end, -1), prefix_count) - r.start, 0)
                                                      : 0;
    r.first = kv_load_index(start, i * start_stride, KV_HAS(KV_WIDE_START));
    const kv_i64 count = kv_min(kv_max(kv_load_index(lens, i * lens_stride, KV_HAS(KV_WIDE_LENS)), -1), extend_count);
    r.extend = r.first >= 0 && r.first < extend_count ? kv_max(kv_min(count, extend_count - r.first), 0) : 0;
    return r;
}

extern "C" __global__ void kv_merged_token_csr(
    const void* __restrict__ prefix_indptr, const void* __restrict__ prefix, const void* __restrict__ start,
    const void* __restrict__ lens, const void* __restrict__ extend, void* __restrict__ indptr_out,
    void* __restrict__ out, kv_i64 prefix_count, kv_i64 extend_count, kv_i64 total, kv_i64 prefix_indptr_stride,
    kv_i64 start_stride, kv_i64 lens_stride, kv_i64 items, kv_i64 flags) {
    KV_GRID_WAIT();
    const kv_i64 b = blockIdx.x, program = kv_row_program(KV_HAS(KV_FOLDED_GRID));
    kv_u64 partial = 0;
    for (kv_i64 i = threadIdx.x; i < b; i += blockDim.x) {
        const kv_merged_parts earlier = kv_merged_parts_of(prefix_indptr, prefix_indptr_stride, start, start_stride,
                                                           lens, lens_stride, i, prefix_count, extend_count, flags);
        partial += (kv_u64)(earlier.prefix + earlier.extend);
    }
    const kv_i64 begin = (kv_i64)kv_block_sum(partial, ~0ULL);
    const kv_merged_parts r = kv_merged_parts_of(prefix_indptr, prefix_indptr_stride, start, start_stride, lens,
                                                 lens_stride, b, prefix_count, extend_count, flags);
    const kv_i64 length = r.prefix + r.extend;
    const bool wide_indptr = KV_HAS(KV_WIDE_MAPPING), wide_out = KV_HAS(KV_WIDE_OUT);
    if (program == 0 && threadIdx.x == 0) {
        if (wide_indptr) ((kv_i64*)indptr_out)[b + 1] = begin + length;
        else ((int*)indptr_out)[b + 1] = (int)(kv_u64)(begin + length);
        if (b == 0) {
            if (wide_indptr) ((kv_i64*)indptr_out)[0] = 0;
            else ((int*)indptr_out)[0] = 0;
        }
    }
    const kv_i64 limit = kv_min(length, kv_max(total - begin, 0));
    const kv_i64 step = kv_row_programs(KV_HAS(KV_FOLDED_GRID)) * items;
    for (kv_i64 first = program * items; first < limit; first += step) {
        const kv_i64 last = kv_min(first + items, limit);
        for (kv_i64 j = first + threadIdx.x; j < last; j += blockDim.x) {
            const kv_i64 value = j < r.prefix ? kv_load_index(prefix, r.start + j, KV_HAS(KV_WIDE_TOKENS))
                                              : kv_load_index(extend, r.first + j - r.prefix, KV_HAS(KV_WIDE_EXTEND));
            if (wide_out) ((kv_i64*)out)[begin + j] = value;
            else ((int*)out)[begin + j] = (int)(kv_u64)value;
        }
    }
    KV_GRID_RELEASE();
}

// ---- Each draft token's row: its request's prefix row, then its expand row (semantics:
// kvdispatch/ops/spec_concat_page_table.py, build_spec_concat_page_table) ----
//
// On the mapped tables' grid at page size 1: row m's columns in blocks of `items`, program k handling blocks
// k, k + T, ... With la = lens_a[m / draft_tokens] and lb = lens_b[m] (clamped into [-2**62, 2**62]: the sum
// is exact): out[m, n] for n < min(la + lb, width) is a[m / draft_tokens, n] for n < la (0 from width_a on),
// then b[m, n - la] (0 from width_b on). Flags: KV_WIDE_POOL (lens_a), KV_WIDE_LENS (lens_b), KV_FOLDED_GRID.
extern "C" __global__ void kv_spec_concat_page_table(
    const int* __restrict__ a, const int* __restrict__ b, const void* __restrict__ lens_a,
    const void* __restrict__ lens_b, int* __restrict__ out, kv_i64 draft_tokens, kv_i64 width_a, kv_i64 a_stride,
    kv_i64 width_b, kv_i64 b_stride, kv_i64 width, kv_i64 out_stride, kv_i64 lens_a_stride, kv_i64 lens_b_stride,
    kv_i64 items, kv_i64 flags) {
    KV_GRID_WAIT();
    const kv_i64 m = blockIdx.x, request = m / draft_tokens, bound = 0x4000000000000000LL;  // 2**62
    const kv_i64 first = kv_min(kv_max(kv_load_index(lens_a, request * lens_a_stride, KV_HAS(KV_WIDE_POOL)), -bound),
                                bound);
    const kv_i64 second = kv_min(kv_max(kv_load_index(lens_b, m * lens_b_stride, KV_HAS(KV_WIDE_LENS)), -bound),
                                 bound);
    const kv_i64 limit = kv_min(first + second, width);
    const kv_i64 step = kv_row_programs(KV_HAS(KV_FOLDED_GRID)) * items;
    for (kv_i64 block = kv_row_program(KV_HAS(KV_FOLDED_GRID)) * items; block < limit; block += step) {
        const kv_i64 last = kv_min(block + items, limit);
        for (kv_i64 n = block + threadIdx.x; n < last; n += blockDim.x) {
            int value = 0;
            if (n < first) {
                if (n < width_a) value = a[request * a_stride + n];
            } else if (n - first < width_b) {
                value = b[m * b_stride + (n - first)];
            }
            out[m * out_stride + n] = value;
        }
    }
    KV_GRID_RELEASE();
}

// A draft model's compact token-table rows (kvdispatch.build_compact_draft_rows): the tables' and the verify
// slots' dtypes travel in the kernel's own `layout` argument.
enum { KV_COMPACT_DRAFT_WIDE_TARGET = 1, KV_COMPACT_DRAFT_WIDE_VERIFY = 2 };

// Request b = blockIdx.x, p = its pool index, n = its prefix length: column j < min(n + K, draft_cols) of draft
// row p gets target[p, start + j] for j < n (where that position lies in [0, target_cols)) and
// verify[b, j - n] after; nothing where p lies outside either table's rows or n < 0. Flags: KV_WIDE_POOL,
// KV_WIDE_LENS (draft_prefix_lens int64), KV_WIDE_START (suffix_start int64), KV_WIDE_OUT (the draft table
// int64), KV_FOLDED_GRID.
extern "C" __global__ void kv_compact_draft_rows(
    void* __restrict__ draft, const void* __restrict__ target, const void* __restrict__ req_pool_indices,
    const void* __restrict__ suffix_start, const void* __restrict__ draft_prefix_lens,
    const void* __restrict__ verify, kv_i64 draft_rows, kv_i64 draft_cols, kv_i64 draft_stride,
    kv_i64 target_rows, kv_i64 target_cols, kv_i64 target_stride, kv_i64 verify_width, kv_i64 verify_stride,
    kv_i64 pool_stride, kv_i64 start_stride, kv_i64 lens_stride, kv_i64 items, kv_i64 layout, kv_i64 flags) {
    KV_GRID_WAIT();
    const kv_i64 b = blockIdx.x;
    const kv_i64 program = kv_row_program(KV_HAS(KV_FOLDED_GRID));
    const kv_i64 step = kv_row_programs(KV_HAS(KV_FOLDED_GRID)) * items;
    const bool wide_target = (layout & KV_COMPACT_DRAFT_WIDE_TARGET) != 0;
    const bool wide_verify = (layout & KV_COMPACT_DRAFT_WIDE_VERIFY) != 0;
    const kv_i64 pool = kv_load_index(req_pool_indices, b * pool_stride, KV_HAS(KV_WIDE_POOL));
    const kv_i64 given_length = kv_load_index(draft_prefix_lens, b * lens_stride, KV_HAS(KV_WIDE_LENS));
    const kv_i64 start = kv_bounded(kv_load_index(suffix_start, b * start_stride, KV_HAS(KV_WIDE_START)));
    const bool valid = pool >= 0 && pool < draft_rows && pool < target_rows && given_length >= 0;
    const kv_i64 length = kv_min(given_length, draft_cols);
    const kv_i64 stop = valid ? kv_min(length + verify_width, draft_cols) : 0;
    const kv_i64 draft_row = valid ? pool * draft_stride : 0, target_row = valid ? pool * target_stride : 0;
    for (kv_i64 first = program * items; first < stop; first += step) {
        const kv_i64 last = kv_min(first + items, stop);
        for (kv_i64 j = first + threadIdx.x; j < last; j += blockDim.x) {
            if (j < length) {
                const kv_i64 position = start + j;
                if (position >= 0 && position < target_cols)
                    kv_store_index(draft, draft_row + j, kv_load_index(target, target_row + position, wide_target),
                                   KV_HAS(KV_WIDE_OUT));
            } else {
                kv_store_index(draft, draft_row + j, kv_load_index(verify, b * verify_stride + j - length, wide_verify),
                               KV_HAS(KV_WIDE_OUT));
            }
        }
    }
    KV_GRID_RELEASE();
}
