//! The console in a real browser (tests/python/console_browser.py): Debian's
//! chromium, driven by Python's selenium through chromium-driver, against a real
//! `serve` under a known load from `tollgate bench grpc`. `scripts/test.sh` installs
//! chromium, chromium-driver and selenium.
//!
//! With `TOLLGATE_CONSOLE_SCREENSHOTS=DIR` the run saves its screenshots there
//! (`scripts/console-screenshots.sh` writes the docs' with it).

#[path = "support/python.rs"]
mod python;

#[test]
#[cfg_attr(
    not(feature = "external-servers"),
    ignore = "drives chromium: run scripts/test.sh, or cargo test --features external-servers"
)]
fn the_console_in_chromium_shows_metrics_figures_and_guards_its_admin_actions() {
    let mut args = vec![env!("CARGO_BIN_EXE_tollgate").to_string()];
    if let Ok(dir) = std::env::var("TOLLGATE_CONSOLE_SCREENSHOTS") {
        args.push(dir);
    }
    python::run_python("console_browser.py", &args);
}
