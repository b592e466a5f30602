//! The framework examples (examples/frameworks: numpy with np.save and memmap, safetensors
//! with weights and optimizer state, h5py) write five steps into a real mount with a
//! `latest` symlink, a second run resumes from `latest` (verifying it bit for bit) and
//! writes two more, and the space's stored/logical shows what ckptfs saved.
//!
//! They need Debian's python3-numpy and python3-h5py, and python3-venv for a venv that
//! pip-installs safetensors; `.ci/run` installs them. Without them a test says so loudly
//! and skips, unless `CKPTFS_REQUIRE` names what is missing (`.ci/run` names all three).

use std::path::{Path, PathBuf};
use std::process::Command;

use ckptfs_tests::{TempDir, TestMount};

fn example(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../examples/frameworks")
        .join(name)
}

fn has_modules(py: &Path, modules: &str) -> bool {
    Command::new(py)
        .args(["-c", &format!("import {modules}")])
        .output()
        .is_ok_and(|o| o.status.success())
}

/// Debian's python3 when it has `modules` (pyenv shims on PATH may shadow it).
fn system_python(modules: &str) -> Option<PathBuf> {
    ["/usr/bin/python3", "python3"]
        .iter()
        .map(PathBuf::from)
        .find(|py| has_modules(py, modules))
}

use ckptfs_tests::skip;

/// Runs the example twice (to step 5, then resumed to step 7) in a fresh mount and
/// returns stored/logical.
fn run_example(py: &Path, script: &str) -> f64 {
    run_example_with(py, script, &[])
}

/// The same with arguments before the directory (`--dcp RANKS`).
fn run_example_with(py: &Path, script: &str, pre: &[&str]) -> f64 {
    let mut m = TestMount::with_format_args("1G", &["--keep-revisions", "1"]);
    let dir = m.path("ckpt");
    std::fs::create_dir(&dir).unwrap();
    let before = m.stats();
    for (steps, want) in [("5", "done at step 5"), ("7", "resumed from step 5")] {
        let out = Command::new(py)
            .arg(example(script))
            .args(pre)
            .arg(&dir)
            .arg(steps)
            .output()
            .expect("run the example");
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        println!("--- {script} to step {steps} ---\n{text}");
        assert!(out.status.success(), "{script} {steps} failed:\n{text}");
        assert!(
            text.contains(want),
            "{script} {steps}: no {want:?}:\n{text}"
        );
    }
    let latest = std::fs::read_link(dir.join("latest")).unwrap();
    assert!(latest.to_string_lossy().starts_with("step-7"), "{latest:?}");
    let after = m.stats();
    let logical = after.stats.logical_bytes - before.stats.logical_bytes;
    let stored = after.stats.stored_bytes - before.stats.stored_bytes;
    let ratio = stored as f64 / logical as f64;
    println!(
        "{script} {pre:?}: 7 steps, logical {logical} B, stored {stored} B, stored/logical \
         {ratio:.3}"
    );
    ratio
}

/// Each step changes a quarter of the tensors; the rest repeat the previous step's bytes,
/// which ckptfs stores once: 7 steps store about (1 + 6/4)/7 = 0.36 of what they write.
const WANT_BELOW: f64 = 0.6;

#[test]
fn numpy_save_and_memmap_resume() {
    let Some(py) = system_python("numpy") else {
        return skip(
            "numpy_save_and_memmap_resume",
            "numpy",
            "no python3 with numpy",
        );
    };
    let r = run_example(&py, "numpy_ckpt.py");
    assert!(r < WANT_BELOW, "stored/logical {r:.3}");
}

#[test]
fn h5py_checkpoints_resume() {
    let Some(py) = system_python("numpy, h5py") else {
        return skip("h5py_checkpoints_resume", "h5py", "no python3 with h5py");
    };
    let r = run_example(&py, "h5py_ckpt.py");
    assert!(r < WANT_BELOW, "stored/logical {r:.3}");
}

/// A venv on top of the system's numpy with safetensors from PyPI, or why there is none.
fn safetensors_python(venv: &TempDir) -> Result<PathBuf, &'static str> {
    let Some(sys_py) = system_python("numpy, venv") else {
        return Err("no python3 with numpy and venv");
    };
    let made = Command::new(&sys_py)
        .args(["-m", "venv", "--system-site-packages"])
        .arg(venv.path())
        .status()
        .is_ok_and(|s| s.success());
    let py = venv.path().join("bin/python");
    let installed = made
        && Command::new(&py)
            .args(["-m", "pip", "install", "--quiet", "safetensors"])
            .status()
            .is_ok_and(|s| s.success());
    if !installed || !has_modules(&py, "safetensors.numpy") {
        return Err("could not pip-install safetensors into a venv");
    }
    Ok(py)
}

#[test]
fn safetensors_weights_and_optimizer_resume() {
    const TEST: &str = "safetensors_weights_and_optimizer_resume";
    let venv = TempDir::new("venv");
    let py = match safetensors_python(&venv) {
        Ok(py) => py,
        Err(why) => return skip(TEST, "safetensors", why),
    };
    let r = run_example(&py, "safetensors_ckpt.py");
    assert!(r < WANT_BELOW, "stored/logical {r:.3}");
}

