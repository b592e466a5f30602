// The float codec's encoder, one warp per chunk: the same bytes as the Rust reference
// (kernels/src/float.rs `encode`), which the emulation tests check byte for byte.
//
// Compiled like lz4.cu: by NVRTC for the GPU and by the host compiler with emu.h; it keeps
// to the same CUDA subset (threadIdx/blockIdx/gridDim .x, __shared__ arrays, __syncwarp,
// __ballot_sync, __shfl_sync).
//
// A chunk of `len` bytes with plan p (transform t = p & 15: for t < 8 width w = 1 << (t / 2)
// and rotation r = t & 1 bits, for t = 8..11 w = 1 << (t - 8) and r = 3; coded planes: bit j
// of (p >> 4) & 255 for plane j; where bit 15 is set, plane (p >> 12) & 7 is tried with codes
// of one length for mask (p >> 16) & 255) becomes one zstd frame (RFC 8878) of its transformed bytes: rotated
// left by r bits as a little-endian bit string, then split into w byte planes of n = len / w bytes
// (plane j holds byte j of every element), the len - n * w trailing bytes last. The
// transformed bytes are never materialised: byte p of them is read from the chunk where it
// comes from (`ckpt_tbyte`).
//
// Frame: magic, descriptor 0xA0 (4-byte content size, single segment, no checksum), the
// content size, then per plane (and the tail) blocks of at most 128 KiB, each
//   under 64 bytes: RLE where every byte of it is the same, raw otherwise;
//   of a coded plane: RLE where every byte is the same (not tried for the fixed plane's
//              blocks whose bytes vary in exactly its mask: those get codes of one length,
//              the rank of the byte among the 2^v of its form, instead of a histogram's),
//              compressed where a tree describes it and Huffman coding makes it smaller: a compressed literals section (four
//              streams, the tree as direct 4-bit weights where every byte is at most 128
//              and that form is no longer, else FSE-coded weights) and an empty sequences
//              section; raw otherwise;
//   of any other piece: raw.
// Huffman code lengths: two-queue Huffman over the symbols sorted by (count, symbol), a leaf
// taken before an internal node of equal weight, lengths over 11 bits cut as JPEG Annex K.3
// does, then lengths handed out again longest first to the rarest symbols. Codes are zstd's
// canonical ones. FSE-coded weights: float.rs `fse_weights`, step for step.
//
// The parallel parts are the byte tests, the histogram (a row of counters per lane) and
// the stream sizes; the table is built by lane 0 and each of the four streams is written by
// one lane. (Bit packing across lanes is future work: this is the reference the GPU data path
// builds on, not yet its fast version.)

#ifndef CKPT_TYPES
#define CKPT_TYPES
typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef unsigned long long u64;
#endif

#define CKPT_F_BLOCK_MAX (128u << 10)
#define CKPT_F_MAX_BITS 11u
#define CKPT_F_MIN_HUFFMAN 64u
#define CKPT_F_MAX_SYMBOL 128u
#define CKPT_F_WEIGHT_LOG 6u
#define CKPT_F_MAX_TREE 127u
#define CKPT_F_FULL 0xffffffffu

// Byte p of the transformed chunk.
__device__ __forceinline__ u8 ckpt_tbyte(const u8* b, u32 len, u32 w, u32 n, u32 rot, u32 p)
{
    const u32 i = p < n * w ? (p % n) * w + p / n : p;
    if (!rot)
        return b[i];
    const u8 prev = b[i == 0 ? len - 1 : i - 1];
    return (u8)((b[i] << rot) | (prev >> (8 - rot)));
}

// AND and OR of v over the warp (butterfly), the same in every lane.
__device__ __forceinline__ void ckpt_warp_and_or(u32& a, u32& o)
{
    for (u32 m = 16; m > 0; m >>= 1) {
        a &= __shfl_sync(CKPT_F_FULL, a, (int)(threadIdx.x ^ m));
        o |= __shfl_sync(CKPT_F_FULL, o, (int)(threadIdx.x ^ m));
    }
}

// Sum of v over the warp (butterfly), the same in every lane.
__device__ __forceinline__ u32 ckpt_warp_sum(u32 v)
{
    for (u32 m = 16; m > 0; m >>= 1)
        v += __shfl_sync(CKPT_F_FULL, v, (int)(threadIdx.x ^ m));
    return v;
}

