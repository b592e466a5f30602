//! Reading back: a sequential reader is read ahead of, and a random reader is not. Checked by
//! what the daemon read from the data file (`ckptfs stats --json`, the `read` stage's
//! bytes), after a remount so nothing is cached.

use std::fs::File;
use std::io::Read;
use std::os::unix::fs::FileExt;

use ckptfs_tests::{pattern, TestMount};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

const MIB: usize = 1 << 20;

/// Bytes the daemon has read from the data file since it mounted.
fn device_read_bytes(m: &mut TestMount) -> u64 {
    let s = m.stats();
    s.stats
        .stages
        .iter()
        .find(|t| t.name == "read")
        .expect("a read stage in the stats")
        .bytes
}

fn written(m: &mut TestMount, name: &str, data: &[u8]) {
    std::fs::write(m.path(name), data).expect("write");
    m.remount();
}

#[test]
fn a_sequential_reader_reads_each_byte_from_the_disk_about_once() {
    let mut m = TestMount::new();
    let data = pattern(11, 96 * MIB);
    written(&mut m, "seq", &data);
    let before = device_read_bytes(&mut m);
    let mut got = Vec::with_capacity(data.len());
    File::open(m.path("seq"))
        .and_then(|mut f| f.read_to_end(&mut got))
        .expect("read");
    assert!(got == data, "the file read back differs");
    let read = device_read_bytes(&mut m) - before;
    println!(
        "sequential: {read} bytes read from the disk for {}",
        data.len()
    );
    // Read-ahead that the cache let go before the reader got there would be read twice.
    assert!(
        read >= data.len() as u64 && read <= data.len() as u64 * 11 / 10,
        "{read} bytes read from the disk for a {} byte file",
        data.len()
    );
}

#[test]
fn random_small_reads_do_not_read_ahead() {
    let mut m = TestMount::new();
    let data = pattern(12, 256 * MIB);
    written(&mut m, "rand", &data);
    let s = m.stats();
    let avg_chunk = s.stats.stored_bytes / s.stats.chunks.max(1);
    let before = device_read_bytes(&mut m);
    let f = File::open(m.path("rand")).expect("open");
    let mut rng = SmallRng::seed_from_u64(12);
    const READS: u64 = 400;
    let mut buf = [0u8; 4096];
    for _ in 0..READS {
        let off = rng.random_range(0..(data.len() - buf.len()) as u64 / 4096) * 4096;
        f.read_exact_at(&mut buf, off).expect("read");
        assert!(buf[..] == data[off as usize..off as usize + buf.len()]);
    }
    let read = device_read_bytes(&mut m) - before;
    println!("random: {read} bytes read from the disk for {READS} reads of 4 KiB, average chunk {avg_chunk}");
    // Each read needs the one or two chunks it touches, plus what the kernel reads around it
    // (page-cache readahead for a file opened without a hint); a read-ahead of megabytes
    // behind a read that looked sequential by chance would pass this many times over.
    assert!(
        read <= READS * 4 * avg_chunk,
        "{read} bytes read from the disk for {READS} random 4 KiB reads (average chunk {avg_chunk})"
    );
}
