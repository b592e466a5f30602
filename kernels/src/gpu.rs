//! The GPU backend: the kernels of `cuda/lz4.cu` compiled by NVRTC at [`Gpu::open`] and run
//! through the CUDA driver API (cudarc, loaded at run time).
//!
//! Nothing here links against CUDA: libcuda and NVRTC are opened when a [`Gpu`] is opened, and
//! a machine without them, or without a device, gets [`Error::Unavailable`] saying what is
//! missing, never a panic. Where the libraries are outside the loader's search path,
//! [`GpuOptions::lib_dir`] (`--cuda-lib-dir`) or the environment variable
//! `CKPTFS_CUDA_LIB_DIR` names their directory; some well-known directories (the CUDA
//! toolkit's, the driver's, Python wheels' `nvidia/*/lib`) are searched too.
//!
//! # Pipeline and memory
//!
//! A batch is cut into sub-batches of at most [`SUB_BATCH_BYTES`] of input (and, for
//! decompression, of output) and at most [`SUB_BATCH_CHUNKS`] chunks; a single chunk larger
//! than [`SUB_BATCH_BYTES`] gets a sub-batch of its own. Two slots, each with its own CUDA
//! stream, pinned host buffers and device buffers, take the sub-batches in turn: while one
//! slot's copies and kernel run, the CPU packs the next sub-batch into the other slot, or
//! unpacks that slot's previous results.
//!
//! Memory held by an open [`Gpu`] (buffers grow on demand and are kept):
//! - pinned host memory: 2 slots × (2 × B + C × 28 bytes), where B = max([`SUB_BATCH_BYTES`],
//!   the largest single chunk or decoded block seen) and C = the most chunks a sub-batch has
//!   had (at most [`SUB_BATCH_CHUNKS`]): about 132 MiB at most with chunks up to 32 MiB;
//! - device memory: the same again.

use std::ffi::CString;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use cudarc::driver::{
    sys, CudaContext, CudaEvent, CudaFunction, CudaModule, CudaSlice, CudaStream, DeviceRepr,
    DriverError, LaunchConfig, PinnedHostSlice, PushKernelArg, ValidAsZeroBits,
};
use cudarc::nvrtc::{self, CompileError, CompileOptions, Ptx};
use libloading::os::unix::{Library, RTLD_GLOBAL, RTLD_NOW};

use crate::{check_batch, BatchCodec, Compressed, Error, Result, MAX_CHUNK, NONE, WARP};

/// Input bytes (and, decompressing, output bytes) of one sub-batch, unless a single chunk is
/// larger.
pub const SUB_BATCH_BYTES: usize = 32 << 20;

/// Chunks in one sub-batch at most (bounds the per-chunk arrays when chunks are tiny).
pub const SUB_BATCH_CHUNKS: usize = 1 << 16;

/// Environment variable naming the directory of libcuda/NVRTC, when `lib_dir` is not given.
pub const LIB_DIR_ENV: &str = "CKPTFS_CUDA_LIB_DIR";

/// Where and what to open.
#[derive(Clone, Debug, Default)]
pub struct GpuOptions {
    /// CUDA device ordinal.
    pub device: usize,
    /// Directory holding libcuda.so.1 and/or libnvrtc.so.13 (`--cuda-lib-dir`); when `None`,
    /// `CKPTFS_CUDA_LIB_DIR` if set.
    pub lib_dir: Option<PathBuf>,
    /// Input bytes per sub-batch (default [`SUB_BATCH_BYTES`]). One warp per chunk means a
    /// sub-batch of 64 KiB chunks fills `bytes / 64 KiB` warps; larger sub-batches fill more
    /// of a big GPU, smaller ones overlap copies and kernels sooner. Not measured on a GPU
    /// yet: `ckptfs-bench gpu --sub-batch` sweeps it.
    pub sub_batch_bytes: Option<usize>,
    /// Threads that pack chunks into pinned memory and unpack results (default: up to 4 of
    /// the machine's cores). One core's copies would cap the GPU path near 10 GB/s.
    pub copy_threads: Option<usize>,
}

/// The LZ4 kernels on a CUDA GPU. One batch runs at a time per `Gpu` (callers on other
/// threads wait); see the module documentation for the pipeline and its memory.
pub struct Gpu {
    describe: String,
    sub_bytes: usize,
    copy_threads: usize,
    /// Seconds the kernels of the last batch ran (f64 bits).
    kernel_seconds: AtomicU64,
    state: Mutex<State>,
}

impl std::fmt::Debug for Gpu {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gpu")
            .field("device", &self.describe)
            .finish()
    }
}

struct State {
    ctx: Arc<CudaContext>,
    compress: CudaFunction,
    decompress: CudaFunction,
    /// The float codec's kernel (`cuda/float.cu`), compiled at its first use.
    float: Option<CudaFunction>,
    /// The device's compute capability, for compiling `float`.
    arch: (i32, i32),
    slots: [Slot; 2],
}

fn cuda(what: &'static str) -> impl Fn(DriverError) -> Error {
    move |e| Error::Cuda(format!("{what}: {e}"))
}

