//! The main config loader: any text is parsed and validated or refused with an
//! error; a parsed config yields its key options and store settings.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tollgate_runtime::config::MainConfig;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(config) = MainConfig::parse(text, std::path::Path::new("/etc/tollgate")) else {
        return;
    };
    let _ = config.key_options();
    let _ = config.store.clone().with_flag(None);
    let _ = config.store.with_flag(Some("memory"));
});
