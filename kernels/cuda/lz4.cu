// LZ4 block compression and decompression, one warp per chunk.
//
// Compiled twice from this one file: by NVRTC at run time for the GPU (kernels/src/gpu.rs),
// and by the host C++ compiler with emu.h, which defines the CUDA built-ins used here, so the
// same logic is tested on machines without a GPU (kernels/src/emu.rs). Keep to that subset:
// threadIdx/blockIdx/blockDim/gridDim .x, __shared__ arrays, __syncwarp, __ballot_sync,
// __shfl_sync, __match_any_sync, __ffs, __clz.
//
// Output is the standard LZ4 block format (lz4_flex and liblz4 decode it):
//   sequence = token (4 bits literal length, 4 bits match length - 4), length extension bytes,
//   literals, 2-byte little-endian offset, match length extension bytes; the last sequence is
//   literals only. A match starts at least 12 bytes before the end of the block and ends at
//   least 5 bytes before it (the format's end-of-block rules).
//
// Compression (the parallel part is match finding, in the manner of SIMD string matching):
// the 32 lanes of a warp look at 32 consecutive positions at once. Each lane hashes the 5
// bytes at its position (as lz4_flex does for chunks of 64 KiB: candidates that agree on a
// fifth byte give longer matches in float data), looks up the most recent earlier position
// with that hash in a table in shared memory, and checks the 4 bytes there. A warp vote picks
// the first lane with a match; the match is then extended 32 bytes per step, each lane
// comparing one byte and a vote finding the first mismatch. The lanes write the sequence
// together (literals copied in parallel), and the window moves past the match, or by 32
// positions if no lane matched. A lane whose 4 bytes repeat those of a lower lane takes that
// lane as candidate too (runs of a byte value), and a match is extended backwards over equal
// literals, as LZ4 does. The table learns the window's positions up to the match and the
// match's last two positions; where lanes share a hash, the highest position wins, so the
// output is deterministic: the emulation and every GPU produce the same bytes.
//
// The table holds the low 16 bits of positions (4096 entries, 8 KiB of shared memory per
// warp). A candidate is reconstructed as the latest position with those low bits below the
// current one; since a candidate is always verified byte for byte, a stale or aliased entry
// can only cost a missed match, never a wrong one, also in chunks over 64 KiB.

typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef unsigned long long u64;

#define CKPT_FULL 0xffffffffu
#define CKPT_NONE 0xffffffffu
#define CKPT_HASH_LOG 12
#define CKPT_HASH_SIZE (1u << CKPT_HASH_LOG)
#define CKPT_MIN_MATCH 4u
#define CKPT_LAST_LITERALS 5u
#define CKPT_MFLIMIT 12u

__device__ __forceinline__ u32 ckpt_load32(const u8* p)
{
    return (u32)p[0] | ((u32)p[1] << 8) | ((u32)p[2] << 16) | ((u32)p[3] << 24);
}

// Hash of the 5 bytes at p (as lz4_flex hashes for chunks of 64 KiB and more): candidates
// that agree on a fifth byte tend to give longer matches in float data.
__device__ __forceinline__ u32 ckpt_hash5(const u8* p)
{
    const u64 v = (u64)ckpt_load32(p) | ((u64)p[4] << 32);
    return (u32)(((v << 24) * 889523592379ull) >> (64 - CKPT_HASH_LOG));
}

// Bytes of a length field's extension for length `v` in a 4-bit token field.
__device__ __forceinline__ u32 ckpt_ext_bytes(u32 v)
{
    return v >= 15 ? (v - 15) / 255 + 1 : 0;
}

// Writes the extension bytes of `v` (>= 15) at dst, lanes in parallel: (v-15)/255 bytes of
// 255, then the remainder.
__device__ __forceinline__ void ckpt_write_ext(u8* dst, u32 v, u32 lane)
{
    if (v < 15)
        return;
    u32 r = v - 15;
    u32 full = r / 255;
    for (u32 i = lane; i <= full; i += 32)
        dst[i] = i < full ? 255 : (u8)(r - full * 255);
}