impl Gpu {
    /// Finds libcuda and NVRTC, opens the device, compiles the kernels for it and checks them
    /// on a small batch. [`Error::Unavailable`] where a library or the device is missing.
    pub fn open(opts: &GpuOptions) -> Result<Gpu> {
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| open_inner(opts))) {
            Ok(r) => r,
            // cudarc's loader panics on a symbol the library lacks (a driver older than the
            // CUDA 13 API): that library is not usable.
            Err(p) => Err(Error::Unavailable(format!(
                "the CUDA libraries found are not usable: {}",
                panic_message(&*p)
            ))),
        }
    }

    /// Seconds the kernels of the last completed batch ran, measured with CUDA events (the
    /// sum over its sub-batches, without copies or CPU work), for showing kernel-only
    /// throughput next to end-to-end.
    pub fn last_kernel_seconds(&self) -> f64 {
        f64::from_bits(self.kernel_seconds.load(Ordering::Relaxed))
    }

    fn run(&self, kind: Kind, inputs: &[&[u8]], raw_lens: &[usize]) -> Result<Sink> {
        let subs = match kind {
            Kind::Compress => plan(inputs.iter().map(|c| (c.len(), c.len())), self.sub_bytes),
            Kind::Decompress => plan(
                inputs.iter().map(|b| b.len()).zip(raw_lens.iter().copied()),
                self.sub_bytes,
            ),
        };
        let total_out: usize = subs.iter().map(|s| s.out_bytes).sum();
        let mut sink = match kind {
            Kind::Compress => Sink::Compress(Compressed::with_capacity(inputs.len(), total_out)),
            // Zeroed allocation of this size comes from fresh pages (no memset pass); each
            // sub-batch's decoded bytes are copied into their place.
            Kind::Decompress => Sink::Decompress(vec![0u8; total_out], 0),
        };
        if inputs.is_empty() {
            return Ok(sink);
        }
        let mut guard = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let State {
            ctx,
            compress,
            decompress,
            slots,
            ..
        } = &mut *guard;
        let f = match kind {
            Kind::Compress => &*compress,
            Kind::Decompress => &*decompress,
        };
        let job = Job {
            kind,
            copy_threads: self.copy_threads,
            inputs,
            raw_lens,
        };
        let mut kernel_ms = 0.0f64;
        let r = guarded("GPU batch", || {
            ctx.bind_to_thread()
                .map_err(cuda("binding the CUDA context"))?;
            // A batch that failed may have left work in flight.
            for s in slots.iter_mut() {
                s.drain()?;
            }
            // Errors recorded since the last batch belong to it (reported or drained).
            let _ = ctx.check_err();
            for (k, sub) in subs.iter().enumerate() {
                let slot = &mut slots[k % 2];
                // The slot still holds sub-batch k - 2: wait for it, take its results.
                slot.collect(&job, &mut sink, &mut kernel_ms)?;
                slot.submit(f, &job, sub)?;
            }
            for k in subs.len().saturating_sub(2)..subs.len() {
                slots[k % 2].collect(&job, &mut sink, &mut kernel_ms)?;
            }
            ctx.check_err().map_err(cuda("CUDA error"))
        });
        if r.is_err() {
            for s in slots.iter_mut() {
                let _ = s.drain();
            }
        }
        r?;
        self.kernel_seconds
            .store((kernel_ms / 1e3).to_bits(), Ordering::Relaxed);
        Ok(sink)
    }

    /// The float codec's kernel on each chunk with its plan: zstd frames, the same
    /// bytes as `float::encode_plan` (the emulation tests check that on every CI run; the GPU
    /// test in tests/gpu.rs on a GPU). One synchronous batch on the default stream, its
    /// buffers allocated per call: the reference the GPU data path builds on, not its fast
    /// version (not pipelined like LZ4 above).
    pub fn float_compress(
        &self,
        chunks: &[&[u8]],
        plans: &[crate::float::Plan],
    ) -> Result<Vec<Vec<u8>>> {
        let b = crate::FloatBatch::new(chunks, plans)?;
        if chunks.is_empty() {
            return Ok(Vec::new());
        }
        let mut guard = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let state = &mut *guard;
        guarded("GPU float batch", || {
            state
                .ctx
                .bind_to_thread()
                .map_err(cuda("binding the CUDA context"))?;
            if state.float.is_none() {
                let (major, minor) = state.arch;
                let m = load_source(&state.ctx, major, minor, crate::FLOAT_SOURCE, "float.cu")?;
                state.float = Some(
                    m.load_function("ckpt_float_compress")
                        .map_err(cuda("loading kernel ckpt_float_compress"))?,
                );
            }
            let f = state.float.as_ref().expect("loaded above");
            let stream = state.ctx.default_stream();
            let d_in = stream
                .clone_htod(&b.bytes)
                .map_err(cuda("copying chunks"))?;
            let d_offs = stream
                .clone_htod(&b.offs)
                .map_err(cuda("copying offsets"))?;
            let d_lens = stream
                .clone_htod(&b.lens)
                .map_err(cuda("copying lengths"))?;
            let d_ts = stream.clone_htod(&b.plans).map_err(cuda("copying plans"))?;
            let d_out_offs = stream
                .clone_htod(&b.out_offs)
                .map_err(cuda("copying offsets"))?;
            let mut d_out = stream
                .alloc_zeros::<u8>(b.out_bytes)
                .map_err(cuda("allocating output"))?;
            let mut d_out_lens = stream
                .alloc_zeros::<u32>(chunks.len())
                .map_err(cuda("allocating lengths"))?;
            let count = chunks.len() as u32;
            let cfg = LaunchConfig {
                grid_dim: (count, 1, 1),
                block_dim: (WARP, 1, 1),
                shared_mem_bytes: 0,
            };
            let mut launch = stream.launch_builder(f);
            launch.arg(&d_in);
            launch.arg(&d_offs);
            launch.arg(&d_lens);
            launch.arg(&d_ts);
            launch.arg(&mut d_out);
            launch.arg(&d_out_offs);
            launch.arg(&mut d_out_lens);
            launch.arg(&count);
            // SAFETY: the arguments match the kernel's signature (cuda/float.cu); every array
            // holds `count` entries, each chunk lies within `d_in` and each frame is written
            // within its `float::bound` bytes of `d_out` at its offset.
            unsafe { launch.launch(cfg) }.map_err(cuda("launching the float kernel"))?;
            let out = stream.clone_dtoh(&d_out).map_err(cuda("copying frames"))?;
            let out_lens = stream
                .clone_dtoh(&d_out_lens)
                .map_err(cuda("copying frame lengths"))?;
            stream
                .synchronize()
                .map_err(cuda("waiting for the float kernel"))?;
            Ok(b.frames(&out, &out_lens))
        })
    }

    /// Compresses a repetitive chunk and decodes it back: catches a kernel or driver that does
    /// not work here before any real data goes through it.
    fn self_test(&self) -> Result<()> {
        let text: Vec<u8> = b"ckptfs GPU self-test, "
            .iter()
            .cycle()
            .take(9000)
            .copied()
            .collect();
        let noise: Vec<u8> = (0..300u32)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 11) as u8)
            .collect();
        let chunks: [&[u8]; 3] = [&text, &noise, &[]];
        let c = self.compress(&chunks)?;
        let block = c.get(0).ok_or_else(|| {
            Error::Cuda("self-test: the compress kernel left a repetitive chunk raw".into())
        })?;
        let back = self.decompress(&[block], &[text.len()])?;
        if back != text {
            return Err(Error::Cuda(
                "self-test: a chunk compressed and decompressed on the GPU came back different"
                    .into(),
            ));
        }
        Ok(())
    }
}

