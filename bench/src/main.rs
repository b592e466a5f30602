//! ckptfs benchmarks.
//!
//!   ckptfs-bench all [--size 1G] [--reps 3] [--json FILE] ...   the end-to-end benchmark
//!   ckptfs-bench first|next|nn|n1-seg|n1-strided|restart ...    one of its scenarios
//!   ckptfs-bench steps [--writers 1,4,8,16] [--size 1G] ...     checkpoint steps: layouts x writers
//!   ckptfs-bench limits [--size 1G] [--reps 3] ...                FUSE sink, blake3 and LZ4 ceilings
//!   ckptfs-bench slots [--nodes 4] [--small-files 2000] ...       several daemons on one space
//!   ckptfs-bench targets [--targets 5] [--redundancy 3+2] [--lose 2] ...  erasure-coded targets
//!   ckptfs-bench closes [--sizes 4K] [--threads 1,8] [--files 200] [--slots 1] ...  durable closes of small files
//!   ckptfs-bench saves [--layouts trainer,zarr] [--jobs 1,4] [--steps 3] ...  many-file checkpoint steps
//!   ckptfs-bench tree [--files 5000] [--listed 20000] [--slots 1] ...  untar, ls -l and stat of many files
//!   ckptfs-bench wide [--files 1024,4096,8192] [--per-file 128K] [--request 64K] ...  many files at once
//!   ckptfs-bench full [--space 1G] [--steps 12] [--idle-secs 60] ...  a full space rotating checkpoints
//!   ckptfs-bench gc-scale-build DIR [--files N] [--chunk-size BYTES]
//!   ckptfs-bench gc-scale-run DIR
//!   ckptfs-bench gpu [--bytes 1G] [--emulate] [--require-gpu] [--json FILE] ...
//!
//! See bench.rs for what the end-to-end benchmark measures, limits.rs and sink.rs for the
//! limits, wide.rs for wide, full.rs for full, gc_scale.rs for gc-scale and gpu.rs for the GPU
//! codec benchmark.

mod bench;
mod ckptfs;
mod closes;
mod codec;
mod data;
mod full;
mod gc_scale;
mod gpu;
mod limits;
mod remote;
mod report;
mod saves;
mod sink;
mod slots;
mod sys;
mod targets;
mod tree;
mod util;
mod wide;
mod worker;

use clap::{Args, Parser, Subcommand};
use std::path::PathBuf;

use ckptfs_engine::parse_size;

/// Options of the end-to-end benchmark (every scenario takes all of them).
#[derive(Args, Clone, Debug)]
pub struct Opts {
    /// Work directory: plain files in DIR/plain, the ckptfs space in DIR/backing mounted at
    /// DIR/mnt, so both sides use the same disk
    #[arg(long, default_value = "/var/tmp/ckptfs-bench")]
    pub dir: PathBuf,
    /// The ckptfs binary [default: target/release/ckptfs of this workspace]
    #[arg(long)]
    pub ckptfs: Option<PathBuf>,
    /// Repetitions per side (plain and ckptfs alternate)
    #[arg(long, default_value_t = 3)]
    pub reps: usize,
    /// Bytes of a checkpoint (split over --procs processes in nn/n1); scales every scenario
    #[arg(long, default_value = "1G", value_parser = parse_size)]
    pub size: u64,
    /// Size of each write()/read() call, and the stripe of n1-strided
    #[arg(long, default_value = "1M", value_parser = parse_size)]
    pub block: u64,
    /// Processes of the nn, n1 and parallel restart scenarios
    #[arg(long, default_value_t = 8)]
    pub procs: usize,
    /// Seed of all generated data
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Size of the ckptfs space to format [default: 8 x --size, at least 1G]
    #[arg(long, value_parser = parse_size)]
    pub space: Option<u64>,
    /// Chunk size given to `ckptfs format`
    #[arg(long, default_value = "64K")]
    pub chunk_size: String,
    /// Also write the results as JSON to this file
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Print every repetition
    #[arg(long)]
    pub verbose: bool,
    /// Measure the limits first (as `limits` does) and print each ckptfs row also as a
    /// fraction of them (`all` always does)
    #[arg(long)]
    pub limits: bool,
    /// Leave the plain files and the ckptfs space in DIR afterwards
    #[arg(long)]
    pub keep: bool,
    /// Data of `steps`: random bytes, compressible float64 field blocks (`field`), or fp32
    /// weights (`tensor`: what the float codec, `--mount-arg=--codec=float`, is for)
    #[arg(long, default_value = "random", value_parser = ["random", "field", "tensor"])]
    pub data: String,
    /// Writer counts of `steps` (those above max(8, cores) are left out)
    #[arg(long, value_delimiter = ',', default_value = "1,4,8,16")]
    pub writers: Vec<usize>,
    /// Files each writer of `steps` writes per step, one after the other (its share of
    /// --size split over them), as jobs that save their shards one by one
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=4096))]
    pub files_per_writer: u32,
    /// Extra argument appended to every `ckptfs mount BACKING MNT` (repeatable; may start with
    /// `-`: --mount-arg=--codec --mount-arg=shuffle, or --mount-arg=--codec=shuffle)
    #[arg(long = "mount-arg", value_name = "ARG", allow_hyphen_values = true)]
    pub mount_args: Vec<String>,
}