extern "C" __global__ void ckpt_lz4_compress(const u8* __restrict__ in,
                                             const u64* __restrict__ offs,
                                             const u32* __restrict__ lens,
                                             u8* __restrict__ out,
                                             u32* __restrict__ out_lens,
                                             u32 count)
{
    __shared__ u16 table[CKPT_HASH_SIZE];
    const u32 lane = threadIdx.x;

    for (u32 c = blockIdx.x; c < count; c += gridDim.x) {
        const u8* src = in + offs[c];
        u8* dst = out + offs[c];
        const u32 n = lens[c];
        // Positions that may start a match, and where a match must end at the latest.
        const u32 mlimit = n >= CKPT_MFLIMIT ? n - CKPT_MFLIMIT + 1 : 0;
        const u32 mend = n - CKPT_LAST_LITERALS;

        for (u32 i = lane; i < CKPT_HASH_SIZE; i += 32)
            table[i] = 0;
        __syncwarp();

        // All lanes keep the same copies of these (warp-uniform control flow).
        u32 op = 0;
        u32 anchor = 0;
        u32 pos = 0;
        bool raw = false;

        while (pos < mlimit) {
            const u32 p = pos + lane;
            const bool valid = p < mlimit;
            u32 h = CKPT_NONE;
            u32 v = 0;
            u32 cand = 0;
            bool ok = false;
            if (valid) {
                v = ckpt_load32(src + p);
                h = ckpt_hash5(src + p);
                const u32 dist = (p - (u32)table[h]) & 0xffffu;
                ok = dist != 0 && dist <= p && ckpt_load32(src + p - dist) == v;
                cand = p - dist;
            }
            // Repeats within the window are not in the table yet: the nearest lower lane
            // holding the same 4 bytes is a candidate too. This is what finds a run of one
            // byte value at offset 1 from its second byte on (without it, runs of bytes other
            // than zero cost a window of literals each: three times lz4_flex's size on data
            // of short runs). Lanes below a valid lane are valid, so only real values match.
            const u32 same = __match_any_sync(CKPT_FULL, v) & ((1u << lane) - 1u);
            if (valid && same != 0) {
                const u32 near = pos + 31 - (u32)__clz(same);
                if (!ok || near > cand) {
                    ok = true;
                    cand = near;
                }
            }
            const u32 found = __ballot_sync(CKPT_FULL, ok);
            // The first lane with a match; positions after it are inside the match (and
            // inserted below) or come after it and are looked at again by the next window:
            // inserting them now would make them their own candidates.
            const u32 m = found != 0 ? (u32)__ffs(found) - 1 : 31;
            const bool ins = valid && lane <= m;
            const u32 peers = __match_any_sync(CKPT_FULL, ins ? h : CKPT_NONE);
            // Every lane has read the table before any lane writes it.
            __syncwarp();
            if (ins && (peers >> lane) == 1u)
                table[h] = (u16)p;
            __syncwarp();

            if (found == 0) {
                pos += 32;
                continue;
            }
            u32 mp = pos + m;
            u32 mc = __shfl_sync(CKPT_FULL, cand, m);
            // Extend the match backwards over literals that match too (as LZ4 does): the
            // candidate found may start after the repeat does, when the repeat's first
            // positions were inside an earlier match and never entered the table.
            u32 back = 0;
            while (mp - back > anchor && mc - back > 0 && src[mp - back - 1] == src[mc - back - 1])
                back++;
            mp -= back;
            mc -= back;

            // Extend the match 32 bytes per step; lanes past `mend` count as a mismatch.
            u32 len = CKPT_MIN_MATCH + back;
            for (;;) {
                const u32 q = mp + len + lane;
                const bool differs = q >= mend || src[q] != src[mc + len + lane];
                const u32 d = __ballot_sync(CKPT_FULL, differs);
                if (d != 0) {
                    len += (u32)__ffs(d) - 1;
                    break;
                }
                len += 32;
            }

            const u32 lit = mp - anchor;
            const u32 ml = len - CKPT_MIN_MATCH;
            const u32 lit_ext = ckpt_ext_bytes(lit);
            const u32 need = 1 + lit_ext + lit + 2 + ckpt_ext_bytes(ml);
            // Not smaller than the chunk: stop, the chunk is stored raw. The output slot is
            // as large as the chunk, so nothing past it is ever written.
            if (op + need >= n) {
                raw = true;
                break;
            }
            u32 o = op;
            if (lane == 0)
                dst[o] = (u8)(((lit >= 15 ? 15 : lit) << 4) | (ml >= 15 ? 15 : ml));
            ckpt_write_ext(dst + o + 1, lit, lane);
            o += 1 + lit_ext;
            for (u32 i = lane; i < lit; i += 32)
                dst[o + i] = src[anchor + i];
            o += lit;
            if (lane == 0) {
                const u32 off = mp - mc;
                dst[o] = (u8)(off & 0xff);
                dst[o + 1] = (u8)(off >> 8);
            }
            o += 2;
            ckpt_write_ext(dst + o, ml, lane);
            op = o + ckpt_ext_bytes(ml);
            pos = mp + len;
            anchor = pos;

            // Insert the match's last two positions, as LZ4 does: the next repeat of this
            // text is likely to be found there. Inserting more of the match's tail made
            // data with repeats at scattered offsets compress worse (later repeats were
            // pointed at copies that end sooner than the original); inserting none made float
            // weights 7% worse. Lane 0 writes both, in order, so the later one wins a tie.
            if (lane == 0) {
                for (u32 q = pos - 2 > mp ? pos - 2 : mp + 1; q < pos && q + 5 <= n; q++)
                    table[ckpt_hash5(src + q)] = (u16)q;
            }
            __syncwarp();
        }

        if (!raw) {
            const u32 lit = n - anchor;
            const u32 lit_ext = ckpt_ext_bytes(lit);
            const u32 need = 1 + lit_ext + lit;
            if (op + need >= n) {
                raw = true;
            } else {
                if (lane == 0)
                    dst[op] = (u8)((lit >= 15 ? 15 : lit) << 4);
                ckpt_write_ext(dst + op + 1, lit, lane);
                const u32 o = op + 1 + lit_ext;
                for (u32 i = lane; i < lit; i += 32)
                    dst[o + i] = src[anchor + i];
                op = o + lit;
            }
        }
        if (lane == 0)
            out_lens[c] = raw ? CKPT_NONE : op;
        // The next chunk clears the table: every lane is done with it first.
        __syncwarp();
    }
}