// Huffman code lengths of `hist` into `lens` (zero for absent symbols), at most 11 bits;
// the algorithm of float.rs `code_lengths`, step for step. Run by one lane.
__device__ void ckpt_code_lengths(const u32* hist, u8* lens)
{
    u32 cnt[256];
    u8 sym[256];
    u32 n = 0;
    for (u32 s = 0; s < 256; s++) {
        lens[s] = 0;
        if (hist[s] == 0)
            continue;
        // Insertion by (count, symbol): symbols arrive in increasing order.
        u32 k = n;
        while (k > 0 && cnt[k - 1] > hist[s]) {
            cnt[k] = cnt[k - 1];
            sym[k] = sym[k - 1];
            k--;
        }
        cnt[k] = hist[s];
        sym[k] = (u8)s;
        n++;
    }
    if (n == 1) {
        lens[sym[0]] = 1;
        return;
    }
    u64 weight[511];
    u16 parent[511];
    u8 depth[511];
    for (u32 i = 0; i < n; i++)
        weight[i] = cnt[i];
    u32 li = 0, ii = n, next = n;
    for (u32 m = 0; m + 1 < n; m++) {
        u32 ab[2];
        for (u32 t = 0; t < 2; t++) {
            if (ii >= next || (li < n && weight[li] <= weight[ii]))
                ab[t] = li++;
            else
                ab[t] = ii++;
        }
        weight[next] = weight[ab[0]] + weight[ab[1]];
        parent[ab[0]] = (u16)next;
        parent[ab[1]] = (u16)next;
        next++;
    }
    const u32 root = 2 * n - 2;
    depth[root] = 0;
    for (u32 v = root; v-- > 0;)
        depth[v] = (u8)(depth[parent[v]] + 1);
    u32 per_len[256];
    for (u32 i = 0; i < 256; i++)
        per_len[i] = 0;
    for (u32 i = 0; i < n; i++)
        per_len[depth[i]]++;
    for (u32 i = 255; i > CKPT_F_MAX_BITS; i--) {
        while (per_len[i] > 0) {
            u32 j = i - 2;
            while (per_len[j] == 0)
                j--;
            per_len[i] -= 2;
            per_len[i - 1] += 1;
            per_len[j + 1] += 2;
            per_len[j] -= 1;
        }
    }
    u32 at = 0;
    for (u32 len = CKPT_F_MAX_BITS; len >= 1; len--)
        for (u32 k = 0; k < per_len[len]; k++)
            lens[sym[at++]] = (u8)len;
}

// A bit writer as zstd's decoders read a bitstream backwards: bits fill a word from its low
// end, whole bytes go out as they fill.
struct CkptBits {
    u8* out;
    u32 len;
    u32 cap;
    u64 acc;
    u32 n;
};

__device__ __forceinline__ void ckpt_bits_put(CkptBits* b, u32 v, u32 len)
{
    b->acc |= (u64)v << b->n;
    b->n += len;
    while (b->n >= 8) {
        if (b->len < b->cap)
            b->out[b->len] = (u8)b->acc;
        b->len++;
        b->acc >>= 8;
        b->n -= 8;
    }
}

// The last partial byte (no end mark).
__device__ __forceinline__ void ckpt_bits_bytes(CkptBits* b)
{
    if (b->n > 0) {
        if (b->len < b->cap)
            b->out[b->len] = (u8)b->acc;
        b->len++;
        b->acc = 0;
        b->n = 0;
    }
}

