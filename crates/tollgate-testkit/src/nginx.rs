//! Real nginx for differential tests, and a frozen clock (libfaketime) that a test
//! steps so that nginx and tollgate see every request at the same instant.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::process::{free_port, Killed};

/// libfaketime, from Debian's `faketime` package (`scripts/test.sh` installs it): its
/// thread-safe build. The plain one reads the timestamp file into shared buffers
/// without a lock, so a multi-threaded process (tollgate) now and then reads a
/// half-written instant, or the real time: one such read moves tokio's timers months
/// ahead and every pending timeout fires (a proxied request answered 504).
pub const LIBFAKETIME: &str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1";

/// A clock frozen at an instant the test sets, for processes started with
/// [`FrozenClock::apply`]: libfaketime reads the instant from a file on every call.
pub struct FrozenClock {
    file: PathBuf,
    base_s: u64,
}

impl FrozenClock {
    /// A clock whose instant 0 is `base_s` seconds after the Unix epoch, kept in a
    /// file in `dir`; it starts at instant 0.
    pub fn new(dir: &Path, base_s: u64) -> FrozenClock {
        assert!(
            Path::new(LIBFAKETIME).exists(),
            "libfaketime is missing ({LIBFAKETIME}): apt-get install faketime, or run scripts/test.sh"
        );
        let clock = FrozenClock {
            file: dir.join("frozen-time"),
            base_s,
        };
        clock.set(0);
        clock
    }

    /// Moves the clock to `t_us` after its instant 0 (atomically: a reader never sees
    /// half a timestamp).
    pub fn set(&self, t_us: u64) {
        let (date, time) = civil(self.base_s + t_us / 1_000_000);
        let stamp = format!("{date} {time}.{:06}\n", t_us % 1_000_000);
        let tmp = self.file.with_extension("tmp");
        std::fs::write(&tmp, stamp).expect("the clock file is writable");
        std::fs::rename(&tmp, &self.file).expect("the clock file is writable");
    }

    /// Runs `cmd` on this clock (and tollgate's own clock on the OS clock, which
    /// libfaketime then answers).
    pub fn apply(&self, cmd: &mut Command) {
        cmd.env("LD_PRELOAD", LIBFAKETIME)
            .env("FAKETIME_TIMESTAMP_FILE", &self.file)
            .env("FAKETIME_NO_CACHE", "1")
            .env("TOLLGATE_CLOCK", "os");
    }
}

/// `YYYY-MM-DD` and `hh:mm:ss` (UTC) of `secs` after the Unix epoch (the days-to-civil
/// conversion of the proleptic Gregorian calendar).
fn civil(secs: u64) -> (String, String) {
    let (days, rem) = ((secs / 86_400) as i64, secs % 86_400);
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    (
        format!("{year:04}-{month:02}-{day:02}"),
        format!("{:02}:{:02}:{:02}", rem / 3600, rem % 3600 / 60, rem % 60),
    )
}

/// An nginx process in the foreground (no master, one worker) with a prefix
/// directory of its own, stopped by PID when dropped.
pub struct Nginx {
    /// The port its `server` listens on (`{port}` in the `http` block).
    pub port: u16,
    _process: Killed,
}

impl Nginx {
    /// Starts nginx with `http` as its `http { }` block, where `{port}` stands for a
    /// free loopback port; its files go in `dir`. `clock`: run it on a frozen clock.
    /// Returns once the port accepts connections.
    pub fn start(dir: &Path, http: &str, clock: Option<&FrozenClock>) -> Nginx {
        let binary = ["/usr/sbin/nginx", "/usr/bin/nginx"]
            .into_iter()
            .find(|p| Path::new(p).exists())
            .expect("nginx is missing: apt-get install nginx, or run scripts/test.sh");
        let port = free_port();
        let conf = format!(
            "env FAKETIME_TIMESTAMP_FILE;\nenv FAKETIME_NO_CACHE;\ndaemon off;\nmaster_process off;\nworker_processes 1;\npid {d}/nginx.pid;\nerror_log {d}/error.log crit;\nevents {{ worker_connections 256; }}\nhttp {{\n{http}}}\n",
            d = dir.display(),
            http = http.replace("{port}", &port.to_string()),
        );
        let conf_path = dir.join("nginx.conf");
        std::fs::write(&conf_path, conf).expect("the nginx config is writable");
        let mut cmd = Command::new(binary);
        cmd.arg("-p")
            .arg(dir)
            .arg("-c")
            .arg(&conf_path)
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        if let Some(clock) = clock {
            clock.apply(&mut cmd);
        }
        let process = Killed(cmd.spawn().expect("nginx starts"));
        for _ in 0..250 {
            if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
                return Nginx {
                    port,
                    _process: process,
                };
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!(
            "nginx did not listen on {port} within 5 s (see {}/error.log)",
            dir.display()
        );
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn civil_dates_match_known_instants() {
        assert_eq!(super::civil(0), ("1970-01-01".into(), "00:00:00".into()));
        assert_eq!(
            super::civil(1_767_225_600 + 86_400 * 31 + 3_661),
            ("2026-02-01".into(), "01:01:01".into())
        );
        assert_eq!(
            super::civil(951_782_400),
            ("2000-02-29".into(), "00:00:00".into())
        );
    }
}
