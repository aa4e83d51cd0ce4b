//! CONTRIBUTING.md's layout names every module of every crate, so the map a newcomer
//! reads stays the code's: a module added, renamed or moved without its line fails
//! here.

use std::path::Path;

#[test]
fn contributing_names_every_module_of_every_crate() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let doc = std::fs::read_to_string(root.join("CONTRIBUTING.md")).unwrap();
    let start = doc
        .find("## Layout")
        .expect("CONTRIBUTING.md has a Layout section");
    let layout = &doc[start..];
    let layout = &layout[..layout[3..].find("\n## ").map_or(layout.len(), |i| i + 3)];
    let mut missing = Vec::new();
    let mut crates: Vec<String> = std::fs::read_dir(root.join("crates"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    crates.sort();
    for krate in &crates {
        if !layout.contains(&format!("crates/{krate}/")) {
            missing.push(format!("crates/{krate}/"));
        }
        let src = root.join("crates").join(krate).join("src");
        let mut dirs = vec![src.clone()];
        while let Some(dir) = dirs.pop() {
            for entry in std::fs::read_dir(&dir).unwrap() {
                let path = entry.unwrap().path();
                let name = path.file_name().unwrap().to_string_lossy().into_owned();
                if path.is_dir() {
                    // A directory is named as `name/`; what is in `algorithms/` (one
                    // file per algorithm or Lua file) is named by the directory.
                    if !layout.contains(&format!("{name}/")) {
                        missing.push(format!("{krate}: {name}/"));
                    }
                    if name != "algorithms" {
                        dirs.push(path);
                    }
                } else if name.ends_with(".rs")
                    && !["mod.rs", "lib.rs"].contains(&name.as_str())
                    && !layout.contains(&name)
                {
                    let file = path.strip_prefix(&src).unwrap().display().to_string();
                    missing.push(format!("{krate}: {file}"));
                }
            }
        }
    }
    assert!(
        missing.is_empty(),
        "CONTRIBUTING.md's Layout does not name: {missing:?}"
    );
}
