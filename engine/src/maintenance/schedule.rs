//! The daemon's periodic work as one scheduler: named jobs, each run every so many ticks on
//! one thread, some of them also at once when a caller asks (`Wake::ask`), and a stop that
//! takes effect without waiting for the tick.
//!
//! The mount registers what it runs (automatic gc, publication, learning other nodes'
//! removals, trims of idle buffers) and starts it; the engine owns the cadence, the asking
//! and the stopping, so no caller writes its own thread and sleep loop. The tick paces work
//! and is real time (`clock` is for decisions by age: skipping a test's clock ahead must not
//! make this thread spin).
//!
//! Bounds: one thread; a job runs to its end before the next starts (a slow gc delays the
//! next publication, never overlaps it); asks are counted, not queued (any number of
//! callers waiting on one pass cost one pass).

use parking_lot::{Condvar, Mutex};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The daemon's tick: automatic gc checks free space four times a second (a check is one
/// metadata read), so a fast writer does not outrun it.
pub const TICK: Duration = Duration::from_millis(250);

/// One registered job.
struct Job {
    name: &'static str,
    /// Runs on every `every`-th tick (1: every tick).
    every: u64,
    /// Also runs, before anything else, when a caller asked (`Wake::ask`).
    on_ask: bool,
    run: Box<dyn FnMut() + Send>,
}

/// Jobs and their cadence, not yet running (`start`).
pub struct Scheduler {
    tick: Duration,
    jobs: Vec<Job>,
    wake: Arc<Wake>,
}

/// What callers use to reach a running scheduler: ask for the asked-for jobs now, or stop.
#[derive(Default)]
pub struct Wake {
    state: Mutex<WakeState>,
    cv: Condvar,
}

#[derive(Default)]
struct WakeState {
    /// Asks so far, and the number of asks the last finished ask pass answered.
    asked: u64,
    answered: u64,
    /// A scheduler thread serves the asks (before `start` and after `stop` nobody does,
    /// and `ask` returns at once).
    running: bool,
    stop: bool,
}

impl Wake {
    /// Has the scheduler run its `on_ask` jobs now and waits for that pass, at most `limit`.
    /// True when a pass that started after this call has finished; false when no scheduler
    /// runs or the wait timed out (the caller goes on: asking is an optimisation, the jobs
    /// run on their cadence anyway).
    pub fn ask(&self, limit: Duration) -> bool {
        let deadline = Instant::now() + limit;
        let mut s = self.state.lock();
        if !s.running {
            return false;
        }
        s.asked += 1;
        let mine = s.asked;
        self.cv.notify_all();
        while s.answered < mine {
            if !s.running || self.cv.wait_until(&mut s, deadline).timed_out() {
                return false;
            }
        }
        true
    }

    /// Stops the scheduler after the job running now (if any) ends. Idempotent.
    pub fn stop(&self) {
        let mut s = self.state.lock();
        s.stop = true;
        self.cv.notify_all();
    }

    /// Waits up to `d` or until asked or stopped; returns (asks to answer so far, stop).
    fn pause(&self, d: Duration) -> (u64, bool) {
        let deadline = Instant::now() + d;
        let mut s = self.state.lock();
        while !s.stop && s.asked == s.answered {
            if self.cv.wait_until(&mut s, deadline).timed_out() {
                break;
            }
        }
        (s.asked, s.stop)
    }

    fn answered(&self, upto: u64) {
        let mut s = self.state.lock();
        s.answered = s.answered.max(upto);
        self.cv.notify_all();
    }

    fn set_running(&self, on: bool) {
        let mut s = self.state.lock();
        s.running = on;
        self.cv.notify_all();
    }
}

/// A started scheduler: `stop` and `join` it at unmount.
pub struct Running {
    wake: Arc<Wake>,
    thread: std::thread::JoinHandle<()>,
}

impl Running {
    pub fn wake(&self) -> Arc<Wake> {
        self.wake.clone()
    }

    /// Stops the scheduler and waits for its thread.
    pub fn join(self) {
        self.wake.stop();
        if self.thread.join().is_err() {
            log::error!("the maintenance thread panicked");
        }
    }
}

impl Default for Scheduler {
    fn default() -> Self {
        Scheduler::new(TICK)
    }
}

impl Scheduler {
    pub fn new(tick: Duration) -> Scheduler {
        Scheduler {
            tick,
            jobs: Vec::new(),
            wake: Arc::default(),
        }
    }

    /// The handle callers ask and stop through; valid before and after `start`.
    pub fn wake(&self) -> Arc<Wake> {
        self.wake.clone()
    }

