//! The Prometheus text exposition read back: the console's figures are `/metrics`'
//! own, parsed from the very text a scrape would get; sums and histogram
//! percentiles over its readings.

/// One sample line: a series' name, its labels, and its value.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    /// The series name (`_total`, `_bucket` and the like included).
    pub name: String,
    /// Its labels, in the order written.
    pub labels: Vec<(String, String)>,
    /// Its value.
    pub value: f64,
}

impl Sample {
    /// The value of label `name`, or "" when it has none.
    pub fn label(&self, name: &str) -> &str {
        (self.labels.iter())
            .find(|(k, _)| k == name)
            .map_or("", |(_, v)| v.as_str())
    }
}

/// Every sample of `text`; lines it cannot read (none, from tollgate's own
/// exposition) are skipped.
pub fn parse(text: &str) -> Vec<Sample> {
    text.lines().filter_map(sample).collect()
}

/// What opens and closes a sample's label set.
const LABELS: (char, char) = ('{', '}');

fn sample(line: &str) -> Option<Sample> {
    if line.starts_with('#') || line.trim().is_empty() {
        return None;
    }
    let name_end = line.find([LABELS.0, ' '])?;
    let name = line[..name_end].to_string();
    let mut rest = &line[name_end..];
    let mut labels = Vec::new();
    if let Some(inner) = rest.strip_prefix(LABELS.0) {
        rest = inner;
        loop {
            if let Some(after) = rest.strip_prefix(LABELS.1) {
                rest = after;
                break;
            }
            let eq = rest.find('=')?;
            let key = rest[..eq].trim_start_matches(',').to_string();
            let (value, after) = quoted(rest[eq + 1..].strip_prefix('"')?)?;
            labels.push((key, value));
            rest = after.strip_prefix(',').unwrap_or(after);
        }
    }
    // A timestamp may follow the value; tollgate writes none.
    let value = rest.split_whitespace().next()?;
    let value = match value {
        "+Inf" => f64::INFINITY,
        "-Inf" => f64::NEG_INFINITY,
        v => v.parse().ok()?,
    };
    Some(Sample {
        name,
        labels,
        value,
    })
}

/// A label value up to its closing quote, unescaped, and what follows the quote.
fn quoted(s: &str) -> Option<(String, &str)> {
    let mut out = String::new();
    let mut chars = s.char_indices();
    while let Some((i, c)) = chars.next() {
        match c {
            '"' => return Some((out, &s[i + 1..])),
            '\\' => match chars.next()?.1 {
                'n' => out.push('\n'),
                c => out.push(c),
            },
            c => out.push(c),
        }
    }
    None
}

/// A sampled exposition: its samples and when it was read (seconds).
pub struct Reading {
    /// When, in seconds since the Unix epoch (what people and tools read).
    pub time: f64,
    /// When, in seconds on a monotonic clock (what rates divide by: a step of the
    /// system clock never makes one).
    pub seconds: f64,
    /// What `/metrics` said then.
    pub samples: Vec<Sample>,
}

impl Reading {
    /// The sum of series `name` whose labels pass `keep`.
    pub(super) fn sum(&self, name: &str, keep: impl Fn(&Sample) -> bool) -> f64 {
        (self.samples.iter())
            .filter(|s| s.name == name && keep(s))
            .fold(0.0, |sum, s| sum + s.value)
    }

    pub(super) fn one(&self, name: &str) -> Option<f64> {
        self.samples
            .iter()
            .find(|s| s.name == name)
            .map(|s| s.value)
    }

    pub(super) fn label_of(&self, name: &str, label: &str) -> String {
        (self.samples.iter().find(|s| s.name == name))
            .map_or(String::new(), |s| s.label(label).to_string())
    }
}

/// Percentiles, in milliseconds.
#[derive(Debug, Clone, Copy, serde::Serialize)]
pub struct Latency {
    /// The median.
    pub p50: f64,
    /// The 99th percentile.
    pub p99: f64,
}

/// The median and 99th percentile of histogram `name`'s observations between two
/// readings, interpolated within buckets as Prometheus' `histogram_quantile` does.
pub fn latency(now: &Reading, before: &Reading, name: &str) -> Option<Latency> {
    let bucket = format!("{name}_bucket");
    let counts = |r: &Reading| -> Vec<(f64, f64)> {
        let mut v: Vec<(f64, f64)> = (r.samples.iter())
            .filter(|s| s.name == bucket)
            .filter_map(|s| Some((s.label("le").parse::<f64>().ok()?, s.value)))
            .collect();
        v.sort_by(|a, b| a.0.total_cmp(&b.0));
        v
    };
    let (a, b) = (counts(now), counts(before));
    // The same buckets, none gone backwards (else the two readings are not of one
    // histogram's life: no percentile).
    let alike = a.len() == b.len() && a.iter().zip(&b).all(|(x, y)| x.0 == y.0 && x.1 >= y.1);
    if !alike {
        return None;
    }
    let delta: Vec<(f64, f64)> = a.iter().zip(&b).map(|(x, y)| (x.0, x.1 - y.1)).collect();
    let total = delta.last()?.1;
    if total <= 0.0 {
        return None;
    }
    let quantile = |q: f64| {
        let rank = q * total;
        let mut lower = (0.0, 0.0);
        for &(le, n) in &delta {
            if n >= rank {
                if le.is_infinite() {
                    return lower.0;
                }
                let within = n - lower.1;
                let at = if within > 0.0 {
                    (rank - lower.1) / within
                } else {
                    1.0
                };
                return lower.0 + (le - lower.0) * at;
            }
            lower = (le, n);
        }
        lower.0
    };
    Some(Latency {
        p50: quantile(0.5) * 1e3,
        p99: quantile(0.99) * 1e3,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_names_labels_and_values_as_written() {
        let text = "# HELP x y\n# TYPE a counter\na_total 3\nb{le=\"+Inf\",rule=\"a\\\"b\\\\c\\nd,e=f\"} 2.5\nc{} NaN\nd 1 1700000000\n# EOF\n";
        let s = parse(text);
        assert_eq!(s.len(), 4);
        assert_eq!((s[0].name.as_str(), s[0].value), ("a_total", 3.0));
        assert_eq!(s[1].label("le"), "+Inf");
        assert_eq!(s[1].label("rule"), "a\"b\\c\nd,e=f");
        assert_eq!(s[1].value, 2.5);
        assert!(s[2].value.is_nan() && s[2].labels.is_empty());
        assert_eq!(s[3].value, 1.0);
        assert_eq!(s[1].label("absent"), "");
    }

    #[test]
    fn a_broken_line_is_skipped_not_fatal() {
        let s = parse("a{x=\"unterminated 1\nb 2\nc{x=1} 3\n");
        assert_eq!(s.len(), 1);
        assert_eq!(s[0].name, "b");
    }
}
