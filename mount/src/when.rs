//! Times as people and programs read them: local time with the age for the terminal
//! (`2026-11-23 20:37:32 (4 min ago)`), RFC 3339 with the local offset for `--json`.
//!
//! The local zone is the C library's (`localtime_r`: TZ, else /etc/localtime), the same
//! answer `date` and `ls -l` give on the node, so no time-zone database ships with ckptfs.

use std::time::{SystemTime, UNIX_EPOCH};

/// Broken-down local time of `secs` since the epoch, and its offset from UTC in seconds.
fn local(secs: i64) -> Option<(libc::tm, i64)> {
    // time_t is i64 on every target ckptfs builds for (64-bit Linux).
    let t: libc::time_t = secs;
    // SAFETY: localtime_r writes only into `tm`, which outlives the call; a null return
    // (a time it cannot represent) leaves it unused.
    let mut tm: libc::tm = unsafe { std::mem::zeroed() };
    let r = unsafe { libc::localtime_r(&t, &mut tm) };
    if r.is_null() {
        return None;
    }
    let off = tm.tm_gmtoff;
    Some((tm, off))
}

fn date_time(tm: &libc::tm, sep: char) -> String {
    format!(
        "{:04}-{:02}-{:02}{sep}{:02}:{:02}:{:02}",
        tm.tm_year + 1900,
        tm.tm_mon + 1,
        tm.tm_mday,
        tm.tm_hour,
        tm.tm_min,
        tm.tm_sec
    )
}

/// RFC 3339 in local time with milliseconds: `2026-11-23T20:37:32.845+01:00`.
pub fn rfc3339(unix: f64) -> String {
    let secs = unix.floor() as i64;
    let ms = ((unix - unix.floor()) * 1000.0).floor() as u32;
    let Some((tm, off)) = local(secs) else {
        return format!("{unix:.3}");
    };
    let sign = if off < 0 { '-' } else { '+' };
    let off = off.unsigned_abs();
    format!(
        "{}.{ms:03}{sign}{:02}:{:02}",
        date_time(&tm, 'T'),
        off / 3600,
        off % 3600 / 60
    )
}

/// Local time with its age, for people: `2026-11-23 20:37:32 (4 min ago)`.
pub fn human(unix: f64) -> String {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64());
    match local(unix.floor() as i64) {
        Some((tm, _)) => format!("{} ({})", date_time(&tm, ' '), age(now - unix)),
        None => format!("{unix:.3}"),
    }
}

/// `just now`, `42 s ago`, `4 min ago`, `3 h ago`, `2 days ago`; `in 5 s` for a clock
/// behind the commit's (another node's clock, or a clock set back).
pub fn age(secs: f64) -> String {
    let (future, s) = (secs < 0.0, secs.abs().floor() as u64);
    let span = match s {
        0 => return "just now".into(),
        1..=59 => format!("{s} s"),
        60..=3599 => format!("{} min", s / 60),
        3600..=86_399 => format!("{} h", s / 3600),
        86_400..=172_799 => "1 day".into(),
        _ => format!("{} days", s / 86_400),
    };
    if future {
        format!("in {span}")
    } else {
        format!("{span} ago")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ages_read_as_people_say_them() {
        assert_eq!(age(0.4), "just now");
        assert_eq!(age(42.0), "42 s ago");
        assert_eq!(age(4.0 * 60.0 + 5.0), "4 min ago");
        assert_eq!(age(3.0 * 3600.0), "3 h ago");
        assert_eq!(age(86_400.0 * 1.5), "1 day ago");
        assert_eq!(age(86_400.0 * 9.0), "9 days ago");
        assert_eq!(age(-5.0), "in 5 s");
    }

    /// In UTC the offset is +00:00 and the fields are the epoch's; this also checks the
    /// milliseconds and the month and year offsets of `tm`.
    #[test]
    fn rfc3339_in_utc() {
        std::env::set_var("TZ", "UTC");
        // SAFETY: tzset reads TZ; the test sets it first and no other test changes it.
        unsafe { tzset() };
        assert_eq!(rfc3339(1_795_466_252.845), "2026-11-23T20:37:32.845+00:00");
        assert_eq!(rfc3339(0.0), "1970-01-01T00:00:00.000+00:00");
        let h = human(1_795_466_252.845);
        assert!(h.starts_with("2026-11-23 20:37:32 ("), "{h}");
    }

    extern "C" {
        fn tzset();
    }
}
