//! Certificates for tests, made with the `openssl` command in a directory of their
//! own: a CA, a server certificate for `localhost` and `127.0.0.1`, a client
//! certificate, and the bad cases (another CA, an expired server certificate, one for
//! another name, a key that belongs to another certificate).

use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};

/// A directory of PEM files; removed on drop.
pub struct Pki {
    /// Where the files are.
    pub dir: PathBuf,
}

impl Pki {
    /// Makes every file (a second or two of `openssl`).
    pub fn new() -> Pki {
        static MADE: AtomicU64 = AtomicU64::new(0);
        let dir = std::env::temp_dir().join(format!(
            "tollgate-pki-{}-{}",
            std::process::id(),
            MADE.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let pki = Pki { dir };
        pki.ca("ca");
        pki.ca("other-ca");
        pki.leaf("server", "ca", "DNS:localhost,IP:127.0.0.1", None);
        pki.leaf("client", "ca", "DNS:tollgate-client", None);
        pki.leaf("wrong-name", "ca", "DNS:redis.example", None);
        pki.leaf(
            "expired",
            "ca",
            "DNS:localhost,IP:127.0.0.1",
            Some("2020-01-01"),
        );
        pki.leaf("stranger", "other-ca", "DNS:tollgate-client", None);
        pki
    }

    /// Another certificate `name.pem` (key `name.key`) signed by `ca.pem`, for `san`
    /// (e.g. `DNS:localhost,IP:127.0.0.1`): a renewed server certificate.
    pub fn issue(&self, name: &str, san: &str) {
        self.leaf(name, "ca", san, None);
    }

    /// Like [`Pki::issue`], but made on `date` (`YYYY-MM-DD`, under libfaketime) and
    /// valid 30 days from it: a certificate about to expire.
    pub fn issue_made_on(&self, name: &str, san: &str, date: &str) {
        self.leaf(name, "ca", san, Some(date));
    }

    /// The path of `name` (e.g. `ca.pem`, `server.pem`, `server.key`).
    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    fn openssl(&self, args: &[&str]) {
        self.run("openssl", args);
    }

    fn run(&self, program: &str, args: &[&str]) {
        self.run_with(program, args, &[]);
    }

    fn run_with(&self, program: &str, args: &[&str], env: &[(&str, &str)]) {
        let out = Command::new(program)
            .args(args)
            .envs(env.iter().copied())
            .current_dir(&self.dir)
            .output()
            .unwrap_or_else(|e| panic!("{program} (scripts/test.sh installs it): {e}"));
        assert!(
            out.status.success(),
            "{program} {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    fn ca(&self, name: &str) {
        let (key, pem) = (format!("{name}.key"), format!("{name}.pem"));
        self.openssl(&[
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-nodes",
            "-keyout",
            &key,
            "-out",
            &pem,
            "-days",
            "30",
            "-subj",
            &format!("/CN=tollgate test {name}"),
        ]);
    }

    /// A certificate `name.pem` with key `name.key`, signed by `ca`, for `san`;
    /// `back_then`: made under faketime at that date (valid 30 days from it).
    fn leaf(&self, name: &str, ca: &str, san: &str, back_then: Option<&str>) {
        let (key, csr, pem) = (
            format!("{name}.key"),
            format!("{name}.csr"),
            format!("{name}.pem"),
        );
        self.openssl(&[
            "req",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-nodes",
            "-keyout",
            &key,
            "-out",
            &csr,
            "-subj",
            &format!("/CN={name}"),
        ]);
        let ext = format!("{name}.ext");
        std::fs::write(
            self.dir.join(&ext),
            format!("subjectAltName={san}\nextendedKeyUsage=serverAuth,clientAuth\n"),
        )
        .unwrap();
        let (ca_pem, ca_key) = (format!("{ca}.pem"), format!("{ca}.key"));
        let sign = [
            "x509",
            "-req",
            "-in",
            &csr,
            "-CA",
            &ca_pem,
            "-CAkey",
            &ca_key,
            "-CAcreateserial",
            "-out",
            &pem,
            "-days",
            "30",
            "-extfile",
            &ext,
        ];
        match back_then {
            None => self.openssl(&sign),
            // libfaketime preloaded, not the `faketime` wrapper: the wrapper's named
            // semaphore collides with a stale one of a recycled PID when many tests
            // make certificates at once ("sem_open: File exists").
            Some(date) => self.run_with(
                "openssl",
                &sign,
                &[
                    ("LD_PRELOAD", crate::LIBFAKETIME),
                    ("FAKETIME", &format!("@{date} 00:00:00")),
                    // The date is UTC's, whatever the machine's zone.
                    ("TZ", "UTC"),
                ],
            ),
        }
    }
}

impl Default for Pki {
    fn default() -> Self {
        Pki::new()
    }
}

impl Drop for Pki {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
