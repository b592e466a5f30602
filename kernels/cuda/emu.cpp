// The kernels of lz4.cu compiled for the host with the emulation shim; C entry points that
// run a whole grid for kernels/src/emu.rs.
#include "emu.h"
#include "lz4.cu"
#include "float.cu"
#include "hash.cu"

namespace {
struct CompressArgs {
    const u8* in;
    const u64* offs;
    const u32* lens;
    u8* out;
    u32* out_lens;
    u32 count;
};

void compress_body(void* p)
{
    CompressArgs* a = (CompressArgs*)p;
    ckpt_lz4_compress(a->in, a->offs, a->lens, a->out, a->out_lens, a->count);
}

struct DecompressArgs {
    const u8* in;
    const u64* in_offs;
    const u32* in_lens;
    u8* out;
    const u64* out_offs;
    const u32* out_caps;
    u32* out_lens;
    u32 count;
};

void decompress_body(void* p)
{
    DecompressArgs* a = (DecompressArgs*)p;
    ckpt_lz4_decompress(a->in, a->in_offs, a->in_lens, a->out, a->out_offs, a->out_caps,
                        a->out_lens, a->count);
}
struct FloatArgs {
    const u8* in;
    const u64* offs;
    const u32* lens;
    const u32* plans;
    u8* out;
    const u64* out_offs;
    u32* out_lens;
    u32 count;
};

void float_body(void* p)
{
    FloatArgs* a = (FloatArgs*)p;
    ckpt_float_compress(a->in, a->offs, a->lens, a->plans, a->out, a->out_offs,
                        a->out_lens, a->count);
}

struct Blake3Args {
    const u8* in;
    const u64* offs;
    const u32* lens;
    u32* cvs;
    const u64* cv_offs;
    u8* out;
    u32 count;
};

void blake3_body(void* p)
{
    Blake3Args* a = (Blake3Args*)p;
    ckpt_blake3(a->in, a->offs, a->lens, a->cvs, a->cv_offs, a->out, a->count);
}

struct GearArgs {
    const u8* in;
    const u64* offs;
    const u32* lens;
    const u64* gear;
    u64 mask_s;
    u64 mask_l;
    u32* bits;
    const u64* bit_offs;
    u32 count;
};

void gear_body(void* p)
{
    GearArgs* a = (GearArgs*)p;
    ckpt_gear_candidates(a->in, a->offs, a->lens, a->gear, a->mask_s, a->mask_l, a->bits,
                         a->bit_offs, a->count);
}
} // namespace

// One block per chunk, 32 threads, as the GPU launch does. Returns 0, or -1 on a barrier
// divergence (a kernel bug).
extern "C" int ckpt_emu_lz4_compress(const u8* in, const u64* offs, const u32* lens, u8* out,
                                     u32* out_lens, u32 count)
{
    CompressArgs a = {in, offs, lens, out, out_lens, count};
    return emu_run_blocks(count, 0, count, 32, compress_body, &a);
}

extern "C" int ckpt_emu_lz4_decompress(const u8* in, const u64* in_offs, const u32* in_lens,
                                       u8* out, const u64* out_offs, const u32* out_caps,
                                       u32* out_lens, u32 count)
{
    DecompressArgs a = {in, in_offs, in_lens, out, out_offs, out_caps, out_lens, count};
    return emu_run_blocks(count, 0, count, 32, decompress_body, &a);
}

extern "C" int ckpt_emu_float_compress(const u8* in, const u64* offs, const u32* lens,
                                       const u32* plans, u8* out, const u64* out_offs,
                                       u32* out_lens, u32 count)
{
    FloatArgs a = {in, offs, lens, plans, out, out_offs, out_lens, count};
    return emu_run_blocks(count, 0, count, 32, float_body, &a);
}

extern "C" int ckpt_emu_blake3(const u8* in, const u64* offs, const u32* lens, u32* cvs,
                               const u64* cv_offs, u8* out, u32 count)
{
    Blake3Args a = {in, offs, lens, cvs, cv_offs, out, count};
    return emu_run_blocks(count, 0, count, 32, blake3_body, &a);
}

extern "C" int ckpt_emu_gear_candidates(const u8* in, const u64* offs, const u32* lens,
                                        const u64* gear, u64 mask_s, u64 mask_l, u32* bits,
                                        const u64* bit_offs, u32 count)
{
    GearArgs a = {in, offs, lens, gear, mask_s, mask_l, bits, bit_offs, count};
    return emu_run_blocks(count, 0, count, 32, gear_body, &a);
}