#[derive(Parser)]
#[command(
    name = "ckptfs-bench",
    about = "ckptfs benchmarks: plain directory vs ckptfs mount on the same disk"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// The limits, then every scenario below, one table (about 6 minutes at the defaults on 2
    /// cores; run as root)
    All(Opts),
    /// First full checkpoint, one writer: random, field and dense data
    First(Opts),
    /// Next revision under a new name: random with 5% of blocks changed, dense, finetune
    Next(Opts),
    /// N-N: --procs writer processes, one file each; full and next revision
    Nn(Opts),
    /// N-1 segmented: --procs processes each write one contiguous part of one shared file
    #[command(name = "n1-seg")]
    N1Seg(Opts),
    /// N-1 strided: --procs processes write --block stripes of one file round-robin
    #[command(name = "n1-strided")]
    N1Strided(Opts),
    /// Cold reads (after drop_caches and a remount): one reader, and one reader per N-N file
    Restart(Opts),
    /// Checkpoint steps as jobs lay them out: 1, 4, 8, 16 writers (--writers), a full step
    /// and a next step with 5% changed, in a new directory per step, in place, and temp +
    /// rename; daemon CPU per GiB by stage and by thread
    Steps(Opts),
    /// This machine's ceilings: a do-nothing FUSE filesystem written and read as the scenarios
    /// do, and blake3 and LZ4 on all cores (no ckptfs needed)
    Limits(Opts),
    /// Internal: the do-nothing FUSE filesystem of `limits`, mounted at MNT
    #[command(hide = true)]
    Sink { mnt: PathBuf },
    /// Several daemons on one multi-slot space (nodes) vs one daemon vs a plain directory: N-N
    /// write, cold read through another node, small-file create and stat
    Slots(slots::SlotsOpts),
    /// A space over several targets (erasure-coded M+K, on the same disk) vs one target vs a
    /// plain directory: N-N write, cold read, degraded cold read with --lose targets gone;
    /// Reed-Solomon encode and reconstruct GiB/s
    Targets(targets::TargetsOpts),
    /// Internal: one writer/reader process of a multi-process scenario
    #[command(hide = true)]
    Worker { task: String },
    /// Format DIR and fill it with N files of two revisions each, for gc-scale-run
    GcScaleBuild {
        dir: PathBuf,
        #[arg(long, default_value_t = 32)]
        files: u64,
        #[arg(long, default_value_t = 4096)]
        chunk_size: u32,
    },
    /// gc's time and peak memory on a space built by gc-scale-build
    GcScaleRun { dir: PathBuf },
    /// Many files written at once, a little at a time in turn: throughput next to a plain
    /// directory, and the daemon's CPU and peak RSS against the number of files
    Wide(wide::WideOpts),
    /// Small files closed one after the other by 1 and 8 writers: time per close beside a
    /// plain directory with and without fsync per file, and the daemon's durable commits and
    /// publications per close
    Closes(closes::ClosesOpts),
    /// Checkpoint steps made of many files, shaped as frameworks save them (a Trainer step of
    /// ten files, a zarr array of 64 chunk files), 1 and 4 jobs at once, beside a plain
    /// directory with and without fsync per file
    Saves(saves::SavesOpts),
    /// Metadata-heavy work beside a plain directory: untar of a tree of 5,000 small files,
    /// `ls -l` and a stat of every file of a directory of 20,000
    Tree(tree::TreeOpts),
    /// The object-store tier beside a plain S3 client (boto3) on the same server: upload of
    /// a full checkpoint and of a 5%-changed next revision (seconds, bytes sent, daemon CPU),
    /// and a cold restore from the bucket beside a plain download
    Remote(remote::RemoteOpts),
    /// A full space rotating checkpoints (three steps kept, older ones removed): write
    /// amplification next to the bytes the application wrote, beside a plain directory, and
    /// what the daemon writes while the full space sits idle (run as root)
    Full(full::FullOpts),
    /// The chunk codecs side by side on one core, no mount: stored fraction under `lz4`,
    /// `float` and zstd level 1, encode and decode GiB/s, on seeded float, text, zero and
    /// random data and on files given (a framework checkpoint)
    Codec(codec::CodecOpts),
    /// GPU LZ4 (ckptfs-kernels) vs lz4_flex on all cores: GiB/s and ratio per data kind; needs
    /// neither root nor FUSE
    Gpu(gpu::GpuOpts),
}