impl BatchCodec for Gpu {
    fn describe(&self) -> String {
        self.describe.clone()
    }

    fn compress(&self, chunks: &[&[u8]]) -> Result<Compressed> {
        check_batch(chunks)?;
        match self.run(Kind::Compress, chunks, &[])? {
            Sink::Compress(c) => Ok(c),
            Sink::Decompress(..) => unreachable!("compress collects blocks"),
        }
    }

    fn decompress(&self, blocks: &[&[u8]], raw_lens: &[usize]) -> Result<Vec<u8>> {
        check_batch(blocks)?;
        if blocks.len() != raw_lens.len() || raw_lens.iter().any(|&n| n > MAX_CHUNK) {
            return Err(Error::Invalid(
                "decompress: one decoded length per block, each within the chunk limit".into(),
            ));
        }
        match self.run(Kind::Decompress, blocks, raw_lens)? {
            Sink::Decompress(v, _) => Ok(v),
            Sink::Compress(_) => unreachable!("decompress collects bytes"),
        }
    }
}

// ---- Opening: libraries, device, kernels ----

fn open_inner(opts: &GpuOptions) -> Result<Gpu> {
    find_libraries(opts)?;
    let count = CudaContext::device_count().map_err(|e| {
        if e.0 == sys::CUresult::CUDA_ERROR_NO_DEVICE {
            Error::Unavailable("no CUDA device".into())
        } else {
            Error::Unavailable(format!("the CUDA driver does not start: {e}"))
        }
    })?;
    if count <= 0 {
        return Err(Error::Unavailable("no CUDA device".into()));
    }
    if opts.device >= count as usize {
        return Err(Error::Unavailable(format!(
            "no CUDA device {}: this machine has {count}",
            opts.device
        )));
    }
    let ctx = CudaContext::new(opts.device).map_err(cuda("creating the CUDA context"))?;
    // The primary context's default (CU_CTX_SCHED_AUTO) spins the waiting thread whenever the
    // process has fewer contexts than cores, i.e. always here: every `synchronize()` of a
    // sub-batch burned a core for as long as the copies and the kernel ran. On a 16-core H100
    // node the GPU thread took 0.5-0.9 CPU-s per GiB written that way (`ckptfs-bench steps`,
    // README). Blocking sync sleeps on the driver's event instead.
    ctx.set_blocking_synchronize().map_err(cuda(
        "asking the CUDA context to block, not spin, while waiting",
    ))?;
    let (major, minor) = ctx
        .compute_capability()
        .map_err(cuda("reading the compute capability"))?;
    let name = ctx.name().map_err(cuda("reading the device name"))?;
    let module = load_kernels(&ctx, major, minor)?;
    let compress = module
        .load_function("ckpt_lz4_compress")
        .map_err(cuda("loading kernel ckpt_lz4_compress"))?;
    let decompress = module
        .load_function("ckpt_lz4_decompress")
        .map_err(cuda("loading kernel ckpt_lz4_decompress"))?;
    let slots = [Slot::new(&ctx)?, Slot::new(&ctx)?];
    let gpu = Gpu {
        describe: format!("{name} (sm_{major}{minor})"),
        sub_bytes: opts.sub_batch_bytes.unwrap_or(SUB_BATCH_BYTES).max(1),
        copy_threads: opts
            .copy_threads
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get().min(4))),
        kernel_seconds: AtomicU64::new(0f64.to_bits()),
        state: Mutex::new(State {
            ctx,
            compress,
            decompress,
            float: None,
            arch: (major, minor),
            slots,
        }),
    };
    gpu.self_test()?;
    Ok(gpu)
}