// The weights of symbols 0..nw-1 as an FSE-coded tree description (header byte, table
// description, two-state bitstream) into `out` (room for 128 bytes); its length, or 0 where
// it cannot be coded or takes 128 bytes or more. float.rs `fse_weights`, step for step.
__device__ u32 ckpt_fse_weights(const u8* weights, u32 nw, u8* out)
{
    if (nw < 3)
        return 0;
    u32 counts[16];
    for (u32 v = 0; v < 16; v++)
        counts[v] = 0;
    for (u32 i = 0; i < nw; i++)
        counts[weights[i]]++;
    const u32 table = 1u << CKPT_F_WEIGHT_LOG;
    u32 present = 0;
    for (u32 v = 0; v < 16; v++)
        present += counts[v] > 0;
    if (present < 2)
        return 0;
    u32 norm[16];
    u32 sum = 0;
    for (u32 v = 0; v < 16; v++) {
        norm[v] = counts[v] == 0 ? 0 : (counts[v] * table / nw > 0 ? counts[v] * table / nw : 1);
        sum += norm[v];
    }
    if (sum < table) {
        u32 top = 0;
        for (u32 v = 0; v < 16; v++)
            if (counts[v] > counts[top])
                top = v;
        norm[top] += table - sum;
        sum = table;
    }
    while (sum > table) {
        u32 top = 0;
        for (u32 v = 0; v < 16; v++)
            if (norm[v] > norm[top])
                top = v;
        norm[top]--;
        sum--;
    }
    u8 cell_value[64];
    u32 pos = 0;
    const u32 step = (table >> 1) + (table >> 3) + 3;
    for (u32 v = 0; v < 16; v++)
        for (u32 k = 0; k < norm[v]; k++) {
            cell_value[pos] = (u8)v;
            pos = (pos + step) & (table - 1);
        }
    u32 first[17];
    first[0] = 0;
    for (u32 v = 0; v < 16; v++)
        first[v + 1] = first[v] + norm[v];
    u32 fill[16];
    for (u32 v = 0; v < 16; v++)
        fill[v] = first[v];
    u8 cells[64];
    for (u32 u = 0; u < table; u++)
        cells[fill[cell_value[u]]++] = (u8)u;

    // Table description.
    CkptBits b = {out + 1, 0, CKPT_F_MAX_TREE, 0, 0};
    ckpt_bits_put(&b, CKPT_F_WEIGHT_LOG - 5, 4);
    int remaining = (int)table + 1, threshold = (int)table;
    u32 nb = CKPT_F_WEIGHT_LOG + 1;
    u32 s = 0;
    bool after_zero = false;
    while (remaining > 1) {
        if (after_zero) {
            u32 start = s;
            while (norm[s] == 0)
                s++;
            while (s >= start + 3) {
                ckpt_bits_put(&b, 3, 2);
                start += 3;
            }
            ckpt_bits_put(&b, s - start, 2);
        }
        const int pr = (int)norm[s];
        s++;
        const int max = 2 * threshold - 1 - remaining;
        remaining -= pr;
        int v = pr + 1;
        if (v >= threshold)
            v += max;
        ckpt_bits_put(&b, (u32)v, v < max ? nb - 1 : nb);
        after_zero = v == 1;
        while (remaining < threshold) {
            nb--;
            threshold >>= 1;
        }
    }
    ckpt_bits_bytes(&b);

    // Bitstream: from the last weight to the first; state 0 codes even positions.
    u32 state[2];
    state[(nw - 1) % 2] = table + cells[first[weights[nw - 1]]];
    state[(nw - 2) % 2] = table + cells[first[weights[nw - 2]]];
    for (u32 i = nw - 2; i-- > 0;) {
        u32 x = state[i % 2];
        const u32 v = weights[i];
        const u32 pr = norm[v];
        u32 k = 0;
        while ((x >> k) >= 2 * pr)
            k++;
        ckpt_bits_put(&b, x & ((1u << k) - 1), k);
        state[i % 2] = table + cells[first[v] + (x >> k) - pr];
    }
    ckpt_bits_put(&b, state[1] - table, CKPT_F_WEIGHT_LOG);
    ckpt_bits_put(&b, state[0] - table, CKPT_F_WEIGHT_LOG);
    ckpt_bits_put(&b, 1, 1);
    ckpt_bits_bytes(&b);
    if (b.len > CKPT_F_MAX_TREE)
        return 0;
    out[0] = (u8)b.len;
    return 1 + b.len;
}

