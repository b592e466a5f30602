//! `ckptfs mount --gpu`: `on` refuses to mount without a GPU and says why; `emulate` runs the
//! GPU compression path (the CUDA kernels in their CPU emulation) behind a real mount, and
//! what it stores reads back through a mount that uses no GPU.

use std::ffi::OsStr;

use ckptfs_tests::{assert_file_eq, Report, StatsReport, TestMount};

/// Log-like text: compresses well with LZ4.
fn log_text(len: usize) -> Vec<u8> {
    let mut v = Vec::with_capacity(len);
    let mut i = 0u64;
    while v.len() < len {
        v.extend_from_slice(
            format!(
                "step {i:>9} loss {:.5} tokens/s {}\n",
                (i % 977) as f64 / 311.0,
                40_000 + i * 7 % 513
            )
            .as_bytes(),
        );
        i += 1;
    }
    v.truncate(len);
    v
}

fn stage_bytes(stats: &Report<StatsReport>, name: &str) -> u64 {
    stats
        .stats
        .stages
        .iter()
        .find(|s| s.name == name)
        .map(|s| s.bytes)
        .unwrap_or_else(|| panic!("no stage {name} in {stats}"))
}

#[test]
fn gpu_on_refuses_to_mount_without_a_gpu_and_says_why() {
    let mut tm = TestMount::new();
    tm.unmount();
    let (st, out, err) = tm.ckptfs(&[
        OsStr::new("mount"),
        OsStr::new("--gpu"),
        OsStr::new("on"),
        tm.backing().to_path_buf().as_os_str(),
        tm.mnt().to_path_buf().as_os_str(),
    ]);
    if st.success() {
        eprintln!("NOTE: a GPU is present here; `--gpu on` mounted, so the refusal is not tested");
        tm.unmount();
        return;
    }
    let msg = format!("{out}{err}");
    assert!(
        msg.contains("--gpu on: no usable GPU"),
        "the error names the flag and the reason: {msg}"
    );
    assert!(!tm.is_mounted());
    // Nothing was harmed: the space mounts without the flag.
    tm.mount();
}

#[test]
fn gpu_emulated_kernels_store_lz4_that_reads_back_without_a_gpu() {
    let mut tm = TestMount::new();
    tm.unmount();
    tm.mount_with(&["--gpu", "emulate"]);
    let data = log_text(1 << 20);
    std::fs::write(tm.path("train.log"), &data).unwrap();
    let stats = tm.stats();
    assert_eq!(
        stage_bytes(&stats, "gpu") as usize,
        data.len(),
        "every new chunk was compressed by the (emulated) GPU kernels"
    );
    assert_eq!(stage_bytes(&stats, "compress"), 0, "none on the CPU");
    let stored = stats.stats.stored_bytes;
    assert!(
        stored < data.len() as u64 / 3,
        "log text compresses: {stored} of {}",
        data.len()
    );
    tm.unmount();
    tm.mount_with(&["--gpu", "off"]);
    assert_file_eq(&tm.path("train.log"), &data);
}
