//! What the run prints and writes: the summary table (per scenario, per
//! invariant, the delay percentiles, the drain), `delays.csv` (one row per
//! order: expire_at → final) and `delays.png` (a histogram of the closed
//! orders' delays). The PNG has no text (see Cargo.toml: no font feature);
//! the summary states its axes.

use crate::scenario::{Driven, Plan};
use crate::verify::{OrderOutcome, Verdict};
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::PathBuf;
use time::OffsetDateTime;

pub struct OrderRow {
    pub index: usize,
    pub plan: Plan,
    pub driven: Driven,
    pub outcome: Option<OrderOutcome>,
}

pub struct RunFacts {
    pub run_id: String,
    pub rate: f64,
    pub window: u64,
    pub create_ms: Vec<u64>,
    pub first_create_to_last_s: f64,
    pub last_expire: OffsetDateTime,
    pub stock_released_at: Option<OffsetDateTime>,
    pub settled_at: OffsetDateTime,
    /// The sweep's resume time and the last backlog order's final time.
    pub backlog_drain: Option<(OffsetDateTime, Option<OffsetDateTime>)>,
    pub drill_notes: Vec<String>,
    /// Drills asked for that did not happen (the run fails).
    pub drill_failures: Vec<String>,
    pub drain_notes: Vec<String>,
    pub out_dir: PathBuf,
    pub replays: usize,
    /// The plan names of the order-level drills asked for: each must have
    /// planted its fault on at least one accepted order.
    pub drills_asked: Vec<&'static str>,
    /// The paying scenarios paid through Stripe (`--channel stripe`).
    pub stripe: bool,
}