fn main() {
    let cli = Cli::parse();
    let none = bench::Selection::default();
    let (opts, sel) = match cli.cmd {
        Cmd::All(o) => (o, bench::Selection::all()),
        Cmd::First(o) => (
            o,
            bench::Selection {
                first: true,
                ..none
            },
        ),
        Cmd::Next(o) => (o, bench::Selection { next: true, ..none }),
        Cmd::Nn(o) => (o, bench::Selection { nn: true, ..none }),
        Cmd::N1Seg(o) => (
            o,
            bench::Selection {
                n1_seg: true,
                ..none
            },
        ),
        Cmd::N1Strided(o) => (
            o,
            bench::Selection {
                n1_strided: true,
                ..none
            },
        ),
        Cmd::Restart(o) => (
            o,
            bench::Selection {
                restart: true,
                ..none
            },
        ),
        Cmd::Steps(o) => (
            o,
            bench::Selection {
                steps: true,
                ..none
            },
        ),
        Cmd::Limits(o) => match limits::run(&o) {
            Ok(()) => std::process::exit(0),
            Err(e) => {
                eprintln!("ckptfs-bench limits: {e}");
                std::process::exit(1);
            }
        },
        Cmd::Sink { mnt } => match sink::sink_main(&mnt) {
            Ok(()) => std::process::exit(0),
            Err(e) => {
                eprintln!("ckptfs-bench sink: {e}");
                std::process::exit(1);
            }
        },
        Cmd::Slots(o) => match slots::run(&o) {
            Ok(ok) => std::process::exit(if ok { 0 } else { 1 }),
            Err(e) => {
                eprintln!("ckptfs-bench slots: {e}");
                std::process::exit(1);
            }
        },
        Cmd::Codec(o) => match codec::run(&o) {
            Ok(()) => std::process::exit(0),
            Err(e) => {
                eprintln!("ckptfs-bench codec: {e}");
                std::process::exit(1);
            }
        },
        Cmd::Targets(o) => match targets::run(&o) {
            Ok(ok) => std::process::exit(if ok { 0 } else { 1 }),
            Err(e) => {
                eprintln!("ckptfs-bench targets: {e}");
                std::process::exit(1);
            }
        },
        Cmd::Full(o) => match full::run(&o) {
            Ok(ok) => std::process::exit(if ok { 0 } else { 1 }),
            Err(e) => {
                eprintln!("ckptfs-bench full: {e}");
                std::process::exit(1);
            }
        },
        Cmd::Wide(o) => match wide::run(&o) {
            Ok(()) => std::process::exit(0),
            Err(e) => {
                eprintln!("ckptfs-bench wide: {e}");
                std::process::exit(1);
            }
        },
        Cmd::Closes(o) => match closes::run(&o) {
            Ok(()) => std::process::exit(0),
            Err(e) => {
                eprintln!("ckptfs-bench closes: {e}");
                std::process::exit(1);
            }
        },
        Cmd::Saves(o) => match saves::run(&o) {
            Ok(()) => std::process::exit(0),
            Err(e) => {
                eprintln!("ckptfs-bench saves: {e}");
                std::process::exit(1);
            }
        },
        Cmd::Remote(o) => match remote::run(&o) {
            Ok(()) => std::process::exit(0),
            Err(e) => {
                eprintln!("ckptfs-bench remote: {e}");
                std::process::exit(1);
            }
        },
        Cmd::Tree(o) => match tree::run(&o) {
            Ok(()) => std::process::exit(0),
            Err(e) => {
                eprintln!("ckptfs-bench tree: {e}");
                std::process::exit(1);
            }
        },
        Cmd::Worker { task } => {
            if let Err(e) = worker::worker_main(&task) {
                eprintln!("ckptfs-bench worker: {e}");
                std::process::exit(1);
            }
            return;
        }
        Cmd::GcScaleBuild {
            dir,
            files,
            chunk_size,
        } => exit_on_error(gc_scale::build(&dir, files, chunk_size)),
        Cmd::GcScaleRun { dir } => exit_on_error(gc_scale::run(&dir)),
        Cmd::Gpu(o) => match gpu::run(&o) {
            Ok(ok) => std::process::exit(if ok { 0 } else { 1 }),
            Err(e) => {
                eprintln!("ckptfs-bench gpu: {e}");
                std::process::exit(1);
            }
        },
    };
    match bench::run(&opts, sel) {
        Ok(true) => {}
        Ok(false) => std::process::exit(1),
        Err(e) => {
            eprintln!("ckptfs-bench: {e}");
            std::process::exit(1);
        }
    }
}

