//! The rule-file loader (Envoy's ratelimit config plus `policies:`): any text is
//! loaded or refused with an error; loaded rules match descriptors without panicking.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tollgate_service::descriptors::DescriptorRules;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let mut rules = DescriptorRules::default();
    if rules
        .add(text, "fuzz.yaml", &Default::default())
        .is_err()
    {
        return;
    }
    let domains: Vec<String> = rules.domains().map(|(d, _)| d.to_string()).collect();
    for domain in domains {
        let _ = rules.limits(&domain);
        for entries in [
            vec![("key".to_string(), "value".to_string())],
            vec![("a".into(), "b".into()), ("c".into(), String::new())],
        ] {
            let _ = rules.find(&domain, &entries);
        }
    }
});
