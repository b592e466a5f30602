// The float codec's encoder, one warp per chunk: the same bytes as the Rust reference
// (kernels/src/float.rs `encode`), which the emulation tests check byte for byte.
//
// Compiled like lz4.cu: by NVRTC for the GPU and by the host compiler with emu.h; it keeps
// to the same CUDA subset (threadIdx/blockIdx/gridDim .x, __shared__ arrays, __syncwarp,
// __ballot_sync, __shfl_sync).
//
// A chunk of `len` bytes with transform t (width w = 1 << (t / 2), rotate = t & 1) becomes
// one zstd frame (RFC 8878) of its transformed bytes: rotated left by one bit as a
// little-endian bit string when `rotate`, then split into w byte planes of n = len / w bytes
// (plane j holds byte j of every element), the len - n * w trailing bytes last. The
// transformed bytes are never materialised: byte p of them is read from the chunk where it
// comes from (`ckpt_tbyte`).
//
// Frame: magic, descriptor 0xA0 (4-byte content size, single segment, no checksum), the
// content size, then per plane (and the tail) blocks of at most 128 KiB, each
//   RLE        where every byte of it is the same,
//   compressed where it is at least 64 bytes, has no byte over 128 and Huffman coding makes
//              it smaller: a compressed literals section (four streams, the tree as direct
//              4-bit weights) and an empty sequences section,
//   raw        otherwise.
// Huffman code lengths: two-queue Huffman over the symbols sorted by (count, symbol), a leaf
// taken before an internal node of equal weight, lengths over 11 bits cut as JPEG Annex K.3
// does, then lengths handed out again longest first to the rarest symbols. Codes are zstd's
// canonical ones.
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
#define CKPT_F_FULL 0xffffffffu

