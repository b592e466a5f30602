//! A bystander process of the open/close race test (tests/tests/open_race.rs): until SECONDS
//! have passed it opens, reads, stats and closes the given files as a monitoring script, an
//! `md5sum` or a data loader would, while the test's writers rewrite them.
//!
//! Usage: `race-opener SEED SECONDS PATH...`. Errors other than ENOENT (a rename-replace in
//! flight) are reported on stderr and make it exit 1; prints one line of op counts.

use std::fs::{self, File};
use std::io::{self, Read};
use std::os::unix::fs::OpenOptionsExt;
use std::path::PathBuf;
use std::time::{Duration, Instant};

const PAUSE: Duration = Duration::from_micros(200);

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.len() < 4 {
        eprintln!("usage: race-opener SEED SECONDS PATH...");
        std::process::exit(2);
    }
    let mut rng: u64 = args[1].parse().expect("SEED");
    let secs: u64 = args[2].parse().expect("SECONDS");
    let paths: Vec<PathBuf> = args[3..].iter().map(PathBuf::from).collect();
    let end = Instant::now() + Duration::from_secs(secs);
    let (mut opens, mut reads, mut stats) = (0u64, 0u64, 0u64);
    let mut buf = vec![0u8; 64 << 10];
    let mut failed = false;
    while Instant::now() < end {
        rng = ckptfs_tests::mix(rng, 1);
        let path = &paths[(rng % paths.len() as u64) as usize];
        let r: io::Result<()> = match (rng >> 8) % 8 {
            // Most of the time just open and close: the pattern that raced RELEASE.
            0..=4 => File::open(path).map(|_| opens += 1),
            5 => fs::metadata(path).map(|_| stats += 1),
            6 => File::open(path).and_then(|mut f| {
                let _ = f.read(&mut buf)?;
                reads += 1;
                Ok(())
            }),
            _ => fs::OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_NONBLOCK)
                .open(path)
                .map(|_| opens += 1),
        };
        if let Err(e) = r {
            if e.kind() != io::ErrorKind::NotFound {
                eprintln!("race-opener: {}: {e}", path.display());
                failed = true;
                break;
            }
        }
        // Paced, so that the files are not open all the time: a file whose open count never
        // drops to zero never exercises the table's removal path.
        std::thread::sleep(PAUSE);
    }
    println!("race-opener: {opens} opens, {reads} reads, {stats} stats");
    std::process::exit(i32::from(failed));
}