/// stored/logical of one GPT-2-shaped checkpoint with AdamW state (`gpt2_adamw.py`, extra
/// arguments `args`) written into a fresh space formatted with `format_args`.
fn gpt2_ratio(py: &Path, format_args: &[&str], args: &[&str]) -> f64 {
    let mut m = TestMount::with_format_args("1G", format_args);
    let before = m.stats();
    let out = Command::new(py)
        .arg(example("gpt2_adamw.py"))
        .arg(m.path("step-3"))
        .args(args)
        .output()
        .expect("run gpt2_adamw.py");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "gpt2_adamw.py {args:?}:\n{text}");
    let after = m.stats();
    let logical = after.stats.logical_bytes - before.stats.logical_bytes;
    let stored = after.stats.stored_bytes - before.stats.stored_bytes;
    let r = stored as f64 / logical as f64;
    println!("GPT-2-shaped checkpoint {args:?}, format {format_args:?}: logical {logical} B, stored {stored} B, {r:.4}");
    r
}

/// The GPT-2-shaped checkpoint (written as `args` say) in an lz4 space and a float space:
/// the float codec stores at most 90% of it, at least 10 points less than LZ4.
fn check_float_on_gpt2(py: &Path, args: &[&str], label: &str) {
    let lz4 = gpt2_ratio(py, &["--codec", "lz4"], args);
    let float = gpt2_ratio(py, &["--codec", "float"], args);
    println!("{label} GPT-2 + AdamW: lz4 {lz4:.4}, float {float:.4}");
    assert!(
        float <= 0.90,
        "float codec stored {float:.4} of the checkpoint, want <= 0.90"
    );
    assert!(
        lz4 - float >= 0.10,
        "float {float:.4} vs lz4 {lz4:.4}: want 10 points better"
    );
}

/// The float codec on a real framework checkpoint: GPT-2's layer shapes and initialisation
/// after AdamW steps, weights and both moments in fp32, saved with safetensors. It stores at
/// most 90% of it, at least 10 points less than LZ4 (which stores float weights raw).
#[test]
fn float_codec_on_a_gpt2_checkpoint_with_adamw_state() {
    const TEST: &str = "float_codec_on_a_gpt2_checkpoint_with_adamw_state";
    let venv = TempDir::new("venv");
    let py = match safetensors_python(&venv) {
        Ok(py) => py,
        Err(why) => return skip(TEST, "safetensors", why),
    };
    check_float_on_gpt2(&py, &[], "safetensors");
}

/// The same written with torch.save where PyTorch is there (`CKPTFS_TORCH_PYTHON`).
#[test]
fn float_codec_on_a_torch_saved_gpt2_checkpoint() {
    let Some(py) = torch_python() else {
        return skip_torch("float_codec_on_a_torch_saved_gpt2_checkpoint");
    };
    check_float_on_gpt2(&py, &["--torch"], "torch.save");
}

/// A Python with PyTorch >= 2.1: `$CKPTFS_TORCH_PYTHON`, else the system's. CI does not
/// install it (the PyPI wheel brings about 5 GB of CUDA libraries into a venv), so these
/// tests skip loudly there; README "Using ckptfs in a job" says how to run them.
fn torch_python() -> Option<PathBuf> {
    let check = "import torch, torch.distributed.checkpoint; \
                 assert tuple(map(int, torch.__version__.split('.')[:2])) >= (2, 1)";
    std::env::var_os("CKPTFS_TORCH_PYTHON")
        .map(PathBuf::from)
        .into_iter()
        .chain(["/usr/bin/python3", "python3"].iter().map(PathBuf::from))
        .find(|py| has_modules(py, "numpy") && has_modules(py, &format!("sys; {check}")))
}

fn skip_torch(test: &str) {
    skip(
        test,
        "torch",
        "no Python with PyTorch >= 2.1 (CI does not install it: the PyPI wheel pulls about \
         5 GB of CUDA libraries). Run it with a venv that has torch: \
         CKPTFS_TORCH_PYTHON=/path/to/venv/bin/python cargo nextest run -p ckptfs-tests \
         --test frameworks",
    );
}

#[test]
fn torch_save_and_mmap_load_resume() {
    let Some(py) = torch_python() else {
        return skip_torch("torch_save_and_mmap_load_resume");
    };
    let r = run_example(&py, "torch_ckpt.py");
    assert!(r < WANT_BELOW, "stored/logical {r:.3}");
}

#[test]
fn torch_distributed_checkpoint_with_four_gloo_ranks() {
    let Some(py) = torch_python() else {
        return skip_torch("torch_distributed_checkpoint_with_four_gloo_ranks");
    };
    let r = run_example_with(&py, "torch_ckpt.py", &["--dcp", "4"]);
    assert!(r < WANT_BELOW, "stored/logical {r:.3}");
}