/// Nearest-rank percentile of sorted values.
pub fn percentile(sorted: &[i64], p: f64) -> Option<i64> {
    if sorted.is_empty() {
        return None;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil().max(1.0) as usize;
    Some(sorted[rank.min(sorted.len()) - 1])
}

fn secs(ms: Option<i64>) -> String {
    ms.map_or("-".into(), |v| format!("{:.2} s", v as f64 / 1000.0))
}

fn rfc3339(t: OffsetDateTime) -> String {
    t.format(&time::format_description::well_known::Rfc3339).unwrap_or_default()
}

#[derive(Default)]
struct PlanLine {
    planned: usize,
    accepted: usize,
    paid: usize,
    closed: usize,
    other: usize,
    refunds: usize,
    wrong: usize,
    errors: usize,
}

impl PlanLine {
    fn add(&mut self, l: &PlanLine) {
        self.planned += l.planned;
        self.accepted += l.accepted;
        self.paid += l.paid;
        self.closed += l.closed;
        self.other += l.other;
        self.refunds += l.refunds;
        self.wrong += l.wrong;
        self.errors += l.errors;
    }

    /// The line in the summary's scenario table.
    fn write(&self, s: &mut String, name: &str) {
        let _ = writeln!(
            s,
            "{name:<26} {:>7} {:>8} {:>6} {:>7} {:>6} {:>8} {:>6} {:>7}",
            self.planned, self.accepted, self.paid, self.closed, self.other, self.refunds, self.wrong, self.errors
        );
    }
}

/// The rows summed per scenario, with every wrong answer and failed call.
#[derive(Default)]
struct Tally {
    lines: BTreeMap<&'static str, PlanLine>,
    wrong: Vec<String>,
    errors: Vec<String>,
}

impl Tally {
    fn of(facts: &RunFacts, rows: &[OrderRow]) -> Self {
        let mut t = Tally::default();
        for r in rows {
            let l = t.lines.entry(r.plan.name()).or_default();
            l.planned += 1;
            l.accepted += usize::from(r.driven.order_id.is_some());
            match r.outcome.as_ref().map(|o| o.status.as_str()) {
                Some("PAID") => l.paid += 1,
                Some("CLOSED") => l.closed += 1,
                Some(_) => l.other += 1,
                None if r.driven.order_id.is_some() => l.other += 1,
                None => {}
            }
            l.refunds += r.outcome.as_ref().map_or(0, |o| o.refunds);
            l.wrong += r.driven.wrong_answers.len();
            l.errors += r.driven.errors.len();
            t.wrong.extend(r.driven.wrong_answers.iter().cloned());
            t.errors.extend(r.driven.errors.iter().cloned());
            for w in unexpected_outcome(r, facts.stripe).into_iter().chain(stripe_disagrees(r)) {
                l.wrong += 1;
                t.wrong.push(w);
            }
        }
        t
    }
}

/// The outcome the scenario must end with, if every step was made: what
/// is wrong with the one it ended with, if anything.
fn unexpected_outcome(r: &OrderRow, stripe: bool) -> Option<String> {
    let (Some(o), Some((statuses, refunds)), true) =
        (&r.outcome, r.plan.expected(r.index, stripe), r.driven.errors.is_empty())
    else {
        return None;
    };
    let refunds_ok = match o.status.as_str() {
        "CLOSED" if r.plan == Plan::Drill(crate::scenario::Drilled::ChannelNotFound) => o.refunds == 1,
        _ => refunds.contains(&o.refunds),
    };
    (!statuses.contains(&o.status.as_str()) || !refunds_ok).then(|| {
        format!(
            "{} ({}): ended {} with {} refunds, expected {statuses:?} with {refunds:?}",
            r.plan.name(),
            o.order_id,
            o.status,
            o.refunds
        )
    })
}

/// Stripe's answer to the confirmation that decided the order is its
/// outcome: a success PAID, a refusal CLOSED, neither refunded. What is
/// wrong with the outcome, if anything.
fn stripe_disagrees(r: &OrderRow) -> Option<String> {
    let (Some(o), Some(confirmed)) = (&r.outcome, r.driven.stripe_confirmed) else { return None };
    let want = if confirmed { "PAID" } else { "CLOSED" };
    (o.status != want || o.refunds != 0).then(|| {
        format!(
            "{} ({}): Stripe {} the deciding confirmation, but the order ended {} with {} refunds",
            r.plan.name(),
            o.order_id,
            if confirmed { "succeeded" } else { "refused" },
            o.status,
            o.refunds
        )
    })
}

/// Prints the summary, writes the files, returns the exit code.
pub fn report(facts: &RunFacts, rows: &[OrderRow], verdict: Result<Verdict, String>) -> i32 {
    let mut s = String::new();
    let tally = Tally::of(facts, rows);
    let _ = writeln!(s, "\n== loadcheck {} ==", facts.run_id);
    let total = write_scenarios(&mut s, &tally.lines);
    let _ = writeln!(s, "idempotent create replays answered with the same order: {}", facts.replays);
    write_creates(&mut s, facts, total.accepted);
    let close_delays = write_drain(&mut s, facts, rows);

    // Invariants.
    let mut code = 0;
    let _ = writeln!(s, "\ninvariants:");
    write_run_invariants(&mut s, facts, rows, &tally, &mut code);
    match &verdict {
        Ok(v) => write_verdict(&mut s, v, &mut code),
        Err(e) => {
            code = code.max(2);
            let _ = writeln!(s, "  the invariant check could not run: {e}");
        }
    }
    for w in tally.wrong.iter().take(30) {
        let _ = writeln!(s, "WRONG ANSWER {w}");
    }
    if !tally.errors.is_empty() {
        let _ =
            writeln!(s, "{} calls failed after their retries (the run could not do them), e.g.:", tally.errors.len());
        for e in tally.errors.iter().take(10) {
            let _ = writeln!(s, "  {e}");
        }
    }

    match write_files(facts, rows, &close_delays) {
        Ok(note) => {
            let _ = writeln!(s, "{note}");
        }
        Err(e) => {
            let _ = writeln!(s, "writing the report files failed: {e}");
            code = code.max(2);
        }
    }
    write_incomplete(&mut s, rows);
    let _ = writeln!(
        s,
        "result: {}",
        match code {
            0 => "PASS",
            1 => "FAIL",
            _ => "INCOMPLETE (the run could not do or check all it planned: see above)",
        }
    );
    print!("{s}");
    let _ = std::fs::write(facts.out_dir.join("summary.txt"), &s);
    code
}

/// The scenario table, a line per scenario and the total: the total.
fn write_scenarios(s: &mut String, lines: &BTreeMap<&str, PlanLine>) -> PlanLine {
    let _ = writeln!(
        s,
        "{:<26} {:>7} {:>8} {:>6} {:>7} {:>6} {:>8} {:>6} {:>7}",
        "scenario", "planned", "accepted", "PAID", "CLOSED", "other", "refunds", "wrong", "errors"
    );
    let mut total = PlanLine::default();
    for (name, l) in lines {
        l.write(s, name);
        total.add(l);
    }
    total.write(s, "total");
    total
}

/// Throughput and latency of the creates.
fn write_creates(s: &mut String, facts: &RunFacts, accepted: usize) {
    let mut create_ms: Vec<i64> = facts.create_ms.iter().map(|v| *v as i64).collect();
    create_ms.sort_unstable();
    let _ = writeln!(
        s,
        "creates: {} accepted in {:.1} s = {:.1}/s (asked {}/s); create latency P50 {} P95 {} P99 {}",
        accepted,
        facts.first_create_to_last_s,
        accepted as f64 / facts.first_create_to_last_s.max(0.001),
        facts.rate,
        secs(percentile(&create_ms, 50.0)),
        secs(percentile(&create_ms, 95.0)),
        secs(percentile(&create_ms, 99.0)),
    );
}

/// expire_at → final, the drain's times and the drills' and drain's
/// notes: the closed orders' delays, sorted.
fn write_drain(s: &mut String, facts: &RunFacts, rows: &[OrderRow]) -> Vec<i64> {
    let closed: Vec<&OrderOutcome> =
        rows.iter().filter_map(|r| r.outcome.as_ref()).filter(|o| o.status == "CLOSED").collect();
    let mut close_delays: Vec<i64> = closed.iter().filter_map(|o| o.delay_ms()).collect();
    close_delays.sort_unstable();
    let _ = writeln!(
        s,
        "expire_at -> CLOSED over {} closed orders: P50 {} P95 {} P99 {} max {}",
        close_delays.len(),
        secs(percentile(&close_delays, 50.0)),
        secs(percentile(&close_delays, 95.0)),
        secs(percentile(&close_delays, 99.0)),
        secs(close_delays.last().copied()),
    );
    let first_expire = rows.iter().filter_map(|r| r.driven.expire_at).min();
    let _ = writeln!(
        s,
        "drain: expire_at from {} to {} (window {} s); last expire_at -> every reservation released or sold: {}; \
         -> every order settled (seen): {:.1} s",
        first_expire.map(rfc3339).unwrap_or_default(),
        rfc3339(facts.last_expire),
        facts.window,
        facts
            .stock_released_at
            .map_or("not reached".into(), |t| format!("{:.1} s", (t - facts.last_expire).as_seconds_f64())),
        (facts.settled_at - facts.last_expire).as_seconds_f64(),
    );
    if let Some((resumed, last_final)) = facts.backlog_drain {
        let _ = writeln!(
            s,
            "drill sweep-pause: sweep resumed at {}; its backlog was final {} after that",
            rfc3339(resumed),
            last_final.map_or("never".into(), |t| format!("{:.1} s", (t - resumed).as_seconds_f64()))
        );
    }
    for note in facts.drill_notes.iter().chain(&facts.drain_notes) {
        let _ = writeln!(s, "{note}");
    }
    close_delays
}

/// The invariants of the run itself, before the records' (the surface's
/// answers, the drain, every step made, every drill exercised).
fn write_run_invariants(s: &mut String, facts: &RunFacts, rows: &[OrderRow], tally: &Tally, code: &mut i32) {
    let (wrong, errors) = (&tally.wrong, &tally.errors);
    let _ = writeln!(
        s,
        "  {:<44} {}",
        "surface_answers (refusals, replays, outcomes)",
        if wrong.is_empty() { "pass".to_owned() } else { format!("FAIL ({})", wrong.len()) }
    );
    if !wrong.is_empty() {
        *code = 1;
    }
    if !facts.drain_notes.is_empty() {
        *code = 1;
        let _ = writeln!(s, "  {:<44} FAIL", "drained_within_timeout");
    }
    // A pass proves only what the run did: a step that failed after its
    // retries (a create, a payment entry, a settle) leaves its scenario
    // unexercised, and such an order is spared the outcome check, so the
    // run cannot pass with it.
    if !errors.is_empty() {
        let _ = writeln!(s, "  {:<44} FAIL ({})", "steps_made (every planned call made)", errors.len());
        *code = (*code).max(2);
    }
    for failure in &facts.drill_failures {
        let _ = writeln!(s, "  {failure:<44} FAIL");
        *code = (*code).max(2);
    }
    for drill in &facts.drills_asked {
        if !rows.iter().any(|r| r.plan.name() == *drill && r.driven.order_id.is_some()) {
            let _ = writeln!(s, "  {:<44} FAIL (no accepted order planted it)", format!("{drill} exercised"));
            *code = (*code).max(2);
        }
    }
}

/// The check's verdict: every invariant by name, the skipped ones, the
/// counts and the first violations.
fn write_verdict(s: &mut String, v: &Verdict, code: &mut i32) {
    let mut by_invariant: BTreeMap<&str, usize> = BTreeMap::new();
    for violation in &v.violations {
        *by_invariant.entry(violation.invariant).or_default() += 1;
    }
    // Every invariant by name, so a pass says what was checked.
    for (inv, what) in crate::verify::INVARIANTS {
        let verdict = match (by_invariant.get(inv), v.skipped.contains_key(inv)) {
            (Some(n), _) => format!("FAIL ({n})"),
            (None, true) => "skipped".to_owned(),
            (None, false) => "pass".to_owned(),
        };
        let _ = writeln!(s, "  {inv:<44} {verdict:<10} {what}");
    }
    for (inv, why) in &v.skipped {
        let _ = writeln!(s, "{inv} skipped: {why}");
    }
    if !v.violations.is_empty() {
        *code = 1;
    }
    if !v.counts.is_empty() {
        let _ =
            writeln!(s, "counts: {}", v.counts.iter().map(|(k, n)| format!("{k}={n}")).collect::<Vec<_>>().join(" "));
    }
    for violation in v.violations.iter().take(50) {
        let _ = writeln!(s, "VIOLATION {} {}: {}", violation.invariant, violation.subject, violation.detail);
    }
    if v.violations.len() > 50 {
        let _ = writeln!(s, "… and {} more violations", v.violations.len() - 50);
    }
}

/// Invariants that held over a mix the run could not drive are not the
/// proof asked for: an overloaded stack (creates slower than the payment
/// window) turns payments into refusals and the mix into closes. Say what
/// to change.
fn write_incomplete(s: &mut String, rows: &[OrderRow]) {
    let orders_with_errors = rows.iter().filter(|r| !r.driven.errors.is_empty()).count();
    if orders_with_errors > 0 {
        let _ = writeln!(
            s,
            "INCOMPLETE: {orders_with_errors} of {} orders could not make every step of their scenario, so the mix \
             above is not the one planned; if the stack was overloaded (create latency near the payment window), \
             run again with a lower --rate or a longer window (PAYMENT_WINDOW_SECONDS at `infra/local.sh up`)",
            rows.len()
        );
    }
}

fn write_files(facts: &RunFacts, rows: &[OrderRow], close_delays: &[i64]) -> Result<String, String> {
    let csv_path = facts.out_dir.join("delays.csv");
    let mut csv = String::from("order_id,scenario,status,expire_at,final_at,delay_ms,refunds\n");
    for r in rows {
        if let Some(o) = &r.outcome {
            let _ = writeln!(
                csv,
                "{},{},{},{},{},{},{}",
                o.order_id,
                r.plan.name(),
                o.status,
                rfc3339(o.expire_at),
                o.final_at.map(rfc3339).unwrap_or_default(),
                o.delay_ms().map(|d| d.to_string()).unwrap_or_default(),
                o.refunds
            );
        }
    }
    std::fs::write(&csv_path, csv).map_err(|e| format!("{}: {e}", csv_path.display()))?;
    let png_path = facts.out_dir.join("delays.png");
    let axes = histogram(&png_path, close_delays)?;
    Ok(format!("wrote {} and {} ({axes})", csv_path.display(), png_path.display()))
}

/// The closed orders' expire_at → CLOSED delays as bars. Returns what the
/// axes are, since the image has no text.
fn histogram(path: &std::path::Path, delays_ms: &[i64]) -> Result<String, String> {
    use plotters::prelude::*;
    const W: u32 = 800;
    const H: u32 = 400;
    const MARGIN: i32 = 20;
    let max = delays_ms.iter().copied().max().unwrap_or(0).max(1000);
    let min = delays_ms.iter().copied().min().unwrap_or(0).min(0);
    // Bins of a whole number of 250 ms steps, about 60 of them.
    let span = (max - min) as f64;
    let bin_ms = (((span / 60.0) / 250.0).ceil() * 250.0).max(250.0) as i64;
    let bins = ((max - min) / bin_ms + 1) as usize;
    let mut counts = vec![0u32; bins];
    for d in delays_ms {
        counts[((d - min) / bin_ms) as usize] += 1;
    }
    let tallest = counts.iter().copied().max().unwrap_or(0).max(1);
    let root = BitMapBackend::new(path, (W, H)).into_drawing_area();
    let err = |e: DrawingAreaErrorKind<_>| format!("drawing {}: {e:?}", path.display());
    root.fill(&WHITE).map_err(err)?;
    let plot_w = (W as i32 - 2 * MARGIN) as f64;
    let plot_h = (H as i32 - 2 * MARGIN) as f64;
    let x_of = |ms: i64| MARGIN + (((ms - min) as f64 / (bins as i64 * bin_ms) as f64) * plot_w) as i32;
    // A light line every 10 s, a darker one at expire_at (0 s).
    let mut t = (min / 10_000) * 10_000;
    while t <= max {
        let color = if t == 0 { RGBColor(120, 120, 120) } else { RGBColor(220, 220, 220) };
        root.draw(&PathElement::new(vec![(x_of(t), MARGIN), (x_of(t), H as i32 - MARGIN)], color)).map_err(err)?;
        t += 10_000;
    }
    for (i, c) in counts.iter().enumerate() {
        if *c == 0 {
            continue;
        }
        let x0 = x_of(min + i as i64 * bin_ms);
        let x1 = x_of(min + (i as i64 + 1) * bin_ms) - 1;
        let y0 = H as i32 - MARGIN - ((*c as f64 / tallest as f64) * plot_h) as i32;
        root.draw(&Rectangle::new([(x0, y0), (x1.max(x0), H as i32 - MARGIN)], BLUE.filled())).map_err(err)?;
    }
    root.draw(&PathElement::new(vec![(MARGIN, H as i32 - MARGIN), (W as i32 - MARGIN, H as i32 - MARGIN)], BLACK))
        .map_err(err)?;
    root.present().map_err(err)?;
    Ok(format!(
        "histogram of {} closed orders: x from {:.2} s to {:.2} s after expire_at in bars of {:.2} s, \
         a grey line every 10 s (darker at 0 s); y up to the tallest bar, {tallest} orders",
        delays_ms.len(),
        min as f64 / 1000.0,
        (min + bins as i64 * bin_ms) as f64 / 1000.0,
        bin_ms as f64 / 1000.0
    ))
}

/// The check alone (`--check`): the violations and the exit code.
pub fn verdict_only(verdict: Result<Verdict, String>) -> i32 {
    match verdict {
        Ok(v) => {
            for violation in &v.violations {
                println!("VIOLATION {} {}: {}", violation.invariant, violation.subject, violation.detail);
            }
            for (inv, why) in &v.skipped {
                println!("{inv} skipped: {why}");
            }
            println!(
                "{} orders checked, {} violations; result: {}",
                v.orders.len(),
                v.violations.len(),
                if v.violations.is_empty() { "PASS" } else { "FAIL" }
            );
            i32::from(!v.violations.is_empty())
        }
        Err(e) => {
            println!("the invariant check could not run: {e}");
            2
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts(dir: &std::path::Path, drills_asked: Vec<&'static str>) -> RunFacts {
        let t = OffsetDateTime::now_utc();
        RunFacts {
            run_id: "lctest".into(),
            rate: 1.0,
            window: 20,
            create_ms: vec![10],
            first_create_to_last_s: 1.0,
            last_expire: t,
            stock_released_at: Some(t),
            settled_at: t,
            backlog_drain: None,
            drill_notes: vec![],
            drill_failures: vec![],
            drain_notes: vec![],
            out_dir: dir.to_path_buf(),
            replays: 0,
            drills_asked,
            stripe: false,
        }
    }

    fn row(plan: Plan, errors: Vec<String>) -> OrderRow {
        let t = OffsetDateTime::now_utc();
        OrderRow {
            index: 0,
            plan,
            driven: Driven { order_id: Some("o1".into()), expire_at: Some(t), errors, ..Default::default() },
            outcome: Some(OrderOutcome {
                order_id: "o1".into(),
                status: "CLOSED".into(),
                expire_at: t,
                final_at: Some(t),
                refunds: 0,
            }),
        }
    }

    #[test]
    fn a_run_whose_calls_failed_or_whose_drill_planted_nothing_does_not_pass() {
        use crate::scenario::{Drilled, Scenario};
        let dir = std::env::temp_dir().join(format!("loadcheck-report-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let never = Plan::Mix(Scenario::NeverPaid);
        assert_eq!(report(&facts(&dir, vec![]), &[row(never, vec![])], Ok(Verdict::default())), 0);
        // A payment entry that failed: the scenario was not exercised.
        let failed = row(Plan::Mix(Scenario::PaidInTime), vec!["payment entry answered 500".into()]);
        assert_eq!(report(&facts(&dir, vec![]), &[failed], Ok(Verdict::default())), 2);
        // A drill asked for with no order of it.
        let asked = vec![Plan::Drill(Drilled::CrashCloser).name()];
        assert_eq!(report(&facts(&dir, asked.clone()), &[row(never, vec![])], Ok(Verdict::default())), 2);
        let drilled = row(Plan::Drill(Drilled::CrashCloser), vec![]);
        assert_eq!(report(&facts(&dir, asked), &[drilled], Ok(Verdict::default())), 0);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn percentiles_are_nearest_rank() {
        let v: Vec<i64> = (1..=100).collect();
        assert_eq!(percentile(&v, 50.0), Some(50));
        assert_eq!(percentile(&v, 99.0), Some(99));
        assert_eq!(percentile(&v, 100.0), Some(100));
        assert_eq!(percentile(&[7], 95.0), Some(7));
        assert_eq!(percentile(&[], 50.0), None);
    }
}
