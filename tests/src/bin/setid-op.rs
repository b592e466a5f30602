//! One write-like operation on a file, for the setuid/setgid test (tests/tests/setid.rs),
//! which runs it as an unprivileged user (and as root) on a ckptfs mount and on a plain
//! directory and compares the mode bits afterwards.
//!
//! Usage: `setid-op OP PATH`, OP one of: wronly, rdwr, trunc-open, truncate, ftruncate,
//! mmap, chown-self (chown to the caller's uid and gid). Exits 0 on success; prints the failing call and exits 1 otherwise.

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;

fn check(what: &str, r: libc::c_int) -> libc::c_int {
    if r < 0 {
        eprintln!("setid-op: {what}: {}", std::io::Error::last_os_error());
        std::process::exit(1);
    }
    r
}

fn main() {
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    if args.len() != 3 {
        eprintln!("usage: setid-op OP PATH");
        std::process::exit(2);
    }
    let op = args[1].to_string_lossy().into_owned();
    let path = CString::new(args[2].as_bytes()).expect("path without NUL");
    let data = b"data";
    // SAFETY: plain syscalls on a valid C string, a 4-byte buffer and descriptors we opened;
    // the mapping is one page of a file extended to at least that size.
    unsafe {
        let open = |flags: libc::c_int| check("open", libc::open(path.as_ptr(), flags));
        match op.as_str() {
            "wronly" | "rdwr" => {
                let fd = open(if op == "wronly" {
                    libc::O_WRONLY
                } else {
                    libc::O_RDWR
                });
                check("pwrite", libc::pwrite(fd, data.as_ptr().cast(), 4, 0) as _);
                check("close", libc::close(fd));
            }
            "trunc-open" => {
                let fd = open(libc::O_WRONLY | libc::O_TRUNC);
                check("close", libc::close(fd));
            }
            "truncate" => {
                check("truncate", libc::truncate(path.as_ptr(), 1));
            }
            "ftruncate" => {
                let fd = open(libc::O_WRONLY);
                check("ftruncate", libc::ftruncate(fd, 1));
                check("close", libc::close(fd));
            }
            "mmap" => {
                let fd = open(libc::O_RDWR);
                check("ftruncate", libc::ftruncate(fd, 4096));
                let p = libc::mmap(
                    std::ptr::null_mut(),
                    4096,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_SHARED,
                    fd,
                    0,
                );
                if p == libc::MAP_FAILED {
                    check("mmap", -1);
                }
                *(p as *mut u8) = b'x';
                check("msync", libc::msync(p, 4096, libc::MS_SYNC));
                check("munmap", libc::munmap(p, 4096));
                check("close", libc::close(fd));
            }
            "chown-self" => {
                check(
                    "chown",
                    libc::chown(path.as_ptr(), libc::getuid(), libc::getgid()),
                );
            }
            other => {
                eprintln!("setid-op: unknown op {other}");
                std::process::exit(2);
            }
        }
    }
}
