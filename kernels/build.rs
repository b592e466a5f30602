//! Compiles the CUDA kernel source for the host with the emulation shim (`cuda/emu.h`), so the
//! kernels' logic runs and is tested on machines without a GPU. Needs only a C++ compiler.

fn main() {
    for f in [
        "cuda/lz4.cu",
        "cuda/float.cu",
        "cuda/hash.cu",
        "cuda/emu.h",
        "cuda/emu.cpp",
    ] {
        println!("cargo:rerun-if-changed={f}");
    }
    cc::Build::new()
        .cpp(true)
        .file("cuda/emu.cpp")
        .include("cuda")
        .flag_if_supported("-std=c++17")
        .flag_if_supported("-Wno-unused-function")
        .opt_level(2)
        .compile("ckpt_emu");
}