// Byte p of the transformed chunk.
__device__ __forceinline__ u8 ckpt_tbyte(const u8* b, u32 len, u32 w, u32 n, u32 rot, u32 p)
{
    const u32 i = p < n * w ? (p % n) * w + p / n : p;
    if (!rot)
        return b[i];
    const u8 prev = b[i == 0 ? len - 1 : i - 1];
    return (u8)((b[i] << 1) | (prev >> 7));
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
                                               const u8* __restrict__ transforms,
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
    const u32 lane = threadIdx.x;

    for (u32 c = blockIdx.x; c < count; c += gridDim.x) {
        const u8* src = in + offs[c];
        u8* dst = out + out_offs[c];
        const u32 len = lens[c];
        const u32 t = transforms[c];
        const u32 w = 1u << (t / 2);
        const u32 rot = t & 1;
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
                const u8 first = ckpt_tbyte(src, len, w, n, rot, bs);
                bool differs = false, big = false;
                for (u32 p = lane; p < blen; p += 32) {
                    const u8 v = ckpt_tbyte(src, len, w, n, rot, bs + p);
                    differs |= v != first;
                    big |= v > CKPT_F_MAX_SYMBOL;
                }
                const bool any_differs = __ballot_sync(CKPT_F_FULL, differs) != 0;
                const bool any_big = __ballot_sync(CKPT_F_FULL, big) != 0;
                if (!any_differs) {
                    if (lane == 0) {
                        ckpt_block_header(dst + o, last, 1, blen);
                        dst[o + 3] = first;
                    }
                    o += 4;
                    continue;
                }
                bool huff = false;
                if (blen >= CKPT_F_MIN_HUFFMAN && !any_big) {
                    for (u32 s = 0; s < 256; s++)
                        rows[lane][s] = 0;
                    for (u32 p = lane; p < blen; p += 32)
                        rows[lane][ckpt_tbyte(src, len, w, n, rot, bs + p)]++;
                    __syncwarp();
                    for (u32 s = lane; s < 256; s += 32) {
                        u32 sum = 0;
                        for (u32 l = 0; l < 32; l++)
                            sum += rows[l][s];
                        hist[s] = sum;
                    }
                    __syncwarp();
                    if (lane == 0) {
                        ckpt_code_lengths(hist, clen);
                        u32 max_bits = 0, max_sym = 0;
                        for (u32 s = 0; s < 256; s++) {
                            if (clen[s] > max_bits)
                                max_bits = clen[s];
                            if (hist[s] > 0)
                                max_sym = s;
                        }
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
                    // Bits of each stream: segments of (blen + 3) / 4 symbols, the last the rest.
                    const u32 seg = (blen + 3) / 4;
                    u32 bits[4];
                    for (u32 k = 0; k < 4; k++) {
                        const u32 from = k * seg < blen ? k * seg : blen;
                        const u32 to = (k + 1) * seg < blen ? (k + 1) * seg : blen;
                        u32 b = 0;
                        for (u32 p = from + lane; p < to; p += 32)
                            b += clen[ckpt_tbyte(src, len, w, n, rot, bs + p)];
                        bits[k] = ckpt_warp_sum(b);
                    }
                    const u32 max_sym = plan[1];
                    const u32 hdr = blen <= 1023 ? 3 : blen <= 16383 ? 4 : 5;
                    const u32 field = hdr == 3 ? 10 : hdr == 4 ? 14 : 18;
                    const u32 tree = 1 + (max_sym + 1) / 2;
                    u32 sizes[4];
                    u32 streams = 0;
                    bool fits = true;
                    for (u32 k = 0; k < 4; k++) {
                        sizes[k] = (bits[k] + 1 + 7) / 8;
                        streams += sizes[k];
                        if (k < 3 && sizes[k] > 0xFFFF)
                            fits = false;
                    }
                    const u32 compressed = tree + 6 + streams;
                    if (compressed >= (1u << field))
                        fits = false;
                    const u32 content = hdr + compressed + 1;
                    huff = fits && content < blen;
                    if (huff) {
                        u8* d = dst + o;
                        if (lane == 0) {
                            ckpt_block_header(d, last, 2, content);
                            const u64 h = 2ull | ((u64)(hdr - 2) << 2) | ((u64)blen << 4) |
                                          ((u64)compressed << (4 + field));
                            for (u32 i = 0; i < hdr; i++)
                                d[3 + i] = (u8)(h >> (8 * i));
                            u8* tw = d + 3 + hdr;
                            tw[0] = (u8)(127 + max_sym);
                            const u32 mb = plan[0];
                            for (u32 s = 0; s < max_sym; s += 2) {
                                const u32 hi = clen[s] ? mb + 1 - clen[s] : 0;
                                const u32 lo = s + 1 < max_sym && clen[s + 1]
                                                   ? mb + 1 - clen[s + 1]
                                                   : 0;
                                tw[1 + s / 2] = (u8)((hi << 4) | lo);
                            }
                            u8* jt = tw + tree;
                            for (u32 k = 0; k < 3; k++) {
                                jt[2 * k] = (u8)sizes[k];
                                jt[2 * k + 1] = (u8)(sizes[k] >> 8);
                            }
                            d[3 + content - 1] = 0; // Number_of_Sequences
                        }
                        if (lane < 4) {
                            const u32 k = lane;
                            u32 at = 3 + hdr + tree + 6;
                            for (u32 q = 0; q < k; q++)
                                at += sizes[q];
                            const u32 from = k * seg < blen ? k * seg : blen;
                            const u32 to = (k + 1) * seg < blen ? (k + 1) * seg : blen;
                            u64 acc = 0;
                            u32 nb = 0;
                            // Last symbol first: the decoder reads the stream from its end.
                            for (u32 p = to; p-- > from;) {
                                const u8 v = ckpt_tbyte(src, len, w, n, rot, bs + p);
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
                        ckpt_block_header(dst + o, last, 0, blen);
                    for (u32 p = lane; p < blen; p += 32)
                        dst[o + 3 + p] = ckpt_tbyte(src, len, w, n, rot, bs + p);
                    o += 3 + blen;
                }
                __syncwarp();
            }
        }
        if (lane == 0)
            out_lens[c] = o;
        __syncwarp();
    }
}