// The tree description of `clen` (symbols 0..max_sym, codes at most mb bits) into `out`
// (room for 129 bytes): direct 4-bit weights where max_sym <= 128 and that is no longer
// than the FSE form, else the FSE form; its length, 0 where neither describes it.
// float.rs `tree_description`.
__device__ u32 ckpt_tree(const u8* clen, u32 max_sym, u32 mb, u8* out)
{
    u8 weights[256] = {0};
    for (u32 s = 0; s < max_sym; s++)
        weights[s] = clen[s] ? (u8)(mb + 1 - clen[s]) : 0;
    u8 fse[128];
    const u32 fse_len = ckpt_fse_weights(weights, max_sym, fse);
    const u32 direct_len = 1 + (max_sym + 1) / 2;
    if (max_sym <= CKPT_F_MAX_SYMBOL && (fse_len == 0 || direct_len <= fse_len)) {
        out[0] = (u8)(127 + max_sym);
        for (u32 s = 0; s < max_sym; s += 2)
            out[1 + s / 2] = (u8)((weights[s] << 4) | (s + 1 < max_sym ? weights[s + 1] : 0));
        return direct_len;
    }
    for (u32 i = 0; i < fse_len; i++)
        out[i] = fse[i];
    return fse_len;
}

// Writes a 3-byte block header.
__device__ __forceinline__ void ckpt_block_header(u8* d, u32 last, u32 kind, u32 size)
{
    const u32 h = last | (kind << 1) | (size << 3);
    d[0] = (u8)h;
    d[1] = (u8)(h >> 8);
    d[2] = (u8)(h >> 16);
}

// Upper bound of a chunk's frame: every block raw (3 bytes of header each) plus the frame
// header; `ckpt_float_compress` needs this much room per chunk.
__device__ __forceinline__ u64 ckpt_float_bound(u32 len)
{
    return (u64)len + 9 + 3 * ((u64)(len >> 17) + 10);
}