fn exit_on_error(r: Result<(), Box<dyn std::error::Error>>) -> ! {
    if let Err(e) = r {
        eprintln!("ckptfs-bench: {e}");
        std::process::exit(1);
    }
    std::process::exit(0);
}

#[cfg(test)]
mod tests {
    use super::{parse_size, Cli, Cmd};
    use clap::Parser;

    #[test]
    fn mount_args() {
        for argv in [
            &["b", "first", "--mount-arg=--codec", "--mount-arg=shuffle"][..],
            &[
                "b",
                "first",
                "--mount-arg",
                "--codec",
                "--mount-arg",
                "shuffle",
            ][..],
        ] {
            let Cmd::First(o) = Cli::try_parse_from(argv).unwrap().cmd else {
                panic!("not first");
            };
            assert_eq!(o.mount_args, ["--codec", "shuffle"]);
        }
        let Cmd::All(o) = Cli::try_parse_from(["b", "all", "--mount-arg", "--codec=shuffle"])
            .unwrap()
            .cmd
        else {
            panic!("not all");
        };
        assert_eq!(o.mount_args, ["--codec=shuffle"]);
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("64K"), Ok(64 << 10));
        assert_eq!(parse_size("1G"), Ok(1 << 30));
        assert_eq!(parse_size("1GiB"), Ok(1 << 30));
        assert_eq!(parse_size("256m"), Ok(256 << 20));
        assert!(parse_size("x").is_err());
    }
}
