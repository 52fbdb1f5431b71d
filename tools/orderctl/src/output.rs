//! Output: a human table by default, JSON with `--json` (for scripts: one
//! JSON document on stdout, progress and notes on stderr only).

use crate::error::{CliError, Result};
use comfy_table::{presets, Table};
use indicatif::{ProgressBar, ProgressStyle};
use serde::Serialize;
use std::time::Duration;

pub fn table(headers: &[&str]) -> Table {
    let mut t = Table::new();
    t.load_preset(presets::UTF8_FULL_CONDENSED);
    t.set_header(headers.to_vec());
    t
}

pub fn print_json(v: &impl Serialize) -> Result<()> {
    let text = serde_json::to_string_pretty(v).map_err(|e| CliError::new(format!("encoding JSON: {e}"), ""))?;
    println!("{text}");
    Ok(())
}

/// A serialised enum's wire name (`RESERVED`, `REFUND_PENDING`, …).
pub fn name_of(v: &impl Serialize) -> String {
    match serde_json::to_value(v) {
        Ok(serde_json::Value::String(s)) => s,
        Ok(other) => other.to_string(),
        Err(_) => "?".into(),
    }
}

/// A spinner on stderr for a wait of unknown length; hidden with `--json`
/// (and by indicatif itself when stderr is not a terminal).
pub fn spinner(quiet: bool, message: impl Into<String>) -> ProgressBar {
    if quiet {
        return ProgressBar::hidden();
    }
    let pb = ProgressBar::new_spinner();
    pb.set_style(ProgressStyle::with_template("{spinner} {msg} ({elapsed})").expect("valid template"));
    pb.set_message(message.into());
    pb.enable_steady_tick(Duration::from_millis(120));
    pb
}

/// A bar over `len` items on stderr; hidden like [`spinner`].
pub fn bar(quiet: bool, len: u64, message: impl Into<String>) -> ProgressBar {
    if quiet {
        return ProgressBar::hidden();
    }
    let pb = ProgressBar::new(len);
    pb.set_style(
        ProgressStyle::with_template("{msg} [{bar:30}] {pos}/{len} ({elapsed})")
            .expect("valid template")
            .progress_chars("=> "),
    );
    pb.set_message(message.into());
    pb
}

/// Seconds as `1h02m`, `3m05s` or `42s`.
pub fn age(d: Duration) -> String {
    let s = d.as_secs();
    match s {
        0..=59 => format!("{s}s"),
        60..=3599 => format!("{}m{:02}s", s / 60, s % 60),
        _ => format!("{}h{:02}m", s / 3600, (s % 3600) / 60),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn ages_read_as_the_largest_units() {
        use std::time::Duration;
        assert_eq!(super::age(Duration::from_secs(42)), "42s");
        assert_eq!(super::age(Duration::from_secs(185)), "3m05s");
        assert_eq!(super::age(Duration::from_secs(3720)), "1h02m");
    }
}