    /// Runs `f` every `every` ticks (at least 1).
    pub fn every(
        mut self,
        name: &'static str,
        every: u64,
        f: impl FnMut() + Send + 'static,
    ) -> Self {
        self.jobs.push(Job {
            name,
            every: every.max(1),
            on_ask: false,
            run: Box::new(f),
        });
        self
    }

    /// As `every`, and also at once when a caller asks (`Wake::ask`).
    pub fn every_or_asked(
        mut self,
        name: &'static str,
        every: u64,
        f: impl FnMut() + Send + 'static,
    ) -> Self {
        self = self.every(name, every, f);
        self.jobs.last_mut().expect("just pushed").on_ask = true;
        self
    }

    /// The names of the jobs, in the order they run (for the log).
    pub fn names(&self) -> Vec<&'static str> {
        self.jobs.iter().map(|j| j.name).collect()
    }

    /// One pass: the asked-for jobs if `asked`, then the jobs due at tick `tick`. Public for
    /// tests that drive the cadence themselves.
    pub fn pass(&mut self, tick: u64, asked: bool) {
        if asked {
            for j in self.jobs.iter_mut().filter(|j| j.on_ask) {
                (j.run)();
            }
        }
        for j in self.jobs.iter_mut() {
            // An asked job that just ran is not run again in the same pass.
            if tick.is_multiple_of(j.every) && !(asked && j.on_ask) {
                (j.run)();
            }
        }
    }

    /// Runs the jobs on their own thread until `Running::join` (or `Wake::stop`).
    pub fn start(mut self) -> Running {
        let wake = self.wake.clone();
        wake.set_running(true);
        let thread = std::thread::Builder::new()
            .name("ckptfs-maint".into())
            .spawn(move || {
                let mut tick = 0u64;
                let mut answered = 0u64;
                loop {
                    let (asked, stop) = self.wake.pause(self.tick);
                    if stop {
                        break;
                    }
                    let ask = asked > answered;
                    tick += 1;
                    self.pass(tick, ask);
                    if ask {
                        answered = asked;
                        self.wake.answered(asked);
                    }
                }
                self.wake.set_running(false);
            })
            .expect("spawning the maintenance thread");
        Running { wake, thread }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU64, Ordering};

    fn counter() -> (Arc<AtomicU64>, impl FnMut() + Send + 'static) {
        let c = Arc::new(AtomicU64::new(0));
        let c2 = c.clone();
        (c, move || {
            c2.fetch_add(1, Ordering::SeqCst);
        })
    }

    #[test]
    fn jobs_run_on_their_cadence_and_asked_jobs_once_more() {
        let (a, fa) = counter();
        let (b, fb) = counter();
        let mut s = Scheduler::new(TICK)
            .every("a", 1, fa)
            .every_or_asked("b", 4, fb);
        assert_eq!(s.names(), vec!["a", "b"]);
        for t in 1..=8 {
            s.pass(t, false);
        }
        assert_eq!((a.load(Ordering::SeqCst), b.load(Ordering::SeqCst)), (8, 2));
        // Asked on a tick where b is due anyway: b runs once, not twice.
        s.pass(12, true);
        assert_eq!(b.load(Ordering::SeqCst), 3);
        s.pass(13, true);
        assert_eq!(
            (a.load(Ordering::SeqCst), b.load(Ordering::SeqCst)),
            (10, 4)
        );
    }

    #[test]
    fn an_ask_is_answered_without_waiting_for_the_tick_and_stop_is_prompt() {
        let (b, fb) = counter();
        // A tick of an hour: only an ask or a stop can end a pause within the test.
        let s = Scheduler::new(Duration::from_secs(3600)).every_or_asked("b", 1000, fb);
        let wake = s.wake();
        assert!(
            !wake.ask(Duration::from_secs(1)),
            "no thread runs yet: nobody answers"
        );
        let running = s.start();
        assert!(wake.ask(Duration::from_secs(60)));
        assert_eq!(b.load(Ordering::SeqCst), 1);
        // Many callers at once: each is answered by a pass that started after it asked.
        let askers: Vec<_> = (0..4)
            .map(|_| {
                let w = wake.clone();
                std::thread::spawn(move || w.ask(Duration::from_secs(60)))
            })
            .collect();
        for a in askers {
            assert!(a.join().unwrap());
        }
        let n = b.load(Ordering::SeqCst);
        assert!((2..=5).contains(&n), "{n} passes for 4 asks");
        let t = Instant::now();
        running.join();
        assert!(
            t.elapsed() < Duration::from_secs(600),
            "stop waited for the tick"
        );
        assert!(!wake.ask(Duration::from_secs(1)), "stopped: nobody answers");
    }
}
