// The data path's other two passes over new bytes, one warp per piece: BLAKE3 of each chunk
// (bit-identical to the `blake3` crate) and the content-defined cutter's candidate bitmap
// (from which `kernels/src/cut.rs` picks exactly the cuts the CPU cutter makes).
//
// Compiled the same two ways as lz4.cu (NVRTC for the GPU, the host compiler with emu.h for
// the CPU emulation that CI runs), so keep to the same subset of CUDA.
//
// BLAKE3 (the specification's reference order): a piece is split into 1 KiB chunks; lane j
// compresses chunks j, j+32, ... to their chaining values (16 blocks of 64 bytes each, the
// chunk's index as counter), written to a per-piece scratch area in global memory; after a
// warp barrier lane 0 merges them with the reference's chaining-value stack (a chunk that
// completes an even number of chunks merges with the stack's top) and compresses the root
// with the ROOT flag. A piece of at most one chunk is hashed by lane 0 alone, its last block
// being the root. The merge is sequential: n - 1 parent compressions beside 16 n chunk
// compressions shared by 32 lanes; a tree-parallel merge is the next step if it shows.
//
// Gear candidates: FastCDC v2020's gear hash after byte i, written per byte as
// G_i = (G_{i-1} << 1) + gear[x_i] (the crate's two-bytes-a-step loop computes exactly this
// at odd bytes and G_i << 1 at even ones, tested against the mask shifted left by one; the
// masks leave bit 63 clear, so both tests are G_i & mask == 0). Bit i of the output is set
// where G_i & mask_s == 0 or G_i & mask_l == 0. G_i depends only on bytes i-63..i (earlier
// ones are shifted out), so lane j computes spans of SPAN_WORDS x 32 bytes starting from a
// hash warmed up over the 63 bytes before the span: any split gives the same bits. Positions
// within 63 bytes of the piece's start hash only the bytes from the start; the host walker
// never uses a candidate that close to a chunk's first tested byte (it hashes the first 64
// bytes after it itself, as the CPU cutter's fresh hash does).

typedef unsigned char u8;
typedef unsigned int u32;
typedef unsigned long long u64;

#define B3_BLOCK 64
#define B3_CHUNK 1024
#define B3_CHUNK_START 1u
#define B3_CHUNK_END 2u
#define B3_PARENT 4u
#define B3_ROOT 8u
// Chaining values a stack can hold: 2^54 chunks, far past any piece.
#define B3_STACK 54

__device__ static const u32 B3_IV[8] = {0x6A09E667u, 0xBB67AE85u, 0x3C6EF372u, 0xA54FF53Au,
                                        0x510E527Fu, 0x9B05688Cu, 0x1F83D9ABu, 0x5BE0CD19u};
__device__ static const u8 B3_PERM[16] = {2, 6, 3, 10, 7, 0, 4, 13, 1, 11, 12, 5, 9, 14, 15, 8};

__device__ __forceinline__ u32 b3_rotr(u32 x, u32 n) { return (x >> n) | (x << (32 - n)); }

__device__ __forceinline__ void b3_g(u32* s, int a, int b, int c, int d, u32 x, u32 y)
{
    s[a] = s[a] + s[b] + x;
    s[d] = b3_rotr(s[d] ^ s[a], 16);
    s[c] = s[c] + s[d];
    s[b] = b3_rotr(s[b] ^ s[c], 12);
    s[a] = s[a] + s[b] + y;
    s[d] = b3_rotr(s[d] ^ s[a], 8);
    s[c] = s[c] + s[d];
    s[b] = b3_rotr(s[b] ^ s[c], 7);
}

// The compression function; writes the first 8 words of the output (a chaining value, or
// the root hash's words).
__device__ static void b3_compress(const u32* cv, const u32* block, u64 counter, u32 len,
                                   u32 flags, u32* out)
{
    u32 s[16] = {cv[0],     cv[1],     cv[2],     cv[3],
                 cv[4],     cv[5],     cv[6],     cv[7],
                 B3_IV[0],  B3_IV[1],  B3_IV[2],  B3_IV[3],
                 (u32)counter, (u32)(counter >> 32), len, flags};
    u32 m[16], t[16];
    for (int i = 0; i < 16; i++)
        m[i] = block[i];
    for (int r = 0; r < 7; r++) {
        b3_g(s, 0, 4, 8, 12, m[0], m[1]);
        b3_g(s, 1, 5, 9, 13, m[2], m[3]);
        b3_g(s, 2, 6, 10, 14, m[4], m[5]);
        b3_g(s, 3, 7, 11, 15, m[6], m[7]);
        b3_g(s, 0, 5, 10, 15, m[8], m[9]);
        b3_g(s, 1, 6, 11, 12, m[10], m[11]);
        b3_g(s, 2, 7, 8, 13, m[12], m[13]);
        b3_g(s, 3, 4, 9, 14, m[14], m[15]);
        for (int i = 0; i < 16; i++)
            t[i] = m[B3_PERM[i]];
        for (int i = 0; i < 16; i++)
            m[i] = t[i];
    }
    for (int i = 0; i < 8; i++)
        out[i] = s[i] ^ s[i + 8];
}

// Little-endian words of `len` (<= 64) bytes at `p`, zero padded.
__device__ static void b3_load(const u8* p, u32 len, u32* w)
{
    for (int i = 0; i < 16; i++)
        w[i] = 0;
    for (u32 i = 0; i < len; i++)
        w[i / 4] |= (u32)p[i] << (8 * (i % 4));
}

