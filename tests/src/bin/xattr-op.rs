//! One extended-attribute call, for tests/tests/xattrs.rs, which runs it as an unprivileged
//! user on a ckptfs mount and on a plain directory and compares the answers.
//!
//! Usage: `xattr-op list PATH`, `xattr-op get PATH NAME`, `xattr-op set PATH NAME VALUE`,
//! `xattr-op remove PATH NAME`. Prints one line: `ok` followed by the names (sorted) or the
//! value, or `errno N`. Exits 0 unless the usage is wrong.

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;

fn c(a: &std::ffi::OsStr) -> CString {
    CString::new(a.as_bytes()).expect("argument without NUL")
}

fn main() {
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    let op = args.get(1).map(|a| a.to_string_lossy().into_owned());
    let n = match op.as_deref() {
        Some("list") => 3,
        Some("get") | Some("remove") => 4,
        Some("set") => 5,
        _ => 0,
    };
    if n == 0 || args.len() != n {
        eprintln!("usage: xattr-op list|get|set|remove PATH [NAME [VALUE]]");
        std::process::exit(2);
    }
    let path = c(&args[2]);
    let mut buf = vec![0u8; 1 << 16];
    // SAFETY: valid C strings, and a buffer whose length is the size passed.
    let r = unsafe {
        match op.as_deref() {
            Some("list") => libc::llistxattr(path.as_ptr(), buf.as_mut_ptr().cast(), buf.len()),
            Some("get") => libc::lgetxattr(
                path.as_ptr(),
                c(&args[3]).as_ptr(),
                buf.as_mut_ptr().cast(),
                buf.len(),
            ),
            Some("set") => {
                let v = args[4].as_bytes();
                libc::lsetxattr(
                    path.as_ptr(),
                    c(&args[3]).as_ptr(),
                    v.as_ptr().cast(),
                    v.len(),
                    0,
                ) as isize
            }
            _ => libc::lremovexattr(path.as_ptr(), c(&args[3]).as_ptr()) as isize,
        }
    };
    if r < 0 {
        println!(
            "errno {}",
            std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
        );
        return;
    }
    let out = &buf[..r.max(0) as usize];
    match op.as_deref() {
        Some("list") => {
            let mut names: Vec<String> = out
                .split(|b| *b == 0)
                .filter(|n| !n.is_empty())
                .map(|n| String::from_utf8_lossy(n).into_owned())
                .collect();
            names.sort();
            println!("ok {}", names.join(","));
        }
        Some("get") => println!("ok {}", String::from_utf8_lossy(out)),
        _ => println!("ok"),
    }
}