extern "C" __global__ void ckpt_float_compress(const u8* __restrict__ in,
                                               const u64* __restrict__ offs,
                                               const u32* __restrict__ lens,
                                               const u32* __restrict__ plans,
                                               u8* __restrict__ out,
                                               const u64* __restrict__ out_offs,
                                               u32* __restrict__ out_lens,
                                               u32 count)
{
    __shared__ u16 rows[32][256];
    __shared__ u32 hist[256];
    __shared__ u8 clen[256];
    __shared__ u32 code[256];
    __shared__ u32 plan[8]; // lane 0's decision, read by every lane after a barrier
    __shared__ u8 tree[130];
    const u32 lane = threadIdx.x;

    for (u32 c = blockIdx.x; c < count; c += gridDim.x) {
        const u8* src = in + offs[c];
        u8* dst = out + out_offs[c];
        const u32 len = lens[c];
        const u32 t = plans[c] & 15u;
        const u32 coded_planes = (plans[c] >> 4) & 255u;
        const bool has_fixed = (plans[c] >> 15) & 1u;
        const u32 fixed_plane = (plans[c] >> 12) & 7u;
        const u32 fixed_mask = (plans[c] >> 16) & 255u;
        const u32 w = t < 8 ? 1u << (t / 2) : 1u << (t - 8);
        const u32 rot = t < 8 ? t & 1 : 3;
        const u32 n = len / w;

        if (lane == 0) {
            const u32 magic = 0xFD2FB528u;
            for (u32 i = 0; i < 4; i++) {
                dst[i] = (u8)(magic >> (8 * i));
                dst[5 + i] = (u8)(len >> (8 * i));
            }
            dst[4] = 0xA0;
        }
        u32 o = 9;
        // Pieces: the w planes (when n > 0), then the tail (when there is one).
        const u32 tail = len - n * w;
        const u32 pieces = (n > 0 ? w : 0) + (tail > 0 ? 1 : 0);
        if (pieces == 0) {
            if (lane == 0)
                ckpt_block_header(dst + o, 1, 0, 0);
            o += 3;
        }
        for (u32 pc = 0; pc < pieces; pc++) {
            const u32 pat = n > 0 && pc < w ? pc * n : n * w;
            const u32 plen = n > 0 && pc < w ? n : tail;
            for (u32 bs = pat; bs < pat + plen; bs += CKPT_F_BLOCK_MAX) {
                const u32 blen = pat + plen - bs < CKPT_F_BLOCK_MAX ? pat + plen - bs
                                                                      : CKPT_F_BLOCK_MAX;
                const u32 last = pc + 1 == pieces && bs + blen == pat + plen;
                const u32 j = n > 0 && pc < w ? pc : w; // plane index; w: the tail
                const bool coded = j < w && ((coded_planes >> j) & 1u);
                if (blen < CKPT_F_MIN_HUFFMAN) {
                    const u8 first = ckpt_tbyte(src, len, w, n, rot, bs);
                    bool differs = false;
                    for (u32 p = lane; p < blen; p += 32)
                        differs |= ckpt_tbyte(src, len, w, n, rot, bs + p) != first;
                    if (__ballot_sync(CKPT_F_FULL, differs) == 0) {
                        if (lane == 0) {
                            ckpt_block_header(dst + o, last, 1, blen);
                            dst[o + 3] = first;
                        }
                        o += 4;
                        continue;
                    }
                }
                bool huff = false;
                // The block's bytes: all of them, or all but the first where the fixed
                // plane's first byte alone breaks its form (it goes into a raw block of its
                // own before them; see float.rs `encode_block`).
                u32 b0 = bs, bl = blen;
                if (bl >= CKPT_F_MIN_HUFFMAN && coded) {
                    // The fixed plane's block: the bits its bytes vary in.
                    bool fixed = false;
                    u32 constant = 0;
                    if (has_fixed && j == fixed_plane) {
                        // AND and OR of the bytes after the first, then with it.
                        u32 a = 255, or_ = 0;
                        for (u32 p = 1 + lane; p < bl; p += 32) {
                            const u32 v = ckpt_tbyte(src, len, w, n, rot, b0 + p);
                            a &= v;
                            or_ |= v;
                        }
                        ckpt_warp_and_or(a, or_);
                        const u32 first = ckpt_tbyte(src, len, w, n, rot, b0);
                        const bool whole = ((or_ | first) & ~(a & first) & 255u) == fixed_mask;
                        const bool rest = bl > CKPT_F_MIN_HUFFMAN && (or_ & ~a & 255u) == fixed_mask;
                        fixed = whole || rest;
                        constant = a & ~fixed_mask & 255u;
                        if (fixed && !whole) {
                            if (lane == 0) {
                                ckpt_block_header(dst + o, 0, 0, 1);
                                dst[o + 3] = (u8)first;
                            }
                            o += 4;
                            b0 += 1;
                            bl -= 1;
                        }
                    }
                    if (fixed) {
                        if (lane == 0) {
                            u32 v = 0;
                            for (u32 b = 0; b < 8; b++)
                                v += (fixed_mask >> b) & 1u;
                            for (u32 s = 0; s < 256; s++)
                                clen[s] = (s & ~fixed_mask) == constant ? (u8)v : 0;
                        }
                    } else {
                        for (u32 s = 0; s < 256; s++)
                            rows[lane][s] = 0;
                        for (u32 p = lane; p < bl; p += 32)
                            rows[lane][ckpt_tbyte(src, len, w, n, rot, b0 + p)]++;
                        __syncwarp();
                        for (u32 s = lane; s < 256; s += 32) {
                            u32 sum = 0;
                            for (u32 l = 0; l < 32; l++)
                                sum += rows[l][s];
                            hist[s] = sum;
                        }
                        __syncwarp();
                        if (lane == 0) {
                            u32 distinct = 0, one = 0;
                            for (u32 s = 0; s < 256; s++)
                                if (hist[s] > 0) {
                                    distinct++;
                                    one = s;
                                }
                            plan[3] = distinct;
                            plan[4] = one;
                        }
                        __syncwarp();
                        if (plan[3] == 1) {
                            if (lane == 0) {
                                ckpt_block_header(dst + o, last, 1, bl);
                                dst[o + 3] = (u8)plan[4];
                            }
                            o += 4;
                            __syncwarp();
                            continue;
                        }
                        if (lane == 0)
                            ckpt_code_lengths(hist, clen);
                    }
                    __syncwarp();
                    if (lane == 0) {
                        u32 max_bits = 0, max_sym = 0;
                        for (u32 s = 0; s < 256; s++) {
                            if (clen[s] > max_bits)
                                max_bits = clen[s];
                            if (clen[s] > 0)
                                max_sym = s;
                        }
                        plan[2] = ckpt_tree(clen, max_sym, max_bits, tree);
                        u32 next = 0;
                        for (u32 l = max_bits; l >= 1; l--)
                            for (u32 s = 0; s <= max_sym; s++)
                                if (clen[s] == l) {
                                    code[s] = next >> (max_bits - l);
                                    next += 1u << (max_bits - l);
                                }
                        plan[0] = max_bits;
                        plan[1] = max_sym;
                    }
                    __syncwarp();
                    // Bits of each stream: segments of (bl + 3) / 4 symbols, the last the rest.
                    const u32 seg = (bl + 3) / 4;
                    u32 bits[4];
                    for (u32 k = 0; k < 4; k++) {
                        const u32 from = k * seg < bl ? k * seg : bl;
                        const u32 to = (k + 1) * seg < bl ? (k + 1) * seg : bl;
                        u32 b = 0;
                        for (u32 p = from + lane; p < to; p += 32)
                            b += clen[ckpt_tbyte(src, len, w, n, rot, b0 + p)];
                        bits[k] = ckpt_warp_sum(b);
                    }
                    const u32 hdr = bl <= 1023 ? 3 : bl <= 16383 ? 4 : 5;
                    const u32 field = hdr == 3 ? 10 : hdr == 4 ? 14 : 18;
                    const u32 tree_len = plan[2];
                    u32 sizes[4];
                    u32 streams = 0;
                    bool fits = tree_len > 0;
                    for (u32 k = 0; k < 4; k++) {
                        sizes[k] = (bits[k] + 1 + 7) / 8;
                        streams += sizes[k];
                        if (k < 3 && sizes[k] > 0xFFFF)
                            fits = false;
                    }
                    const u32 compressed = tree_len + 6 + streams;
                    if (compressed >= (1u << field))
                        fits = false;
                    const u32 content = hdr + compressed + 1;
                    huff = fits && content < bl;
                    if (huff) {
                        u8* d = dst + o;
                        if (lane == 0) {
                            ckpt_block_header(d, last, 2, content);
                            const u64 h = 2ull | ((u64)(hdr - 2) << 2) | ((u64)bl << 4) |
                                          ((u64)compressed << (4 + field));
                            for (u32 i = 0; i < hdr; i++)
                                d[3 + i] = (u8)(h >> (8 * i));
                            u8* tw = d + 3 + hdr;
                            for (u32 i = 0; i < tree_len; i++)
                                tw[i] = tree[i];
                            u8* jt = tw + tree_len;
                            for (u32 k = 0; k < 3; k++) {
                                jt[2 * k] = (u8)sizes[k];
                                jt[2 * k + 1] = (u8)(sizes[k] >> 8);
                            }
                            d[3 + content - 1] = 0; // Number_of_Sequences
                        }
                        if (lane < 4) {
                            const u32 k = lane;
                            u32 at = 3 + hdr + tree_len + 6;
                            for (u32 q = 0; q < k; q++)
                                at += sizes[q];
                            const u32 from = k * seg < bl ? k * seg : bl;
                            const u32 to = (k + 1) * seg < bl ? (k + 1) * seg : bl;
                            u64 acc = 0;
                            u32 nb = 0;
                            // Last symbol first: the decoder reads the stream from its end.
                            for (u32 p = to; p-- > from;) {
                                const u8 v = ckpt_tbyte(src, len, w, n, rot, b0 + p);
                                acc |= (u64)code[v] << nb;
                                nb += clen[v];
                                while (nb >= 8) {
                                    d[at++] = (u8)acc;
                                    acc >>= 8;
                                    nb -= 8;
                                }
                            }
                            acc |= 1ull << nb; // end mark
                            nb += 1;
                            while (nb > 0) {
                                d[at++] = (u8)acc;
                                acc >>= 8;
                                nb = nb > 8 ? nb - 8 : 0;
                            }
                        }
                        __syncwarp();
                        o += 3 + content;
                    }
                }
                if (!huff) {
                    if (lane == 0)
                        ckpt_block_header(dst + o, last, 0, bl);
                    for (u32 p = lane; p < bl; p += 32)
                        dst[o + 3 + p] = ckpt_tbyte(src, len, w, n, rot, b0 + p);
                    o += 3 + bl;
                }
                __syncwarp();
            }
        }
        if (lane == 0)
            out_lens[c] = o;
        __syncwarp();
    }
}
