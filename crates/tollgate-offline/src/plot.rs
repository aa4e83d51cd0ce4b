//! `tollgate plot`: draws the columns of a CSV file of samples over time as a chart —
//! how `scripts/soak.sh` charts the memory and open files of the processes it soaks.
//!
//! The first column is the x axis (its header names it); every other column is a
//! series, and columns whose names end in the same unit (`_kb`, `_fds`, ...) share a
//! panel. Columns in `_kb` are drawn in MiB.

use std::collections::BTreeMap;
use std::path::PathBuf;

use anyhow::{bail, Context};
use clap::Parser;

use crate::chart::{draw_samples, Panel, Series};

#[derive(Debug, Parser)]
/// `tollgate plot` arguments.
pub struct PlotArgs {
    /// The CSV file: a header, then one row of numbers per sample.
    #[arg(long)]
    pub csv: PathBuf,
    /// Where to draw (`.svg` or `.png`).
    #[arg(long)]
    pub out: PathBuf,
    /// The chart's title.
    #[arg(long, default_value = "samples")]
    pub title: String,
}

/// Reads `text` (CSV) into panels, one per unit suffix, and the x axis's name.
pub fn panels(text: &str) -> anyhow::Result<(String, Vec<Panel>)> {
    let mut reader = csv::Reader::from_reader(text.as_bytes());
    let header: Vec<String> = reader.headers()?.iter().map(str::to_string).collect();
    if header.len() < 2 {
        bail!("expected a header with an x column and at least one series, got {header:?}");
    }
    let mut columns: Vec<Vec<(f64, f64)>> = vec![Vec::new(); header.len() - 1];
    for (i, row) in reader.records().enumerate() {
        let row = row?;
        let number = |j: usize| -> anyhow::Result<f64> {
            let cell = row.get(j).unwrap_or("");
            cell.trim().parse().with_context(|| {
                format!(
                    "line {}: column {}: not a number: {cell:?}",
                    i + 2,
                    header[j]
                )
            })
        };
        let x = number(0)?;
        for (j, column) in columns.iter_mut().enumerate() {
            column.push((x, number(j + 1)?));
        }
    }
    let mut by_unit: BTreeMap<String, Vec<Series>> = BTreeMap::new();
    for (name, mut points) in header[1..].iter().zip(columns) {
        let (series, unit) = name.rsplit_once('_').unwrap_or((name.as_str(), ""));
        let (series, unit) = match series.rsplit_once('_') {
            // `serve_rss_kb`: series `serve`, measure `rss`, unit `kb`.
            Some((who, what)) => (who.to_string(), format!("{what}_{unit}")),
            None => (series.to_string(), unit.to_string()),
        };
        let unit = if let Some(what) = unit.strip_suffix("_kb") {
            points.iter_mut().for_each(|p| p.1 /= 1024.0);
            format!("{what} (MiB)")
        } else {
            unit
        };
        by_unit.entry(unit).or_default().push((series, points));
    }
    let panels = by_unit
        .into_iter()
        .map(|(y_desc, series)| Panel { y_desc, series })
        .collect();
    Ok((header[0].clone(), panels))
}

/// `tollgate plot`.
pub fn command(args: PlotArgs) -> anyhow::Result<()> {
    let text = std::fs::read_to_string(&args.csv)
        .with_context(|| format!("cannot read {}", args.csv.display()))?;
    let (x, panels) = panels(&text).with_context(|| args.csv.display().to_string())?;
    draw_samples(&args.out, &args.title, &x, &panels)?;
    println!("wrote {}", args.out.display());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_group_by_unit_and_kib_become_mib() {
        let (x, panels) =
            panels("t_s,serve_rss_kb,serve_fds,proxy_rss_kb,proxy_fds\n0,2048,30,1024,37\n5,4096,31,1024,37\n")
                .unwrap();
        assert_eq!(x, "t_s");
        let names: Vec<_> = panels.iter().map(|p| p.y_desc.as_str()).collect();
        assert_eq!(names, ["fds", "rss (MiB)"]);
        let rss = &panels[1].series;
        assert_eq!(rss[0].0, "serve");
        assert_eq!(rss[0].1, vec![(0.0, 2.0), (5.0, 4.0)]);
        assert_eq!(rss[1].0, "proxy");
    }

    #[test]
    fn a_bad_cell_names_its_line_and_column() {
        let e = panels("t_s,a_fds\n0,1\n5,x\n").unwrap_err().to_string();
        assert!(e.contains("line 3") && e.contains("a_fds"), "{e}");
    }
}