// The chaining value of chunk `index` (`len` <= 1024 bytes at `p`); with `root`, the root
// words of a one-chunk input instead.
__device__ static void b3_chunk(const u8* p, u32 len, u64 index, bool root, u32* out)
{
    u32 cv[8], w[16];
    for (int i = 0; i < 8; i++)
        cv[i] = B3_IV[i];
    u32 blocks = len == 0 ? 1 : (len + B3_BLOCK - 1) / B3_BLOCK;
    for (u32 b = 0; b < blocks; b++) {
        u32 n = b + 1 < blocks ? B3_BLOCK : len - b * B3_BLOCK;
        b3_load(p + b * B3_BLOCK, n, w);
        u32 flags = (b == 0 ? B3_CHUNK_START : 0u) | (b + 1 == blocks ? B3_CHUNK_END : 0u);
        if (root && b + 1 == blocks)
            flags |= B3_ROOT;
        b3_compress(cv, w, index, n, flags, cv);
    }
    for (int i = 0; i < 8; i++)
        out[i] = cv[i];
}

__device__ static void b3_parent(const u32* left, const u32* right, u32 flags, u32* out)
{
    u32 block[16];
    for (int i = 0; i < 8; i++) {
        block[i] = left[i];
        block[i + 8] = right[i];
    }
    b3_compress(B3_IV, block, 0, B3_BLOCK, B3_PARENT | flags, out);
}

// Piece c is lens[c] bytes at in + offs[c]; its hash goes to out + 32 c. `cvs` + cv_offs[c]
// (in words) is scratch for 8 words per 1 KiB chunk of the piece.
extern "C" __global__ void ckpt_blake3(const u8* __restrict__ in, const u64* __restrict__ offs,
                                       const u32* __restrict__ lens, u32* __restrict__ cvs,
                                       const u64* __restrict__ cv_offs, u8* __restrict__ out,
                                       u32 count)
{
    const u32 lane = threadIdx.x;
    for (u32 c = blockIdx.x; c < count; c += gridDim.x) {
        const u8* src = in + offs[c];
        const u32 len = lens[c];
        const u32 chunks = len <= B3_CHUNK ? 1 : (len + B3_CHUNK - 1) / B3_CHUNK;
        u32* cv = cvs + cv_offs[c];
        u32 root[8];
        if (chunks > 1) {
            for (u32 k = lane; k < chunks; k += blockDim.x) {
                u32 n = k + 1 < chunks ? B3_CHUNK : len - k * B3_CHUNK;
                b3_chunk(src + (u64)k * B3_CHUNK, n, k, false, cv + 8 * (u64)k);
            }
        }
        __syncwarp();
        if (lane == 0) {
            if (chunks == 1) {
                b3_chunk(src, len, 0, true, root);
            } else {
                u32 stack[B3_STACK][8];
                u32 depth = 0;
                // Every chunk but the last: merge while the count of chunks so far is even.
                for (u32 k = 0; k + 1 < chunks; k++) {
                    u32 node[8];
                    for (int i = 0; i < 8; i++)
                        node[i] = cv[8 * (u64)k + i];
                    for (u64 total = (u64)k + 1; (total & 1) == 0; total >>= 1) {
                        depth--;
                        b3_parent(stack[depth], node, 0, node);
                    }
                    for (int i = 0; i < 8; i++)
                        stack[depth][i] = node[i];
                    depth++;
                }
                // The last chunk's value climbs the stack; the final parent is the root.
                u32 node[8];
                for (int i = 0; i < 8; i++)
                    node[i] = cv[8 * (u64)(chunks - 1) + i];
                while (depth > 1) {
                    depth--;
                    b3_parent(stack[depth], node, 0, node);
                }
                b3_parent(stack[0], node, B3_ROOT, root);
            }
            u8* o = out + 32 * (u64)c;
            for (int i = 0; i < 32; i++)
                o[i] = (u8)(root[i / 4] >> (8 * (i % 4)));
        }
        __syncwarp();
    }
}

// Words of 32 candidate bits a lane computes from one warm-up.
#define SPAN_WORDS 32

// Piece c is lens[c] bytes at in + offs[c]; bit i % 32 of bits[bit_offs[c] + i / 32] is
// set where G_i meets either mask (see above).
extern "C" __global__ void ckpt_gear_candidates(const u8* __restrict__ in,
                                                const u64* __restrict__ offs,
                                                const u32* __restrict__ lens,
                                                const u64* __restrict__ gear, u64 mask_s,
                                                u64 mask_l, u32* __restrict__ bits,
                                                const u64* __restrict__ bit_offs, u32 count)
{
    const u32 lane = threadIdx.x;
    for (u32 c = blockIdx.x; c < count; c += gridDim.x) {
        const u8* src = in + offs[c];
        const u32 len = lens[c];
        const u32 words = (len + 31) / 32;
        u32* out = bits + bit_offs[c];
        for (u32 w0 = lane * SPAN_WORDS; w0 < words; w0 += blockDim.x * SPAN_WORDS) {
            u32 start = w0 * 32;
            u64 h = 0;
            for (u32 i = start >= 63 ? start - 63 : 0; i < start; i++)
                h = (h << 1) + gear[src[i]];
            u32 w_end = w0 + SPAN_WORDS < words ? w0 + SPAN_WORDS : words;
            for (u32 w = w0; w < w_end; w++) {
                u32 word = 0;
                u32 base = w * 32;
                u32 n = base + 32 <= len ? 32 : len - base;
                for (u32 k = 0; k < n; k++) {
                    h = (h << 1) + gear[src[base + k]];
                    if ((h & mask_s) == 0 || (h & mask_l) == 0)
                        word |= 1u << k;
                }
                out[w] = word;
            }
        }
        __syncwarp();
    }
}