/// NVRTC compiles the kernel source to PTX for the device's architecture; the driver JITs it.
/// If the driver rejects that PTX (an NVRTC newer than the driver: PTX is the one thing CUDA's
/// minor-version compatibility leaves out), the source is compiled straight to a CUBIN.
fn load_kernels(ctx: &Arc<CudaContext>, major: i32, minor: i32) -> Result<Arc<CudaModule>> {
    load_source(ctx, major, minor, crate::LZ4_SOURCE, "lz4.cu")
}

/// `load_kernels` of any kernel source (`name` for NVRTC's messages).
fn load_source(
    ctx: &Arc<CudaContext>,
    major: i32,
    minor: i32,
    src: &str,
    name: &str,
) -> Result<Arc<CudaModule>> {
    let opts = CompileOptions {
        arch: Some(leak_arch(format!("compute_{major}{minor}"))),
        name: Some(name.into()),
        ..Default::default()
    };
    let ptx = nvrtc::compile_ptx_with_opts(src, opts).map_err(compile_error)?;
    match ctx.load_module(ptx) {
        Ok(m) => Ok(m),
        Err(ptx_err) => {
            let cubin = compile_cubin(src, &format!("sm_{major}{minor}")).map_err(|e| {
                Error::Cuda(format!(
                    "loading the kernels' PTX: {ptx_err}; compiling a CUBIN instead: {e}"
                ))
            })?;
            ctx.load_module(Ptx::from_binary(cubin)).map_err(|e| {
                Error::Cuda(format!("loading the kernels: PTX: {ptx_err}; CUBIN: {e}"))
            })
        }
    }
}

fn compile_error(e: CompileError) -> Error {
    match e {
        CompileError::CompileError {
            nvrtc,
            options,
            log,
        } => Error::Cuda(format!(
            "NVRTC could not compile the kernels ({nvrtc}, options {options:?}):\n{}",
            log.to_string_lossy()
        )),
        e => Error::Cuda(format!("NVRTC: {e}")),
    }
}

fn log_string(log: &[std::ffi::c_char]) -> String {
    let bytes: Vec<u8> = log
        .iter()
        .map(|&c| c as u8)
        .take_while(|&b| b != 0)
        .collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// Compiles `src` to a CUBIN for `arch` ("sm_90") with NVRTC directly (cudarc's safe API
/// only produces PTX).
fn compile_cubin(src: &str, arch: &str) -> std::result::Result<Vec<u8>, String> {
    use cudarc::nvrtc::{result, sys as nsys};
    let src = CString::new(src).map_err(|e| e.to_string())?;
    let name = CString::new("lz4.cu").map_err(|e| e.to_string())?;
    let prog = result::create_program(&src, Some(&name)).map_err(|e| e.to_string())?;
    let options = [format!("--gpu-architecture={arch}")];
    // SAFETY: `prog` was created above and is destroyed only at the end; `src` and `name`
    // outlive it; the CUBIN buffer is as large as NVRTC says.
    let r = unsafe {
        match result::compile_program(prog, &options) {
            Err(e) => Err(format!(
                "NVRTC ({arch}): {e}\n{}",
                result::get_program_log(prog)
                    .map(|l| log_string(&l))
                    .unwrap_or_default()
            )),
            Ok(()) => {
                let mut size = 0usize;
                nsys::nvrtcGetCUBINSize(prog, &mut size)
                    .result()
                    .map_err(|e| format!("nvrtcGetCUBINSize: {e}"))
                    .and_then(|()| {
                        let mut cubin = vec![0u8; size];
                        nsys::nvrtcGetCUBIN(prog, cubin.as_mut_ptr().cast())
                            .result()
                            .map_err(|e| format!("nvrtcGetCUBIN: {e}"))
                            .map(|()| cubin)
                    })
            }
        }
    };
    // SAFETY: created above, not destroyed before.
    let _ = unsafe { result::destroy_program(prog) };
    r
}

/// NVRTC takes the architecture as a `&'static str`: each distinct one is leaked once.
fn leak_arch(arch: String) -> &'static str {
    static ARCHES: Mutex<Vec<&'static str>> = Mutex::new(Vec::new());
    let mut known = ARCHES.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some(a) = known.iter().find(|a| **a == arch) {
        return a;
    }
    let a: &'static str = Box::leak(arch.into_boxed_str());
    known.push(a);
    a
}