// Reads a length extension starting at *ip (all lanes read the same bytes). Returns false
// when the block ends inside it or the length overflows.
__device__ __forceinline__ bool ckpt_read_ext(const u8* src, u32 n, u32* ip, u32* v)
{
    u32 b;
    do {
        if (*ip >= n)
            return false;
        b = src[(*ip)++];
        if (*v > 0xffffffffu - 255)
            return false;
        *v += b;
    } while (b == 255);
    return true;
}

// Decompression: the lanes parse each sequence together (every lane reads the same token and
// lengths) and copy its literals and match in parallel. A match copy of offset `off` repeats
// the `off` bytes before it, so byte i of the match is dst[op - off + i % off]: every source
// byte precedes the copy and the lanes need no ordering among themselves within it.
extern "C" __global__ void ckpt_lz4_decompress(const u8* __restrict__ in,
                                               const u64* __restrict__ in_offs,
                                               const u32* __restrict__ in_lens,
                                               u8* __restrict__ out,
                                               const u64* __restrict__ out_offs,
                                               const u32* __restrict__ out_caps,
                                               u32* __restrict__ out_lens,
                                               u32 count)
{
    const u32 lane = threadIdx.x;

    for (u32 c = blockIdx.x; c < count; c += gridDim.x) {
        const u8* src = in + in_offs[c];
        u8* dst = out + out_offs[c];
        const u32 n = in_lens[c];
        const u32 cap = out_caps[c];
        u32 ip = 0;
        u32 op = 0;
        bool bad = false;

        for (;;) {
            if (ip >= n) {
                bad = true;
                break;
            }
            const u32 token = src[ip++];
            u32 lit = token >> 4;
            if (lit == 15 && !ckpt_read_ext(src, n, &ip, &lit)) {
                bad = true;
                break;
            }
            if (lit > n - ip || lit > cap - op) {
                bad = true;
                break;
            }
            for (u32 i = lane; i < lit; i += 32)
                dst[op + i] = src[ip + i];
            ip += lit;
            op += lit;
            if (ip == n)
                break; // the last sequence: literals only
            if (n - ip < 2) {
                bad = true;
                break;
            }
            const u32 off = (u32)src[ip] | ((u32)src[ip + 1] << 8);
            ip += 2;
            u32 ml = token & 15;
            if (ml == 15 && !ckpt_read_ext(src, n, &ip, &ml)) {
                bad = true;
                break;
            }
            ml += CKPT_MIN_MATCH;
            if (off == 0 || off > op || ml > cap - op) {
                bad = true;
                break;
            }
            // Literals and earlier matches written by other lanes are read below.
            __syncwarp();
            const u8* from = dst + op - off;
            for (u32 i = lane; i < ml; i += 32)
                dst[op + i] = from[i < off ? i : i % off];
            op += ml;
        }
        if (lane == 0)
            out_lens[c] = bad ? CKPT_NONE : op;
        __syncwarp();
    }
}
