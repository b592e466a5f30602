// The kernels of lz4.cu compiled for the host with the emulation shim; C entry points that
// run a whole grid for kernels/src/emu.rs.
#include "emu.h"
#include "lz4.cu"
#include "float.cu"

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
    const u8* transforms;
    u8* out;
    const u64* out_offs;
    u32* out_lens;
    u32 count;
};

void float_body(void* p)
{
    FloatArgs* a = (FloatArgs*)p;
    ckpt_float_compress(a->in, a->offs, a->lens, a->transforms, a->out, a->out_offs,
                        a->out_lens, a->count);
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
                                       const u8* transforms, u8* out, const u64* out_offs,
                                       u32* out_lens, u32 count)
{
    FloatArgs a = {in, offs, lens, transforms, out, out_offs, out_lens, count};
    return emu_run_blocks(count, 0, count, 32, float_body, &a);
}