/// One library cudarc opens by name, and how to find it elsewhere.
struct Family {
    what: &'static str,
    /// File names to look for in a directory.
    names: &'static [&'static str],
    /// Prefixes of files opened along with it from the same directory: libraries it opens by
    /// name itself (NVRTC's builtins, the driver's PTX JIT).
    companions: &'static [&'static str],
    present: fn() -> bool,
}

fn driver_present() -> bool {
    // SAFETY: only tries to open (and closes) the library; cudarc's names for libcuda.
    unsafe { cudarc::driver::sys::is_culib_present() }
}

fn nvrtc_present() -> bool {
    // SAFETY: as above, for NVRTC.
    unsafe { cudarc::nvrtc::sys::is_culib_present() }
}

const FAMILIES: [Family; 2] = [
    Family {
        what: "the CUDA driver library (libcuda.so.1)",
        names: &["libcuda.so.1", "libcuda.so"],
        companions: &["libnvidia-ptxjitcompiler.so"],
        present: driver_present,
    },
    Family {
        what: "NVRTC, the CUDA run-time compiler (libnvrtc.so.13)",
        names: &["libnvrtc.so.13", "libnvrtc.so"],
        companions: &["libnvrtc-builtins.so"],
        present: nvrtc_present,
    },
];

/// Fixed directories searched when a library is not on the loader's path.
const WELL_KNOWN_DIRS: [&str; 4] = [
    "/usr/local/cuda/lib64",
    "/usr/local/cuda/targets/x86_64-linux/lib",
    "/usr/lib/x86_64-linux-gnu",
    "/usr/local/nvidia/lib64",
];

const WHEEL_DIRS: &str = "/usr/local/lib/python3*/dist-packages/nvidia/*/lib, \
     /usr/lib/python3/dist-packages/nvidia/*/lib, \
     /opt/*/.venv/lib/python3*/site-packages/nvidia/*/lib";

/// Opens with RTLD_NOW | RTLD_GLOBAL and keeps the library loaded for the process: cudarc's
/// later `dlopen("libnvrtc.so.13")` then finds this object by its soname.
fn preload(path: &Path) -> std::result::Result<(), String> {
    // SAFETY: runs the library's initialisers, as cudarc's own dlopen of it would.
    match unsafe { Library::open(Some(path), RTLD_NOW | RTLD_GLOBAL) } {
        Ok(lib) => {
            std::mem::forget(lib);
            Ok(())
        }
        Err(e) => Err(format!("{}: {e}", path.display())),
    }
}

/// Preloads `fam`'s libraries found in `dir`, companions first. Returns whether one of its
/// main names was there.
fn preload_dir(dir: &Path, fam: &Family, errors: &mut Vec<String>) -> bool {
    let mains: Vec<PathBuf> = fam
        .names
        .iter()
        .map(|n| dir.join(n))
        .filter(|p| p.is_file())
        .collect();
    if mains.is_empty() {
        return false;
    }
    let mut companions: Vec<PathBuf> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| fam.companions.iter().any(|c| n.starts_with(c)))
        })
        .collect();
    companions.sort();
    for p in companions.iter().chain(&mains) {
        if let Err(e) = preload(p) {
            errors.push(e);
        }
    }
    true
}

/// Subdirectories of `dir` whose names start with `prefix`, sorted.
fn subdirs(dir: &Path, prefix: &str) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| {
            e.file_name()
                .to_str()
                .is_some_and(|n| n.starts_with(prefix))
        })
        .map(|e| e.path())
        .filter(|p| p.is_dir())
        .collect();
    v.sort();
    v
}

/// `nvidia/*/lib` under a Python packages directory.
fn wheel_libs(packages: &Path, out: &mut Vec<PathBuf>) {
    for d in subdirs(&packages.join("nvidia"), "") {
        let lib = d.join("lib");
        if lib.is_dir() {
            out.push(lib);
        }
    }
}

fn well_known_dirs() -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = WELL_KNOWN_DIRS.iter().map(PathBuf::from).collect();
    for py in subdirs(Path::new("/usr/local/lib"), "python3") {
        wheel_libs(&py.join("dist-packages"), &mut dirs);
    }
    wheel_libs(Path::new("/usr/lib/python3/dist-packages"), &mut dirs);
    for opt in subdirs(Path::new("/opt"), "") {
        for py in subdirs(&opt.join(".venv/lib"), "python3") {
            wheel_libs(&py.join("site-packages"), &mut dirs);
        }
    }
    dirs
}

/// Makes libcuda and NVRTC loadable by cudarc, or says which is missing and where it looked.
fn find_libraries(opts: &GpuOptions) -> Result<()> {
    let explicit = opts.lib_dir.clone().or_else(|| {
        std::env::var_os(LIB_DIR_ENV)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    });
    let mut errors = Vec::new();
    if let Some(dir) = &explicit {
        for fam in &FAMILIES {
            preload_dir(dir, fam, &mut errors);
        }
    }
    let mut wells: Option<Vec<PathBuf>> = None;
    for fam in &FAMILIES {
        if (fam.present)() {
            continue;
        }
        for dir in wells.get_or_insert_with(well_known_dirs).iter() {
            if preload_dir(dir, fam, &mut errors) && (fam.present)() {
                break;
            }
        }
        if !(fam.present)() {
            let explicit = match &explicit {
                Some(d) if !d.is_dir() => {
                    format!("{} (not a directory), ", d.display())
                }
                Some(d) => format!("{}, ", d.display()),
                None => String::new(),
            };
            let errors = if errors.is_empty() {
                String::new()
            } else {
                format!("; failed to load: {}", errors.join("; "))
            };
            return Err(Error::Unavailable(format!(
                "{} not found: looked on the loader's path (LD_LIBRARY_PATH, ld.so.cache), in \
                 {explicit}{}, and {WHEEL_DIRS}{errors}. Name its directory with \
                 --cuda-lib-dir or {LIB_DIR_ENV}",
                fam.what,
                WELL_KNOWN_DIRS.join(", "),
            )));
        }
    }
    Ok(())
}

fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
    p.downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic".into())
}

/// Runs `f`, turning a panic inside the CUDA wrappers (cudarc resolves driver symbols lazily
/// and panics on a missing one) into an error instead of taking the process down.
fn guarded<T>(what: &str, f: impl FnOnce() -> Result<T>) -> Result<T> {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(r) => r,
        Err(p) => Err(Error::Cuda(format!(
            "{what}: panicked: {}",
            panic_message(&*p)
        ))),
    }
}

// ---- The pipeline ----

#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Compress,
    Decompress,
}

/// One batch: the chunks (compress) or blocks (decompress), and the decoded lengths.
struct Job<'a> {
    kind: Kind,
    copy_threads: usize,
    inputs: &'a [&'a [u8]],
    raw_lens: &'a [usize],
}

enum Sink {
    Compress(Compressed),
    /// The batch's decoded bytes, and how many are filled.
    Decompress(Vec<u8>, usize),
}

/// Chunks `first .. first + count` of a batch.
struct Sub {
    first: usize,
    count: usize,
    in_bytes: usize,
    out_bytes: usize,
}

/// Cuts a batch of (input bytes, output bytes) per chunk into sub-batches.
fn plan(sizes: impl Iterator<Item = (usize, usize)>, limit: usize) -> Vec<Sub> {
    let mut subs = Vec::new();
    let mut cur = Sub {
        first: 0,
        count: 0,
        in_bytes: 0,
        out_bytes: 0,
    };
    for (i, (a, b)) in sizes.enumerate() {
        if cur.count > 0
            && (cur.count == SUB_BATCH_CHUNKS
                || cur.in_bytes + a > limit
                || cur.out_bytes + b > limit)
        {
            let next = Sub {
                first: i,
                count: 0,
                in_bytes: 0,
                out_bytes: 0,
            };
            subs.push(std::mem::replace(&mut cur, next));
        }
        cur.count += 1;
        cur.in_bytes += a;
        cur.out_bytes += b;
    }
    if cur.count > 0 {
        subs.push(cur);
    }
    subs
}

/// Capacity to grow a buffer to for `need` elements: powers of two up to `limit`, exactly
/// `need` beyond it.
fn grown(need: usize, limit: usize) -> usize {
    if need > limit {
        need
    } else {
        need.next_power_of_two().min(limit)
    }
}

/// A pinned host buffer and a device buffer of the same length.
struct Buf<T: DeviceRepr + ValidAsZeroBits> {
    host: PinnedHostSlice<T>,
    dev: CudaSlice<T>,
    /// Write-combined host memory: fast for the CPU to fill and the GPU to read, slow for the
    /// CPU to read; for buffers only the CPU writes.
    write_combined: bool,
}

impl<T: DeviceRepr + ValidAsZeroBits> Buf<T> {
    fn new(stream: &Arc<CudaStream>, len: usize, write_combined: bool) -> Result<Self> {
        let len = len.max(1);
        let flags = if write_combined {
            sys::CU_MEMHOSTALLOC_WRITECOMBINED
        } else {
            0
        };
        // SAFETY: the memory is uninitialised until zeroed just below.
        let mut host = unsafe { stream.context().alloc_pinned_with_flags::<T>(len, flags) }
            .map_err(cuda("allocating pinned host memory"))?;
        let p = host
            .as_mut_ptr()
            .map_err(cuda("allocating pinned host memory"))?;
        // SAFETY: `p` points to `len` elements just allocated, of a type valid as zero bits.
        unsafe { std::ptr::write_bytes(p, 0, len) };
        // SAFETY: device memory is only read where a copy or the kernel wrote it first.
        let dev = unsafe { stream.alloc::<T>(len) }.map_err(cuda("allocating device memory"))?;
        Ok(Buf {
            host,
            dev,
            write_combined,
        })
    }

    /// Makes room for `need` elements. Only between sub-batches, with the stream idle.
    fn reserve(&mut self, stream: &Arc<CudaStream>, need: usize, limit: usize) -> Result<()> {
        if self.host.len() < need {
            *self = Buf::new(stream, grown(need, limit), self.write_combined)?;
        }
        Ok(())
    }

    fn host(&self) -> Result<&[T]> {
        self.host.as_slice().map_err(cuda("pinned host memory"))
    }

    fn host_mut(&mut self) -> Result<&mut [T]> {
        self.host.as_mut_slice().map_err(cuda("pinned host memory"))
    }

    /// Queues the copy of the first `n` elements to the device.
    fn upload(&mut self, stream: &Arc<CudaStream>, n: usize) -> Result<()> {
        if n == 0 {
            return Ok(());
        }
        let src = &self.host.as_slice().map_err(cuda("pinned host memory"))?[..n];
        stream
            .memcpy_htod(src, &mut self.dev.slice_mut(..n))
            .map_err(cuda("copying to the GPU"))
    }

    /// Queues the copy of the first `n` elements back to the host.
    fn download(&mut self, stream: &Arc<CudaStream>, n: usize) -> Result<()> {
        if n == 0 {
            return Ok(());
        }
        let dst = &mut self
            .host
            .as_mut_slice()
            .map_err(cuda("pinned host memory"))?[..n];
        stream
            .memcpy_dtoh(&self.dev.slice(..n), dst)
            .map_err(cuda("copying from the GPU"))
    }
}

/// A sub-batch in flight on a slot.
struct Pending {
    first: usize,
    count: usize,
    out_bytes: usize,
    /// Events around the kernel, for [`Gpu::last_kernel_seconds`].
    timing: Option<(CudaEvent, CudaEvent)>,
}

/// One half of the double buffer: a stream and the buffers of one sub-batch.
struct Slot {
    stream: Arc<CudaStream>,
    /// Packed chunks (compress) or blocks (decompress).
    input: Buf<u8>,
    /// Compressed blocks, each in its chunk's input span (compress); decoded chunks back to
    /// back (decompress).
    output: Buf<u8>,
    in_offs: Buf<u64>,
    in_lens: Buf<u32>,
    /// Decompress only: where each block decodes to, and its length.
    out_offs: Buf<u64>,
    out_caps: Buf<u32>,
    out_lens: Buf<u32>,
    pending: Option<Pending>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        // Nothing may still copy into the buffers as they are freed.
        let _ = self.stream.synchronize();
    }
}

const INITIAL_BYTES: usize = 1 << 20;
const INITIAL_CHUNKS: usize = 1 << 10;

impl Slot {
    fn new(ctx: &Arc<CudaContext>) -> Result<Slot> {
        let stream = ctx.new_stream().map_err(cuda("creating a CUDA stream"))?;
        Ok(Slot {
            input: Buf::new(&stream, INITIAL_BYTES, true)?,
            output: Buf::new(&stream, INITIAL_BYTES, false)?,
            in_offs: Buf::new(&stream, INITIAL_CHUNKS, true)?,
            in_lens: Buf::new(&stream, INITIAL_CHUNKS, true)?,
            out_offs: Buf::new(&stream, 1, true)?,
            out_caps: Buf::new(&stream, 1, true)?,
            out_lens: Buf::new(&stream, INITIAL_CHUNKS, false)?,
            pending: None,
            stream,
        })
    }

    /// Waits for the stream and forgets what was in flight.
    fn drain(&mut self) -> Result<()> {
        self.pending = None;
        self.stream
            .synchronize()
            .map_err(cuda("waiting for the GPU"))
    }

    /// Packs sub-batch `sub` into the pinned buffers and queues its copies and kernel.
    fn submit(&mut self, f: &CudaFunction, job: &Job, sub: &Sub) -> Result<()> {
        debug_assert!(self.pending.is_none());
        let stream = self.stream.clone();
        let chunks = &job.inputs[sub.first..sub.first + sub.count];
        let decompress = job.kind == Kind::Decompress;
        self.input.reserve(&stream, sub.in_bytes, SUB_BATCH_BYTES)?;
        self.output
            .reserve(&stream, sub.out_bytes, SUB_BATCH_BYTES)?;
        self.in_offs.reserve(&stream, sub.count, SUB_BATCH_CHUNKS)?;
        self.in_lens.reserve(&stream, sub.count, SUB_BATCH_CHUNKS)?;
        self.out_lens
            .reserve(&stream, sub.count, SUB_BATCH_CHUNKS)?;
        if decompress {
            self.out_offs
                .reserve(&stream, sub.count, SUB_BATCH_CHUNKS)?;
            self.out_caps
                .reserve(&stream, sub.count, SUB_BATCH_CHUNKS)?;
        }

        // Pack (the slot is idle: its previous sub-batch was collected).
        {
            let bytes = self.input.host_mut()?;
            let offs = self.in_offs.host_mut()?;
            let lens = self.in_lens.host_mut()?;
            crate::copy_pieces(&mut bytes[..sub.in_bytes], chunks, job.copy_threads);
            let mut at = 0usize;
            for (j, c) in chunks.iter().enumerate() {
                offs[j] = at as u64;
                lens[j] = c.len() as u32;
                at += c.len();
            }
        }
        if decompress {
            let offs = self.out_offs.host_mut()?;
            let caps = self.out_caps.host_mut()?;
            let raw = &job.raw_lens[sub.first..sub.first + sub.count];
            let mut at = 0usize;
            for (j, &n) in raw.iter().enumerate() {
                offs[j] = at as u64;
                caps[j] = n as u32;
                at += n;
            }
        }

        self.input.upload(&stream, sub.in_bytes)?;
        self.in_offs.upload(&stream, sub.count)?;
        self.in_lens.upload(&stream, sub.count)?;
        if decompress {
            self.out_offs.upload(&stream, sub.count)?;
            self.out_caps.upload(&stream, sub.count)?;
        }

        let count = sub.count as u32;
        let cfg = LaunchConfig {
            grid_dim: (count, 1, 1),
            block_dim: (WARP, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut launch = stream.launch_builder(f);
        launch.arg(&self.input.dev);
        launch.arg(&self.in_offs.dev);
        launch.arg(&self.in_lens.dev);
        launch.arg(&mut self.output.dev);
        if decompress {
            launch.arg(&self.out_offs.dev);
            launch.arg(&self.out_caps.dev);
        }
        launch.arg(&mut self.out_lens.dev);
        launch.arg(&count);
        launch.record_kernel_launch(sys::CUevent_flags::CU_EVENT_DEFAULT);
        // SAFETY: the arguments match the kernel's signature (cuda/lz4.cu); every array holds
        // `count` entries and each chunk's span lies within the input (compress: and output)
        // buffer, each decoded span within the output buffer.
        let timing = unsafe { launch.launch(cfg) }.map_err(cuda("launching the kernel"))?;

        self.output.download(&stream, sub.out_bytes)?;
        self.out_lens.download(&stream, sub.count)?;
        self.pending = Some(Pending {
            first: sub.first,
            count: sub.count,
            out_bytes: sub.out_bytes,
            timing,
        });
        Ok(())
    }

    /// Waits for the slot's sub-batch, if any, and appends its results to `sink`.
    fn collect(&mut self, job: &Job, sink: &mut Sink, kernel_ms: &mut f64) -> Result<()> {
        let Some(p) = self.pending.take() else {
            return Ok(());
        };
        self.stream
            .synchronize()
            .map_err(cuda("running the kernel"))?;
        if let Some((start, end)) = &p.timing {
            *kernel_ms += f64::from(start.elapsed_ms(end).map_err(cuda("kernel timing"))?);
        }
        let lens = &self.out_lens.host()?[..p.count];
        let bytes = &self.output.host()?[..p.out_bytes];
        match sink {
            Sink::Compress(c) => {
                let mut blocks = Vec::with_capacity(p.count);
                let mut at = 0usize;
                for (j, chunk) in job.inputs[p.first..p.first + p.count].iter().enumerate() {
                    let n = lens[j];
                    if n == NONE || n as usize == chunk.len() {
                        blocks.push(None);
                    } else if (n as usize) < chunk.len() {
                        blocks.push(Some(&bytes[at..at + n as usize]));
                    } else {
                        return Err(Error::Cuda(format!(
                            "compress kernel: chunk {} of {} bytes came back with {n} bytes",
                            p.first + j,
                            chunk.len()
                        )));
                    }
                    at += chunk.len();
                }
                c.push_all(&blocks, job.copy_threads);
            }
            Sink::Decompress(out, filled) => {
                let raw = &job.raw_lens[p.first..p.first + p.count];
                if let Some(j) = (0..p.count).find(|&j| lens[j] as usize != raw[j]) {
                    return Err(Error::Corrupt { index: p.first + j });
                }
                let dst = &mut out[*filled..*filled + bytes.len()];
                crate::copy_pieces(dst, &[bytes], job.copy_threads);
                *filled += bytes.len();
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plan_cuts_by_bytes_and_keeps_big_chunks_alone() {
        let sizes = [10, SUB_BATCH_BYTES - 10, 1, SUB_BATCH_BYTES + 5, 0, 3];
        let subs = plan(sizes.iter().map(|&n| (n, n)), SUB_BATCH_BYTES);
        let got: Vec<(usize, usize)> = subs.iter().map(|s| (s.first, s.count)).collect();
        assert_eq!(got, vec![(0, 2), (2, 1), (3, 1), (4, 2)]);
        assert_eq!(subs[2].in_bytes, SUB_BATCH_BYTES + 5);
    }

    #[test]
    fn plan_cuts_by_decoded_bytes_and_by_count() {
        let subs = plan([(1, SUB_BATCH_BYTES), (1, 1)].into_iter(), SUB_BATCH_BYTES);
        assert_eq!(subs.len(), 2);
        let subs = plan(
            std::iter::repeat_n((0, 0), SUB_BATCH_CHUNKS + 1),
            SUB_BATCH_BYTES,
        );
        let got: Vec<usize> = subs.iter().map(|s| s.count).collect();
        assert_eq!(got, vec![SUB_BATCH_CHUNKS, 1]);
        assert!(plan(std::iter::empty(), SUB_BATCH_BYTES).is_empty());
    }

    #[test]
    fn grown_rounds_up_within_the_limit() {
        assert_eq!(grown(3, 1 << 20), 4);
        assert_eq!(grown((1 << 20) - 1, 1 << 20), 1 << 20);
        assert_eq!(grown((1 << 20) + 1, 1 << 20), (1 << 20) + 1);
    }
}
